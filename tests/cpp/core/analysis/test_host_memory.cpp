// Specification of the host's three layers (ridgescope/host_memory.h): reading
// /proc/self/status, and splitting a reading into PyTorch, the C allocator's slack and
// everything else, with everything else itemised. The readings are plain numbers, so every
// figure is exact.
#include <cstdint>
#include <string>

#include "catch.h"
#include "ridgescope/host_memory.h"

using namespace ridgescope;

namespace {
constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;

// The head of a real /proc/self/status (Linux 6.x), recorded from `cat /proc/self/status`.
const char* kStatus =
    "Name:\tpython\nUmask:\t0022\nState:\tR (running)\nTgid:\t23056\nPid:\t23056\n"
    "VmPeak:\t    3060 kB\nVmSize:\t    3060 kB\nVmLck:\t       0 kB\nVmHWM:\t  812340 kB\n"
    "VmRSS:\t  812340 kB\nRssAnon:\t  501200 kB\nRssFile:\t  300100 kB\nRssShmem:\t   11040 kB\n"
    "VmData:\t     360 kB\nVmSwap:\t       0 kB\nThreads:\t9\n";
}  // namespace

SCENARIO("/proc/self/status gives the resident set and its three kinds of pages", "[core][host]") {
  GIVEN("a recorded status text") {
    const ProcStatus s = parse_proc_status(kStatus);
    THEN("VmRSS and the split counters are read, kB being KiB") {
      CHECK(s.ok);
      CHECK(s.resident == 812340 * KiB);
      CHECK(s.anon == 501200 * KiB);
      CHECK(s.file == 300100 * KiB);
      CHECK(s.shmem == 11040 * KiB);
      CHECK(s.anon + s.file + s.shmem == s.resident);  // the kernel's own identity
    }
  }
  GIVEN("a kernel without the split counters (before Linux 4.5), and texts that are not status files") {
    THEN("the resident set alone, or nothing") {
      const ProcStatus old = parse_proc_status("VmRSS:\t 2048 kB\nVmData:\t 10 kB\n");
      CHECK(old.ok);
      CHECK(old.resident == 2 * MiB);
      CHECK(old.anon == 0);
      CHECK_FALSE(parse_proc_status("").ok);
      CHECK_FALSE(parse_proc_status("VmRSS:\tlots kB\n").ok);
      CHECK_FALSE(parse_proc_status("VmRSS:\t99999999999999999999999 kB").ok);  // overflow refused
      // Two of the three split counters are as good as none.
      CHECK(parse_proc_status("VmRSS: 8 kB\nRssAnon: 4 kB\nRssFile: 4 kB\n").anon == 0);
    }
  }
}

SCENARIO("/proc/self/statm stands in for the status file while the shared pages stay put", "[core][host]") {
  GIVEN("a statm text, and the last status reading (anon 500 MiB, file 290 MiB, shmem 10 MiB)") {
    // 4 KiB pages: 205,000 resident (about 801 MiB), 76,800 shared (300 MiB: 290 file + 10 shmem).
    const ProcStatm m = parse_proc_statm("1234567 205000 76800 1000 0 300000 0\n");
    ProcStatus last;
    last.ok = true;
    last.resident = 800 * MiB;
    last.anon = 500 * MiB;
    last.file = 290 * MiB;
    last.shmem = 10 * MiB;
    THEN("statm's resident and shared pages are read") {
      CHECK(m.ok);
      CHECK(m.resident_pages == 205000);
      CHECK(m.shared_pages == 76800);
    }
    WHEN("the shared part is still file + shmem of the last status reading") {
      bool needed = true;
      const ProcStatus s = status_from_statm(m, last, 4096, &needed);
      THEN("the split is the last one's files and shared memory, and anonymous is the rest") {
        CHECK_FALSE(needed);
        CHECK(s.ok);
        CHECK(s.resident == 205000u * 4096u);
        CHECK(s.file == 290 * MiB);
        CHECK(s.shmem == 10 * MiB);
        CHECK(s.anon == 205000u * 4096u - 300 * MiB);
        CHECK(s.anon + s.file + s.shmem == s.resident);
      }
    }
    WHEN("a file was mapped since (the shared part moved by one page)") {
      bool needed = false;
      const ProcStatus s = status_from_statm(parse_proc_statm("1 205001 76801 0 0 0 0"), last, 4096, &needed);
      THEN("the status file must be read") {
        CHECK(needed);
        CHECK_FALSE(s.ok);
      }
    }
    WHEN("the last status reading had no split (a kernel before 4.5), or there was none") {
      ProcStatus old;
      old.ok = true;
      old.resident = 800 * MiB;
      bool a = false, b = false;
      status_from_statm(m, old, 4096, &a);
      status_from_statm(m, ProcStatus{}, 4096, &b);
      THEN("the status file is read every time") {
        CHECK(a);
        CHECK(b);
      }
    }
  }
  GIVEN("texts that are not statm files") {
    THEN("they are refused") {
      CHECK_FALSE(parse_proc_statm("").ok);
      CHECK_FALSE(parse_proc_statm("12 34").ok);
      CHECK_FALSE(parse_proc_statm("a b c").ok);
      CHECK_FALSE(parse_proc_statm("10 5 6 0 0 0 0").ok);  // shared above resident
      CHECK_FALSE(parse_proc_statm("1 99999999999999999999999 2").ok);
      bool needed = false;
      CHECK_FALSE(status_from_statm(ProcStatm{}, ProcStatus{true, 8 * MiB, 4 * MiB, 4 * MiB, 0}, 4096, &needed).ok);
      CHECK(needed);
    }
  }
}

