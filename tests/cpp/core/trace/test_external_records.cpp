// Specification of format version 3's records of device memory allocated outside PyTorch
// (docs/trace_format.md, kinds 13 `external_alloc` and 14 `external_free`): their bytes, spelled
// out from the format's field table, and how readers of each version treat them.
#include <cstdint>
#include <string>
#include <vector>

#include "byte_codec.h"
#include "catch.h"
#include "record_codec.h"
#include "ridgescope/event.h"
#include "ridgescope/external_alloc.h"
#include "ridgescope/trace_format.h"
#include "ridgescope/trace_reader.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {

void leb128(std::vector<std::uint8_t>& out, std::uint64_t v) {
  do {
    std::uint8_t byte = v & 0x7F;
    v >>= 7;
    if (v != 0) byte |= 0x80;
    out.push_back(byte);
  } while (v != 0);
}
// kind byte, payload length, payload.
std::vector<std::uint8_t> record(EventKind kind, const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> out{static_cast<std::uint8_t>(kind)};
  leb128(out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}
std::vector<std::uint8_t> bytes_of(const std::string& s) { return std::vector<std::uint8_t>(s.begin(), s.end()); }

Event external(EventKind kind) {
  Event e;
  e.kind = kind;
  e.time_ns = 3000;  // +1000 ns after the previous record (zigzag 2000)
  e.device = Device{DeviceType::CUDA, 1};
  e.addr = 0x7f0000200000;
  e.bytes = 0x80;  // the smallest two-byte varint
  e.flags = static_cast<std::uint8_t>(ExternalApi::MemCreate);
  e.string_id = 9;  // the library
  e.thread = 2;
  e.stack_id = 300;
  return e;
}

}  // namespace

