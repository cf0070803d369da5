// forensics.cpp — OOM verdicts, free space and remedies (include/ridgescope/forensics.h).
#include "ridgescope/forensics.h"

#include <algorithm>

#include "format_bytes.h"
#include "ridgescope/external_alloc.h"
#include "ridgescope/phase.h"

namespace ridgescope {

using detail::format_bytes;

FreeSpace free_space(std::vector<AddressRange> segments, std::vector<AddressRange> live_blocks) {
  auto by_addr = [](const AddressRange& a, const AddressRange& b) { return a.addr < b.addr; };
  std::sort(segments.begin(), segments.end(), by_addr);
  std::sort(live_blocks.begin(), live_blocks.end(), by_addr);
  FreeSpace out;
  out.histogram.assign(24, 0);
  auto gap = [&out](std::uint64_t bytes) {
    if (bytes == 0) return;
    out.free_bytes += bytes;
    ++out.free_blocks;
    out.largest_free_block = std::max(out.largest_free_block, bytes);
    std::size_t bucket = 0;
    for (std::uint64_t b = bytes >> 21; b != 0 && bucket + 1 < out.histogram.size(); b >>= 1) ++bucket;
    ++out.histogram[bucket];
  };
  std::size_t i = 0;
  for (const AddressRange& seg : segments) {
    const std::uint64_t end = seg.addr + seg.bytes;
    while (i < live_blocks.size() && live_blocks[i].addr < seg.addr) ++i;
    std::uint64_t cursor = seg.addr;
    std::uint64_t seg_free = 0, seg_largest = 0;
    bool holds_live = false;
    auto seg_gap = [&](std::uint64_t bytes) {
      gap(bytes);
      seg_free += bytes;
      seg_largest = std::max(seg_largest, bytes);
    };
    for (; i < live_blocks.size() && live_blocks[i].addr < end; ++i) {
      holds_live = true;
      if (live_blocks[i].addr > cursor) seg_gap(live_blocks[i].addr - cursor);
      cursor = std::max(cursor, live_blocks[i].addr + live_blocks[i].bytes);
    }
    if (end > cursor) seg_gap(end - cursor);
    if (holds_live) out.inactive_split_bytes += seg_free;
    std::uint64_t& pool_largest = seg.bytes <= FreeSpace::kSmallPoolSegmentBytes
                                      ? out.largest_free_block_small_pool
                                      : out.largest_free_block_large_pool;
    pool_largest = std::max(pool_largest, seg_largest);
  }
  return out;
}

std::vector<Remedy> remedies_for(Category category) {
  switch (category) {
    case Category::Activation:
      return {{"Use a smaller micro-batch (with gradient accumulation to keep the effective batch) or a shorter sequence",
               "more steps per sample; throughput per step falls"},
              {"Enable activation checkpointing (torch.utils.checkpoint, use_reentrant=False) on the largest blocks",
               "about one extra forward of compute per checkpointed block"},
              {"Use memory-efficient attention (F.scaled_dot_product_attention) instead of materialised attention scores",
               "none for standard attention; custom masks may need rework"}};
    case Category::Parameter:
    case Category::Gradient:
      return {{"Shard parameters and gradients across devices (FSDP / ZeRO-3)",
               "communication every step; needs several devices"},
              {"Train a parameter-efficient subset (LoRA or another adapter) and freeze the rest",
               "fewer trainable weights; quality may differ from full fine-tuning"},
              {"Keep parameters in bf16 with mixed precision",
               "lower precision weights; needs care with optimizer state (master weights)"}};
    case Category::OptimizerState:
      return {{"Shard optimizer state across devices (ZeRO-1/2, FSDP)", "communication every step"},
              {"Offload optimizer state to host memory", "host-device traffic slows the optimizer step"},
              {"Use lower-precision or factored optimizer state (8-bit Adam, Adafactor)",
               "approximate moments; may change convergence"}};
    case Category::Workspace:
      return {{"Choose a lower-workspace algorithm (torch.backends.cudnn.benchmark=False, a smaller CUBLAS_WORKSPACE_CONFIG)",
               "possibly slower kernels"}};
    case Category::Temporary:
      return {{"Split the operation that needs the large temporary (chunk the loss or the attention over the batch or sequence)",
               "more, smaller kernels"}};
    case Category::Input:
      return {{"Load smaller batches or keep inputs on the host until needed", "more transfers"}};
    default:
      return {{"Tag or label the unexplained memory (rs.phase, Session::tag) and rerun to see what it is",
               "none"}};
  }
}

namespace {

Category dominant_category(const OomContext& c) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < kCategoryCount; ++i)
    if (c.by_category[i] > c.by_category[best]) best = i;
  return static_cast<Category>(best);
}

