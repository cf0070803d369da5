// train_mlp.cpp — a libtorch trainer tracked by ridgescope: an MLP trained with Adam on
// synthetic data. The same model in Python is tests/python/test_cpp_trainer.py's reference.
//
//   train_mlp [--out PREFIX] [--steps N] [--batch B]
//
// Writes PREFIX.rstrace (open it with `ridgescope report PREFIX.rstrace`) and PREFIX.json.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include <ridgescope/ridgescope.h>

struct MLPImpl : torch::nn::Module {
  MLPImpl(int64_t d_in, int64_t hidden, int64_t d_out)
      : fc1(register_module("fc1", torch::nn::Linear(d_in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, d_out))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::gelu(fc1->forward(x));
    x = torch::gelu(fc2->forward(x));
    return fc3->forward(x);
  }

  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(MLP);

int main(int argc, char** argv) {
  std::string out = "run";
  int steps = 3;
  int64_t batch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--out") out = argv[i + 1];
    else if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    else if (flag == "--batch") batch = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: train_mlp [--out PREFIX] [--steps N] [--batch B]\n");
      return 2;
    }
  }

  torch::manual_seed(0);
  MLP model(128, 256, 10);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));

  ridgescope::Session session(ridgescope::Options{}.out(out + ".rstrace"));
  session.track(*model, optimizer);
  for (int step = 0; step < steps; ++step) {
    torch::Tensor x = torch::randn({batch, 128});
    torch::Tensor y = torch::randint(0, 10, {batch});
    session.tag(x, ridgescope::Category::Input, "batch");
    session.tag(y, ridgescope::Category::Input, "targets");
    torch::Tensor loss;
    { ridgescope::PhaseGuard g(session, ridgescope::Phase::ZeroGrad); optimizer.zero_grad(); }
    {
      ridgescope::PhaseGuard g(session, ridgescope::Phase::Forward);
      loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    }
    { ridgescope::PhaseGuard g(session, ridgescope::Phase::Backward); loss.backward(); }
    { ridgescope::PhaseGuard g(session, ridgescope::Phase::OptimizerStep); optimizer.step(); }
    std::printf("step %d: loss %.4f\n", step, loss.item<float>());
  }

  const ridgescope::Report report = session.report();
  report.write_json(out + ".json");
  std::printf("peak %llu bytes in step %llu (%s); wrote %s.rstrace and %s.json\n",
              static_cast<unsigned long long>(report.peak.bytes),
              static_cast<unsigned long long>(report.peak.step), report.peak.phase.c_str(),
              out.c_str(), out.c_str());
  return session.error().empty() ? 0 : 1;
}
