// Specification of PageArena and InternTable (csrc/core/util/page_arena.h): memory for the
// session's own tables, from page mappings, never from the C heap.
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "catch.h"
#include "page_arena.h"

using ridgescope::detail::ArenaHashMap;
using ridgescope::detail::InternTable;
using ridgescope::detail::PageArena;

SCENARIO("a page arena hands out aligned, separate memory and gives it all back at once", "[util][arena]") {
  GIVEN("an empty arena") {
    PageArena arena;
    THEN("it holds no pages") { CHECK(arena.mapped_bytes() == 0); }
    WHEN("1,000 blocks of 1 to 300 bytes are taken, aligned to 1 to 64 bytes") {
      std::vector<std::pair<char*, std::size_t>> blocks;
      for (std::size_t i = 0; i < 1000; ++i) {
        const std::size_t bytes = 1 + (i * 37) % 300;
        const std::size_t align = std::size_t{1} << (i % 7);
        auto* p = static_cast<char*>(arena.allocate(bytes, align));
        CHECK(reinterpret_cast<std::uintptr_t>(p) % align == 0);
        std::memset(p, static_cast<int>(i & 0xFF), bytes);
        blocks.emplace_back(p, bytes);
      }
      THEN("no two blocks overlap, each keeps what was written to it") {
        std::set<std::pair<char*, std::size_t>> sorted(blocks.begin(), blocks.end());
        char* end = nullptr;
        for (const auto& [p, n] : sorted) {
          CHECK(p >= end);
          end = p + n;
        }
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          CHECK(static_cast<unsigned char>(blocks[i].first[blocks[i].second - 1]) == (i & 0xFF));
        }
      }
      THEN("the pages come in a few growing blocks of whole pages") {
        CHECK(arena.mapped_bytes() % 4096 == 0);
        CHECK(arena.mapped_bytes() >= 1000);
        CHECK(arena.mapped_bytes() <= PageArena::kFirstBlockBytes * 8);
      }
      AND_WHEN("it is released") {
        arena.release();
        THEN("it holds no pages, and can be used again") {
          CHECK(arena.mapped_bytes() == 0);
          CHECK(arena.allocate(10, 8) != nullptr);
        }
      }
    }
    WHEN("one block larger than the largest block size is taken") {
      auto* p = static_cast<char*>(arena.allocate(10u << 20, 64));
      p[(10u << 20) - 1] = 1;
      THEN("it gets a mapping of its own") { CHECK(arena.mapped_bytes() >= (10u << 20)); }
    }
  }
#if defined(__GLIBC__)
  GIVEN("glibc's count of the C heap's bytes in use") {
    PageArena arena;
    WHEN("the arena gives out 2 MiB in blocks of 56 bytes (an interned string's size)") {
      const struct mallinfo2 before = mallinfo2();
      std::size_t given = 0;
      for (int i = 0; i < 2 * 1024 * 1024 / 56; ++i) given += arena.allocate(56, 8) != nullptr ? 56 : 0;
      const struct mallinfo2 after = mallinfo2();
      REQUIRE(given >= 2 * 1024 * 1024 - 56);
      THEN("not one byte of it came from the C heap") {
        CHECK(after.uordblks == before.uordblks);
        CHECK(after.hblkhd == before.hblkhd);
      }
    }
  }
#endif
}

SCENARIO("an intern table maps text to the number it was added with, in its own pages", "[util][arena]") {
  GIVEN("a table with 10,000 texts of 1 to 200 bytes") {
    InternTable table;
    std::vector<std::string> texts;
    for (std::uint32_t i = 0; i < 10000; ++i) {
      texts.push_back(std::to_string(i) + std::string(i % 200, 'x'));
      REQUIRE(table.find(texts.back()) == 0);
      table.add(texts.back(), i + 1);
    }
    THEN("every text finds its number, and an unknown one finds 0") {
      CHECK(table.size() == 10000);
      for (std::uint32_t i = 0; i < 10000; ++i) CHECK(table.find(texts[i]) == i + 1);
      CHECK(table.find("not added") == 0);
      CHECK(table.find("") == 0);
    }
    THEN("the table keeps its own copy of each text") {
      const std::string first = texts[5];
      texts[5].assign(texts[5].size(), '?');
      CHECK(table.find(first) == 6);
      CHECK(table.find(texts[5]) == 0);
    }
    THEN("its pages are about the texts and table it holds, not more than twice that") {
      std::uint64_t text_bytes = 0;
      for (const auto& t : texts) text_bytes += t.size();
      CHECK(table.mapped_bytes() >= text_bytes);
      CHECK(table.mapped_bytes() < 2 * (text_bytes + 10000 * 32) + 8 * PageArena::kFirstBlockBytes);
    }
  }
  GIVEN("a hash map in an arena") {
    PageArena arena;
    ArenaHashMap<std::uint64_t, std::uint32_t> map(&arena);
    WHEN("it grows to 100,000 entries") {
      for (std::uint32_t i = 0; i < 100000; ++i) map[std::uint64_t{i} * 7919] = i;
      THEN("every entry is found, and its table is in the arena") {
        for (std::uint32_t i = 0; i < 100000; i += 997) CHECK(map.at(std::uint64_t{i} * 7919) == i);
        CHECK(arena.mapped_bytes() >= 100000 * 12);
      }
    }
  }
}