std::string pct(std::uint64_t part, std::uint64_t whole) {
  if (whole == 0) return "0%";
  return std::to_string(static_cast<int>(100.0 * static_cast<double>(part) / static_cast<double>(whole) + 0.5)) + "%";
}

}  // namespace

Verdict explain_oom(const OomContext& c) {
  Verdict v;
  v.dominant = dominant_category(c);
  const std::string request = format_bytes(c.request_bytes);
  const std::uint64_t cache_free = c.reserved_bytes > c.live_bytes ? c.reserved_bytes - c.live_bytes : 0;
  v.evidence.push_back("request " + request + " in step " + std::to_string(c.step) + ", " + c.phase);
  v.evidence.push_back("live " + format_bytes(c.live_bytes) + ", reserved " + format_bytes(c.reserved_bytes) +
                       (c.capacity_bytes ? ", capacity " + format_bytes(*c.capacity_bytes) : std::string()) +
                       (c.device_free_bytes ? ", device free " + format_bytes(*c.device_free_bytes) : std::string()));
  const std::uint64_t transient = c.by_category[category_index(Category::Temporary)] +
                                  c.by_category[category_index(Category::Workspace)];

  // Memory outside PyTorch: what the device says is used beyond what the allocator reserved.
  std::uint64_t non_pytorch = 0;
  if (c.capacity_bytes && c.device_free_bytes && *c.capacity_bytes > *c.device_free_bytes + c.reserved_bytes) {
    non_pytorch = *c.capacity_bytes - *c.device_free_bytes - c.reserved_bytes;
  }
  // The device ledger's view of it (docs/forensics.md, "The device ledger"): who holds it.
  std::string held_by;  // ", 8.1 GiB of it by NCCL"
  if (c.outside) {
    const OomContext::Outside& o = *c.outside;
    std::string line = "outside PyTorch";
    if (non_pytorch > 0) line += " on the device: " + format_bytes(non_pytorch);
    std::vector<std::string> parts;
    if (o.process_bytes) {
      parts.push_back("this process " + format_bytes(*o.process_bytes) + " (CUDA context " +
                      format_bytes(o.context_bytes) + ")");
      if (non_pytorch > *o.process_bytes) parts.push_back("other processes " + format_bytes(non_pytorch - *o.process_bytes));
    }
    if (o.itemised) {
      std::string libs = "allocated by libraries:";
      for (std::size_t i = 0; i < o.by_library.size() && i < 4; ++i) {
        libs += std::string(i ? ", " : " ") + std::string(library_friendly_name(o.by_library[i].first)) + " " +
                format_bytes(o.by_library[i].second);
      }
      if (o.by_library.empty()) libs += " none live";
      parts.push_back(libs);
      if (!o.by_library.empty()) {
        held_by = ", " + format_bytes(o.by_library.front().second) + " of it by " +
                  std::string(library_friendly_name(o.by_library.front().first));
      }
    } else {
      parts.push_back("not itemised (no CUPTI)");
    }
    for (std::size_t i = 0; i < parts.size(); ++i) line += (i || non_pytorch > 0 ? "; " : ": ") + parts[i];
    v.evidence.push_back(std::move(line));
  }

  if (cache_free >= c.request_bytes && !c.free.can_serve(c.request_bytes)) {
    v.kind = "fragmentation";
    v.summary = "Fragmentation: the cache holds " + format_bytes(c.free.free_bytes) +
                " free, enough for the " + request + " request, but its largest free block is " +
                format_bytes(c.request_bytes <= FreeSpace::kSmallPoolRequestBytes
                                 ? c.free.largest_free_block_small_pool
                                 : c.free.largest_free_block_large_pool) + ".";
    v.evidence.push_back("free in the cache " + format_bytes(c.free.free_bytes) + " in " +
                         std::to_string(c.free.free_blocks) + " blocks; largest " +
                         format_bytes(c.free.largest_free_block));
    v.evidence.push_back("largest free block in the " +
                         std::string(c.request_bytes <= FreeSpace::kSmallPoolRequestBytes ? "small" : "large") +
                         " pool, which serves this request: " +
                         format_bytes(c.request_bytes <= FreeSpace::kSmallPoolRequestBytes
                                          ? c.free.largest_free_block_small_pool
                                          : c.free.largest_free_block_large_pool) +
                         "; inactive split " + format_bytes(c.free.inactive_split_bytes));
    v.remedies = {{"Keep tensor shapes stable across steps (pad or bucket sequence lengths)",
                   "padding wastes some compute"},
                  {"Set PYTORCH_ALLOC_CONF=expandable_segments:True so segments grow instead of splitting",
                   "needs a driver with virtual memory management; not for IPC-shared tensors"},
                  {"Cap splitting of large blocks with PYTORCH_ALLOC_CONF=max_split_size_mb:<N>",
                   "more segments; some requests round up further"}};
    return v;
  }
  if (parse_phase_kind(c.phase) == PhaseKind::OptimizerStep && c.first_optimizer_step) {
    v.kind = "lazy_optimizer_state";
    v.summary = "The first optimizer step failed while creating optimizer state lazily (" +
                format_bytes(c.optimizer_state_created + c.request_bytes) +
                " of it with this request); forward and backward fitted without it.";
    v.evidence.push_back("optimizer state created by this step before the failure: " +
                         format_bytes(c.optimizer_state_created));
    v.dominant = Category::OptimizerState;
    v.remedies = remedies_for(Category::OptimizerState);
    return v;
  }
  if (parse_phase_kind(c.phase) == PhaseKind::Checkpoint) {
    v.kind = "checkpoint_staging";
    v.summary = "Saving a checkpoint needed " + request + " of staging memory on top of training state.";
    v.remedies = {{"Save asynchronously with a bounded staging buffer (torch.distributed.checkpoint async_save), or stage shard by shard",
                   "the checkpoint completes later; host memory for the staging buffer"},
                  {"Move state to the host tensor by tensor instead of gathering it all at once",
                   "a slower save"}};
    return v;
  }
  if (non_pytorch > 0 && non_pytorch >= c.request_bytes) {
    v.kind = "non_pytorch";
    if (c.device_free_bytes) {
      v.summary = "The request of " + request + " failed with " + format_bytes(*c.device_free_bytes) +
                  " free on the device; " + format_bytes(non_pytorch) + " of the card is held outside PyTorch" +
                  (held_by.empty() ? std::string(" (CUDA context, NCCL, libraries, other processes)") : held_by) +
                  ": without it the request would fit.";
    } else {
      v.summary = format_bytes(non_pytorch) + " of device memory is used outside PyTorch (CUDA context, NCCL, libraries); without it the request would fit.";
    }
    if (!c.outside) v.evidence.push_back("used outside PyTorch " + format_bytes(non_pytorch));  // else said above
    v.remedies = {{"Reduce NCCL buffers (NCCL_BUFFSIZE) or other libraries' pools", "possibly slower collectives"},
                  {"Check for another process on the device (nvidia-smi)", "none"}};
    return v;
  }
  // A transient peak: temporaries and workspaces are a real share of what is live (a tenth or
  // more) and, without them, the request would have fitted.
  if (c.capacity_bytes && transient >= c.request_bytes && transient * 10 >= c.live_bytes &&
      c.live_bytes - transient + c.request_bytes <= *c.capacity_bytes) {
    v.kind = "transient_peak";
    v.summary = "A transient peak: " + format_bytes(transient) +
                " of temporaries and workspaces sat on top of a step that otherwise fits.";
    v.evidence.push_back("temporary and workspace " + format_bytes(transient));
    v.dominant = c.by_category[category_index(Category::Workspace)] > c.by_category[category_index(Category::Temporary)]
                     ? Category::Workspace : Category::Temporary;
    v.remedies = remedies_for(v.dominant);
    return v;
  }
  v.kind = "live_tensors";
  v.summary = "Live tensors exceed the capacity: " + std::string(category_name(v.dominant)) + " holds " +
              format_bytes(c.by_category[category_index(v.dominant)]) + " (" +
              pct(c.by_category[category_index(v.dominant)], c.live_bytes) +
              " of what was live); emptying the cache would not help.";
  v.remedies = remedies_for(v.dominant);
  return v;
}

