// Specification of the trace format: round trips, readable prefixes, clear errors.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "byte_codec.h"
#include "catch.h"
#include "ridgescope/trace_format.h"
#include "ridgescope/trace_reader.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_all(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}
// One chunk of a written file, found by walking the chunk headers (trace_format.md, "Chunks").
struct ChunkSpan {
  std::size_t offset;     // byte offset of the chunk header in the file
  std::uint32_t length;   // payload bytes after the 16-byte header
  std::uint32_t records;  // records in the payload
};
// Where the writer put its chunks. Chunk boundaries depend on the time deltas the records
// carry (varints) and on the writer's 100 ms flush, so a test that damages "a byte in a chunk"
// has to find the chunk in the file rather than guess an offset.
std::vector<ChunkSpan> chunks_of(const std::string& file) {
  std::vector<ChunkSpan> out;
  std::size_t at = trace_format::kFileHeaderBytes;
  while (at + trace_format::kChunkHeaderBytes <= file.size()) {
    const std::uint32_t length = detail::get_u32(&file[at + 4]);
    out.push_back({at, length, detail::get_u32(&file[at + 8])});
    at += trace_format::kChunkHeaderBytes + length;
  }
  REQUIRE(at == file.size());  // the file is whole chunks
  return out;
}
std::size_t records_before(const std::vector<ChunkSpan>& chunks, std::size_t index) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < index; ++i) n += chunks[i].records;
  return n;
}
std::vector<Event> read_events(TraceReader& reader) {
  std::vector<Event> events;
  Event e;
  while (reader.next(e)) {
    e.text = {};
    events.push_back(e);
  }
  return events;
}
}  // namespace

SCENARIO("every event kind survives a write and a read", "[core][trace]") {
  GIVEN("a trace with one event of each kind, including a CUDA device and 64-bit values") {
    TempPath path;
    {
      Recorder rec(path.str());
      Event a;
      a.kind = EventKind::Alloc;
      a.device = Device{DeviceType::CUDA, 3};
      a.addr = 0x7f0000001000ull;
      a.bytes = 1ull << 40;
      a.requested_bytes = (1ull << 40) - 17;
      a.stream = 0xdeadbeef;
      rec.record(a);
      Event t;
      t.kind = EventKind::Tag;
      t.device = a.device;
      t.addr = a.addr;
      t.category = Category::OptimizerState;
      t.flags = kTagWeak;
      t.string_id = rec.intern("exp_avg of layers.0.attn.qkv.weight");
      rec.record(t);
      Event f;
      f.kind = EventKind::Free;
      f.device = a.device;
      f.addr = a.addr;
      f.bytes = a.bytes;
      rec.record(f);
      Event s;
      s.kind = EventKind::Step;
      s.value = ~0ull;
      rec.record(s);
      rec.metadata("run", "{\"x\": 1}");
    }
    WHEN("it is read back") {
      TraceReader reader(path.str());
      auto events = read_events(reader);
      THEN("the events come back in order with every field intact") {
        REQUIRE(events.size() == 7);
        CHECK_FALSE(reader.truncated());
        std::vector<EventKind> kinds;
        for (auto& e : events) kinds.push_back(e.kind);
        CHECK(kinds == std::vector<EventKind>{EventKind::Alloc, EventKind::String, EventKind::Tag,
                                              EventKind::Free, EventKind::Step, EventKind::String,
                                              EventKind::Metadata});
        const Event& alloc = events[0];
        CHECK(alloc.kind == EventKind::Alloc);
        CHECK(alloc.device == Device{DeviceType::CUDA, 3});
        CHECK(alloc.addr == 0x7f0000001000ull);
        CHECK(alloc.bytes == (1ull << 40));
        CHECK(alloc.requested_bytes == (1ull << 40) - 17);
        CHECK(alloc.stream == 0xdeadbeef);
        const Event& tag = events[2];
        CHECK(tag.kind == EventKind::Tag);
        CHECK(tag.category == Category::OptimizerState);
        CHECK(tag.flags == kTagWeak);
        CHECK(reader.string(tag.string_id) == "exp_avg of layers.0.attn.qkv.weight");
        CHECK(events[3].kind == EventKind::Free);
        CHECK(events[4].value == ~0ull);
        for (std::size_t i = 0; i < events.size(); ++i) CHECK(events[i].seq == i);
        for (std::size_t i = 1; i < events.size(); ++i) {
          if (events[i].kind != EventKind::String && events[i].kind != EventKind::Metadata &&
              events[i - 1].kind != EventKind::String && events[i - 1].kind != EventKind::Metadata)
            CHECK(events[i].time_ns >= events[i - 1].time_ns);
        }
      }
    }
  }
}

