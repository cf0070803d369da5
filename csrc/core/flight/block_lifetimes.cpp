// block_lifetimes.cpp — the lifetime rules of docs/categories.md, online (block_lifetimes.h).
#include "block_lifetimes.h"

namespace ridgescope::detail {

bool BlockLifetimes::stack_has(PhaseKind kind) const {
  for (const Open& o : stack_) if (o.kind == kind) return true;
  return false;
}

bool BlockLifetimes::open(std::uint64_t serial) const {
  for (const Open& o : stack_) if (o.serial == serial) return true;
  return false;
}

BlockLife& BlockLifetimes::alloc(const Event& e, std::uint64_t step, std::optional<EndedBlock>* replaced) {
  // Counted per step: a count last bumped in another step starts again (no clear() per step,
  // which would give a large table's memory back and take it again every step).
  Occurrences& n = occurrences_[{device_code(e.device), e.stack_id, e.string_id}];
  if (n.step != step) n = Occurrences{step, 0};
  const std::uint32_t occurrence = n.count++;
  // Made in its slot of the table, not copied there: the writer thread does this per allocation.
  auto [it, inserted] = live_.try_emplace(block_key(e.device, e.addr));
  if (!inserted) {  // a missed free: the old block ends here
    if (replaced != nullptr) {
      *replaced = EndedBlock{it->second, it->second.final ? *it->second.final : resolve(it->second, false)};
    }
    it->second = BlockLife{};
  }
  BlockLife& b = it->second;
  b.uid = next_uid_++;
  b.position = position_++;
  b.device = e.device;
  b.addr = e.addr;
  b.bytes = e.bytes;
  b.requested_bytes = e.requested_bytes;
  b.stream = e.stream;
  b.context_id = e.string_id;
  b.stack_id = e.stack_id;
  b.occurrence = occurrence;
  b.alloc_phase_id = stack_.empty() ? 0 : stack_.back().name_id;
  b.alloc_step = step;
  b.idle_epoch = idle_epoch_;
  b.instance = stack_.empty() ? 0 : stack_.back().serial;
  for (const Open& o : stack_) {
    b.forwardish |= o.kind == PhaseKind::Forward || o.kind == PhaseKind::Recompute;
    b.in_backward |= o.kind == PhaseKind::Backward;
    b.in_optimizer |= o.kind == PhaseKind::OptimizerStep;
    b.in_compile |= o.kind == PhaseKind::Compile;
  }
  return b;
}

std::optional<EndedBlock> BlockLifetimes::free(const Event& e) {
  auto it = live_.find(block_key(e.device, e.addr));
  if (it == live_.end()) return std::nullopt;
  EndedBlock out{std::move(it->second), {}};
  out.resolved = out.life.final ? *out.life.final : resolve(out.life, /*freed=*/true);
  live_.erase(it);
  return out;
}

BlockLife* BlockLifetimes::tag(const Event& e) {
  auto it = live_.find(block_key(e.device, e.addr));
  if (it == live_.end()) return nullptr;
  BlockLife& b = it->second;
  if ((e.flags & kTagWeak) == 0) {
    if (!b.has_strong) {
      b.has_strong = true;
      b.strong = e.category;
      b.strong_label = e.string_id;
      b.strong_inferred = (e.flags & kTagInferred) != 0 && e.category != Category::Unknown;
      b.current = e.category;
      b.current_label = e.string_id;
    } else if (b.current != e.category || (e.string_id != 0 && b.current_label != e.string_id)) {
      b.current = e.category;  // as a ledger replaying the tags would change it
      if (e.string_id != 0) b.current_label = e.string_id;
    }
  } else if (!b.has_weak) {
    b.has_weak = true;
    b.weak = e.category;
    b.weak_label = e.string_id;
    // A tensor saved for backward that existed before the current forward began is an input
    // of that forward (the batch, the targets), not an activation it produced.
    if (b.weak == Category::Activation && have_forward_ && b.position < last_forward_begin_) {
      b.weak = Category::Input;
      b.weak_label = 0;  // the saver's label ("activation saved in ...") would mislead
    }
    if ((b.weak == Category::Activation && b.weak_label != 0) || b.weak == Category::Input) learn_saver(b);
  }
  return &b;
}

void BlockLifetimes::learn_saver(const BlockLife& b) {
  if (b.occurrence == kNoOccurrence) return;
  const SaverKey key = saver_key(b);
  const Learned learned{b.weak, b.weak_label};
  if (auto it = savers_.find(key); it != savers_.end()) {
    it->second = learned;  // the latest step's
  } else if (savers_.size() < kMaxLearnedSavers) {
    savers_.emplace(key, learned);
  }
}

const BlockLifetimes::Learned* BlockLifetimes::learned_saver(const BlockLife& b) const {
  if (b.occurrence == kNoOccurrence || savers_.empty()) return nullptr;
  auto it = savers_.find(saver_key(b));
  return it != savers_.end() ? &it->second : nullptr;
}

void BlockLifetimes::phase_begin(std::uint32_t name_id, PhaseKind kind) {
  if (stack_.empty()) ++idle_epoch_;
  const std::uint64_t position = position_++;
  if (kind == PhaseKind::Forward || kind == PhaseKind::Recompute) {
    have_forward_ = true;
    last_forward_begin_ = position;
  }
  stack_.push_back(Open{next_serial_++, kind, name_id});
}

std::size_t BlockLifetimes::phase_end(std::uint32_t name_id) {
  for (std::size_t i = stack_.size(); i-- > 0;) {
    if (stack_[i].name_id == name_id) {
      const std::size_t closed = stack_.size() - i;
      stack_.resize(i);
      if (stack_.empty()) ++idle_epoch_;
      return closed;
    }
  }
  return 0;
}

Resolved BlockLifetimes::resolve(const BlockLife& b, bool freed) const {
  if (b.has_strong) return Resolved{b.strong, b.strong_inferred, b.strong_label};
  if (b.has_weak) return Resolved{b.weak, false, b.weak_label};
  Resolved r;
  r.inferred = true;
  if (freed) {
    const bool same_idle = b.instance == 0 && stack_.empty() && b.idle_epoch == idle_epoch_;
    const bool same_phase = b.instance != 0 && open(b.instance);
    // Made in a backward and freed while a backward still runs (made in a nested one, as a
    // reentrant checkpoint's recomputation runs): a temporary of the backward, not a gradient.
    const bool inside_backward = b.in_backward && !b.forwardish && stack_has(PhaseKind::Backward);
    if (same_idle || same_phase || inside_backward) {
      r.category = Category::Temporary;
      return r;
    }
    // Made in forward (or in a recomputation, or between forward and backward, where the
    // loss is computed) and freed by backward: what autograd saved.
    if ((b.forwardish || (b.instance == 0 && have_forward_)) && stack_has(PhaseKind::Backward)) {
      // Made outside every phase before the current forward began and freed by its backward:
      // data the step saved for backward without the model making it (the targets a loss
      // saves, made with the batch). An input, as the saved-tensor hook's weak tag makes it.
      r.category = !b.forwardish && b.position < last_forward_begin_ ? Category::Input : Category::Activation;
      // The saver the hook named for the same allocation of an earlier step, if it did.
      if (r.category == Category::Activation) {
        const Learned* l = learned_saver(b);
        if (l != nullptr && l->category == Category::Activation) {
          r.label_id = l->label_id;
          r.inferred = false;  // the hook's word for the same allocation, not a lifetime rule's
        }
      }
      return r;
    }
  }
  if (b.in_compile) {
    // Made while torch.compile compiled and kept after it: the compiled code's own constants
    // (Inductor's lifted scalar tensors), persistent like a module's buffers.
    r.category = Category::Buffer;
  } else if (b.in_backward && !b.forwardish) {
    r.category = Category::Gradient;
  } else if (b.in_optimizer) {
    r.category = Category::OptimizerState;
  } else if (const Learned* l = learned_saver(b)) {
    // Nothing in its life decides it: what the hook said of the same allocation of an earlier
    // step (an activation not yet freed, a target kept past backward).
    r.category = l->category;
    r.label_id = l->label_id;
    r.inferred = false;
  } else {
    r.category = Category::Unknown;
    r.inferred = false;
  }
  return r;
}

Category BlockLifetimes::current_category(const BlockLife& b) const {
  return b.has_strong ? b.current : resolve(b, /*freed=*/false).category;
}

BlockLife* BlockLifetimes::find(Device device, std::uint64_t addr) {
  auto it = live_.find(block_key(device, addr));
  return it == live_.end() ? nullptr : &it->second;
}

std::vector<std::uint32_t> BlockLifetimes::open_phases() const {
  std::vector<std::uint32_t> out;
  out.reserve(stack_.size());
  for (const Open& o : stack_) out.push_back(o.name_id);
  return out;
}

Checkpoint BlockLifetimes::checkpoint(std::uint64_t step, std::uint64_t time_ns) const {
  Checkpoint c;
  c.step = step;
  c.time_ns = time_ns;
  c.have_forward = have_forward_;
  for (const Open& o : stack_) c.phases.push_back(CheckpointPhase{o.name_id});
  return c;
}

CheckpointBlock BlockLifetimes::checkpoint_block(const BlockLife& b) const {
  CheckpointBlock c;
  c.device = b.device;
  c.addr = b.addr;
  c.bytes = b.bytes;
  c.requested_bytes = b.requested_bytes;
  c.stream = b.stream;
  c.context_id = b.context_id;
  c.stack_id = b.stack_id;
  c.alloc_phase_id = b.alloc_phase_id;
  c.alloc_step = b.alloc_step;
  c.lifetime = static_cast<std::uint8_t>(
      (b.forwardish ? kLifeForwardish : 0) | (b.in_backward ? kLifeInBackward : 0) |
      (b.in_optimizer ? kLifeInOptimizer : 0) | (b.in_compile ? kLifeInCompile : 0) |
      (have_forward_ && b.position < last_forward_begin_ ? kLifeBeforeForward : 0) |
      (b.instance == 0 && b.idle_epoch == idle_epoch_ ? kLifeIdleNow : 0));
  for (std::size_t i = 0; i < stack_.size(); ++i) {
    if (b.instance != 0 && stack_[i].serial == b.instance) c.alloc_instance = static_cast<std::int32_t>(i);
  }
  c.tags = static_cast<std::uint8_t>((b.has_strong ? kTagsStrong : 0) | (b.strong_inferred ? kTagsStrongInferred : 0) |
                                     (b.has_weak ? kTagsWeak : 0));
  c.first_strong = b.strong;
  c.first_strong_label = b.strong_label;
  c.weak = b.weak;
  c.weak_label = b.weak_label;
  c.current = b.current;
  c.current_label = b.current_label;
  return c;
}

void BlockLifetimes::begin_window(const Checkpoint& c, const std::vector<PhaseKind>& kinds) {
  live_.clear();
  stack_.clear();
  for (std::size_t i = 0; i < c.phases.size(); ++i) {
    stack_.push_back(Open{next_serial_++, i < kinds.size() ? kinds[i] : PhaseKind::Other, c.phases[i].name_id});
  }
  idle_epoch_ += 2;  // a new idle spell, unlike any a block of the last window saw
  have_forward_ = c.have_forward;
  // Blocks made before the last forward began get the position before it, the others this one.
  position_ += 2;
  last_forward_begin_ = position_;
  ++position_;
}

BlockLife& BlockLifetimes::add_checkpoint_block(const CheckpointBlock& c) {
  BlockLife b;
  b.uid = next_uid_++;
  b.position = (c.lifetime & kLifeBeforeForward) ? last_forward_begin_ - 1 : last_forward_begin_;
  b.device = c.device;
  b.addr = c.addr;
  b.bytes = c.bytes;
  b.requested_bytes = c.requested_bytes;
  b.stream = c.stream;
  b.context_id = c.context_id;
  b.stack_id = c.stack_id;
  b.occurrence = kNoOccurrence;  // its step's earlier allocations are not in this window
  b.alloc_phase_id = c.alloc_phase_id;
  b.alloc_step = c.alloc_step;
  b.idle_epoch = (c.lifetime & kLifeIdleNow) ? idle_epoch_ : idle_epoch_ - 1;
  b.instance = c.alloc_instance >= 0 && static_cast<std::size_t>(c.alloc_instance) < stack_.size()
                   ? stack_[static_cast<std::size_t>(c.alloc_instance)].serial
                   : 0;
  b.forwardish = (c.lifetime & kLifeForwardish) != 0;
  b.in_backward = (c.lifetime & kLifeInBackward) != 0;
  b.in_optimizer = (c.lifetime & kLifeInOptimizer) != 0;
  b.in_compile = (c.lifetime & kLifeInCompile) != 0;
  b.has_strong = (c.tags & kTagsStrong) != 0;
  b.strong_inferred = (c.tags & kTagsStrongInferred) != 0;
  b.has_weak = (c.tags & kTagsWeak) != 0;
  b.strong = c.first_strong;
  b.strong_label = c.first_strong_label;
  b.weak = c.weak;
  b.weak_label = c.weak_label;
  b.current = c.current;
  b.current_label = c.current_label;
  auto [it, inserted] = live_.insert_or_assign(block_key(c.device, c.addr), b);
  return it->second;
}

}  // namespace ridgescope::detail
