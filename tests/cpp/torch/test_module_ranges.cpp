// Specification of ModuleRanges (csrc/torch/site_capture.h): which module's forward created an
// autograd node, from the sequence numbers autograd hands out on a thread, and how the calls of
// past steps are forgotten so that a long run's memory stays flat. The nodes are simulated by
// taking sequence numbers the way autograd does when it creates one
// (at::sequence_number::get_and_increment).
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <vector>

#include "catch.h"
#include "site_capture.h"

using ridgescope::sources::ModuleRanges;

namespace {

// One module call that creates one autograd node; returns the node's sequence number.
std::uint64_t call_creating_a_node(ModuleRanges& ranges, std::uint32_t module_id) {
  ranges.enter(module_id);
  const std::uint64_t seq = at::sequence_number::get_and_increment();
  ranges.exit();
  return seq;
}

}  // namespace

SCENARIO("module calls are forgotten one step after the step they ran in", "[torch][sites]") {
  const std::uint64_t thread = at::RecordFunction::currentThreadId();
  GIVEN("the forward of module 1 in step 0, and of module 2 in step 1") {
    ModuleRanges ranges;
    const std::uint64_t a = call_creating_a_node(ranges, 1);
    ranges.on_step();  // step 0 ends
    const std::uint64_t b = call_creating_a_node(ranges, 2);
    THEN("before step 1 ends both nodes name their module") {
      CHECK(ranges.module_of(thread, a) == 1);
      CHECK(ranges.module_of(thread, b) == 2);
    }
    WHEN("step 1 ends") {
      ranges.on_step();
      THEN("step 0's call is forgotten and step 1's is still known") {
        CHECK(ranges.module_of(thread, a) == 0);
        CHECK(ranges.module_of(thread, b) == 2);
      }
      AND_WHEN("step 2 runs module 3 and ends") {
        const std::uint64_t c = call_creating_a_node(ranges, 3);
        ranges.on_step();
        THEN("only step 2's call is known") {
          CHECK(ranges.module_of(thread, b) == 0);
          CHECK(ranges.module_of(thread, c) == 3);
        }
      }
    }
    THEN("another thread's sequence numbers name no module") { CHECK(ranges.module_of(thread + 1, b) == 0); }
  }
  GIVEN("10,000 steps of one call each") {
    ModuleRanges ranges;
    const std::uint64_t first = call_creating_a_node(ranges, 7);
    ranges.on_step();
    std::uint64_t last = 0;
    for (std::uint32_t step = 1; step < 10000; ++step) {
      last = call_creating_a_node(ranges, 100 + step);
      ranges.on_step();
    }
    THEN("the first step's call is forgotten long before the bound of kMaxCalls, the last one known") {
      CHECK(ranges.module_of(thread, first) == 0);
      CHECK(ranges.module_of(thread, last) == 100 + 9999);
    }
  }
}

SCENARIO("many calls a step: the last two steps' calls stay exact, older ones are forgotten",
         "[torch][sites]") {
  const std::uint64_t thread = at::RecordFunction::currentThreadId();
  GIVEN("50 steps of 100 module calls each (module step * 1000 + call)") {
    ModuleRanges ranges;
    std::vector<std::vector<std::uint64_t>> nodes(50);
    for (std::uint32_t step = 0; step < 50; ++step) {
      for (std::uint32_t call = 0; call < 100; ++call) {
        nodes[step].push_back(call_creating_a_node(ranges, step * 1000 + call));
      }
      if (step < 49) ranges.on_step();
    }
    THEN("every node of the last two steps names its module, and older ones none") {
      for (std::uint32_t step : {48u, 49u}) {
        for (std::uint32_t call = 0; call < 100; ++call) {
          CHECK(ranges.module_of(thread, nodes[step][call]) == step * 1000 + call);
        }
      }
      CHECK(ranges.module_of(thread, nodes[47][99]) == 0);
      CHECK(ranges.module_of(thread, nodes[0][0]) == 0);
    }
  }
}

SCENARIO("a module call still open at a step's end is kept, with the calls inside it", "[torch][sites]") {
  const std::uint64_t thread = at::RecordFunction::currentThreadId();
  GIVEN("module 9's call spanning three steps, with a call of module 4 inside it in each") {
    ModuleRanges ranges;
    ranges.enter(9);
    const std::uint64_t outer = at::sequence_number::get_and_increment();
    const std::uint64_t inner0 = call_creating_a_node(ranges, 4);
    ranges.on_step();
    call_creating_a_node(ranges, 4);
    ranges.on_step();
    const std::uint64_t inner2 = call_creating_a_node(ranges, 4);
    ranges.on_step();
    THEN("all of them still name their modules") {
      CHECK(ranges.module_of(thread, outer) == 9);
      CHECK(ranges.module_of(thread, inner0) == 4);
      CHECK(ranges.module_of(thread, inner2) == 4);
    }
    WHEN("the call ends and two steps pass") {
      ranges.exit();
      ranges.on_step();
      ranges.on_step();
      THEN("they are forgotten") {
        CHECK(ranges.module_of(thread, outer) == 0);
        CHECK(ranges.module_of(thread, inner0) == 0);
        CHECK(ranges.module_of(thread, inner2) == 0);
      }
    }
    ranges.exit();  // no-op when already closed; leaves no call open on this thread
  }
}

SCENARIO("a steady run stops allocating: the ring holds a step's calls and no longer grows",
         "[torch][sites]") {
  const std::uint64_t thread = at::RecordFunction::currentThreadId();
  GIVEN("steps of 300 module calls each, nested three deep, after the first two steps") {
    ModuleRanges ranges;
    auto run_step = [&](std::uint32_t step) {
      for (std::uint32_t call = 0; call < 100; ++call) {
        ranges.enter(step * 1000 + call);
        ranges.enter(1);
        call_creating_a_node(ranges, 2);
        ranges.exit();
        ranges.exit();
      }
      ranges.on_step();
    };
    run_step(0);
    run_step(1);
    const std::size_t settled = ranges.capacity(thread);
    WHEN("1,000 more steps run") {
      std::uint64_t last_outer = 0;
      for (std::uint32_t step = 2; step < 1002; ++step) {
        if (step == 1001) {
          ranges.enter(424242);
          last_outer = at::sequence_number::get_and_increment();
          ranges.exit();
        }
        run_step(step);
      }
      THEN("the ring's size never changed, and holds what it must (two steps of 300 calls)") {
        CHECK(settled >= 600);
        CHECK(settled < 2048);
        CHECK(ranges.capacity(thread) == settled);
        CHECK(ranges.module_of(thread, last_outer) == 424242);
      }
    }
  }
  GIVEN("no call on a thread") {
    ModuleRanges ranges;
    THEN("its ring has no room at all") { CHECK(ranges.capacity(thread) == 0); }
  }
}
