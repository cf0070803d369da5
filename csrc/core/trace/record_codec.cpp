#include "record_codec.h"

#include "byte_codec.h"
#include "field_reader.h"

namespace ridgescope::detail {
namespace {

std::uint64_t zigzag(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
std::int64_t unzigzag(std::uint64_t v) {
  return static_cast<std::int64_t>(v >> 1) ^ -static_cast<std::int64_t>(v & 1);
}

// Strings and metadata: the text makes the payload as long as it is. Out of line: once per
// text, where the timed records below are one per allocation.
template <class Out>
[[gnu::noinline]] void encode_text_record(const Event& e, Out& out) {
  std::string id;  // the payload's first field; then its length, in the record's header
  put_varint(id, e.string_id);
  std::string header(1, static_cast<char>(e.kind));
  put_varint(header, id.size() + e.text.size());
  out.append(header);
  out.append(id);
  out.append(e.text.data(), e.text.size());
}

// Timed records (every kind but string and metadata) are the recorder's hot path: one per
// allocator callback. They are built in a stack buffer and appended once; the bytes are those of
// docs/trace_format.md (tests/cpp/core/trace/test_record_codec.cpp spells them out).
template <class Out>
void encode_record_to(const Event& e, RecordStamp stamp, CodecClock& clock, Out& out) {
  if (e.kind == EventKind::String || e.kind == EventKind::Metadata) {
    encode_text_record(e, out);
    return;
  }
  // Frames, stacks and the flight records carry their content outside Event: encode_frame_record,
  // encode_stack_record, flight_codec.cpp.
  if (static_cast<std::uint8_t>(e.kind) >= 64) return;
  RecordBuffer p;
  p.varint(zigzag(static_cast<std::int64_t>(stamp.time_ns - clock.last_time_ns)));
  clock.last_time_ns = stamp.time_ns;
  switch (e.kind) {
    case EventKind::Alloc:
      p.device(e.device);
      p.varint(e.addr);
      p.varint(e.bytes);
      p.varint(e.requested_bytes);
      p.varint(e.stream);
      p.varint(stamp.thread);
      // Trailing and optional: the module context, then the stack (which needs the context
      // before it, 0 when none).
      if (e.string_id != 0 || e.stack_id != 0) p.varint(e.string_id);
      if (e.stack_id != 0) p.varint(e.stack_id);
      break;
    case EventKind::Free:
      p.device(e.device);
      p.varint(e.addr);
      p.varint(e.bytes);
      p.varint(e.stream);
      p.varint(stamp.thread);
      break;
    case EventKind::SegmentAlloc:
    case EventKind::SegmentFree:
      p.device(e.device);
      p.varint(e.addr);
      p.varint(e.bytes);
      p.varint(e.stream);
      break;
    case EventKind::Tag:
      p.device(e.device);
      p.varint(e.addr);
      p.varint(static_cast<std::uint64_t>(e.category));
      p.varint(e.flags);
      p.varint(e.string_id);
      break;
    case EventKind::PhaseBegin:
    case EventKind::PhaseEnd:
      p.varint(e.string_id);
      p.varint(stamp.thread);
      break;
    case EventKind::Step:
      p.varint(e.value);
      break;
    case EventKind::Oom:
      p.device(e.device);
      p.varint(e.bytes);
      p.varint(e.value);
      p.varint(e.stream);
      break;
    case EventKind::Sample:
      p.device(e.device);
      p.varint(e.string_id);
      p.varint(e.value);
      break;
    case EventKind::Mark:
      p.varint(e.string_id);
      p.varint(stamp.thread);
      break;
    case EventKind::ExternalAlloc:
      put_external_fields(p, e, stamp.thread);
      if (e.stack_id != 0) p.varint(e.stack_id);  // trailing and optional
      break;
    case EventKind::ExternalFree:
      p.device(e.device);
      p.varint(e.addr);
      p.varint(e.bytes);
      p.varint(e.flags);
      p.varint(stamp.thread);
      break;
    case EventKind::String:
    case EventKind::Metadata:
    case EventKind::Frame:
    case EventKind::Stack:
      break;  // returned above
    default:
      return;  // the flight records have encoders of their own (flight_codec.cpp)
  }
  p.append_record(e.kind, out);
}

}  // namespace

void encode_record(const Event& e, CodecClock& clock, std::string& out) {
  encode_record_to(e, RecordStamp{e.time_ns, e.thread}, clock, out);
}
void encode_record(const Event& e, RecordStamp stamp, CodecClock& clock, std::pmr::string& out) {
  encode_record_to(e, stamp, clock, out);
}

namespace {
void append_definition(EventKind kind, const std::string& payload, std::string& out) {
  out.push_back(static_cast<char>(kind));
  put_varint(out, payload.size());
  out.append(payload);
}
}  // namespace

void encode_frame_record(std::uint32_t id, const FrameRecord& f, std::string& out) {
  std::string payload;
  put_varint(payload, id);
  put_varint(payload, static_cast<std::uint64_t>(f.kind));
  put_varint(payload, f.file_id);
  put_varint(payload, f.line);
  put_varint(payload, f.function_id);
  put_varint(payload, f.module_id);
  append_definition(EventKind::Frame, payload, out);
}

void encode_stack_record(std::uint32_t id, const std::uint32_t* frames, std::size_t count,
                         std::uint32_t site, std::string& out) {
  std::string payload;
  put_varint(payload, id);
  put_varint(payload, site);
  for (std::size_t i = 0; i < count; ++i) put_varint(payload, frames[i]);
  append_definition(EventKind::Stack, payload, out);
}

namespace {
// Copied rather than value-initialised: a few vector moves, where zeroing takes `rep stos`.
const Event kBlankEvent{};

// Alloc and free records (format 2 on: nearly every record of a trace) read by pointer, with the
// general path's checks and results. Nothing is written unless the whole record reads; on false
// the general path decodes it again (and says what is malformed).
bool decode_alloc_or_free(EventKind kind, std::string_view payload, CodecClock& clock, Event* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(payload.data());
  const unsigned char* const end = p + payload.size();
  std::uint64_t dt, type, index, addr, bytes, requested = 0, stream, thread, context = 0, stack = 0;
  if (!read_varint(p, end, &dt) || !read_varint(p, end, &type) || type > 1 || !read_varint(p, end, &index) ||
      index > 32768 || !read_varint(p, end, &addr) || !read_varint(p, end, &bytes)) {
    return false;
  }
  if (kind == EventKind::Alloc && !read_varint(p, end, &requested)) return false;
  if (!read_varint(p, end, &stream) || !read_varint(p, end, &thread) || thread > 0xFFFFFFFFu) return false;
  if (kind == EventKind::Alloc) {  // trailing and optional: the module context, then the stack
    if (p != end && (!read_varint(p, end, &context) || context > 0xFFFFFFFFu)) return false;
    if (p != end && (!read_varint(p, end, &stack) || stack > 0xFFFFFFFFu)) return false;
  }
  Event& e = *out;
  e = kBlankEvent;
  e.kind = kind;
  e.time_ns = clock.last_time_ns + static_cast<std::uint64_t>(unzigzag(dt));
  clock.last_time_ns = e.time_ns;
  e.device.type = static_cast<DeviceType>(type);
  e.device.index = static_cast<std::int16_t>(static_cast<std::int64_t>(index) - 1);
  e.addr = addr;
  e.bytes = bytes;
  e.requested_bytes = requested;
  e.stream = stream;
  e.thread = static_cast<std::uint32_t>(thread);
  e.string_id = static_cast<std::uint32_t>(context);
  e.stack_id = static_cast<std::uint32_t>(stack);
  return true;
}
}  // namespace

DecodeStatus decode_record(std::string_view chunk, std::size_t* pos, CodecClock& clock,
                           Event* out, std::uint32_t version, Definition* definition, FlightPayload* flight) {
  if (*pos >= chunk.size()) return DecodeStatus::Malformed;
  const auto kind_byte = static_cast<std::uint8_t>(chunk[*pos]);
  std::size_t p = *pos + 1;
  std::uint64_t length;
  if (!get_varint(chunk, &p, &length) || length > chunk.size() - p) return DecodeStatus::Malformed;
  const std::string_view payload = chunk.substr(p, length);
  *pos = p + length;
  if (version >= 2 && (kind_byte == static_cast<std::uint8_t>(EventKind::Alloc) ||
                       kind_byte == static_cast<std::uint8_t>(EventKind::Free))) {
    if (decode_alloc_or_free(static_cast<EventKind>(kind_byte), payload, clock, out)) return DecodeStatus::Ok;
  }
  const bool definition_kind = version >= 2 && (kind_byte == static_cast<std::uint8_t>(EventKind::Frame) ||
                                                 kind_byte == static_cast<std::uint8_t>(EventKind::Stack));
  if (is_flight_kind(kind_byte, version)) {
    Event e;
    FlightPayload scratch;
    if (!decode_flight_record(kind_byte, payload, clock, &e, flight != nullptr ? flight : &scratch)) {
      return DecodeStatus::Malformed;
    }
    *out = e;
    return DecodeStatus::Ok;
  }
  // Kinds 13 and 14 exist from trace_format::kFirstExternalVersion on, kind 15 (mark) from
  // trace_format::kFirstFlightVersion on; before, they are unknown.
  const bool external_kind = version >= trace_format::kFirstExternalVersion &&
                             (kind_byte == static_cast<std::uint8_t>(EventKind::ExternalAlloc) ||
                              kind_byte == static_cast<std::uint8_t>(EventKind::ExternalFree));
  const bool mark_kind = version >= trace_format::kFirstFlightVersion &&
                         kind_byte == static_cast<std::uint8_t>(EventKind::Mark);
  if (!definition_kind && !external_kind && !mark_kind &&
      (kind_byte < 1 || kind_byte > static_cast<std::uint8_t>(EventKind::Metadata))) {
    // Forward compatibility: kinds below 64 (but String and Metadata) begin with the time delta,
    // so a reader that skips one still keeps the clock right.
    std::uint64_t dt;
    std::size_t q = 0;
    if (kind_byte < 64 && get_varint(payload, &q, &dt)) {
      clock.last_time_ns += static_cast<std::uint64_t>(unzigzag(dt));
    }
    return DecodeStatus::UnknownKind;
  }
  // Decoded in place (the writer thread decodes every record): *out is rewritten from here on,
  // also when the record turns out malformed.
  Event& e = *out;
  e = kBlankEvent;
  e.kind = static_cast<EventKind>(kind_byte);
  FieldReader r(payload);
  if (definition_kind) {
    Definition scratch;
    Definition& d = definition != nullptr ? *definition : scratch;
    if (!r.u32(&e.string_id)) return DecodeStatus::Malformed;
    if (e.kind == EventKind::Frame) {
      std::uint8_t kind = 0;
      if (!r.u8(&kind) || !r.u32(&d.frame.file_id) || !r.u64(&d.frame.line) ||
          !r.u32(&d.frame.function_id) || !r.u32(&d.frame.module_id)) {
        return DecodeStatus::Malformed;
      }
      d.frame.kind = frame_kind_from_byte(kind);
    } else {
      if (!r.u32(&d.site)) return DecodeStatus::Malformed;
      d.frames.clear();
      while (!r.rest().empty()) {
        std::uint32_t f = 0;
        if (d.frames.size() >= kMaxStackFrames || !r.u32(&f)) return DecodeStatus::Malformed;
        d.frames.push_back(f);
      }
      if (d.site > d.frames.size()) return DecodeStatus::Malformed;
    }
    return DecodeStatus::Ok;
  }
  if (e.kind != EventKind::String && e.kind != EventKind::Metadata) {
    std::uint64_t dt;
    if (!r.u64(&dt)) return DecodeStatus::Malformed;
    e.time_ns = clock.last_time_ns + static_cast<std::uint64_t>(unzigzag(dt));
    clock.last_time_ns = e.time_ns;
  }
  bool ok = true;
  switch (e.kind) {
    case EventKind::Alloc:
      ok = r.device(&e.device) && r.u64(&e.addr) && r.u64(&e.bytes) && r.u64(&e.requested_bytes) &&
           r.u64(&e.stream) && r.u32(&e.thread) && (r.rest().empty() || r.u32(&e.string_id)) &&
           (version < 2 || r.rest().empty() || r.u32(&e.stack_id));  // version 1: ignored
      break;
    case EventKind::Free:
      ok = r.device(&e.device) && r.u64(&e.addr) && r.u64(&e.bytes) && r.u64(&e.stream) &&
           r.u32(&e.thread);
      break;
    case EventKind::SegmentAlloc:
    case EventKind::SegmentFree:
      ok = r.device(&e.device) && r.u64(&e.addr) && r.u64(&e.bytes) && r.u64(&e.stream);
      break;
    case EventKind::Tag: {
      std::uint8_t category = 0;
      ok = r.device(&e.device) && r.u64(&e.addr) && r.u8(&category) && r.u8(&e.flags) &&
           r.u32(&e.string_id);
      e.category = category_from_byte(category);
      break;
    }
    case EventKind::PhaseBegin:
    case EventKind::PhaseEnd:
      ok = r.u32(&e.string_id) && r.u32(&e.thread);
      break;
    case EventKind::Step:
      ok = r.u64(&e.value);
      break;
    case EventKind::Oom:
      ok = r.device(&e.device) && r.u64(&e.bytes) && r.u64(&e.value) && r.u64(&e.stream);
      break;
    case EventKind::Sample:
      ok = r.device(&e.device) && r.u32(&e.string_id) && r.u64(&e.value);
      break;
    case EventKind::Mark:
      ok = r.u32(&e.string_id) && r.u32(&e.thread);
      break;
    case EventKind::ExternalAlloc:
      ok = r.device(&e.device) && r.u64(&e.addr) && r.u64(&e.bytes) && r.u8(&e.flags) &&
           r.u32(&e.string_id) && r.u32(&e.thread) && (r.rest().empty() || r.u32(&e.stack_id));
      break;
    case EventKind::ExternalFree:
      ok = r.device(&e.device) && r.u64(&e.addr) && r.u64(&e.bytes) && r.u8(&e.flags) && r.u32(&e.thread);
      break;
    case EventKind::String:
    case EventKind::Metadata:
      ok = r.u32(&e.string_id);
      e.text = r.rest();
      break;
    default:
      break;  // frames, stacks and the flight records were decoded above
  }
  if (!ok) return DecodeStatus::Malformed;
  return DecodeStatus::Ok;
}

}  // namespace ridgescope::detail
