// Specification of ridgescope::Ledger: live blocks, bytes per category, reserved bytes.
#include "catch.h"
#include "ridgescope/ledger.h"

using ridgescope::Category;
using ridgescope::Ledger;
using ridgescope::LiveBlock;

namespace {
LiveBlock block(std::uint64_t bytes, Category c, std::uint64_t id = 0) {
  LiveBlock b;
  b.bytes = b.requested_bytes = bytes;
  b.category = c;
  b.block_id = id;
  return b;
}
}  // namespace

SCENARIO("the ledger keeps exact bytes per category", "[core][ledger]") {
  GIVEN("an empty ledger") {
    Ledger ledger;
    WHEN("a parameter of 4096 bytes and an activation of 1000 bytes become live") {
      ledger.on_alloc(0x1000, block(4096, Category::Parameter));
      ledger.on_alloc(0x9000, block(1000, Category::Activation));
      THEN("live bytes are their sum and each category holds its own") {
        CHECK(ledger.live_bytes() == 5096);
        CHECK(ledger.live_bytes(Category::Parameter) == 4096);
        CHECK(ledger.live_bytes(Category::Activation) == 1000);
        CHECK(ledger.live_blocks() == 2);
        CHECK(ledger.reserved_bytes() == 5096);  // no segments: allocated equals reserved
      }
      AND_WHEN("the activation is freed") {
        auto freed = ledger.on_free(0x9000);
        THEN("the freed block is returned and its bytes leave its category") {
          REQUIRE(freed.has_value());
          CHECK(freed->bytes == 1000);
          CHECK(ledger.live_bytes() == 4096);
          CHECK(ledger.live_bytes(Category::Activation) == 0);
        }
      }
      AND_WHEN("the activation becomes a gradient") {
        REQUIRE(ledger.set_category(0x9000, Category::Gradient, 7));
        THEN("its bytes move between categories and the total is unchanged") {
          CHECK(ledger.live_bytes(Category::Activation) == 0);
          CHECK(ledger.live_bytes(Category::Gradient) == 1000);
          CHECK(ledger.live_bytes() == 5096);
          CHECK(ledger.find(0x9000)->label_id == 7);
        }
      }
    }
  }
}

SCENARIO("inconsistent input is counted and never corrupts the totals", "[core][ledger]") {
  GIVEN("a ledger with one live block") {
    Ledger ledger;
    ledger.on_alloc(0x10, block(100, Category::Temporary));
    WHEN("an unknown address is freed") {
      auto freed = ledger.on_free(0x20);
      THEN("nothing changes but the anomaly count") {
        CHECK_FALSE(freed.has_value());
        CHECK(ledger.live_bytes() == 100);
        CHECK(ledger.anomalies().unknown_frees == 1);
      }
    }
    WHEN("a second alloc arrives at the same address (a missed free)") {
      ledger.on_alloc(0x10, block(300, Category::Activation));
      THEN("the old block is replaced, not double counted") {
        CHECK(ledger.live_bytes() == 300);
        CHECK(ledger.live_bytes(Category::Temporary) == 0);
        CHECK(ledger.live_bytes(Category::Activation) == 300);
        CHECK(ledger.anomalies().replaced_allocs == 1);
      }
    }
    WHEN("an unknown address is tagged") {
      CHECK_FALSE(ledger.set_category(0x30, Category::Gradient, 0));
      THEN("it is counted") { CHECK(ledger.anomalies().unknown_tags == 1); }
    }
  }
}

SCENARIO("segments make reserved bytes differ from live bytes", "[core][ledger]") {
  GIVEN("a 2 MiB segment holding one 512-byte block") {
    Ledger ledger;
    ledger.on_segment_alloc(0x7000000, 2 * 1024 * 1024);
    ledger.on_alloc(0x7000000, block(512, Category::Activation));
    THEN("reserved is the segment and live is the block") {
      CHECK(ledger.reserved_bytes() == 2 * 1024 * 1024);
      CHECK(ledger.live_bytes() == 512);
    }
    WHEN("the segment is released") {
      ledger.on_free(0x7000000);
      ledger.on_segment_free(0x7000000);
      THEN("reserved returns to zero") { CHECK(ledger.reserved_bytes() == 0); }
    }
  }
}
