// train_convnet.cpp — a libtorch trainer as C++ users write one, tracked by ridgescope: a small
// convolutional net (with batch norm) trained with SGD and momentum on generated images, fed by
// a torch::data dataset and data loader, checkpointed with torch::save after every epoch.
// Every phase is marked with a ridgescope::PhaseGuard: data, zero_grad, forward, backward,
// optimizer_step and checkpoint. tests/python/test_cpp_convnet.py holds the same model in Python
// and checks this program's report against it.
//
//   train_convnet [--out PREFIX] [--epochs E] [--batch B] [--samples N]
//
// Writes PREFIX.rstrace (`ridgescope report PREFIX.rstrace`), PREFIX.json (the report), and the
// checkpoint PREFIX.model.pt and PREFIX.optimizer.pt, which it reloads at the end to check them.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <ridgescope/ridgescope.h>

namespace {

constexpr int64_t kClasses = 10;
constexpr int64_t kSide = 32;  // images are 3 x 32 x 32

// Generated images: noise plus a bright 8 x 8 square whose channel and place depend on the
// class, so the net has something to learn. Made once, in memory, from a fixed seed.
class GeneratedImages : public torch::data::datasets::Dataset<GeneratedImages> {
 public:
  explicit GeneratedImages(int64_t samples) {
    torch::manual_seed(1);
    labels_ = torch::arange(samples, torch::kLong).remainder(kClasses);
    torch::Tensor patterns = torch::zeros({kClasses, 3, kSide, kSide});
    for (int64_t c = 0; c < kClasses; ++c) {
      const int64_t row = 4 + 6 * (c / 4), col = 4 + 6 * (c % 4);
      patterns[c][c % 3].slice(0, row, row + 8).slice(1, col, col + 8).fill_(2.0);
    }
    images_ = torch::randn({samples, 3, kSide, kSide}) * 0.5 + patterns.index_select(0, labels_);
  }

  torch::data::Example<> get(size_t index) override { return {images_[index], labels_[index]}; }
  std::optional<size_t> size() const override { return static_cast<size_t>(labels_.size(0)); }

 private:
  torch::Tensor images_, labels_;
};

}  // namespace

// The model (named ConvNetImpl in the report, as the class is named).
struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(16))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(32 * (kSide / 4) * (kSide / 4), kClasses))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1->forward(conv1->forward(x))), 2);  // 16 x 16 x 16
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);                // 32 x 8 x 8
    return fc->forward(x.flatten(1));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(ConvNet);

namespace {

// True when b holds exactly a's parameters and buffers.
bool same_state(ConvNet& a, ConvNet& b) {
  auto pa = a->named_parameters(), pb = b->named_parameters();
  auto ba = a->named_buffers(), bb = b->named_buffers();
  if (pa.size() != pb.size() || ba.size() != bb.size()) return false;
  for (const auto& item : pa) {
    if (!pb.contains(item.key()) || !torch::equal(item.value(), pb[item.key()])) return false;
  }
  for (const auto& item : ba) {
    if (!bb.contains(item.key()) || !torch::equal(item.value(), bb[item.key()])) return false;
  }
  return true;
}

int usage() {
  std::fprintf(stderr, "usage: train_convnet [--out PREFIX] [--epochs E] [--batch B] [--samples N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "convnet";
  int epochs = 2;
  int64_t batch = 32, samples = 128;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage();
    if (flag == "--out") out = argv[i + 1];
    else if (flag == "--epochs") epochs = std::atoi(argv[i + 1]);
    else if (flag == "--batch") batch = std::atoll(argv[i + 1]);
    else if (flag == "--samples") samples = std::atoll(argv[i + 1]);
    else return usage();
  }
  if (epochs < 1 || batch < 1 || samples < batch) return usage();

  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      GeneratedImages(samples).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(static_cast<size_t>(batch)).workers(0));
  torch::manual_seed(0);
  ConvNet model;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  ridgescope::Session session(ridgescope::Options{}.out(out + ".rstrace"));
  session.track(*model, optimizer);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    double loss_sum = 0.0;
    int64_t batches = 0;
    auto it = loader->begin();
    for (bool first = true;; first = false) {
      torch::data::Example<> b;
      {
        // The loader stacks a batch's examples lazily, when its iterator is compared or advanced.
        ridgescope::PhaseGuard g(session, ridgescope::Phase::Data);
        if (!first) ++it;
        if (it == loader->end()) break;
        b = *it;
      }
      session.tag(b.data, ridgescope::Category::Input, "images");
      session.tag(b.target, ridgescope::Category::Input, "labels");
      torch::Tensor loss;
      { ridgescope::PhaseGuard g(session, ridgescope::Phase::ZeroGrad); optimizer.zero_grad(); }
      {
        ridgescope::PhaseGuard g(session, ridgescope::Phase::Forward);
        loss = torch::nn::functional::cross_entropy(model->forward(b.data), b.target);
      }
      { ridgescope::PhaseGuard g(session, ridgescope::Phase::Backward); loss.backward(); }
      { ridgescope::PhaseGuard g(session, ridgescope::Phase::OptimizerStep); optimizer.step(); }
      loss_sum += loss.item<double>();
      ++batches;
    }
    {
      ridgescope::PhaseGuard g(session, ridgescope::Phase::Checkpoint);
      torch::save(model, out + ".model.pt");
      torch::save(optimizer, out + ".optimizer.pt");
    }
    std::printf("epoch %d: mean loss %.4f over %lld batches\n", epoch, loss_sum / static_cast<double>(batches),
                static_cast<long long>(batches));
  }

  const ridgescope::Report report = session.report();
  report.write_json(out + ".json");
  std::printf("peak %llu bytes in step %llu (%s); wrote %s.rstrace and %s.json\n",
              static_cast<unsigned long long>(report.peak.bytes),
              static_cast<unsigned long long>(report.peak.step), report.peak.phase.c_str(),
              out.c_str(), out.c_str());

  // The checkpoint is a real one: a fresh model loads it and holds the trained weights.
  ConvNet restored;
  torch::load(restored, out + ".model.pt");
  torch::optim::SGD restored_optimizer(restored->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::load(restored_optimizer, out + ".optimizer.pt");
  if (!same_state(model, restored)) {
    std::fprintf(stderr, "train_convnet: the checkpoint %s.model.pt does not hold the trained model\n", out.c_str());
    return 1;
  }
  std::printf("checkpoint %s.model.pt reloaded: identical parameters and buffers\n", out.c_str());
  if (!session.error().empty()) {
    std::fprintf(stderr, "train_convnet: ridgescope stopped recording: %s\n", session.error().c_str());
    return 1;
  }
  return 0;
}