SCENARIO("a reading splits into PyTorch, the allocator's slack and everything else", "[core][host]") {
  GIVEN("800 MiB resident (500 anonymous, 290 file, 10 shared), torch's blocks of 300 MiB of which "
        "260 MiB resident, glibc holding 420 MiB in use and 30 MiB free") {
    HostReading r;
    r.resident = 800 * MiB;
    r.rss_anon = 500 * MiB;
    r.rss_file = 290 * MiB;
    r.rss_shmem = 10 * MiB;
    r.torch_allocated = 300 * MiB;
    r.torch_resident = 260 * MiB;
    r.malloc_in_use = 420 * MiB;
    r.malloc_free = 30 * MiB;
    const HostLayers l = decompose_host_memory(r);
    THEN("PyTorch is its resident part, and the untouched 40 MiB are not in the resident set") {
      CHECK(l.pytorch == 260 * MiB);
      CHECK(l.untouched == 40 * MiB);
      CHECK(l.residency_known);
    }
    THEN("the slack is glibc's free bytes, and everything else is the rest") {
      CHECK(l.slack == 30 * MiB);
      CHECK(l.outside == 510 * MiB);
      CHECK(l.pytorch + l.slack + l.outside == l.resident);
    }
    THEN("everything else is files, shared memory, other heap users and a named remainder") {
      CHECK(l.files == 290 * MiB);
      CHECK(l.shared_memory == 10 * MiB);
      CHECK(l.other_heap == 120 * MiB);  // 420 in use - torch's 300
      CHECK(l.remainder == static_cast<std::int64_t>(90 * MiB));
      CHECK(l.files + l.shared_memory + l.other_heap + static_cast<std::uint64_t>(l.remainder) == l.outside);
      CHECK_FALSE(l.malloc_misses_torch);
    }
  }
  GIVEN("glibc's free bytes larger than the anonymous memory torch does not hold") {
    HostReading r;
    r.resident = 100 * MiB;
    r.rss_anon = 60 * MiB;
    r.rss_file = 40 * MiB;
    r.rss_shmem = 0;
    r.torch_allocated = 50 * MiB;
    r.torch_resident = 50 * MiB;
    r.malloc_in_use = 55 * MiB;
    r.malloc_free = 30 * MiB;  // most of it never written, so not resident
    const HostLayers l = decompose_host_memory(r);
    THEN("the slack is capped at what anonymous memory is left, and no layer goes negative") {
      CHECK(l.slack == 10 * MiB);
      CHECK(l.outside == 40 * MiB);
      CHECK(l.files == 40 * MiB);
      CHECK(l.other_heap == 5 * MiB);
      CHECK(l.remainder == -static_cast<std::int64_t>(5 * MiB));  // signed: other heap pages never written
    }
  }
  GIVEN("another malloc (jemalloc) serving torch: glibc's in-use bytes below torch's blocks") {
    HostReading r;
    r.resident = 100 * MiB;
    r.torch_allocated = 50 * MiB;
    r.torch_resident = 40 * MiB;
    r.malloc_in_use = 2 * MiB;
    r.malloc_free = 1 * MiB;
    const HostLayers l = decompose_host_memory(r);
    THEN("it says so, and the other heap is not made up") {
      CHECK(l.malloc_misses_torch);
      CHECK(l.other_heap == 0);
      CHECK_FALSE(l.split_known);
      CHECK(l.outside == 59 * MiB);
      CHECK(l.remainder == static_cast<std::int64_t>(59 * MiB));
    }
  }
  GIVEN("a reading without mincore or glibc's counters") {
    HostReading r;
    r.resident = 10 * MiB;
    r.torch_allocated = 12 * MiB;  // more than is resident: pages never written
    const HostLayers l = decompose_host_memory(r);
    THEN("PyTorch is its live bytes capped at the resident set, and nothing is made up") {
      CHECK_FALSE(l.residency_known);
      CHECK_FALSE(l.malloc_known);
      CHECK(l.pytorch == 10 * MiB);
      CHECK(l.slack == 0);
      CHECK(l.outside == 0);
    }
  }
}

SCENARIO("a time budget lets a part run while under its allowance, then within its share of the time",
         "[core][analysis][host]") {
  namespace b = host_budget;
  GIVEN("the readings' budget past their first phase ends: 1/1000 of the time since the first reading") {
    THEN("they run only while their cost is at most a thousandth of the elapsed time") {
      CHECK(b::within(3000000, 0, b::kReadingBudget, 3000000000));
      CHECK_FALSE(b::within(3000000, 0, b::kReadingBudget, 2999999999));
    }
  }
  GIVEN("mallinfo2's budget: 1 ms of allowance, then 1/2000") {
    CHECK(b::within(999999, b::kMallocAllowanceNs, b::kMallocBudget, 0));  // however little time passed
    CHECK(b::within(1000000, b::kMallocAllowanceNs, b::kMallocBudget, 2000000000));
    CHECK_FALSE(b::within(1000000, b::kMallocAllowanceNs, b::kMallocBudget, 1999999999));
  }
}
