// Specification of ridgescope::Recorder: streaming, bounded, never throwing.
#include <chrono>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <dirent.h>
#include <sched.h>

#include <fstream>
#include <string>
#endif

#include "catch.h"
#include "ridgescope/recorder.h"
#include "ridgescope/trace_reader.h"
#include "trace_builder.h"

using namespace ridgescope;
using ridgescope::testing::TempPath;

namespace {
Event alloc_event(std::uint64_t addr, std::uint64_t bytes) {
  Event e;
  e.kind = EventKind::Alloc;
  e.addr = addr;
  e.bytes = e.requested_bytes = bytes;
  return e;
}
// Small chunks and a short queue, so that a test fills the queue in a few thousand events.
RecorderOptions small_chunks(std::uint32_t chunk_bytes, std::uint32_t max_queued_chunks) {
  RecorderOptions options;
  options.chunk_bytes = chunk_bytes;
  options.max_queued_chunks = max_queued_chunks;
  return options;
}
std::size_t count_events(const std::string& path) {
  TraceReader reader(path);
  Event e;
  std::size_t n = 0;
  while (reader.next(e)) ++n;
  return n;
}
}  // namespace

SCENARIO("a running recorder leaves a readable file behind it", "[core][recorder]") {
  GIVEN("a recorder that has recorded 10 events and is still open") {
    TempPath path;
    RecorderOptions options;
    options.flush_interval_ms = 20;
    Recorder rec(path.str(), options);
    for (int i = 0; i < 10; ++i) rec.record(alloc_event(0x100 + 16 * i, 16));
    WHEN("the background writer's flush interval passes, with no flush() or close()") {
      // The writer writes a partial chunk once its oldest record is 20 ms old. When exactly
      // that happens depends on the scheduler (a loaded machine can delay the writer thread
      // far beyond the interval), so wait for the file to show the events; the 30 s bound
      // only catches a writer that never flushes on its own.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      std::size_t seen = count_events(path.str());
      while (seen < 10 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        seen = count_events(path.str());
      }
      THEN("another reader sees all 10 events, as it would if the process were killed now") {
        CHECK(seen == 10);
        CHECK(rec.stats().chunks_written >= 1);
      }
    }
  }
}

SCENARIO("the recorder's memory is bounded by its queue, not by the run", "[core][recorder]") {
  GIVEN("a recorder with 4 KiB chunks and a queue of 4 chunks") {
    TempPath path;
    Recorder rec(path.str(), small_chunks(4096, 4));
    WHEN("200,000 events are recorded from two threads") {
      auto work = [&rec](std::uint64_t base) {
        for (std::uint64_t i = 0; i < 100000; ++i) rec.record(alloc_event(base + 64 * i, 64));
      };
      std::thread a(work, 0x10000000), b(work, 0x90000000);
      a.join();
      b.join();
      rec.close();
      THEN("every event is on disk and the buffer never held more than a few chunks") {
        CHECK(count_events(path.str()) == 200000);
        CHECK(rec.stats().events == 200000);
        CHECK(rec.stats().dropped_events == 0);
        // The buffers that can exist at once: the queue's limit plus one hand-off per
        // recording thread (each appends before it waits for room), the chunk being written
        // and the one being filled. A written buffer kept for the next hand-off is one of
        // these, reused, not one more: a buffer is made only when none is kept.
        CHECK(rec.stats().buffer_bytes_peak <= (4 + 2 + 1 + 1) * (4096 + 1024));
      }
    }
  }
}

SCENARIO("a closed recorder gives its chunk buffers back", "[core][recorder]") {
  GIVEN("a recorder with 4 KiB chunks that recorded 10,000 events (about 40 chunks)") {
    TempPath path;
    Recorder rec(path.str(), small_chunks(4096, 4));
    for (std::uint64_t i = 0; i < 10000; ++i) rec.record(alloc_event(0x1000 + 64 * i, 64));
    THEN("while it records it holds at least the chunk being filled") {
      CHECK(rec.stats().buffer_bytes >= 4096);
      CHECK(rec.stats().buffer_bytes <= rec.stats().buffer_bytes_peak);
    }
    WHEN("it is closed") {
      rec.close();
      THEN("every event is on disk and it holds no buffer, while its peak stays reported") {
        CHECK(count_events(path.str()) == 10000);
        CHECK(rec.stats().dropped_events == 0);
        CHECK(rec.stats().buffer_bytes == 0);
        CHECK(rec.stats().buffer_bytes_peak >= 4096);
      }
      AND_WHEN("an event comes after the close") {
        rec.record(alloc_event(0x5000000, 64));
        THEN("it is refused and counted as dropped, and no buffer is made for it") {
          CHECK(rec.stats().dropped_events == 1);
          CHECK(rec.stats().buffer_bytes == 0);
          CHECK(count_events(path.str()) == 10000);
        }
      }
    }
  }
}

