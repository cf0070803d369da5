// snapshot_inference.cpp — categories of a PyTorch snapshot's blocks, with their reasons (see
// snapshot_inference.h and docs/snapshot.md, "Inference rules").
#include "snapshot_inference.h"
#include "snapshot_inference_state.h"

#include "snapshot_frames.h"
#include "ridgescope/cuda_workspace.h"

#include <algorithm>
#include <array>
#include <limits>
#include <regex>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "ridgescope/phase.h"

namespace ridgescope::detail {

using Block = SnapshotInference::Impl::Block;
using Impl = SnapshotInference::Impl;
constexpr std::uint64_t kNever = Impl::kNever;

std::uint32_t SnapshotInference::Impl::phase_bit(std::string_view name) {
  switch (parse_phase_kind(name)) {
    case PhaseKind::Forward: return kForward;
    case PhaseKind::Backward: return kBackward;
    case PhaseKind::OptimizerStep: return kOptimizer;
    case PhaseKind::ZeroGrad: return kZeroGrad;
    case PhaseKind::Recompute: return kRecompute;
    default: return kOtherPhase;
  }
}

void SnapshotInference::Impl::decide(Block& b, Category category, InferenceRule rule, std::string_view detail) {
  b.decided = true;
  b.category = category;
  b.rule = rule;
  const std::string text = inference_reason_text(rule, category, detail);
  auto key = std::make_tuple(rule, category, text);
  auto it = reason_index.find(key);
  if (it == reason_index.end()) {
    it = reason_index.emplace(std::move(key), static_cast<std::uint32_t>(reasons.size())).first;
    InferenceReason r;
    r.rule = rule;
    r.category = category;
    r.text = text;
    reasons.push_back(std::move(r));
  }
  b.reason = it->second;
}

void SnapshotInference::Impl::run() {
  // Phases left open close at the end.
  for (auto i : stack) instances[i].end_op = op;
  saw_forward = !forward_begins.empty();
  for (const Block& b : blocks) {
    if (saw_forward) break;
    saw_forward = b.has_frames() && phase_from_frames(*b.frames) == PhaseKind::Forward;
  }
  for (Block& b : blocks) {
    if (rule_recorded(b) || !b.has_frames() || rule_comm_frames(b)) continue;
    // The frame rules depend on the stack only: decided once per frames list (torch shares
    // one list among an allocation's entries and its block).
    auto [it, inserted] = frame_verdicts.try_emplace(b.frames);
    if (inserted) {
      Block probe = b;
      rule_user(probe) || rule_workspace_frames(probe) || rule_optimizer_init_group(probe) ||
          rule_accumulate_grad(probe) || rule_parameter_frames(probe) || rule_data_loader(probe);
      it->second = probe.decided ? std::optional<std::tuple<Category, InferenceRule, std::uint32_t>>(
                                       std::make_tuple(probe.category, probe.rule, probe.reason))
                                 : std::nullopt;
    }
    if (it->second) {
      b.decided = true;
      std::tie(b.category, b.rule, b.reason) = *it->second;
    }
  }
  for (Block& b : blocks) {
    if (!b.decided) rule_gradient_kept(b) || rule_optimizer_state_kept(b);
  }
  rule_parameter_matched_gradient();
  rule_optimizer_state_replaced();
  rule_comm_buffer_replaced();
  rule_gradient_zero_grad();
  for (Block& b : blocks) {
    if (!b.decided) {
      rule_workspace_size(b) || rule_temporary(b) || rule_activation(b) || rule_forward_output(b) ||
          rule_weights_by_lifetime(b) || rule_forward_frames(b);
    }
  }
  rule_parameter_shaped_state();
  for (Block& b : blocks) {
    if (!b.decided) rule_input_before_forward(b);
  }
  rule_repeated_step();
  for (Block& b : blocks) {
    if (!b.decided) decide(b, Category::Unknown, InferenceRule::Unknown);
  }
  for (InferenceReason& r : reasons) r.evidence = inference_rule_evidence(r.rule, !instances.empty());
  for (const Block& b : blocks) {
    InferenceReason& r = reasons[b.reason];
    ++r.allocations;
    if (peak_op != kNever && b.alloc_op <= peak_op && b.free_op > peak_op) {
      r.peak_bytes += b.bytes;
      ++r.peak_blocks;
    }
    if (b.free_op == kNever) r.end_bytes += b.bytes;
  }
}
SnapshotInference::SnapshotInference(const std::vector<SnapshotCategoryRule>& user_rules)
    : impl_(std::make_unique<Impl>()) {
  if (user_rules.size() > Impl::kMaxUserRules) {
    throw std::invalid_argument("at most " + std::to_string(Impl::kMaxUserRules) + " category rules are supported, got " +
                                std::to_string(user_rules.size()));
  }
  for (const SnapshotCategoryRule& r : user_rules) {
    Impl::UserRule u;
    u.name = r.name;
    u.category = r.category;
    u.any_name = r.frame_name.empty();
    u.any_file = r.file.empty();
    try {
      if (!u.any_name) u.name_re = std::regex(r.frame_name, std::regex::ECMAScript);
      if (!u.any_file) u.file_re = std::regex(r.file, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw std::invalid_argument("category rule '" + r.name + "': invalid regular expression (" + e.what() + ")");
    }
    if (u.any_name && u.any_file) {
      throw std::invalid_argument("category rule '" + r.name + "' has neither a frame nor a file pattern");
    }
    impl_->user_rules.push_back(std::move(u));
  }
}

SnapshotInference::~SnapshotInference() = default;

void SnapshotInference::phase_begin(std::string_view name) {
  Impl& m = *impl_;
  if (m.stack.empty()) ++m.idle_epoch;
  Impl::Instance in;
  in.bit = Impl::phase_bit(name);
  in.name = std::string(name);
  in.begin_op = m.op;
  if (in.bit == Impl::kForward || in.bit == Impl::kRecompute) m.forward_begins.push_back(m.op);
  if (in.bit == Impl::kBackward) {
    if (m.first_backward_op == kNever) m.first_backward_instance = m.instances.size();
    if (m.first_backward_op == kNever) m.first_backward_op = m.op;
    m.backward_begins.push_back(m.op);
  }
  m.instances.push_back(std::move(in));
  m.stack.push_back(static_cast<std::uint32_t>(m.instances.size() - 1));
  ++m.op;
}

void SnapshotInference::phase_end(std::string_view name) {
  Impl& m = *impl_;
  for (std::size_t i = m.stack.size(); i-- > 0;) {
    if (m.instances[m.stack[i]].name != name) continue;
    for (std::size_t j = i; j < m.stack.size(); ++j) {
      m.instances[m.stack[j]].open = false;
      m.instances[m.stack[j]].end_op = m.op;
    }
    m.stack.resize(i);
    if (m.stack.empty()) ++m.idle_epoch;
    break;
  }
  ++m.op;
}

std::uint32_t SnapshotInference::alloc(std::uint64_t addr, std::uint64_t bytes, std::uint64_t requested,
                                       const SnapshotFrames* frames, bool before_trace,
                                       std::optional<Category> recorded) {
  Impl& m = *impl_;
  if (m.live.contains(addr)) free(addr, nullptr);  // a missed free: the old block ends here
  Impl::Block b;
  b.addr = addr;
  b.bytes = bytes;
  b.requested = requested;
  b.frames = frames;
  b.before_trace = before_trace;
  b.recorded = recorded;
  b.alloc_op = m.op;
  b.alloc_instance = m.stack.empty() ? -1 : static_cast<std::int32_t>(m.stack.back());
  b.alloc_bits = m.open_bits();
  b.alloc_idle_epoch = m.idle_epoch;
  b.backward_at_alloc = m.open_instance_with(Impl::kBackward);
  b.optimizer_at_alloc = m.open_instance_with(Impl::kOptimizer);
  b.last_begun_bit = m.instances.empty() ? 0 : m.instances.back().bit;
  const auto id = static_cast<std::uint32_t>(m.blocks.size());
  m.blocks.push_back(b);
  m.live[addr] = id;
  m.live_bytes += bytes;
  if (m.live_bytes > m.peak) {
    m.peak = m.live_bytes;
    m.peak_op = m.op;
  }
  ++m.op;
  return id;
}

void SnapshotInference::free(std::uint64_t addr, const SnapshotFrames* frames, bool after_trace) {
  Impl& m = *impl_;
  auto it = m.live.find(addr);
  if (it == m.live.end()) {
    ++m.op;
    return;
  }
  Impl::Block& b = m.blocks[it->second];
  m.live.erase(it);
  m.live_bytes -= b.bytes;
  b.free_op = m.op;
  b.free_frames = frames;
  b.freed_in_trace = !after_trace;
  b.free_bits = m.open_bits();
  b.optimizer_at_free = m.open_instance_with(Impl::kOptimizer);
  b.freed_in_alloc_phase = b.alloc_instance >= 0
                               ? m.instances[static_cast<std::size_t>(b.alloc_instance)].open
                               : m.stack.empty() && m.idle_epoch == b.alloc_idle_epoch;
  ++m.op;
}

void SnapshotInference::finish() {
  if (impl_->finished) return;
  impl_->finished = true;
  impl_->run();
}

InferenceDecision SnapshotInference::decision(std::uint32_t block) const {
  const Impl::Block& b = impl_->blocks.at(block);
  return InferenceDecision{b.category, b.rule};
}

std::vector<InferenceReason> SnapshotInference::reasons() const {
  std::vector<InferenceReason> out = impl_->reasons;
  std::stable_sort(out.begin(), out.end(), [](const InferenceReason& a, const InferenceReason& b) {
    return std::tie(b.peak_bytes, b.end_bytes, b.allocations) < std::tie(a.peak_bytes, a.end_bytes, a.allocations);
  });
  return out;
}

std::uint64_t SnapshotInference::peak_bytes() const { return impl_->peak; }
std::uint64_t SnapshotInference::blocks() const { return impl_->blocks.size(); }

}  // namespace ridgescope::detail
