// Specification of the record encoding (docs/trace_format.md "Records") and the chunk CRC: the
// bytes encode_record() writes for every kind, spelled out from the format's field table, and
// CRC-32 values fixed by the standard (zlib.crc32). The encoder is the recorder's hot path and
// is written for speed; these specs hold its output to the documented bytes.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "byte_codec.h"
#include "catch.h"
#include "record_codec.h"
#include "ridgescope/event.h"

using namespace ridgescope;

namespace {

// The format's building blocks, written independently of the encoder.
void leb128(std::vector<std::uint8_t>& out, std::uint64_t v) {
  do {
    std::uint8_t byte = v & 0x7F;
    v >>= 7;
    if (v != 0) byte |= 0x80;
    out.push_back(byte);
  } while (v != 0);
}
std::uint64_t zigzag(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
// kind byte, payload length, payload.
std::vector<std::uint8_t> record(EventKind kind, const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> out{static_cast<std::uint8_t>(kind)};
  leb128(out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}
std::vector<std::uint8_t> bytes_of(const std::string& s) {
  return std::vector<std::uint8_t>(s.begin(), s.end());
}
void device(std::vector<std::uint8_t>& p, Device d) {
  leb128(p, static_cast<std::uint64_t>(d.type));
  leb128(p, static_cast<std::uint64_t>(static_cast<std::int64_t>(d.index) + 1));
}

}  // namespace

SCENARIO("encode_record writes the documented bytes for every timed kind", "[core][codec]") {
  GIVEN("events with extreme field values (64-bit maxima, a time going backwards, cuda:32767)") {
    const std::uint64_t big = UINT64_MAX;
    const Device cuda{DeviceType::CUDA, 32767};
    const Device cpu{DeviceType::CPU, -1};
    Event e;
    e.time_ns = 1000;
    e.addr = big;
    e.bytes = 0x7F;              // the largest one-byte varint
    e.requested_bytes = 0x80;    // the smallest two-byte varint
    e.stream = big - 1;
    e.thread = 0xFFFFFFFFu;
    e.category = Category::Activation;
    e.flags = kTagWeak;
    e.string_id = 300;
    e.value = big;

    for (const EventKind kind :
         {EventKind::Alloc, EventKind::Free, EventKind::SegmentAlloc, EventKind::SegmentFree,
          EventKind::Tag, EventKind::PhaseBegin, EventKind::PhaseEnd, EventKind::Step,
          EventKind::Oom, EventKind::Sample}) {
      for (const Device d : {cpu, cuda}) {
        WHEN("kind " << static_cast<int>(kind) << " on device type "
                     << static_cast<int>(d.type) << " is encoded after a later event") {
          e.kind = kind;
          e.device = d;
          detail::CodecClock clock{5000};  // the previous record was at 5000 ns: delta -4000
          std::string out = "prefix";
          detail::encode_record(e, clock, out);

          std::vector<std::uint8_t> p;
          leb128(p, zigzag(-4000));
          switch (kind) {
            case EventKind::Alloc:
              device(p, d); leb128(p, e.addr); leb128(p, e.bytes); leb128(p, e.requested_bytes);
              leb128(p, e.stream); leb128(p, e.thread); leb128(p, e.string_id);
              break;
            case EventKind::Free:
              device(p, d); leb128(p, e.addr); leb128(p, e.bytes); leb128(p, e.stream);
              leb128(p, e.thread);
              break;
            case EventKind::SegmentAlloc:
            case EventKind::SegmentFree:
              device(p, d); leb128(p, e.addr); leb128(p, e.bytes); leb128(p, e.stream);
              break;
            case EventKind::Tag:
              device(p, d); leb128(p, e.addr); leb128(p, 5); leb128(p, 1); leb128(p, 300);
              break;
            case EventKind::PhaseBegin:
            case EventKind::PhaseEnd:
              leb128(p, 300); leb128(p, e.thread);
              break;
            case EventKind::Step:
              leb128(p, e.value);
              break;
            case EventKind::Oom:
              device(p, d); leb128(p, e.bytes); leb128(p, e.value); leb128(p, e.stream);
              break;
            case EventKind::Sample:
              device(p, d); leb128(p, 300); leb128(p, e.value);
              break;
            default:
              FAIL("untimed kind in the timed list");
          }
          THEN("the record is kind, length and the fields in the table's order, after what was there") {
            std::vector<std::uint8_t> expected = bytes_of("prefix");
            const auto rec = record(kind, p);
            expected.insert(expected.end(), rec.begin(), rec.end());
            CHECK(bytes_of(out) == expected);
            CHECK(clock.last_time_ns == 1000);
          }
          AND_THEN("it decodes back to the same fields") {
            detail::CodecClock read_clock{5000};
            std::size_t pos = 6;
            Event back;
            REQUIRE(detail::decode_record(out, &pos, read_clock, &back) == detail::DecodeStatus::Ok);
            CHECK(pos == out.size());
            CHECK(back.kind == kind);
            CHECK(back.time_ns == 1000);
          }
        }
      }
    }
  }
  GIVEN("an alloc without a module context") {
    Event e;
    e.kind = EventKind::Alloc;
    e.time_ns = 186899;
    e.addr = 0x7f0000000000;
    e.bytes = e.requested_bytes = 104448;
    e.thread = 1;
    THEN("it is the 21-byte example record of docs/trace_format.md") {
      detail::CodecClock clock{0};
      std::string out;
      detail::encode_record(e, clock, out);
      const std::vector<std::uint8_t> doc{0x01, 0x14, 0xa6, 0xe8, 0x16, 0x00, 0x00, 0x80, 0x80,
                                          0x80, 0x80, 0x80, 0xe0, 0x1f, 0x80, 0xb0, 0x06, 0x80,
                                          0xb0, 0x06, 0x00, 0x01};
      // 22 bytes: the kind, the length (20) and the 20-byte payload.
      CHECK(bytes_of(out) == doc);
    }
  }
}

SCENARIO("string and metadata records carry their text", "[core][codec]") {
  Event e;
  e.kind = EventKind::String;
  e.string_id = 1;
  e.text = "forward";
  detail::CodecClock clock{777};
  std::string out;
  detail::encode_record(e, clock, out);
  THEN("a string is `0b 08 01 forward` (docs/trace_format.md) and leaves the clock alone") {
    CHECK(bytes_of(out) == std::vector<std::uint8_t>{0x0b, 0x08, 0x01, 'f', 'o', 'r', 'w', 'a', 'r', 'd'});
    CHECK(clock.last_time_ns == 777);
  }
  AND_WHEN("a metadata text is longer than a one-byte length") {
    Event m;
    m.kind = EventKind::Metadata;
    m.string_id = 2;
    const std::string json(200, 'x');
    m.text = json;
    std::string out2;
    detail::encode_record(m, clock, out2);
    std::vector<std::uint8_t> p;
    leb128(p, 2);
    for (char ch : json) p.push_back(static_cast<std::uint8_t>(ch));
    CHECK(bytes_of(out2) == record(EventKind::Metadata, p));
  }
}

SCENARIO("the chunk CRC is CRC-32/IEEE, as zlib.crc32 computes it", "[core][codec]") {
  CHECK(detail::crc32("") == 0x00000000u);
  CHECK(detail::crc32("a") == 0xE8B7BE43u);
  CHECK(detail::crc32("123456789") == 0xCBF43926u);
  CHECK(detail::crc32("The quick brown fox jumps over the lazy dog") == 0x414FA339u);
  GIVEN("every length from 0 to 40 at every alignment of a larger buffer") {
    // The reference: the bitwise definition, one bit at a time.
    auto reference = [](std::string_view s) {
      std::uint32_t c = 0xFFFFFFFFu;
      for (unsigned char ch : s) {
        c ^= ch;
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
      }
      return c ^ 0xFFFFFFFFu;
    };
    std::string buffer;
    for (int i = 0; i < 64; ++i) buffer.push_back(static_cast<char>(i * 37 + 11));
    for (std::size_t offset = 0; offset < 8; ++offset) {
      for (std::size_t n = 0; n <= 40; ++n) {
        const std::string_view s(buffer.data() + offset, n);
        CHECK(detail::crc32(s) == reference(s));
      }
    }
  }
}

SCENARIO("the folded CRC (carry-less multiply) equals the table CRC on every length and alignment",
         "[core][codec]") {
  // crc32() folds 16-byte lanes where the CPU can (64 bytes and more), then finishes by tables;
  // crc32_portable() is tables alone. Lengths around each boundary of the folding: 64 (the least
  // folded), multiples of 16 and 64 and one either side, and a chunk's size.
  GIVEN("pseudo-random bytes") {
    std::string buffer;
    std::uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 300000; ++i) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      buffer.push_back(static_cast<char>(s >> 32));
    }
    WHEN("checksummed both ways at every alignment") {
      for (std::size_t offset = 0; offset < 16; ++offset) {
        for (std::size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 79, 80, 81, 127, 128, 129, 191, 192, 193, 255, 256, 1000,
                              4095, 4096, 65537, 262144, 262144 + 7}) {
          const std::string_view v(buffer.data() + offset, n);
          CHECK(detail::crc32(v) == detail::crc32_portable(v));
        }
      }
      THEN("a known value holds on a long input too: 1 MiB of zeros, as zlib.crc32 gives it") {
        CHECK(detail::crc32(std::string(1 << 20, '\0')) == 0xA738EA1Cu);
        CHECK(detail::crc32_portable(std::string(1 << 20, '\0')) == 0xA738EA1Cu);
      }
    }
  }
}