SCENARIO("a record longer than the room left in its chunk counts in the buffers' peak",
         "[core][recorder]") {
  GIVEN("a recorder with 4 KiB chunks whose writer writes nothing, holding one small event") {
    TempPath path;
    Recorder rec(path.str(), small_chunks(4096, 4));
    rec.pause_writer_for_testing();
    rec.record(alloc_event(0x1000, 64));
    const std::uint64_t before = rec.stats().buffer_bytes_peak;
    WHEN("a 64 KiB metadata record is appended to that chunk (which has room for 5 KiB)") {
      rec.metadata("big", "\"" + std::string(64 * 1024, 'x') + "\"");
      const RecorderStats during = rec.stats();
      THEN("the chunk grew to hold it, and the peak counts the grown buffer before any reading of it") {
        CHECK(before >= 4096);
        CHECK(during.dropped_events == 0);
        CHECK(during.buffer_bytes >= 64 * 1024);
        CHECK(during.buffer_bytes_peak >= during.buffer_bytes);
      }
      AND_WHEN("the recorder is closed") {
        rec.close();
        THEN("the peak still reports the grown chunk, and every record is on disk") {
          CHECK(rec.stats().buffer_bytes == 0);
          CHECK(rec.stats().buffer_bytes_peak >= 64 * 1024);
          CHECK(count_events(path.str()) == 3);  // the event, the key's string, the metadata
        }
      }
    }
  }
}

SCENARIO("a writer that gets no CPU time delays the file but never stalls recording",
         "[core][recorder]") {
  GIVEN("a recorder with 1 KiB chunks and a queue of 2 whose writer thread writes nothing") {
    TempPath path;
    Recorder rec(path.str(), small_chunks(1024, 2));
    rec.pause_writer_for_testing();  // as an idle-class writer on a machine with no idle time
    WHEN("5,000 events (about 40 chunks) are recorded, then flushed") {
      for (std::uint64_t i = 0; i < 5000; ++i) rec.record(alloc_event(0x1000 + 64 * i, 64));
      rec.flush();
      THEN("the recording thread wrote the chunks itself: all of them are on disk, none dropped") {
        CHECK(count_events(path.str()) == 5000);
        CHECK(rec.stats().chunks_written >= 30);
        CHECK(rec.stats().dropped_events == 0);
        // The queue's limit, this thread's hand-off, the one written and the one filled.
        CHECK(rec.stats().buffer_bytes_peak <= (2 + 1 + 1 + 1) * (1024 + 1024));
      }
      AND_WHEN("more events come and the recorder is closed") {
        for (std::uint64_t i = 0; i < 700; ++i) rec.record(alloc_event(0x900000 + 64 * i, 64));
        rec.close();
        THEN("close() wrote what was left: every event is in the file, in order") {
          TraceReader reader(path.str());
          Event e;
          std::uint64_t n = 0, last_time = 0;
          bool ordered = true;
          while (reader.next(e)) {
            ordered = ordered && e.time_ns >= last_time;
            last_time = e.time_ns;
            ++n;
          }
          CHECK(n == 5700);
          CHECK(ordered);
          CHECK(rec.stats().dropped_events == 0);
        }
      }
    }
  }
}

