// host_memory.cpp — /proc/self/status and statm, and the three layers of the resident set
// (include/ridgescope/host_memory.h).
#include "ridgescope/host_memory.h"

#include <algorithm>

namespace ridgescope {

namespace {
// "  123 kB" -> 123 * 1024; false when no number follows.
bool kib_value(std::string_view rest, std::uint64_t* out) noexcept {
  std::size_t i = 0;
  while (i < rest.size() && (rest[i] == ' ' || rest[i] == '\t')) ++i;
  if (i == rest.size() || rest[i] < '0' || rest[i] > '9') return false;
  std::uint64_t v = 0;
  for (; i < rest.size() && rest[i] >= '0' && rest[i] <= '9'; ++i) {
    if (v > (UINT64_MAX / 1024 - 9) / 10) return false;  // no kernel reports such a size
    v = v * 10 + static_cast<std::uint64_t>(rest[i] - '0');
  }
  *out = v * 1024;
  return true;
}
}  // namespace

ProcStatus parse_proc_status(std::string_view text) noexcept {
  ProcStatus s;
  bool anon = false, file = false, shmem = false;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, colon), rest = line.substr(colon + 1);
    if (key == "VmRSS") s.ok = kib_value(rest, &s.resident);
    else if (key == "RssAnon") anon = kib_value(rest, &s.anon);
    else if (key == "RssFile") file = kib_value(rest, &s.file);
    else if (key == "RssShmem") shmem = kib_value(rest, &s.shmem);
  }
  if (!(anon && file && shmem)) s.anon = s.file = s.shmem = 0;  // all three or none
  return s;
}

ProcStatm parse_proc_statm(std::string_view text) noexcept {
  // "size resident shared text lib data dt", in pages.
  std::uint64_t v[3] = {};
  std::size_t i = 0;
  for (int k = 0; k < 3; ++k) {
    while (i < text.size() && text[i] == ' ') ++i;
    if (i == text.size() || text[i] < '0' || text[i] > '9') return {};
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      if (v[k] > (UINT64_MAX / 65536 - 9) / 10) return {};  // no kernel reports such a size
      v[k] = v[k] * 10 + static_cast<std::uint64_t>(text[i] - '0');
    }
  }
  if (v[2] > v[1]) return {};  // the shared part is part of the resident set
  ProcStatm m;
  m.ok = true;
  m.resident_pages = v[1];
  m.shared_pages = v[2];
  return m;
}

ProcStatus status_from_statm(const ProcStatm& statm, const ProcStatus& last, std::uint64_t page_bytes,
                             bool* status_needed) noexcept {
  *status_needed = true;
  const bool split = last.ok && last.anon + last.file + last.shmem != 0;
  if (!statm.ok || !split || page_bytes == 0) return {};
  const std::uint64_t resident = statm.resident_pages * page_bytes, shared = statm.shared_pages * page_bytes;
  if (shared != last.file + last.shmem) return {};
  *status_needed = false;
  ProcStatus s;
  s.ok = true;
  s.resident = resident;
  s.anon = resident - shared;
  s.file = last.file;
  s.shmem = last.shmem;
  return s;
}

HostLayers decompose_host_memory(const HostReading& r) noexcept {
  HostLayers l;
  l.resident = r.resident;
  l.split_known = r.rss_anon && r.rss_file && r.rss_shmem;
  l.malloc_known = r.malloc_in_use && r.malloc_free;
  l.residency_known = r.torch_resident.has_value();
  const std::uint64_t torch_resident = std::min(r.torch_resident.value_or(r.torch_allocated), r.torch_allocated);
  l.pytorch = std::min(torch_resident, l.resident);
  l.untouched = r.torch_allocated - torch_resident;
  // Torch's blocks and malloc's free chunks are anonymous memory: together they cannot exceed it.
  const std::uint64_t anonymous = l.split_known ? std::min(*r.rss_anon, l.resident) : l.resident;
  const std::uint64_t room = anonymous > l.pytorch ? anonymous - l.pytorch : 0;
  l.slack = l.malloc_known ? std::min(*r.malloc_free, room) : 0;
  l.outside = l.resident - l.pytorch - l.slack;
  if (l.split_known) {
    l.files = std::min(*r.rss_file, l.outside);
    l.shared_memory = std::min(*r.rss_shmem, l.outside - l.files);
  }
  if (l.malloc_known) {
    l.malloc_misses_torch = *r.malloc_in_use < r.torch_allocated;
    l.other_heap = l.malloc_misses_torch ? 0 : *r.malloc_in_use - r.torch_allocated;
  }
  const auto clamp = [](std::uint64_t v) { return static_cast<std::int64_t>(std::min<std::uint64_t>(v, INT64_MAX)); };
  l.remainder = clamp(l.outside) - clamp(l.files) - clamp(l.shared_memory) - clamp(l.other_heap);
  return l;
}

}  // namespace ridgescope
