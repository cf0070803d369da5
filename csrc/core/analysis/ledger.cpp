#include "ridgescope/ledger.h"

#include "absl/container/flat_hash_map.h"

namespace ridgescope {

struct Ledger::Maps {
  absl::flat_hash_map<std::uint64_t, LiveBlock> blocks;
  absl::flat_hash_map<std::uint64_t, std::uint64_t> segments;
};

Ledger::Ledger() : maps_(std::make_unique<Maps>()) { maps_->blocks.reserve(4096); }
Ledger::~Ledger() = default;
Ledger::Ledger(Ledger&&) noexcept = default;
Ledger& Ledger::operator=(Ledger&&) noexcept = default;

std::size_t Ledger::live_blocks() const noexcept { return maps_->blocks.size(); }

void Ledger::for_each_segment(const std::function<void(std::uint64_t, std::uint64_t)>& fn) const {
  for (const auto& [addr, bytes] : maps_->segments) fn(addr, bytes);
}

void Ledger::for_each_live(const std::function<void(std::uint64_t, const LiveBlock&)>& fn) const {
  for (const auto& [addr, block] : maps_->blocks) fn(addr, block);
}

void Ledger::on_alloc(std::uint64_t addr, const LiveBlock& block) {
  auto [it, inserted] = maps_->blocks.try_emplace(addr, block);
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
  auto it = maps_->blocks.find(addr);
  if (it == maps_->blocks.end()) {
    ++anomalies_.unknown_frees;
    return std::nullopt;
  }
  LiveBlock block = it->second;
  maps_->blocks.erase(it);
  by_category_[category_index(block.category)] -= block.bytes;
  live_bytes_ -= block.bytes;
  return block;
}

bool Ledger::set_category(std::uint64_t addr, Category category, std::uint32_t label_id) {
  auto it = maps_->blocks.find(addr);
  if (it == maps_->blocks.end()) {
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
  auto [it, inserted] = maps_->segments.try_emplace(addr, bytes);
  if (!inserted) {
    segment_bytes_ -= it->second;
    it->second = bytes;
  }
  segment_bytes_ += bytes;
}

void Ledger::on_segment_free(std::uint64_t addr) {
  auto it = maps_->segments.find(addr);
  if (it == maps_->segments.end()) {
    ++anomalies_.unknown_segment_frees;
    return;
  }
  segment_bytes_ -= it->second;
  maps_->segments.erase(it);
}

const LiveBlock* Ledger::find(std::uint64_t addr) const {
  auto it = maps_->blocks.find(addr);
  return it == maps_->blocks.end() ? nullptr : &it->second;
}

}  // namespace ridgescope