SCENARIO("external_alloc and external_free records have the documented bytes", "[core][codec][external]") {
  GIVEN("an allocation made by library string 9 through cuMemCreate on cuda:1, at stack 300") {
    const Event e = external(EventKind::ExternalAlloc);
    detail::CodecClock clock{2000};
    std::string out;
    detail::encode_record(e, clock, out);
    THEN("it is kind 13: time delta, device, addr, bytes, api, library, thread, stack") {
      std::vector<std::uint8_t> p;
      leb128(p, 2000);                // zigzag(+1000)
      leb128(p, 1);                   // device type CUDA
      leb128(p, 2);                   // index + 1
      leb128(p, 0x7f0000200000);
      leb128(p, 0x80);
      leb128(p, 5);                   // cuMemCreate
      leb128(p, 9);
      leb128(p, 2);
      leb128(p, 300);
      CHECK(out[0] == 13);
      CHECK(bytes_of(out) == record(EventKind::ExternalAlloc, p));
    }
    AND_THEN("a version 3 reader gets every field back") {
      detail::CodecClock read{2000};
      std::size_t pos = 0;
      Event back;
      REQUIRE(detail::decode_record(out, &pos, read, &back, 3) == detail::DecodeStatus::Ok);
      CHECK(pos == out.size());
      CHECK(back.kind == EventKind::ExternalAlloc);
      CHECK(back.time_ns == 3000);
      CHECK(back.device == e.device);
      CHECK(back.addr == e.addr);
      CHECK(back.bytes == 0x80);
      CHECK(back.flags == 5);
      CHECK(back.string_id == 9);
      CHECK(back.thread == 2);
      CHECK(back.stack_id == 300);
    }
    AND_THEN("a version 2 reader skips it as an unknown timed kind, and its clock still advances") {
      detail::CodecClock read{2000};
      std::size_t pos = 0;
      Event back;
      CHECK(detail::decode_record(out, &pos, read, &back, 2) == detail::DecodeStatus::UnknownKind);
      CHECK(pos == out.size());
      CHECK(read.last_time_ns == 3000);
    }
  }
  GIVEN("an allocation without a stack") {
    Event e = external(EventKind::ExternalAlloc);
    e.stack_id = 0;
    detail::CodecClock clock{2000};
    std::string out;
    detail::encode_record(e, clock, out);
    THEN("the stack is left out, and reads back as 0") {
      CHECK(out.size() == 2 + 2 + 2 + 7 + 2 + 1 + 1 + 1);
      detail::CodecClock read{2000};
      std::size_t pos = 0;
      Event back;
      REQUIRE(detail::decode_record(out, &pos, read, &back, 3) == detail::DecodeStatus::Ok);
      CHECK(back.stack_id == 0);
      CHECK(back.string_id == 9);
    }
  }
  GIVEN("its free") {
    const Event e = external(EventKind::ExternalFree);
    detail::CodecClock clock{2000};
    std::string out;
    detail::encode_record(e, clock, out);
    THEN("it is kind 14: time delta, device, addr, bytes, api, thread") {
      std::vector<std::uint8_t> p;
      leb128(p, 2000);
      leb128(p, 1);
      leb128(p, 2);
      leb128(p, 0x7f0000200000);
      leb128(p, 0x80);
      leb128(p, 5);
      leb128(p, 2);
      CHECK(out[0] == 14);
      CHECK(bytes_of(out) == record(EventKind::ExternalFree, p));
      detail::CodecClock read{2000};
      std::size_t pos = 0;
      Event back;
      REQUIRE(detail::decode_record(out, &pos, read, &back, 3) == detail::DecodeStatus::Ok);
      CHECK(back.kind == EventKind::ExternalFree);
      CHECK(back.string_id == 0);  // a free names no library
      CHECK(back.flags == 5);
    }
  }
  GIVEN("an api byte above 255") {
    std::vector<std::uint8_t> p;
    leb128(p, 0);
    leb128(p, 1);
    leb128(p, 1);
    leb128(p, 0x1000);
    leb128(p, 8);
    leb128(p, 256);  // does not fit the u8 field
    leb128(p, 1);
    std::string rec(1, static_cast<char>(14));
    rec.push_back(static_cast<char>(p.size()));
    rec.append(p.begin(), p.end());
    THEN("the record is malformed") {
      detail::CodecClock read{0};
      std::size_t pos = 0;
      Event back;
      CHECK(detail::decode_record(rec, &pos, read, &back, 3) == detail::DecodeStatus::Malformed);
    }
  }
}

SCENARIO("a trace with external allocations reads back through the Recorder and TraceReader",
         "[core][trace][external]") {
  GIVEN("a CUDA trace with a segment, an NCCL allocation and its free") {
    TempPath path;
    {
      TraceBuilder t(path.str(), Device{DeviceType::CUDA, 0});
      t.segment(0x10000000, 2 << 20);
      t.external_alloc(0x20000000, 4 << 20, "libnccl.so.2", static_cast<std::uint8_t>(ExternalApi::MemCreate));
      t.external_free(0x20000000, 4 << 20, static_cast<std::uint8_t>(ExternalApi::MemCreate));
      t.close();
    }
    TraceReader reader(path.str());
    std::vector<Event> events;
    Event e;
    while (reader.next(e)) {
      if (e.kind == EventKind::ExternalAlloc || e.kind == EventKind::ExternalFree) events.push_back(e);
    }
    THEN("the file is version 3 and both records come back, the alloc naming its library") {
      CHECK(reader.version() == trace_format::kVersion);
      CHECK(trace_format::kVersion >= trace_format::kFirstExternalVersion);
      REQUIRE(events.size() == 2);
      CHECK(reader.string(events[0].string_id) == "libnccl.so.2");
      CHECK(events[0].bytes == (4u << 20));
      CHECK(events[1].kind == EventKind::ExternalFree);
      CHECK(reader.skipped_records() == 0);
      CHECK(event_kind_name(events[0].kind) == "external_alloc");
      CHECK(event_kind_name(events[1].kind) == "external_free");
    }
  }
}
