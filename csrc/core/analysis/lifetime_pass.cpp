// lifetime_pass.cpp — pass 1 of the analysis: lifetimes, tags, and the peak of every device
// (see lifetime_pass.h).
#include "lifetime_pass.h"

namespace ridgescope::detail {

void LifetimePass::run(TraceReader& reader) {
  Event e;
  while (reader.next(e)) {
    last_seq_ = e.seq;
    last_time_ = e.time_ns;
    switch (e.kind) {
      case EventKind::Alloc: on_alloc(e); break;
      case EventKind::Free: on_free(e); break;
      case EventKind::Tag: on_tag(e); break;
      case EventKind::PhaseBegin: on_phase_begin(e, reader.string(e.string_id)); break;
      case EventKind::PhaseEnd: on_phase_end(e); break;
      default: break;
    }
    ++events_;
  }
  for (auto& [key, pending] : live_) resolve(pending, /*freed=*/false);
  live_.clear();
}

bool LifetimePass::stack_has(PhaseKind kind) const {
  for (auto i : stack_) if (instances_[i].kind == kind) return true;
  return false;
}

void LifetimePass::on_alloc(const Event& e) {
  const std::uint64_t id = next_block_id_++;
  resolved_.emplace_back();
  Pending p{};
  p.block_id = id;
  p.alloc_seq = e.seq;
  p.bytes = e.bytes;
  p.idle_epoch = idle_epoch_;
  p.instance = stack_.empty() ? -1 : static_cast<std::int32_t>(stack_.back());
  p.forwardish = stack_has(PhaseKind::Forward) || stack_has(PhaseKind::Recompute);
  p.in_backward = stack_has(PhaseKind::Backward);
  p.in_optimizer = stack_has(PhaseKind::OptimizerStep);
  p.in_compile = stack_has(PhaseKind::Compile);
  auto [it, inserted] = live_.try_emplace(block_key(e.device, e.addr), p);
  auto& peak = peaks_[device_code(e.device)];
  if (!inserted) {  // a missed free: the old block ends here
    peak.live -= it->second.bytes;
    resolve(it->second, /*freed=*/false);
    it->second = p;
  }
  peak.seen = true;
  peak.live += e.bytes;
  if (peak.live > peak.peak) {
    peak.peak = peak.live;
    peak.peak_seq = e.seq;
  }
}

void LifetimePass::on_free(const Event& e) {
  auto it = live_.find(block_key(e.device, e.addr));
  if (it == live_.end()) return;
  peaks_[device_code(e.device)].live -= it->second.bytes;
  resolve(it->second, /*freed=*/true);
  live_.erase(it);
}

void LifetimePass::on_tag(const Event& e) {
  auto it = live_.find(block_key(e.device, e.addr));
  if (it == live_.end()) return;
  Pending& p = it->second;
  if ((e.flags & kTagWeak) == 0) {
    if (!p.has_strong) {
      p.has_strong = true;
      p.strong = e.category;
      p.strong_label = e.string_id;
      p.strong_inferred = (e.flags & kTagInferred) != 0 && e.category != Category::Unknown;
    }
  } else if (!p.has_weak) {
    p.has_weak = true;
    p.weak = e.category;
    p.weak_label = e.string_id;
    // A tensor saved for backward that existed before the current forward began is an input
    // of that forward (the batch, the targets), not an activation it produced.
    if (p.weak == Category::Activation && have_forward_ && p.alloc_seq < last_forward_begin_seq_) {
      p.weak = Category::Input;
      p.weak_label = 0;  // the saver's label ("activation saved in ...") would mislead
    }
  }
}

void LifetimePass::on_phase_begin(const Event& e, std::string_view name) {
  if (stack_.empty()) ++idle_epoch_;
  const PhaseKind kind = parse_phase_kind(name);
  if (kind == PhaseKind::Forward || kind == PhaseKind::Recompute) {
    have_forward_ = true;
    last_forward_begin_seq_ = e.seq;
  }
  instances_.push_back(Instance{kind, e.string_id, true});
  stack_.push_back(static_cast<std::uint32_t>(instances_.size() - 1));
}

void LifetimePass::on_phase_end(const Event& e) {
  for (std::size_t i = stack_.size(); i-- > 0;) {
    if (instances_[stack_[i]].name_id == e.string_id) {
      for (std::size_t j = i; j < stack_.size(); ++j) instances_[stack_[j]].open = false;
      stack_.resize(i);
      if (stack_.empty()) ++idle_epoch_;
      return;
    }
  }
}

void LifetimePass::resolve(const Pending& p, bool freed) {
  Resolved& r = resolved_[p.block_id];
  if (p.has_strong) {
    r = Resolved{p.strong, p.strong_inferred, p.strong_label};
    return;
  }
  if (p.has_weak) {
    r = Resolved{p.weak, false, p.weak_label};
    return;
  }
  r.inferred = true;
  if (freed) {
    const bool same_idle = p.instance < 0 && stack_.empty() && p.idle_epoch == idle_epoch_;
    const bool same_phase = p.instance >= 0 && instances_[p.instance].open;
    // Made in a backward and freed while a backward still runs (made in a nested one, as a
    // reentrant checkpoint's recomputation runs): a temporary of the backward, not a gradient.
    const bool inside_backward = p.in_backward && !p.forwardish && stack_has(PhaseKind::Backward);
    if (same_idle || same_phase || inside_backward) {
      r.category = Category::Temporary;
      return;
    }
    // Made in forward (or in a recomputation, or between forward and backward, where the
    // loss is computed) and freed by backward: what autograd saved.
    if ((p.forwardish || (p.instance < 0 && have_forward_)) && stack_has(PhaseKind::Backward)) {
      r.category = Category::Activation;
      return;
    }
  }
  if (p.in_compile) {
    // Made while torch.compile compiled and kept after it: the compiled code's own constants
    // (Inductor's lifted scalar tensors), persistent like a module's buffers.
    r.category = Category::Buffer;
  } else if (p.in_backward && !p.forwardish) {
    r.category = Category::Gradient;
  } else if (p.in_optimizer) {
    r.category = Category::OptimizerState;
  } else {
    r.category = Category::Unknown;
    r.inferred = false;
  }
}

}  // namespace ridgescope::detail
