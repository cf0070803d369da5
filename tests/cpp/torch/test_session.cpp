// Specification of the libtorch session API (include/ridgescope/session.h).
#include <cstdio>
#include <string>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "catch.h"
#include "ridgescope/ridgescope.h"

using ridgescope::Category;
using ridgescope::Phase;
using ridgescope::PhaseGuard;
using ridgescope::Session;

namespace {

std::string temp_trace(const char* name) {
  return std::string("/tmp/ridgescope_cpp_test_") + name + ".rstrace";
}

std::uint64_t cat(const ridgescope::CategoryBytes& bytes, Category c) {
  return bytes[ridgescope::category_index(c)];
}

std::uint64_t param_bytes(torch::nn::Module& m) {
  std::uint64_t total = 0;
  for (const auto& p : m.parameters()) total += p.numel() * p.element_size();
  return total;
}

const ridgescope::PhaseStats* phase(const ridgescope::Report& r, std::uint64_t step, const std::string& name) {
  for (const auto& s : r.steps)
    if (s.step == step)
      for (const auto& p : s.phases)
        if (p.phase == name) return &p;
  return nullptr;
}

}  // namespace

// Runs first (Catch2 runs test cases in declaration order by default): nothing has created a
// Session yet, so this is the state any program linking the library sees.
SCENARIO("linking the library installs nothing until a Session is created", "[torch][session]") {
  CHECK(c10::GetCPUAllocator() == c10::GetDefaultCPUAllocator());
}

SCENARIO("a C++ training loop gets exact parameter, gradient and Adam state bytes", "[torch][session]") {
  GIVEN("an MLP trained for two steps with Adam under a session") {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
    const std::uint64_t p_bytes = param_bytes(*model);
    Session session(ridgescope::Options{}.out(temp_trace("exact")));
    session.track(*model, optimizer);
    CHECK(c10::GetCPUAllocator() != c10::GetDefaultCPUAllocator());
    for (int step = 0; step < 2; ++step) {
      auto x = torch::randn({16, 32});
      auto y = torch::randint(0, 4, {16});
      session.tag(x, Category::Input, "batch");
      torch::Tensor loss;
      { PhaseGuard g(session, Phase::ZeroGrad); optimizer.zero_grad(); }
      { PhaseGuard g(session, Phase::Forward); loss = torch::nn::functional::cross_entropy(model->forward(x), y); }
      { PhaseGuard g(session, Phase::Backward); loss.backward(); }
      { PhaseGuard g(session, Phase::OptimizerStep); optimizer.step(); }
    }
    const ridgescope::Report r = session.report();
    THEN("the figures equal what the model and optimizer hold, to the byte") {
      CHECK(c10::GetCPUAllocator() == c10::GetDefaultCPUAllocator());  // restored
      REQUIRE(r.steps.size() == 2);
      CHECK(cat(r.peak.by_category, Category::Parameter) == p_bytes);
      const auto* bwd = phase(r, 0, "backward");
      REQUIRE(bwd != nullptr);
      CHECK(cat(bwd->end_by_category, Category::Gradient) == p_bytes);
      const auto* opt = phase(r, 0, "optimizer_step");
      REQUIRE(opt != nullptr);
      CHECK(cat(opt->end_by_category, Category::OptimizerState) == 2 * p_bytes);  // step is an int64 field
      CHECK(r.consistency.samples > 0);
      CHECK(r.consistency.mismatches == 0);
      CHECK(r.optimizer.type == "Adam");
      CHECK(r.model.parameter_bytes == p_bytes);
      CHECK(r.model.dtypes == std::vector<std::pair<std::string, std::uint64_t>>{{"float32", 4}});
      CHECK(*r.model.expected_persistent_bytes_per_parameter == 16.0);
      CHECK(r.warnings.at(0).kind == "lazy_optimizer_state");
      CHECK(r.warnings.at(0).bytes == 2 * p_bytes);
    }
    THEN("activations are inferred from lifetimes and forward ends with them") {
      const auto* fwd = phase(r, 1, "forward");
      REQUIRE(fwd != nullptr);
      CHECK(cat(fwd->end_by_category, Category::Activation) > 0);
      CHECK(cat(fwd->end_by_category, Category::Input) == 16 * 32 * 4);
    }
  }
}

SCENARIO("gradients are tagged once per allocation, and tracking holds nothing of them",
         "[torch][session]") {
  GIVEN("an MLP trained for three steps with SGD, its gradients freed by zero_grad each step") {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(1e-2));
    const std::uint64_t p_bytes = param_bytes(*model);
    Session session(ridgescope::Options{}.out(temp_trace("grads")));
    session.track(*model, optimizer);
    std::vector<std::uint32_t> weak_counts;  // of each gradient's storage, after its tagging
    for (int step = 0; step < 3; ++step) {
      auto x = torch::randn({16, 32});
      auto y = torch::randint(0, 4, {16});
      { PhaseGuard g(session, Phase::ZeroGrad); optimizer.zero_grad(/*set_to_none=*/true); }
      torch::Tensor loss;
      { PhaseGuard g(session, Phase::Forward); loss = torch::nn::functional::cross_entropy(model->forward(x), y); }
      { PhaseGuard g(session, Phase::Backward); loss.backward(); }  // its end tags the gradients
      for (const auto& p : model->parameters()) {
        // A weak reference of our own: 2 when nobody else holds one (the strong references
        // count as one), 3 when tracking keeps a weak reference to the storage too.
        const auto probe = p.grad().storage().getWeakStorageImpl();
        weak_counts.push_back(probe.weak_use_count());
      }
      { PhaseGuard g(session, Phase::OptimizerStep); optimizer.step(); }
    }
    const ridgescope::Report r = session.report();
    THEN("no gradient's storage is held, even weakly, by the session") {
      REQUIRE(weak_counts.size() == 3 * model->parameters().size());
      for (std::uint32_t count : weak_counts) CHECK(count == 2);
    }
    THEN("every step's new gradients are tagged, though they may reuse the last step's addresses") {
      REQUIRE(r.steps.size() == 3);
      for (std::uint64_t step = 0; step < 3; ++step) {
        const auto* bwd = phase(r, step, "backward");
        REQUIRE(bwd != nullptr);
        CHECK(cat(bwd->end_by_category, Category::Gradient) == p_bytes);
      }
    }
  }
}