SCENARIO("a trace cut short keeps its readable prefix and names the offset", "[core][trace]") {
  GIVEN("a trace of many chunks, as a long run writes") {
    TempPath path;
    {
      RecorderOptions small;
      small.chunk_bytes = 512;  // many chunks
      Recorder rec(path.str(), small);
      for (std::uint64_t i = 0; i < 2000; ++i) {
        Event e;
        e.kind = EventKind::Alloc;
        e.addr = 0x1000 + 64 * i;
        e.bytes = e.requested_bytes = 64;
        rec.record(e);
      }
    }
    const std::string full = read_all(path.str());
    const std::vector<ChunkSpan> chunks = chunks_of(full);
    REQUIRE(chunks.size() >= 10);
    REQUIRE(records_before(chunks, chunks.size()) == 2000);
    WHEN("the file ends in the middle of its last chunk's payload (killed mid-write)") {
      const ChunkSpan last = chunks.back();
      REQUIRE(last.length >= 2);
      write_all(path.str(), full.substr(0, last.offset + trace_format::kChunkHeaderBytes + last.length / 2));
      TraceReader reader(path.str());
      auto events = read_events(reader);
      THEN("every whole chunk is read and the torn one is reported with its offset") {
        CHECK(reader.truncated());
        CHECK(events.size() == records_before(chunks, chunks.size() - 1));
        CHECK(reader.truncated_at() == last.offset);
        CHECK_THAT(reader.problem(), Catch::Matchers::Contains("trace ends inside the chunk at byte offset " +
                                                               std::to_string(last.offset)));
        for (std::size_t i = 0; i < events.size(); ++i) CHECK(events[i].addr == 0x1000 + 64 * i);
      }
    }
    WHEN("a payload byte of the middle chunk is flipped") {
      const std::size_t middle = chunks.size() / 2;
      const ChunkSpan damaged = chunks[middle];
      std::string bad = full;
      bad[damaged.offset + trace_format::kChunkHeaderBytes + damaged.length / 2] ^= 0x5A;
      write_all(path.str(), bad);
      TraceReader reader(path.str());
      auto events = read_events(reader);
      THEN("the reader keeps the chunks before it and stops there with a checksum message") {
        CHECK(reader.truncated());
        CHECK(reader.truncated_at() == damaged.offset);
        CHECK_THAT(reader.problem(), Catch::Matchers::Contains("checksum mismatch in the chunk at byte offset " +
                                                               std::to_string(damaged.offset)));
        CHECK(events.size() == records_before(chunks, middle));
        for (std::size_t i = 0; i < events.size(); ++i) CHECK(events[i].addr == 0x1000 + 64 * i);
      }
    }
    WHEN("a chunk header claims 2 GB") {
      std::string bad = full;
      detail::put_u32(&bad[trace_format::kFileHeaderBytes + 4], 0x7FFFFFFFu);
      write_all(path.str(), bad);
      TraceReader reader(path.str());
      auto events = read_events(reader);
      THEN("nothing is allocated for it and the problem names the limit") {
        CHECK(events.empty());
        CHECK_THAT(reader.problem(), Catch::Matchers::Contains("claims"));
        CHECK(reader.truncated_at() == trace_format::kFileHeaderBytes);
      }
    }
  }
}

SCENARIO("files that are not traces are refused with a clear error", "[core][trace]") {
  TempPath path;
  WHEN("the file is a pickle") {
    write_all(path.str(), std::string("\x80\x04\x95\x00\x00", 5));
    THEN("the error says it is not a trace") {
      CHECK_THROWS_WITH(TraceReader(path.str()), Catch::Matchers::Contains("not a ridgescope trace"));
    }
  }
  WHEN("the file is empty") {
    write_all(path.str(), "");
    THEN("the error says it is not a trace") {
      CHECK_THROWS_AS(TraceReader(path.str()), TraceError);
    }
  }
  WHEN("the file comes from a future format version") {
    std::string header(trace_format::kFileMagic, 8);
    header += std::string("\x09\x00\x00\x00\x00\x00\x00\x00", 8);
    write_all(path.str(), header);
    THEN("the error names both versions") {
      CHECK_THROWS_WITH(TraceReader(path.str()), Catch::Matchers::Contains("version 9"));
    }
  }
  WHEN("the file does not exist") {
    THEN("the error names the path") {
      CHECK_THROWS_WITH(TraceReader("/nonexistent/x.rstrace"), Catch::Matchers::Contains("/nonexistent/x.rstrace"));
    }
  }
}