SCENARIO("format 2: an alloc carries its stack after the module context", "[core][codec][sites]") {
  Event e;
  e.kind = EventKind::Alloc;
  e.time_ns = 186899;
  e.addr = 0x7f0000000000;
  e.bytes = e.requested_bytes = 104448;
  e.thread = 1;
  GIVEN("an alloc with a stack id but no module context") {
    e.stack_id = 300;
    detail::CodecClock clock{0};
    std::string out;
    detail::encode_record(e, clock, out);
    THEN("the context is written as 0 so that the stack follows it, then the stack id") {
      const std::vector<std::uint8_t> doc{0x01, 0x17, 0xa6, 0xe8, 0x16, 0x00, 0x00, 0x80, 0x80,
                                          0x80, 0x80, 0x80, 0xe0, 0x1f, 0x80, 0xb0, 0x06, 0x80,
                                          0xb0, 0x06, 0x00, 0x01, 0x00, 0xac, 0x02};
      CHECK(bytes_of(out) == doc);
    }
    AND_THEN("a version 2 reader gets the stack, a version 1 reader ignores the trailing field") {
      for (const std::uint32_t version : {2u, 1u}) {
        detail::CodecClock read_clock{0};
        std::size_t pos = 0;
        Event back;
        REQUIRE(detail::decode_record(out, &pos, read_clock, &back, version) == detail::DecodeStatus::Ok);
        CHECK(back.string_id == 0);
        CHECK(back.stack_id == (version == 2 ? 300u : 0u));
      }
    }
  }
  GIVEN("an alloc without a stack") {
    e.string_id = 7;
    detail::CodecClock clock{0};
    std::string out;
    detail::encode_record(e, clock, out);
    THEN("it is the version 1 record: no trailing stack field") {
      CHECK(out.size() == 23);
      CHECK(static_cast<std::uint8_t>(out.back()) == 7);
    }
  }
}