#if defined(__linux__)
SCENARIO("an idle writer runs at the idle scheduling class, a default one at the normal class",
         "[core][recorder]") {
  auto policy_of = [](Recorder& rec) {
    // The writer thread sets its class as it starts; wait for it to have started.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    int policy = rec.writer_policy();
    while (policy == -1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      policy = rec.writer_policy();
    }
    return policy;
  };
  GIVEN("a recorder made with idle_writer, and one made without") {
    TempPath idle_path, normal_path;
    RecorderOptions idle;
    idle.idle_writer = true;
    Recorder idle_rec(idle_path.str(), idle);
    Recorder normal_rec(normal_path.str());
    THEN("their writers' classes are SCHED_IDLE and SCHED_OTHER, and both write every event") {
      CHECK(policy_of(idle_rec) == SCHED_IDLE);
      CHECK(policy_of(normal_rec) == SCHED_OTHER);
      for (int i = 0; i < 100; ++i) idle_rec.record(alloc_event(0x100 + 16 * i, 16));
      idle_rec.close();
      normal_rec.close();
      CHECK(count_events(idle_path.str()) == 100);
      CHECK(idle_rec.stats().dropped_events == 0);
    }
  }
}
#endif

#if defined(__linux__)
namespace {
// How many threads of this process are named `name` now (/proc/self/task/*/comm).
int threads_named(const std::string& name) {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + entry->d_name + "/comm");
    std::string text;
    if (std::getline(comm, text) && text == name) ++n;
  }
  closedir(dir);
  return n;
}
}  // namespace

SCENARIO("the writer thread is named, and gone once the recorder is closed", "[core][recorder]") {
  const std::string name = Recorder::kWriterThreadName;
  REQUIRE(name.size() <= 15);  // the kernel's limit for a thread's name
  GIVEN("no recorder") {
    const int before = threads_named(name);
    REQUIRE(before >= 0);
    WHEN("one is made and its writer has started") {
      TempPath path;
      Recorder rec(path.str());
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (rec.writer_policy() == -1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      THEN("exactly one more thread carries the writer's name, and none after close()") {
        const auto named_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (threads_named(name) == before && std::chrono::steady_clock::now() < named_deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        CHECK(threads_named(name) == before + 1);
        rec.close();
        CHECK(threads_named(name) == before);
      }
    }
  }
}
#endif

SCENARIO("a write failure stops recording without throwing", "[core][recorder]") {
  GIVEN("a recorder whose next write fails as a full disk would") {
    TempPath path;
    RecorderOptions options;
    options.chunk_bytes = 1024;
    Recorder rec(path.str(), options);
    rec.inject_write_failure();
    WHEN("events keep arriving") {
      for (int i = 0; i < 1000; ++i) rec.record(alloc_event(0x100 + 16 * i, 16));
      rec.flush();
      THEN("the recorder reports the failure and counts every event as dropped") {
        CHECK(rec.failed());
        CHECK_THAT(rec.error(), Catch::Matchers::Contains("injected write failure"));
        // The very first chunk write failed, so no event reached the file: the failing chunk,
        // the ones queued behind it and the ones refused afterwards are all counted.
        CHECK(rec.stats().dropped_events == 1000);
        CHECK(rec.stats().chunks_written == 0);
        rec.close();
        CHECK(count_events(path.str()) == 0);
      }
    }
  }
}

SCENARIO("an unwritable path is refused at construction", "[core][recorder]") {
  CHECK_THROWS_WITH(Recorder("/nonexistent-dir/run.rstrace"),
                    Catch::Matchers::Contains("/nonexistent-dir/run.rstrace"));
}

SCENARIO("strings are interned once", "[core][recorder]") {
  TempPath path;
  Recorder rec(path.str());
  const auto a = rec.intern("forward");
  const auto b = rec.intern("backward");
  CHECK(a != 0);
  CHECK(b != a);
  CHECK(rec.intern("forward") == a);
  CHECK(rec.intern("") == 0);
  rec.close();
  CHECK(count_events(path.str()) == 2);
}

SCENARIO("a metadata text too large for any chunk is dropped, not written", "[core][recorder]") {
  TempPath path;
  Recorder rec(path.str());
  rec.metadata("big", std::string(Recorder::kMaxRecordBytes + 1, 'x'));
  rec.record(alloc_event(0x100, 8));
  rec.close();
  CHECK(rec.stats().dropped_events == 1);
  CHECK(count_events(path.str()) == 2);  // the key's string and the alloc
}
