// flight_codec.cpp — the records of the flight recorder (format version 4, kinds 66-72:
// docs/trace_format.md "The flight recorder"; ridgescope/flight_records.h). All untimed: a
// time_base record sets the time chain of the records after it, the others carry their times
// as fields.
#include <algorithm>

#include "byte_codec.h"
#include "field_reader.h"
#include "record_codec.h"

namespace ridgescope::detail {
namespace {

constexpr std::uint32_t kMaxListed = 65536;  // phases of a summary or a checkpoint

void put_device(std::string& out, Device d) {
  put_varint(out, static_cast<std::uint64_t>(d.type));
  put_varint(out, static_cast<std::uint64_t>(static_cast<std::int64_t>(d.index) + 1));
}

void append(EventKind kind, const std::string& payload, std::string& out) {
  out.push_back(static_cast<char>(kind));
  put_varint(out, payload.size());
  out.append(payload);
}

thread_local std::string t_payload;  // reused: the writer encodes one record at a time

std::string& payload() {
  t_payload.clear();
  return t_payload;
}

bool category(FieldReader& r, Category* c) {
  std::uint8_t v = 0;
  if (!r.u8(&v)) return false;
  *c = category_from_byte(v);
  return true;
}

}  // namespace

void encode_time_base(std::uint64_t time_ns, std::string& out) {
  RecordBuffer p;
  p.varint(time_ns);
  p.append_record(EventKind::TimeBase, out);
}

void encode_step_summary(const StepSummary& s, std::string& out) {
  std::string& p = payload();
  put_varint(p, s.step);
  put_device(p, s.device);
  put_varint(p, s.flags);
  put_varint(p, s.begin_time_ns);
  put_varint(p, s.end_time_ns - s.begin_time_ns);
  put_varint(p, s.start_bytes);
  put_varint(p, s.end_bytes);
  put_varint(p, s.peak_bytes);
  put_varint(p, s.peak_reserved_bytes);
  put_varint(p, s.allocations);
  put_varint(p, s.ooms);
  put_varint(p, s.marks);
  put_varint(p, s.mark_id);
  // The categories present (bit i: category i), then their bytes in category order.
  std::uint64_t present = 0;
  for (std::size_t i = 0; i < kCategoryCount; ++i) {
    if (s.peak_by_category[i] != 0) present |= std::uint64_t{1} << i;
  }
  put_varint(p, present);
  for (std::size_t i = 0; i < kCategoryCount; ++i) {
    if (s.peak_by_category[i] != 0) put_varint(p, s.peak_by_category[i]);
  }
  put_varint(p, s.phases.size());
  for (const PhasePeak& ph : s.phases) {
    put_varint(p, ph.name_id);
    put_varint(p, ph.peak_bytes);
  }
  append(EventKind::StepSummary, p, out);
}

void encode_checkpoint(const Checkpoint& c, std::string& out) {
  std::string& p = payload();
  put_varint(p, c.step);
  put_varint(p, c.time_ns);
  put_varint(p, c.have_forward ? 1 : 0);
  put_varint(p, c.phases.size());
  for (const CheckpointPhase& ph : c.phases) put_varint(p, ph.name_id);
  append(EventKind::Checkpoint, p, out);
}

void encode_checkpoint_segment(Device device, std::uint64_t addr, std::uint64_t bytes, std::string& out) {
  RecordBuffer p;
  p.device(device);
  p.varint(addr);
  p.varint(bytes);
  p.append_record(EventKind::CheckpointSegment, out);
}

void encode_checkpoint_external(const Event& e, std::string& out) {
  RecordBuffer p;
  put_external_fields(p, e, e.thread);
  p.varint(e.stack_id);
  p.append_record(EventKind::CheckpointExternal, out);
}

void encode_checkpoint_block(const CheckpointBlock& b, std::string& out) {
  RecordBuffer p;  // a device and 17 fields: at most 94 bytes
  p.device(b.device);
  p.varint(b.addr);
  p.varint(b.bytes);
  p.varint(b.requested_bytes);
  p.varint(b.stream);
  p.varint(b.context_id);
  p.varint(b.stack_id);
  p.varint(b.alloc_phase_id);
  p.varint(b.alloc_step);
  p.varint(b.lifetime);
  p.varint(static_cast<std::uint64_t>(static_cast<std::int64_t>(b.alloc_instance) + 1));
  p.varint(b.tags);
  p.varint(static_cast<std::uint64_t>(b.first_strong));
  p.varint(b.first_strong_label);
  p.varint(static_cast<std::uint64_t>(b.weak));
  p.varint(b.weak_label);
  p.varint(static_cast<std::uint64_t>(b.current));
  p.varint(b.current_label);
  p.append_record(EventKind::CheckpointBlock, out);
}

void encode_resolve(Device device, std::uint64_t addr, Category category, std::uint8_t flags,
                    std::uint32_t label_id, std::string& out) {
  RecordBuffer p;
  p.device(device);
  p.varint(addr);
  p.varint(static_cast<std::uint64_t>(category));
  p.varint(flags);
  p.varint(label_id);
  p.append_record(EventKind::Resolve, out);
}

bool is_flight_kind(std::uint8_t kind, std::uint32_t version) {
  return version >= trace_format::kFirstFlightVersion && is_flight_record(kind);
}

bool decode_flight_record(std::uint8_t kind, std::string_view body, CodecClock& clock, Event* e,
                          FlightPayload* flight) {
  FieldReader r(body);
  e->kind = static_cast<EventKind>(kind);
  switch (e->kind) {
    case EventKind::TimeBase:
      if (!r.u64(&e->value)) return false;
      clock.last_time_ns = e->value;
      e->time_ns = e->value;
      return true;
    case EventKind::StepSummary: {
      StepSummary& s = flight->summary;
      s = StepSummary{};
      std::uint64_t duration = 0, present = 0, phases = 0;
      if (!r.u64(&s.step) || !r.device(&s.device) || !r.u8(&s.flags) || !r.u64(&s.begin_time_ns) ||
          !r.u64(&duration) || !r.u64(&s.start_bytes) || !r.u64(&s.end_bytes) || !r.u64(&s.peak_bytes) ||
          !r.u64(&s.peak_reserved_bytes) || !r.u64(&s.allocations) || !r.u64(&s.ooms) || !r.u64(&s.marks) ||
          !r.u32(&s.mark_id) || !r.u64(&present)) {
        return false;
      }
      s.end_time_ns = s.begin_time_ns + duration;
      // Bits for categories this version does not know are read and their bytes counted as
      // unknown, as an unknown category number reads elsewhere.
      if (present >> 63) return false;
      for (std::size_t i = 0; i < 63; ++i) {
        if ((present >> i) & 1) {
          std::uint64_t v = 0;
          if (!r.u64(&v)) return false;
          s.peak_by_category[i < kCategoryCount ? i : 0] += v;
        }
      }
      if (!r.u64(&phases) || phases > kMaxListed) return false;
      s.phases.resize(phases);
      for (PhasePeak& ph : s.phases) {
        if (!r.u32(&ph.name_id) || !r.u64(&ph.peak_bytes)) return false;
      }
      e->value = s.step;
      e->device = s.device;
      return true;
    }
    case EventKind::Checkpoint: {
      Checkpoint& c = flight->checkpoint;
      c = Checkpoint{};
      std::uint64_t flags = 0, phases = 0;
      if (!r.u64(&c.step) || !r.u64(&c.time_ns) || !r.u64(&flags) || !r.u64(&phases) || phases > kMaxListed) {
        return false;
      }
      c.have_forward = (flags & 1) != 0;
      c.phases.resize(phases);
      for (CheckpointPhase& ph : c.phases) {
        if (!r.u32(&ph.name_id)) return false;
      }
      e->value = c.step;
      return true;
    }
    case EventKind::CheckpointSegment:
      return r.device(&e->device) && r.u64(&e->addr) && r.u64(&e->bytes);
    case EventKind::CheckpointBlock: {
      CheckpointBlock& b = flight->block;
      b = CheckpointBlock{};
      std::uint64_t instance = 0;
      if (!r.device(&b.device) || !r.u64(&b.addr) || !r.u64(&b.bytes) || !r.u64(&b.requested_bytes) ||
          !r.u64(&b.stream) || !r.u32(&b.context_id) || !r.u32(&b.stack_id) || !r.u32(&b.alloc_phase_id) ||
          !r.u64(&b.alloc_step) || !r.u8(&b.lifetime) || !r.u64(&instance) || instance > kMaxListed ||
          !r.u8(&b.tags) || !category(r, &b.first_strong) || !r.u32(&b.first_strong_label) ||
          !category(r, &b.weak) || !r.u32(&b.weak_label) || !category(r, &b.current) ||
          !r.u32(&b.current_label)) {
        return false;
      }
      b.alloc_instance = static_cast<std::int32_t>(instance) - 1;
      e->device = b.device;
      e->addr = b.addr;
      e->bytes = b.bytes;
      return true;
    }
    case EventKind::CheckpointExternal:
      return r.device(&e->device) && r.u64(&e->addr) && r.u64(&e->bytes) && r.u8(&e->flags) &&
             r.u32(&e->string_id) && r.u32(&e->thread) && r.u32(&e->stack_id);
    case EventKind::Resolve:
      return r.device(&e->device) && r.u64(&e->addr) && category(r, &e->category) && r.u8(&e->flags) &&
             r.u32(&e->string_id);
    default:
      return false;
  }
}

}  // namespace ridgescope::detail