SCENARIO("alloc and free records read field by field: every truncation and every out-of-range field",
         "[core][codec]") {
  // decode_record reads alloc and free records (nearly all of a trace) on a path of their own;
  // these are the rules of the field table it must keep (docs/trace_format.md): the fields up to
  // the thread are required, an alloc's module context and stack are optional and trailing, a
  // device type above 1, a device index above 32768 or a thread above 2^32-1 is malformed.
  Event e;
  e.time_ns = 5000000;
  e.device = Device{DeviceType::CUDA, 3};
  e.addr = 0x7f12345678c0;
  e.bytes = 1 << 20;
  e.requested_bytes = 1000000;
  e.stream = 0x55aa00;
  e.thread = 4;
  e.string_id = 70000;
  e.stack_id = 300;
  // A record of this kind with `payload` as its payload.
  auto record = [](EventKind kind, const std::string& payload) {
    std::string r(1, static_cast<char>(kind));
    detail::put_varint(r, payload.size());
    return r + payload;
  };
  for (const EventKind kind : {EventKind::Alloc, EventKind::Free}) {
    e.kind = kind;
    detail::CodecClock clock{0};
    std::string whole;
    detail::encode_record(e, clock, whole);
    const std::string payload = whole.substr(2);  // kind byte, one-byte length
    // Where each field ends in the payload: time, device type, device index, addr, bytes,
    // [requested], stream, thread, [context, stack].
    std::vector<std::size_t> ends;
    {
      std::size_t p = 0;
      std::uint64_t v;
      while (p < payload.size() && detail::get_varint(payload, &p, &v)) ends.push_back(p);
    }
    const std::size_t required = kind == EventKind::Alloc ? 8 : 7;
    REQUIRE(ends.size() == (kind == EventKind::Alloc ? 10u : 7u));
    const std::string name = kind == EventKind::Alloc ? "alloc" : "free";
    WHEN("every prefix of a full " + name + " is decoded") {
      for (std::size_t n = 0; n <= payload.size(); ++n) {
        const std::string r = record(kind, payload.substr(0, n));
        detail::CodecClock read_clock{0};
        std::size_t pos = 0;
        Event back;
        const auto status = detail::decode_record(r, &pos, read_clock, &back, trace_format::kVersion);
        const bool whole_fields = std::find(ends.begin(), ends.end(), n) != ends.end() || n == 0;
        const bool readable = n >= ends[required - 1] && whole_fields;
        CAPTURE(n);
        REQUIRE((status == detail::DecodeStatus::Ok) == readable);
        if (!readable) continue;
        CHECK(pos == r.size());
        CHECK(back.kind == kind);
        CHECK(back.time_ns == e.time_ns);
        CHECK(back.device == e.device);
        CHECK(back.addr == e.addr);
        CHECK(back.bytes == e.bytes);
        CHECK(back.requested_bytes == (kind == EventKind::Alloc ? e.requested_bytes : 0u));
        CHECK(back.stream == e.stream);
        CHECK(back.thread == e.thread);
        CHECK(back.string_id == (kind == EventKind::Alloc && n >= ends[8] ? e.string_id : 0u));
        CHECK(back.stack_id == (kind == EventKind::Alloc && n >= ends[9] ? e.stack_id : 0u));
        CHECK(back.category == Category::Unknown);
        CHECK(back.value == 0u);
      }
    }
    WHEN("one field of a " + name + " is out of its range") {
      // The field at `index` replaced by `value`, the others as encoded.
      auto with_field = [&](std::size_t index, std::uint64_t value) {
        std::string p = payload.substr(0, index == 0 ? 0 : ends[index - 1]);
        detail::put_varint(p, value);
        return record(kind, p + payload.substr(ends[index]));
      };
      const std::size_t thread_field = required - 1;
      for (const auto& [index, value] : std::vector<std::pair<std::size_t, std::uint64_t>>{
               {1, 2}, {1, 256}, {2, 32769}, {thread_field, 0x100000000ull}}) {
        const std::string r = with_field(index, value);
        detail::CodecClock read_clock{0};
        std::size_t pos = 0;
        Event back;
        CAPTURE(index, value);
        CHECK(detail::decode_record(r, &pos, read_clock, &back, trace_format::kVersion) ==
              detail::DecodeStatus::Malformed);
      }
      THEN("the largest values in range read back") {
        const std::string r = with_field(2, 32768);
        detail::CodecClock read_clock{0};
        std::size_t pos = 0;
        Event back;
        REQUIRE(detail::decode_record(r, &pos, read_clock, &back, trace_format::kVersion) == detail::DecodeStatus::Ok);
        CHECK(back.device.index == 32767);
      }
    }
  }
}

