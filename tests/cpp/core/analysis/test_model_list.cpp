// Specification of the report's list of models (model_list.cpp): read from the run metadata,
// each model's parameter and buffer bytes measured at the peak by the labels it owns.
#include "catch.h"
#include "ridgescope/analysis.h"
#include "trace_builder.h"

using namespace ridgescope;
using Catch::Matchers::Contains;
using ridgescope::testing::TempPath;
using ridgescope::testing::TraceBuilder;

SCENARIO("every model's bytes at the peak are the blocks under its labels", "[core][models]") {
  GIVEN("a tracked model with plain labels, a frozen reference 'ref' and an EMA copy 'ref #2' whose "
        "prefix begins like the reference's") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.metadata("run", R"({"models": [
        {"name": "policy", "class": "MLP", "found": "tracked", "created_at": null, "copy_of": null,
         "label_prefix": "", "trainable": true, "parameters": 300, "parameter_tensors": 2,
         "trainable_parameters": 300, "parameter_bytes": 1200, "trainable_parameter_bytes": 1200,
         "buffers": 1, "buffer_bytes": 16, "dtypes": {"float32": 2}, "devices": ["cpu"]},
        {"name": "ref", "class": "MLP", "found": "variable", "created_at": "dpo.py:9",
         "copy_of": null, "label_prefix": "ref: ", "trainable": false, "parameters": 300,
         "parameter_tensors": 2, "trainable_parameters": 0, "parameter_bytes": 1200,
         "trainable_parameter_bytes": 0, "buffers": 0, "buffer_bytes": 0, "dtypes": {}, "devices": []},
        {"name": "ref #2", "class": "list", "found": "collection", "created_at": null,
         "copy_of": "policy", "label_prefix": "ref #2: ", "trainable": false, "parameters": 300,
         "parameter_tensors": 2, "trainable_parameters": 0, "parameter_bytes": 1200,
         "trainable_parameter_bytes": 0, "buffers": 0, "buffer_bytes": 0, "dtypes": {}, "devices": []},
        "not an object"]})");
      t.alloc(0x100, 800).tag(0x100, Category::Parameter, "0.weight");
      t.alloc(0x200, 400).tag(0x200, Category::Parameter, "0.bias");
      t.alloc(0x300, 16).tag(0x300, Category::Buffer, "norm.running_mean");
      t.alloc(0x400, 800).tag(0x400, Category::Parameter, "ref: 0.weight (frozen)");
      t.alloc(0x500, 400).tag(0x500, Category::Parameter, "ref: 0.bias (frozen)");
      t.alloc(0x600, 1200).tag(0x600, Category::Parameter, "ref #2: 0.weight (frozen)");
      t.begin("backward").alloc(0x700, 800).tag(0x700, Category::Gradient, "grad of 0.weight").end("backward");
      t.step(0);
    }
    const Report r = analyze_trace(path.str());
    THEN("each model gets the parameter and buffer blocks its prefix (else the plain one) owns") {
      REQUIRE(r.model.models.size() == 3);
      const auto& policy = r.model.models[0];
      const auto& ref = r.model.models[1];
      const auto& copy = r.model.models[2];
      CHECK(policy.peak_parameter_bytes == 1200);
      CHECK(policy.peak_buffer_bytes == 16);
      CHECK(ref.peak_parameter_bytes == 1200);  // "ref #2: ..." is not ref's: the longer prefix wins
      CHECK(copy.peak_parameter_bytes == 1200);
      CHECK(ref.created_at == "dpo.py:9");
      CHECK_FALSE(ref.trainable);
      CHECK(copy.copy_of == "policy");
    }
    THEN("the JSON lists them under model.models, with null for what is not known") {
      const std::string json = r.to_json();
      CHECK_THAT(json, Contains("\"models\":[{\"name\":\"policy\",\"class\":\"MLP\",\"found\":\"tracked\","
                                "\"created_at\":null,\"copy_of\":null,\"trainable\":true"));
      CHECK_THAT(json, Contains("\"label_prefix\":\"ref: \",\"at_peak\":{\"parameter_bytes\":1200,\"buffer_bytes\":0}"));
      CHECK_THAT(json, Contains("\"copy_of\":\"policy\""));
    }
  }
  GIVEN("a trace whose run metadata lists no models") {
    TempPath path;
    {
      TraceBuilder t(path.str());
      t.metadata("run", R"({"model": {"class": "MLP"}})");
      t.alloc(0x100, 64).tag(0x100, Category::Parameter, "w").step(0);
    }
    THEN("the list is empty, and the JSON says so") {
      const Report r = analyze_trace(path.str());
      CHECK(r.model.models.empty());
      CHECK_THAT(r.to_json(), Contains("\"models\":[]"));
    }
  }
}