SCENARIO("records of a kind this version does not know are skipped", "[core][trace]") {
  GIVEN("a chunk holding an untimed kind 99 and a timed kind 40 (+1000 ns) between allocs") {
    TempPath path;
    std::string payload;
    auto alloc = [&](std::uint64_t addr) {
      std::string p;
      detail::put_varint(p, 10);       // dt: +5 ns, zigzag encoded
      detail::put_varint(p, 0);        // device type
      detail::put_varint(p, 0);        // device index + 1
      detail::put_varint(p, addr);
      detail::put_varint(p, 8);
      detail::put_varint(p, 8);
      detail::put_varint(p, 0);
      detail::put_varint(p, 1);
      payload.push_back(1);
      detail::put_varint(payload, p.size());
      payload += p;
    };
    alloc(0x100);
    payload.push_back(99);
    detail::put_varint(payload, 3);
    payload += "xyz";
    payload.push_back(40);
    detail::put_varint(payload, 3);
    detail::put_varint(payload, 2000);  // dt +1000 ns, zigzag: two bytes
    payload += "z";
    alloc(0x200);
    std::string file(trace_format::kFileMagic, 8);
    file += std::string("\x01\x00\x00\x00\x00\x00\x00\x00", 8);
    char header[16];
    detail::put_u32(header, trace_format::kChunkMagic);
    detail::put_u32(header + 4, static_cast<std::uint32_t>(payload.size()));
    detail::put_u32(header + 8, 4);
    detail::put_u32(header + 12, detail::crc32(payload));
    file.append(header, 16);
    file += payload;
    write_all(path.str(), file);
    TraceReader reader(path.str());
    auto events = read_events(reader);
    THEN("both allocs are read, the timed unknown kind still advanced the clock") {
      REQUIRE(events.size() == 2);
      CHECK(events[0].addr == 0x100);
      CHECK(events[1].addr == 0x200);
      CHECK(events[0].time_ns == 5);
      CHECK(events[1].time_ns == 5 + 1000 + 5);
      CHECK(reader.skipped_records() == 2);
      CHECK_FALSE(reader.truncated());
    }
  }
}

SCENARIO("a chunk whose record count disagrees with its contents is corrupt", "[core][trace]") {
  GIVEN("a valid trace whose first chunk header claims one record more than it holds") {
    TempPath path;
    {
      Recorder rec(path.str());
      Event e;
      e.kind = EventKind::Alloc;
      e.addr = 0x10;
      e.bytes = 8;
      rec.record(e);
    }
    std::string data = read_all(path.str());
    const auto records = detail::get_u32(&data[trace_format::kFileHeaderBytes + 8]);
    detail::put_u32(&data[trace_format::kFileHeaderBytes + 8], records + 1);
    write_all(path.str(), data);
    TraceReader reader(path.str());
    auto events = read_events(reader);
    THEN("the reader delivers what is there and reports the disagreement") {
      CHECK(events.size() == records);
      CHECK(reader.truncated());
      CHECK_THAT(reader.problem(), Catch::Matchers::Contains("record count"));
    }
  }
}

SCENARIO("frames and stacks are interned once and read back (format 2)", "[core][trace][sites]") {
  GIVEN("a trace with two allocations at the same site and one with a three-frame stack") {
    TempPath path;
    std::uint32_t user = 0, lib = 0, node = 0, site_stack = 0, deep = 0;
    {
      TraceBuilder t(path.str());
      user = t.python_frame("/home/me/train.py", 10, "train");
      lib = t.python_frame("/site-packages/torch/nn/functional.py", 2100, "linear");
      node = t.frame(FrameKind::Autograd, "", 0, "MmBackward0", "layers.3.mlp.fc1");
      CHECK(t.python_frame("/home/me/train.py", 10, "train") == user);  // the same frame: the same id
      site_stack = t.stack({user});
      deep = t.stack({lib, user, node}, 1);
      CHECK(t.stack({user}) == site_stack);
      t.alloc(0x100, 64, site_stack).alloc(0x200, 64, site_stack).alloc(0x300, 8, deep).alloc(0x400, 8);
      t.close();
    }
    TraceReader reader(path.str());
    std::vector<Event> allocs;
    std::size_t frames = 0, stacks = 0;
    Event e;
    while (reader.next(e)) {
      if (e.kind == EventKind::Alloc) allocs.push_back(e);
      frames += e.kind == EventKind::Frame;
      stacks += e.kind == EventKind::Stack;
    }
    THEN("each distinct frame and stack was written once, before its first use") {
      CHECK(reader.version() == trace_format::kVersion);  // written at the current version
      CHECK(frames == 3);
      CHECK(stacks == 2);
      REQUIRE(allocs.size() == 4);
      CHECK(allocs[0].stack_id == site_stack);
      CHECK(allocs[1].stack_id == site_stack);
      CHECK(allocs[2].stack_id == deep);
      CHECK(allocs[3].stack_id == 0);
    }
    AND_THEN("the tables give every field back") {
      const FrameRecord u = reader.frame(user);
      CHECK(u.kind == FrameKind::Python);
      CHECK(reader.string(u.file_id) == "/home/me/train.py");
      CHECK(u.line == 10);
      CHECK(reader.string(u.function_id) == "train");
      const FrameRecord n = reader.frame(node);
      CHECK(n.kind == FrameKind::Autograd);
      CHECK(reader.string(n.function_id) == "MmBackward0");
      CHECK(reader.string(n.module_id) == "layers.3.mlp.fc1");
      const StackView s = reader.stack(deep);
      REQUIRE(s.size == 3);
      CHECK(s.frames[0] == lib);
      CHECK(s.frames[2] == node);
      CHECK(s.site_frame() == user);
      CHECK(reader.stack(0).size == 0);
      CHECK(reader.stack(999).size == 0);
      CHECK(reader.frame(999).kind == FrameKind::Untracked);
    }
    AND_THEN("a second pass over the file sees the same stacks") {
      reader.rewind();
      while (reader.next(e)) {
      }
      CHECK(reader.stack(deep).size == 3);
      CHECK(reader.stack(deep).site_frame() == user);
    }
  }
}