SCENARIO("misuse of the C++ API gets a clear error", "[torch][session]") {
  torch::nn::Linear model(4, 4);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  WHEN("a second session is created while one runs") {
    Session first(ridgescope::Options{}.out(temp_trace("first")));
    CHECK_THROWS_WITH(Session(ridgescope::Options{}.out(temp_trace("second"))),
                      Catch::Matchers::Contains("already running"));
  }
  WHEN("track is called twice") {
    Session session(ridgescope::Options{}.out(temp_trace("twice")));
    session.track(*model, optimizer);
    CHECK_THROWS_AS(session.track(*model, optimizer), std::logic_error);
    CHECK_THROWS_WITH(session.track(*model), Catch::Matchers::Contains("already tracks"));
  }
  WHEN("the module has no parameters") {
    Session session(ridgescope::Options{}.out(temp_trace("noparams")));
    torch::nn::ReLU relu;
    CHECK_THROWS_AS(session.track(*relu), std::invalid_argument);
    CHECK_THROWS_WITH(session.track(*relu), Catch::Matchers::Contains("has no parameters"));
  }
  WHEN("the trace path cannot be written") {
    CHECK_THROWS_WITH(Session(ridgescope::Options{}.out("/nonexistent-dir/x.rstrace")),
                      Catch::Matchers::Contains("/nonexistent-dir/x.rstrace"));
  }
  WHEN("a phase guard outlives its session") {
    std::unique_ptr<PhaseGuard> guard;
    {
      Session session(ridgescope::Options{}.out(temp_trace("outlive")));
      guard = std::make_unique<PhaseGuard>(session, Phase::Forward);
    }
    THEN("ending it records nothing and does not crash") { CHECK_NOTHROW(guard.reset()); }
  }
  WHEN("a phase guard is made on a stopped session") {
    Session session(ridgescope::Options{}.out(temp_trace("stopped")));
    session.stop();
    CHECK_THROWS_WITH(PhaseGuard(session, Phase::Backward), Catch::Matchers::Contains("stopped"));
  }
}

SCENARIO("a simulated capacity fails an allocation as a device would, after recording it", "[torch][session]") {
  torch::nn::Linear model(256, 256);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  Session session(ridgescope::Options{}.out(temp_trace("capacity")).capacity(1 << 20));
  session.track(*model, optimizer);
  {
    PhaseGuard g(session, Phase::Forward);
    CHECK_THROWS_AS(torch::empty({1 << 20}), c10::OutOfMemoryError);
  }
  const ridgescope::Report r = session.report();
  REQUIRE(r.ooms.size() == 1);
  CHECK(r.ooms[0].request_bytes == 4u << 20);
  CHECK(r.ooms[0].phase == "forward");
  CHECK(r.ooms[0].live_bytes == param_bytes(*model));
  CHECK(r.device_capacity_bytes == std::uint64_t{1} << 20);
}

SCENARIO("asking for the driver's view where NVML is absent is reported, not fatal", "[torch][session]") {
  torch::nn::Linear model(8, 8);
  Session session(ridgescope::Options{}.out(temp_trace("nvml")).driver_view(true));
  session.track(*model);
  const ridgescope::Report r = session.report();
  REQUIRE(r.driver_view.available.has_value());
  if (!*r.driver_view.available) {
    CHECK_THAT(r.driver_view.reason, Catch::Matchers::Contains("NVML"));
  }
  CHECK(r.model.parameter_bytes == (8 * 8 + 8) * 4);
}

SCENARIO("state from before the session is adopted, so the ledger starts right", "[torch][session]") {
  GIVEN("a model trained one step before tracking starts (gradients and Adam state exist)") {
    torch::manual_seed(0);
    torch::nn::Linear model(64, 64);
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
    auto step = [&] {
      optimizer.zero_grad(/*set_to_none=*/false);
      model->forward(torch::randn({8, 64})).sum().backward();
      optimizer.step();
    };
    step();
    const std::uint64_t p_bytes = param_bytes(*model);
    Session session(ridgescope::Options{}.out(temp_trace("adopt")));
    session.track(*model, optimizer);
    { PhaseGuard g(session, Phase::ZeroGrad); optimizer.zero_grad(/*set_to_none=*/true); }
    const ridgescope::Report r = session.report();
    const auto* zg = phase(r, 0, "zero_grad");
    REQUIRE(zg != nullptr);
    THEN("parameters, gradients and both moments are live from the start, with their names") {
      CHECK(cat(zg->start_by_category, Category::Parameter) == p_bytes);
      CHECK(cat(zg->start_by_category, Category::Gradient) == p_bytes);
      CHECK(cat(zg->start_by_category, Category::OptimizerState) == 2 * p_bytes);
      CHECK(cat(zg->end_by_category, Category::Gradient) == 0);  // their frees were seen
      bool named = false;
      for (const auto& l : r.peak.by_label) named |= l.label == "exp_avg_sq of weight";
      CHECK(named);
    }
  }
}