SCENARIO("format 2: frame and stack records define the tables, untimed", "[core][codec][sites]") {
  GIVEN("a Python frame and a stack of three frames") {
    FrameRecord f;
    f.kind = FrameKind::Autograd;
    f.file_id = 1;
    f.line = 200;
    f.function_id = 3;
    f.module_id = 4;
    std::string out;
    detail::encode_frame_record(5, f, out);
    const std::uint32_t frames[] = {5, 128, 2};
    detail::encode_stack_record(9, frames, 3, 1, out);
    THEN("each is its kind (64, 65), a length and varints: id, then the fields of the table") {
      const std::vector<std::uint8_t> expected{
          64, 7, 5, 2, 1, 0xc8, 0x01, 3, 4,   // frame 5: autograd, file 1, line 200, function 3, module 4
          65, 6, 9, 1, 5, 0x80, 0x01, 2};     // stack 9: site 1, frames 5, 128, 2
      CHECK(bytes_of(out) == expected);
    }
    AND_THEN("they decode into the definitions, and the clock does not move") {
      detail::CodecClock clock{777};
      std::size_t pos = 0;
      Event e;
      detail::Definition d;
      REQUIRE(detail::decode_record(out, &pos, clock, &e, 2, &d) == detail::DecodeStatus::Ok);
      CHECK(e.kind == EventKind::Frame);
      CHECK(e.string_id == 5);
      CHECK(d.frame.kind == FrameKind::Autograd);
      CHECK(d.frame.line == 200);
      CHECK(d.frame.module_id == 4);
      REQUIRE(detail::decode_record(out, &pos, clock, &e, 2, &d) == detail::DecodeStatus::Ok);
      CHECK(e.kind == EventKind::Stack);
      CHECK(e.string_id == 9);
      CHECK(d.site == 1);
      CHECK(d.frames == std::vector<std::uint32_t>{5, 128, 2});
      CHECK(pos == out.size());
      CHECK(clock.last_time_ns == 777);
    }
    AND_THEN("a version 1 reader skips both as unknown kinds") {
      detail::CodecClock clock{777};
      std::size_t pos = 0;
      Event e;
      CHECK(detail::decode_record(out, &pos, clock, &e, 1) == detail::DecodeStatus::UnknownKind);
      CHECK(detail::decode_record(out, &pos, clock, &e, 1) == detail::DecodeStatus::UnknownKind);
      CHECK(clock.last_time_ns == 777);
    }
  }
  GIVEN("the example of docs/trace_format.md, \"Frames and stacks\"") {
    FrameRecord f;
    f.kind = FrameKind::Python;
    f.file_id = 3;
    f.line = 10;
    f.function_id = 4;
    std::string out;
    detail::encode_frame_record(5, f, out);
    const std::uint32_t frames[] = {5};
    detail::encode_stack_record(2, frames, 1, 0, out);
    CHECK(bytes_of(out) == std::vector<std::uint8_t>{0x40, 0x06, 0x05, 0x00, 0x03, 0x0a, 0x04, 0x00,
                                                      0x41, 0x03, 0x02, 0x00, 0x05});
  }
  GIVEN("a frame kind this version does not know") {
    std::string out;
    FrameRecord f;
    f.kind = static_cast<FrameKind>(9);
    detail::encode_frame_record(1, f, out);
    THEN("it reads as untracked") {
      detail::CodecClock clock;
      std::size_t pos = 0;
      Event e;
      detail::Definition d;
      REQUIRE(detail::decode_record(out, &pos, clock, &e, 2, &d) == detail::DecodeStatus::Ok);
      CHECK(d.frame.kind == FrameKind::Untracked);
    }
  }
  GIVEN("stack records a reader must refuse") {
    auto decode = [](const std::string& rec) {
      detail::CodecClock clock;
      std::size_t pos = 0;
      Event e;
      detail::Definition d;
      return detail::decode_record(rec, &pos, clock, &e, 2, &d);
    };
    THEN("a site past the end of the frames is malformed") {
      std::string out;
      const std::uint32_t frames[] = {1, 2};
      detail::encode_stack_record(1, frames, 2, 3, out);
      CHECK(decode(out) == detail::DecodeStatus::Malformed);
    }
    THEN("more than kMaxStackFrames frames is malformed") {
      std::vector<std::uint32_t> frames(kMaxStackFrames + 1, 1);
      std::string out;
      detail::encode_stack_record(1, frames.data(), frames.size(), 0, out);
      CHECK(decode(out) == detail::DecodeStatus::Malformed);
    }
    THEN("a frame id past 32 bits is malformed") {
      std::string payload;
      detail::put_varint(payload, 1);
      detail::put_varint(payload, 0);
      detail::put_varint(payload, 1ull << 33);
      std::string out(1, static_cast<char>(65));
      detail::put_varint(out, payload.size());
      out += payload;
      CHECK(decode(out) == detail::DecodeStatus::Malformed);
    }
  }
}