SCENARIO("a version 1 trace is still read", "[core][trace][sites]") {
  GIVEN("a version 1 file: an alloc with a module context and a trailing byte, and a kind-64 record") {
    TempPath path;
    std::string payload;
    std::string p;
    detail::put_varint(p, 10);  // +5 ns
    detail::put_varint(p, 0);
    detail::put_varint(p, 0);
    detail::put_varint(p, 0x100);
    detail::put_varint(p, 8);
    detail::put_varint(p, 8);
    detail::put_varint(p, 0);
    detail::put_varint(p, 1);
    detail::put_varint(p, 3);   // the module context
    detail::put_varint(p, 77);  // a trailing field version 1 readers ignore
    payload.push_back(1);
    detail::put_varint(payload, p.size());
    payload += p;
    payload.push_back(64);  // in version 1 an unknown untimed kind, not a frame
    detail::put_varint(payload, 2);
    payload += "ab";
    std::string file(trace_format::kFileMagic, 8);
    file += std::string("\x01\x00\x00\x00\x00\x00\x00\x00", 8);
    char header[16];
    detail::put_u32(header, trace_format::kChunkMagic);
    detail::put_u32(header + 4, static_cast<std::uint32_t>(payload.size()));
    detail::put_u32(header + 8, 2);
    detail::put_u32(header + 12, detail::crc32(payload));
    file.append(header, 16);
    file += payload;
    write_all(path.str(), file);
    TraceReader reader(path.str());
    auto events = read_events(reader);
    THEN("the alloc keeps its context, has no stack, and the kind-64 record is skipped") {
      CHECK(reader.version() == 1);
      REQUIRE(events.size() == 1);
      CHECK(events[0].string_id == 3);
      CHECK(events[0].stack_id == 0);
      CHECK(reader.skipped_records() == 1);
      CHECK_FALSE(reader.truncated());
    }
  }
}

SCENARIO("frame and stack ids far past the table are corrupt", "[core][trace][sites]") {
  for (const int kind : {64, 65}) {
    GIVEN("a version 2 file whose " << (kind == 64 ? "frame" : "stack") << " record has id 2^31") {
      TempPath path;
      std::string p;
      detail::put_varint(p, 1u << 31);
      for (int i = 0; i < (kind == 64 ? 5 : 1); ++i) detail::put_varint(p, 0);
      std::string payload(1, static_cast<char>(kind));
      detail::put_varint(payload, p.size());
      payload += p;
      std::string file(trace_format::kFileMagic, 8);
      file += std::string("\x02\x00\x00\x00\x00\x00\x00\x00", 8);
      char header[16];
      detail::put_u32(header, trace_format::kChunkMagic);
      detail::put_u32(header + 4, static_cast<std::uint32_t>(payload.size()));
      detail::put_u32(header + 8, 1);
      detail::put_u32(header + 12, detail::crc32(payload));
      file.append(header, 16);
      file += payload;
      write_all(path.str(), file);
      TraceReader reader(path.str());
      auto events = read_events(reader);
      THEN("the reader stops there without allocating the table, naming the offset") {
        CHECK(events.empty());
        CHECK(reader.truncated());
        CHECK_THAT(reader.problem(), Catch::Matchers::Contains("id out of range at byte offset 32"));
      }
    }
  }
}
