// Specification of report_to_json(): stable keys, integer bytes, always-valid strings.
#include "catch.h"
#include "json_writer.h"
#include "ridgescope/analysis.h"
#include "trace_builder.h"

using namespace ridgescope;
using Catch::Matchers::Contains;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

SCENARIO("strings from a hostile trace cannot break the JSON", "[core][json]") {
  detail::JsonWriter w;
  w.begin_object().field("label", std::string("a\"b\\c\n\x01\xff\xc3\xa9", 10)).end_object();
  const std::string expected = std::string("{\"label\":\"a\\\"b\\\\c\\n\\u0001") +
                               "\xEF\xBF\xBD" /* U+FFFD for the lone 0xFF */ + "\xC3\xA9" + "\"}";
  CHECK(w.take() == expected);
}

SCENARIO("the report JSON carries the keys of design.md section 9", "[core][json]") {
  TempPath path;
  {
    TraceBuilder t(path.str());
    t.alloc(0x100, 4096).tag(0x100, Category::Parameter, "w");
    t.metadata("run", "{\"injected\": \"}, \\\"peak\\\": 1\"}");
    t.begin("forward").alloc(0x200, 10).end("forward").step(0);
  }
  const std::string json = report_to_json(analyze_trace(path.str()));
  for (const char* key : {"\"schema_version\":1", "\"peak\":{\"bytes\":4106", "\"by_category\":{\"unknown\":10,\"parameter\":4096",
                          "\"top_blocks\":[{\"bytes\":4096,\"category\":\"parameter\"", "\"phase_allocated\":\"idle\"",
                          "\"steps\":[{\"step\":0", "\"peak_by_category\":", "\"end_by_category\":",
                          "\"start_bytes\":", "\"end_bytes\":", "\"peak_bytes\":", "\"ooms\":[]"}) {
    CHECK_THAT(json, Contains(key));
  }
  THEN("metadata is carried as a JSON string, never spliced into the report") {
    CHECK_THAT(json, Contains("\"run\":\"{\\\"injected\\\""));
  }
}
