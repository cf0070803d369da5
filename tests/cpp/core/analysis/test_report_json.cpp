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
    t.metadata("notes", "{\"injected\": \"}, \\\"peak\\\": 1\"}");
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
    CHECK_THAT(json, Contains("\"notes\":\"{\\\"injected\\\""));
  }
}

SCENARIO("the run metadata becomes the model and optimizer header", "[core][json]") {
  GIVEN("a trace of one AdamW step whose run metadata describes the model") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.metadata("run", R"({"torch_version": "2.14.1", "argv": ["train.py", "--x"],
        "model": {"class": "MLP", "parameters": 1280, "parameter_tensors": 2,
                  "trainable_parameters": 1280, "trainable_parameter_tensors": 2,
                  "parameter_bytes": 5120, "trainable_parameter_bytes": 5120,
                  "dtypes": {"float32": 2}, "buffers": 0, "buffer_bytes": 0},
        "optimizer": {"type": "AdamW", "states_per_parameter": 2,
                      "state_keys": ["exp_avg", "exp_avg_sq"],
                      "hyperparameters": {"lr": 0.001, "betas": [0.9, 0.999], "amsgrad": false}}})");
      t.alloc(0x100, 5120).tag(0x100, Category::Parameter, "w");
      t.begin("backward").alloc(0x200, 5120).tag(0x200, Category::Gradient, "grad of w").end("backward");
      t.begin("optimizer_step").alloc(0x300, 10240).tag(0x300, Category::OptimizerState, "moments");
      t.alloc(0x400, 8).tag(0x400, Category::OptimizerState, "steps").end("optimizer_step").step(0);
      t.metadata("session", R"({"events": 20, "dropped_events": 0, "bytes_written": 900, "buffer_bytes_peak": 4096})");
    }
    const Report r = analyze_trace(path.str());
    THEN("the sections carry the metadata and the measured figures") {
      CHECK(r.model.class_name == "MLP");
      CHECK(r.model.parameters == 1280u);
      CHECK(r.model.parameter_bytes == 5120);
      CHECK(r.optimizer.type == "AdamW");
      CHECK(r.optimizer.state_bytes == 10248);
      CHECK(r.optimizer.steps == 1);
      CHECK(r.model.expected_persistent_bytes_per_parameter == 16.0);
      CHECK(r.model.measured_persistent_bytes_per_parameter == (5120.0 + 5120 + 10248) / 1280);
      CHECK(r.run.argv == std::vector<std::string>{"train.py", "--x"});
      CHECK(r.recorder.known);
      CHECK(r.recorder.buffer_bytes_peak == 4096);
      const std::string json = r.to_json();
      CHECK_THAT(json, Contains("\"hyperparameters\":{\"lr\":0.001,\"betas\":[0.9,0.999],\"amsgrad\":false}"));
      CHECK_THAT(json, Contains("\"expected\":16.0"));
      CHECK_THAT(json, Contains("\"metadata\":{}"));
    }
  }
  GIVEN("run metadata that is not JSON") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.metadata("run", "{\"model\": {\"parameters\": 12").alloc(0x100, 64).tag(0x100, Category::Parameter, "w");
    }
    const Report r = analyze_trace(path.str());
    THEN("a warning says so and the measured figures stand alone") {
      REQUIRE(r.warnings.size() == 1);
      CHECK(r.warnings[0].kind == "corrupt_metadata");
      CHECK_THAT(r.warnings[0].message, Contains("byte offset"));
      CHECK(r.model.parameter_bytes == 64);
      CHECK_FALSE(r.model.parameters.has_value());
      CHECK_THAT(r.to_json(), Contains("\"parameters\":null"));
    }
  }
}
