#include "ridgescope/ledger.h"

namespace ridgescope {

Ledger::Ledger() { blocks_.reserve(4096); }

void Ledger::on_alloc(std::uint64_t addr, const LiveBlock& block) {
  auto [it, inserted] = blocks_.try_emplace(addr, block);
  if (!inserted) {
    ++anomalies_.replaced_allocs;
    by_category_[category_index(it->second.category)] -= it->second.bytes;
    live_bytes_ -= it->second.bytes;
    it->second = block;
  }
  by_category_[category_index(block.category)] += block.bytes;
  live_bytes_ += block.bytes;
}

std::optional<LiveBlock> Ledger::on_free(std::uint64_t addr) {
  auto it = blocks_.find(addr);
  if (it == blocks_.end()) {
    ++anomalies_.unknown_frees;
    return std::nullopt;
  }
  LiveBlock block = it->second;
  blocks_.erase(it);
  by_category_[category_index(block.category)] -= block.bytes;
  live_bytes_ -= block.bytes;
  return block;
}

bool Ledger::set_category(std::uint64_t addr, Category category, std::uint32_t label_id) {
  auto it = blocks_.find(addr);
  if (it == blocks_.end()) {
    ++anomalies_.unknown_tags;
    return false;
  }
  LiveBlock& block = it->second;
  by_category_[category_index(block.category)] -= block.bytes;
  by_category_[category_index(category)] += block.bytes;
  block.category = category;
  if (label_id != 0) block.label_id = label_id;
  return true;
}

void Ledger::on_segment_alloc(std::uint64_t addr, std::uint64_t bytes) {
  has_segments_ = true;
  auto [it, inserted] = segments_.try_emplace(addr, bytes);
  if (!inserted) {
    segment_bytes_ -= it->second;
    it->second = bytes;
  }
  segment_bytes_ += bytes;
}

void Ledger::on_segment_free(std::uint64_t addr) {
  auto it = segments_.find(addr);
  if (it == segments_.end()) {
    ++anomalies_.unknown_segment_frees;
    return;
  }
  segment_bytes_ -= it->second;
  segments_.erase(it);
}

const LiveBlock* Ledger::find(std::uint64_t addr) const {
  auto it = blocks_.find(addr);
  return it == blocks_.end() ? nullptr : &it->second;
}

}  // namespace ridgescope
