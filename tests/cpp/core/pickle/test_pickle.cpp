// Specification of the pickle encoder and the restricted unpickler (csrc/core/pickle_*.h):
// exact opcodes out, plain values back, and every hostile or broken input refused with an
// error that names the problem.
#include <string>

#include "catch.h"
#include "pickle_reader.h"
#include "pickle_writer.h"

using namespace ridgescope::detail;

namespace {
std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

std::string error_of(const std::string& pickle, const PickleLimits& limits = {}) {
  try {
    parse_pickle(pickle, limits);
  } catch (const PickleError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

SCENARIO("the writer emits exactly the opcodes memory_viz's unpickler reads", "[core][pickle]") {
  GIVEN("a dict holding every kind of value") {
    PickleWriter w;
    w.begin_dict();
    w.key("a").integer(1);
    w.key("b").begin_list().none().boolean(true).boolean(false).end_list();
    w.key("t").begin_tuple().integer(0).integer(300).end_tuple();
    w.end_dict();
    w.finish();
    THEN("the bytes are PROTO 4, EMPTY_DICT, one MARK ... SETITEMS batch, and STOP") {
      const std::string expected =
          bytes({0x80, 4, '}', '(', 0x8c, 1, 'a', 'K', 1, 0x8c, 1, 'b', ']', '(', 'N', 0x88, 0x89, 'e', 0x8c, 1, 't',
                 'K', 0, 'M', 0x2c, 0x01, 0x86, 'u', '.'});
      CHECK(w.take() == expected);
    }
  }
  GIVEN("integers at every encoding boundary") {
    struct Case {
      std::int64_t v;
      std::string enc;
    };
    const Case cases[] = {
        {0, bytes({'K', 0})},
        {255, bytes({'K', 0xFF})},
        {256, bytes({'M', 0x00, 0x01})},
        {65535, bytes({'M', 0xFF, 0xFF})},
        {65536, bytes({'J', 0x00, 0x00, 0x01, 0x00})},
        {-1, bytes({'J', 0xFF, 0xFF, 0xFF, 0xFF})},
        {2147483647, bytes({'J', 0xFF, 0xFF, 0xFF, 0x7F})},
        {2147483648LL, bytes({0x8a, 5, 0x00, 0x00, 0x00, 0x80, 0x00})},
        {0x7f0000001000LL, bytes({0x8a, 6, 0x00, 0x10, 0x00, 0x00, 0x00, 0x7f})},
        {-2147483649LL, bytes({0x8a, 5, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF})},
    };
    for (const Case& c : cases) {
      PickleWriter w;
      w.integer(c.v);
      w.finish();
      const std::string out = w.take();
      INFO("value " << c.v);
      CHECK(out == bytes({0x80, 4}) + c.enc + ".");
      const PickleResult r = parse_pickle(out);
      std::int64_t back = 0;
      REQUIRE(r.root.to_int64(&back));
      CHECK(back == c.v);
    }
    THEN("an unsigned 64-bit value above INT64_MAX takes 9 LONG1 bytes and reads back") {
      PickleWriter w;
      w.unsigned_integer(UINT64_MAX);
      w.finish();
      const std::string out = w.take();
      CHECK(out == bytes({0x80, 4, 0x8a, 9, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x00, '.'}));
      std::uint64_t back = 0;
      REQUIRE(parse_pickle(out).root.to_uint64(&back));
      CHECK(back == UINT64_MAX);
    }
  }
  GIVEN("a list of 2500 items and a string of 300 bytes") {
    PickleWriter w;
    w.begin_list();
    for (int i = 0; i < 2500; ++i) w.integer(i % 200);
    w.str(std::string(300, 'x'));
    w.end_list();
    w.finish();
    const std::string out = w.take();
    THEN("items are appended in batches of 1000 (three APPENDS) and the long string is BINUNICODE") {
      std::size_t appends = 0, marks = 0;
      // Count only opcode positions: every item here is BININT1 (2 bytes), so walk the stream.
      std::size_t i = 3;  // after PROTO 4 and EMPTY_LIST
      while (i < out.size()) {
        const auto op = static_cast<unsigned char>(out[i]);
        if (op == '(') { ++marks; i += 1; }
        else if (op == 'e') { ++appends; i += 1; }
        else if (op == 'K') i += 2;
        else if (op == 'X') { CHECK(out.substr(i + 1, 4) == bytes({0x2c, 0x01, 0, 0})); i += 5 + 300; }
        else if (op == '.') { i += 1; }
        else FAIL("unexpected opcode " << pickle_opcode_name(op));
      }
      CHECK(marks == 3);
      CHECK(appends == 3);
      const PickleResult r = parse_pickle(out);
      REQUIRE(r.root.list().size() == 2501);
      CHECK(r.root.list()[2500].str() == std::string(300, 'x'));
    }
  }
  GIVEN("a float") {
    PickleWriter w;
    w.real(1.5);
    w.finish();
    THEN("it is BINFLOAT, big-endian, and reads back exactly") {
      const std::string out = w.take();
      CHECK(out == bytes({0x80, 4, 'G', 0x3F, 0xF8, 0, 0, 0, 0, 0, 0, '.'}));
      CHECK(parse_pickle(out).root.real == 1.5);
    }
  }
  GIVEN("misuse of the writer") {
    PickleWriter w;
    w.begin_dict().key("k");
    THEN("a dict with a key and no value, or an unfinished container, is a logic error") {
      CHECK_THROWS_AS(w.end_dict(), std::logic_error);
      PickleWriter w2;
      w2.begin_list();
      CHECK_THROWS_AS(w2.finish(), std::logic_error);
    }
  }
}

SCENARIO("the reader reads what Python's pickle writes for plain data", "[core][pickle]") {
  GIVEN("pickle.dumps({'a': [1, 'x', None, True, 2.5], 'b': ('x', 'x')}, protocol=4) with memo references") {
    // Python 3.11: FRAME, MEMOIZE after each container and string, BINGET for the repeated 'x'.
    const std::string p = bytes({0x80, 4, 0x95, 0x28, 0, 0, 0, 0, 0, 0, 0, '}', 0x94, '(', 0x8c, 1, 'a', 0x94, ']', 0x94,
                                 '(', 'K', 1, 0x8c, 1, 'x', 0x94, 'N', 0x88, 'G', 0x40, 0x04, 0, 0, 0, 0, 0, 0, 'e',
                                 0x8c, 1, 'b', 0x94, 'h', 3, 'h', 3, 0x86, 0x94, 'u', '.'});
    const PickleResult r = parse_pickle(p);
    THEN("the tree has the same values, and the shared string is read twice") {
      CHECK(r.protocol == 4);
      REQUIRE(r.root.is_dict());
      const PickleValue* a = r.root.get("a");
      REQUIRE(a != nullptr);
      REQUIRE(a->list().size() == 5);
      std::int64_t one = 0;
      CHECK((a->list()[0].to_int64(&one) && one == 1));
      CHECK(a->list()[1].str() == "x");
      CHECK(a->list()[2].type == PickleValue::Type::None);
      CHECK((a->list()[3].type == PickleValue::Type::Bool && a->list()[3].boolean));
      CHECK(a->list()[4].real == 2.5);
      const PickleValue* b = r.root.get("b");
      REQUIRE(b != nullptr);
      CHECK(b->type == PickleValue::Type::Tuple);
      REQUIRE(b->list().size() == 2);
      CHECK(b->list()[1].str() == "x");
    }
  }
}

SCENARIO("the reader reads protocol 5, Python 3.14's default, with bytes, sets and 8-byte lengths", "[core][pickle]") {
  GIVEN("pickle.dumps({'a': [1, 'x', 'x'], 'b': b'\\x00\\x01', 'c': {7}, 'd': frozenset({3}), 'e': bytearray(b'z')}, protocol=5)") {
    // Python 3.11's bytes: FRAME, MEMOIZE, SHORT_BINBYTES, EMPTY_SET + ADDITEMS, FROZENSET, BYTEARRAY8
    const std::string p = bytes({0x80, 5, 0x95, '@', 0, 0, 0, 0, 0, 0, 0, '}', 0x94, '(', 0x8c, 1, 'a', 0x94, ']', 0x94,
                                 '(', 'K', 1, 0x8c, 1, 'x', 0x94, 'h', 3, 'e', 0x8c, 1, 'b', 0x94, 'C', 2, 0, 1, 0x94,
                                 0x8c, 1, 'c', 0x94, 0x8f, 0x94, '(', 'K', 7, 0x90, 0x8c, 1, 'd', 0x94, '(', 'K', 3,
                                 0x91, 0x94, 0x8c, 1, 'e', 0x94, 0x96, 1, 0, 0, 0, 0, 0, 0, 0, 'z', 0x94, 'u', '.'});
    const PickleResult r = parse_pickle(p);
    THEN("every value reads back: bytes as bytes, sets and frozensets as sets of their items") {
      CHECK(r.protocol == 5);
      REQUIRE(r.root.dict().size() == 5);
      REQUIRE(r.root.get("a")->list().size() == 3);
      CHECK(r.root.get("a")->list()[2].str() == "x");
      CHECK(r.root.get("b")->type == PickleValue::Type::Bytes);
      CHECK(r.root.get("b")->bytes() == std::string("\0\1", 2));
      CHECK(r.root.get("b")->str().empty());  // bytes are not text
      REQUIRE(r.root.get("c")->set().size() == 1);
      std::int64_t seven = 0;
      CHECK((r.root.get("c")->set()[0].to_int64(&seven) && seven == 7));
      CHECK(r.root.get("d")->set().size() == 1);
      CHECK(r.root.get("e")->bytes() == "z");
      CHECK(pickle_type_name(r.root.get("c")->type) == "set");
    }
  }
  GIVEN("a BINUNICODE8 string, a BINBYTES8 and a BINBYTES (8- and 4-byte lengths)") {
    const std::string p = bytes({0x80, 5, ']', '(', 0x8d, 3, 0, 0, 0, 0, 0, 0, 0, 'a', 'b', 'c', 0x8e, 1, 0, 0, 0, 0, 0, 0,
                                 0, 'q', 'B', 2, 0, 0, 0, 'r', 's', 'e', '.'});
    const PickleResult r = parse_pickle(p);
    THEN("they read back, and a length past the end is refused before anything is allocated") {
      REQUIRE(r.root.list().size() == 3);
      CHECK(r.root.list()[0].str() == "abc");
      CHECK(r.root.list()[1].bytes() == "q");
      CHECK(r.root.list()[2].bytes() == "rs");
      CHECK(contains(error_of(bytes({0x80, 5, 0x8d, 0, 0, 0, 0, 0, 0, 0, 0x80, '.'})),
                     "string length field claims 9223372036854775808 bytes but only 1 remain"));
      CHECK(contains(error_of(bytes({0x80, 5, 0x96, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '.'})),
                     "bytes length field claims 4294967295 bytes"));
    }
  }
  GIVEN("a set fetched from the memo and added to again (a set that holds itself)") {
    THEN("it is refused as a recursive structure") {
      CHECK(contains(error_of(bytes({0x80, 5, 0x8f, 0x94, '(', 'h', 0, 0x90, '.'})), "ADDITEMS adds to a container already referenced"));
    }
  }
}

SCENARIO("hostile and broken pickles are refused with a clear error", "[core][pickle]") {
  WHEN("the pickle imports a class (GLOBAL) and calls it (REDUCE): os.system('touch x')") {
    const char raw[] = "\x80\x02" "cposix\nsystem\n" "q\x00" "X\x07\x00\x00\x00" "touch x" "\x85" "R.";
    const std::string p(raw, sizeof(raw) - 1);
    THEN("GLOBAL is refused by name, at byte 2") {
      const std::string err = error_of(p);
      CHECK(contains(err, "GLOBAL"));
      CHECK(contains(err, "byte offset 2"));
    }
  }
  WHEN("the pickle uses STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID or EXT1") {
    const std::pair<int, const char*> ops[] = {{0x93, "STACK_GLOBAL"}, {'R', "REDUCE"},    {'b', "BUILD"},
                                               {'i', "INST"},          {'o', "OBJ"},       {0x81, "NEWOBJ"},
                                               {0x92, "NEWOBJ_EX"},    {'P', "PERSID"},    {'Q', "BINPERSID"},
                                               {0x82, "EXT1"}};
    for (const auto& [op, name] : ops) {
      INFO(name);
      const std::string err = error_of(bytes({0x80, 4, ']', op, '.'}));
      CHECK(contains(err, name));
      CHECK(contains(err, "refused"));
    }
  }
  WHEN("the pickle holds a LONG4 or protocol 0/1 text opcodes") {
    for (const auto& [op, name] : std::initializer_list<std::pair<int, const char*>>{
             {0x8b, "LONG4"}, {'U', "SHORT_BINSTRING"}, {'I', "INT"}, {'V', "UNICODE"}}) {
      INFO(name);
      const std::string err = error_of(bytes({0x80, 4, op, 0, '.'}));
      CHECK(contains(err, std::string("refused: opcode ") + name + " is not allowed"));
    }
  }
  WHEN("the pickle uses protocol 5's out-of-band buffers: NEXT_BUFFER, or READONLY_BUFFER after a value") {
    // pickle.dumps([PickleBuffer(b'ab')], protocol=5, buffer_callback=...): the data is not in the file
    const std::string next = bytes({0x80, 5, 0x95, 7, 0, 0, 0, 0, 0, 0, 0, ']', 0x94, '(', 0x97, 0x98, 'e', '.'});
    const std::string readonly = bytes({0x80, 5, ']', 0x98, '.'});
    THEN("each is refused by name at its offset, as a buffer passed beside the pickle") {
      const std::string a = error_of(next);
      CHECK(contains(a, "refused: opcode NEXT_BUFFER is one of pickle protocol 5's out-of-band buffers"));
      CHECK(contains(a, "byte offset 14"));
      const std::string b = error_of(readonly);
      CHECK(contains(b, "refused: opcode READONLY_BUFFER is one of pickle protocol 5's out-of-band buffers"));
      CHECK(contains(b, "byte offset 3"));
    }
  }
  WHEN("the protocol is 6, or 1, or there is no PROTO at all") {
    CHECK(contains(error_of(bytes({0x80, 6, 'N', '.'})), "pickle protocol 6 is not supported (protocols 2 to 5 are)"));
    CHECK(contains(error_of(bytes({0x80, 1, 'N', '.'})), "protocol 1 is not supported"));
    CHECK(contains(error_of("(lp0\n."), "not a protocol 2-5 pickle"));
    CHECK(contains(error_of(""), "empty file"));
  }
  WHEN("the file is truncated: mid-string, mid-integer, or before STOP") {
    CHECK(contains(error_of(bytes({0x80, 4, 0x8c, 10, 'a', 'b'})), "claims 10 bytes but only 2 remain"));
    CHECK(contains(error_of(bytes({0x80, 4, 'J', 1, 2})), "truncated pickle: BININT needs 4 more bytes"));
    CHECK(contains(error_of(bytes({0x80, 4, ']'})), "ends before STOP"));
  }
  WHEN("a length field claims 2 GiB") {
    const std::string p = bytes({0x80, 4, 'X', 0x00, 0x00, 0x00, 0x80, 'a', 'b', 'c', '.'});
    THEN("it is an error naming the claim, not a 2 GiB allocation") {
      CHECK(contains(error_of(p), "claims 2147483648 bytes but only 4 remain"));
      CHECK(contains(error_of(bytes({0x80, 4, 0x95, 0, 0, 0, 0x80, 0, 0, 0, 0, ']', '.'})), "FRAME claims"));
      CHECK(contains(error_of(bytes({0x80, 4, 0x8a, 200, 1, '.'})), "LONG1 integer of 200 bytes"));
    }
  }
  WHEN("lists are nested 10^6 deep") {
    std::string p = bytes({0x80, 4});
    p.append(1000000, ']');
    p.append(999999, 'a');
    p.push_back('.');
    THEN("the depth limit refuses it without recursing") {
      CHECK(contains(error_of(p), "nested deeper than 256 levels"));
    }
    THEN("a depth within the limit is read") {
      std::string q = bytes({0x80, 4});
      q.append(200, ']');
      q.append(199, 'a');
      q.push_back('.');
      CHECK(parse_pickle(q).root.depth() == 200);
    }
  }
  WHEN("a memo reference makes a list contain itself") {
    // EMPTY_LIST, MEMOIZE, BINGET 0, APPEND: l = []; l.append(l)
    THEN("it is refused as a recursive structure") {
      CHECK(contains(error_of(bytes({0x80, 4, ']', 0x94, 'h', 0, 'a', '.'})), "recursive structure"));
    }
  }
  WHEN("the stack is malformed: STOP with two values, APPEND to an int, SETITEMS without MARK, a missing memo") {
    CHECK(contains(error_of(bytes({0x80, 4, 'N', 'N', '.'})), "STOP with 2 values"));
    CHECK(contains(error_of(bytes({0x80, 4, 'K', 1, 'N', 'a', '.'})), "APPEND on a int"));
    CHECK(contains(error_of(bytes({0x80, 4, '}', 'N', 'N', 'u', '.'})), "SETITEMS without a MARK"));
    CHECK(contains(error_of(bytes({0x80, 4, 'h', 7, '.'})), "memo entry 7 was never stored"));
    CHECK(contains(error_of(bytes({0x80, 4, 'N', '.', 'N'})), "trailing data"));
  }
  WHEN("the value budget is exceeded") {
    PickleLimits small;
    small.max_values = 3;
    CHECK(contains(error_of(bytes({0x80, 4, ']', '(', 'N', 'N', 'N', 'e', '.'}), small), "more than 3 values"));
  }
}

SCENARIO("a writer that memoizes strings writes each one once", "[core][pickle]") {
  GIVEN("a list of the same string three times and another string") {
    PickleWriter w(/*memoize_strings=*/true);
    w.begin_list().str("alloc").str("alloc").str("free").str("alloc").end_list();
    w.finish();
    const std::string out = w.take();
    THEN("the first is MEMOIZEd and the others are BINGET 0; memo ids count in order") {
      CHECK(out == bytes({0x80, 4, ']', '(', 0x8c, 5, 'a', 'l', 'l', 'o', 'c', 0x94, 'h', 0, 0x8c, 4, 'f', 'r', 'e', 'e',
                          0x94, 'h', 0, 'e', '.'}));
      const PickleResult r = parse_pickle(out);
      REQUIRE(r.root.list().size() == 4);
      CHECK(r.root.list()[1].str() == "alloc");
      CHECK(r.root.list()[2].str() == "free");
      CHECK(r.root.list()[3].str() == "alloc");
    }
  }
  GIVEN("more than 256 distinct strings, then the 300th again") {
    PickleWriter w(true);
    w.begin_list();
    for (int i = 0; i < 300; ++i) w.str("s" + std::to_string(i));
    w.str("s299");
    w.end_list();
    w.finish();
    const std::string out = w.take();
    THEN("it is fetched with LONG_BINGET 299") {
      CHECK(out.substr(out.size() - 7) == bytes({'j', 0x2b, 0x01, 0, 0, 'e', '.'}));
      CHECK(parse_pickle(out).root.list()[300].str() == "s299");
    }
  }
}