SCENARIO("the flight recorder's fixed records carry the documented fields, extremes included",
         "[core][codec][flight]") {
  const std::uint64_t big = UINT64_MAX;
  const Device cuda{DeviceType::CUDA, 32767};
  const Device cpu{DeviceType::CPU, -1};
  GIVEN("a checkpoint block with every field at its widest") {
    CheckpointBlock b;
    b.device = cuda;
    b.addr = big;
    b.bytes = big - 1;
    b.requested_bytes = big - 2;
    b.stream = big - 3;
    b.context_id = 0xFFFFFFFFu;
    b.stack_id = 0xFFFFFFFEu;
    b.alloc_phase_id = 0xFFFFFFFDu;
    b.alloc_step = big - 4;
    b.lifetime = 31;
    b.alloc_instance = 65535;
    b.tags = 3;
    b.first_strong = Category::OptimizerState;
    b.first_strong_label = 0xFFFFFFFCu;
    b.weak = Category::Activation;
    b.weak_label = 0xFFFFFFFBu;
    b.current = Category::Gradient;
    b.current_label = 0xFFFFFFFAu;
    WHEN("it is encoded") {
      std::string out = "x";  // appended after what the buffer holds
      detail::encode_checkpoint_block(b, out);
      THEN("the bytes are the kind, the payload's length and the fields in the documented order") {
        std::vector<std::uint8_t> p;
        device(p, cuda);
        for (std::uint64_t v : {big, big - 1, big - 2, big - 3}) leb128(p, v);
        for (std::uint64_t v : {0xFFFFFFFFull, 0xFFFFFFFEull, 0xFFFFFFFDull}) leb128(p, v);
        leb128(p, big - 4);
        leb128(p, 31);
        leb128(p, 65536);  // alloc_instance + 1
        leb128(p, 3);
        leb128(p, static_cast<std::uint64_t>(Category::OptimizerState));
        leb128(p, 0xFFFFFFFCull);
        leb128(p, static_cast<std::uint64_t>(Category::Activation));
        leb128(p, 0xFFFFFFFBull);
        leb128(p, static_cast<std::uint64_t>(Category::Gradient));
        leb128(p, 0xFFFFFFFAull);
        CHECK(p.size() == 92);  // the longest a block can be
        std::vector<std::uint8_t> expected{'x'};
        const auto r = record(EventKind::CheckpointBlock, p);
        expected.insert(expected.end(), r.begin(), r.end());
        CHECK(bytes_of(out) == expected);
      }
      THEN("it decodes to the same block") {
        std::size_t pos = 1;
        detail::CodecClock clock;
        Event e;
        detail::FlightPayload flight;
        REQUIRE(detail::decode_record(out, &pos, clock, &e, trace_format::kVersion, nullptr, &flight) ==
                detail::DecodeStatus::Ok);
        CHECK(pos == out.size());
        const CheckpointBlock& d = flight.block;
        CHECK(d.device.type == cuda.type);
        CHECK(d.device.index == cuda.index);
        CHECK((d.addr == big && d.bytes == big - 1 && d.requested_bytes == big - 2 && d.stream == big - 3));
        CHECK((d.context_id == b.context_id && d.stack_id == b.stack_id && d.alloc_phase_id == b.alloc_phase_id));
        CHECK((d.alloc_step == b.alloc_step && d.lifetime == 31 && d.alloc_instance == 65535 && d.tags == 3));
        CHECK((d.first_strong == b.first_strong && d.first_strong_label == b.first_strong_label));
        CHECK((d.weak == b.weak && d.weak_label == b.weak_label && d.current == b.current &&
               d.current_label == b.current_label));
      }
    }
  }
  GIVEN("a time base, a segment, an external block and a resolution") {
    std::string out;
    detail::encode_time_base(big, out);
    detail::encode_checkpoint_segment(cuda, big, 0x80, out);
    Event x;
    x.device = cpu;
    x.addr = 0x7F;
    x.bytes = big;
    x.flags = 2;
    x.string_id = 0x80;
    x.thread = 0xFFFFFFFFu;
    x.stack_id = 9;
    detail::encode_checkpoint_external(x, out);
    detail::encode_resolve(cuda, 0x80, Category::Workspace, 0xFF, 0xFFFFFFFFu, out);
    THEN("each is its kind, its payload's length and its fields") {
      std::vector<std::uint8_t> expected, p;
      leb128(p, big);
      auto r = record(EventKind::TimeBase, p);
      expected.insert(expected.end(), r.begin(), r.end());
      p.clear();
      device(p, cuda);
      leb128(p, big);
      leb128(p, 0x80);
      r = record(EventKind::CheckpointSegment, p);
      expected.insert(expected.end(), r.begin(), r.end());
      p.clear();
      device(p, cpu);
      for (std::uint64_t v : {std::uint64_t{0x7F}, big, std::uint64_t{2}, std::uint64_t{0x80},
                              std::uint64_t{0xFFFFFFFFu}, std::uint64_t{9}}) {
        leb128(p, v);
      }
      r = record(EventKind::CheckpointExternal, p);
      expected.insert(expected.end(), r.begin(), r.end());
      p.clear();
      device(p, cuda);
      leb128(p, 0x80);
      leb128(p, static_cast<std::uint64_t>(Category::Workspace));
      leb128(p, 0xFF);
      leb128(p, 0xFFFFFFFFull);
      r = record(EventKind::Resolve, p);
      expected.insert(expected.end(), r.begin(), r.end());
      CHECK(bytes_of(out) == expected);
    }
  }
}