Verdict explain_retention(const RetentionContext& c) {
  Verdict v;
  v.kind = "retained_tensors";
  v.dominant = c.category;
  const std::uint64_t activation = c.growth_by_category[category_index(Category::Activation)];
  // A graph kept alive: most of what grows is what autograd saved for a backward that never ran.
  const bool graph = activation * 2 > c.growth_per_step_bytes;
  std::string growth = c.growth_constant
                           ? format_bytes(c.growth_per_step_bytes)
                           : "Between " + format_bytes(c.min_growth_bytes) + " and " +
                                 format_bytes(c.max_growth_bytes) + " (" +
                                 format_bytes(c.growth_per_step_bytes) + " on average)";
  const std::string latest = c.sites > 1 ? "the latest " : "";
  std::string where;
  if (!c.location.empty()) {
    where = latest + "allocated at " + c.location + (c.function.empty() ? "" : " in `" + c.function + "`");
  } else if (!c.site.empty()) {
    where = latest + "allocated by " + c.site;
  }
  std::string what = growth + " more is live at the end of every step since step " +
                     std::to_string(c.since_step) + " (" + std::to_string(c.blocks) + " blocks, " +
                     format_bytes(c.bytes) + " now)";
  if (c.sites > 1) what += " at " + std::to_string(c.sites) + " sites";
  if (!where.empty()) what += ", " + where;
  if (c.sites > 1) {
    // Several sites: what each category adds a step, largest first.
    std::vector<std::pair<std::uint64_t, std::size_t>> parts;
    for (std::size_t i = 0; i < kCategoryCount; ++i) {
      if (c.growth_by_category[i] != 0) parts.emplace_back(c.growth_by_category[i], i);
    }
    std::sort(parts.rbegin(), parts.rend());
    what += ", a step by category:";
    for (std::size_t i = 0; i < parts.size(); ++i) {
      what += std::string(i ? ", " : " ") + std::string(category_name(static_cast<Category>(parts[i].second))) + " " +
              format_bytes(parts[i].first);
    }
  } else {
    what += ", category " + std::string(category_name(c.category));
  }
  if (graph) {
    v.dominant = Category::Activation;
    v.summary = what + ": the autograd graph of a forward is kept across steps (its saved activations are "
                       "never freed), for example by keeping a loss or an output without `.item()` or `.detach()`.";
    v.remedies = {{"Keep `loss.item()` (or `.detach()`) of what you keep, or run that forward under `torch.no_grad()`",
                   "none"}};
  } else {
    v.summary = what + ": a tensor kept across steps (for example appended to a list).";
    v.remedies = {{"Keep `.item()`/`.detach().cpu()` of it, or drop the reference", "none"}};
  }
  std::string steps = "growth at the end of the last steps:";
  for (const auto& [step, bytes] : c.evidence_steps) steps += " step " + std::to_string(step) + " +" + format_bytes(bytes) + ";";
  if (!c.evidence_steps.empty()) steps.pop_back();
  v.evidence.push_back(steps);
  for (const auto& s : c.evidence_sites) v.evidence.push_back(s);
  return v;
}

}  // namespace ridgescope
