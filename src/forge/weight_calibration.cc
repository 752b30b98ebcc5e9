#include "forge/weight_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "forge/matmul_observer.h"
#include "io/checkpoint.h"
#include "kernels/matmul.h"
#include "models/model.h"
#include "runtime/perplexity.h"
#include "util/error.h"

namespace qhx {
namespace fs = std::filesystem;

namespace {

// The checkpoint's tensor names by where their data lies (where the model's matrices point).
std::map<const void*, std::string> names_by_data(const Checkpoint& checkpoint) {
  std::map<const void*, std::string> names;
  for (const auto& file : checkpoint.files()) {
    for (const auto& [name, view] : file->tensors()) names[view.data] = name;
  }
  return names;
}

}  // namespace

InputStatistics collect_input_statistics(const fs::path& dir,
                                         std::span<const std::vector<int32_t>> sequences,
                                         const CalibrationOptions& options) {
  auto context = calibration_context(options.n_threads);
  Checkpoint checkpoint = Checkpoint::open(dir);
  const std::map<const void*, std::string> names = names_by_data(checkpoint);

  std::map<std::string, std::shared_ptr<InputGram>> grams;
  // The previous matmul's input and gram: the next matrix that reads the same rows shares both.
  std::vector<float> previous;
  std::shared_ptr<InputGram> previous_gram;
  std::vector<float> xt, product;
  const auto observe = [&](const ObservedMatmul& m) {
    const auto name = names.find(m.w.data);
    if (name == names.end()) return;
    const int64_t rows = m.rows, cols = m.w.cols;
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(x.data() + r * cols, m.x + r * m.x_stride, cols * sizeof(float));
    }
    for (const float v : x) {
      if (!std::isfinite(v)) {
        fail(dir.string() + ": " + name->second, "read a value that is not finite on the text");
      }
    }
    const bool same_input = previous_gram != nullptr && previous == x;
    std::shared_ptr<InputGram>& gram = grams[name->second];
    if (gram == nullptr) {
      if (same_input) {
        gram = previous_gram;
      } else {
        gram = std::make_shared<InputGram>(InputGram{cols, 0, std::vector<double>(cols * cols)});
      }
    }
    if (same_input && gram == previous_gram) return;  // counted with the other matrix
    // Σ x xᵀ as the matmul of xᵀ with itself (y[i, j] = Σ_t xᵀ[i, t] · xᵀ[j, t]).
    xt.resize(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
    }
    product.resize(static_cast<size_t>(cols * cols));
    matmul(*context, xt.data(), cols, MatrixRef{DType::kF32, xt.data(), cols, rows},
           product.data());
    for (size_t i = 0; i < product.size(); ++i) gram->sum[i] += product[i];
    gram->rows += rows;
    previous = std::move(x);
    previous_gram = gram;
  };
  auto observer = std::make_shared<MatmulObserver>(context, observe);
  const auto model = load_model(std::move(checkpoint), {.context = context, .devices = {observer}});
  const int64_t read = read_calibration_passes(*model, sequences, options, dir.string());
  if (grams.empty()) fail(dir.string(), "calibration reached no matrix of the checkpoint");
  InputStatistics out;
  for (auto& [name, gram] : grams) out.grams[name] = gram;
  out.tokens = read;
  return out;
}

std::vector<double> measure_sensitivity(const fs::path& dir, std::span<const int32_t> ids,
                                        std::span<const StandIn> stand_ins, int n_threads) {
  if (ids.empty()) fail("sensitivity", "no calibration tokens to measure it on");
  auto context = calibration_context(n_threads);
  Checkpoint checkpoint = Checkpoint::open(dir);
  std::map<std::string, const void*> data;
  for (const auto& [where, name] : names_by_data(checkpoint)) data[name] = where;
  for (const StandIn& s : stand_ins) {
    if (!data.contains(s.name)) fail(dir.string(), "has no matrix '" + s.name + "'");
  }
  auto observer = std::make_shared<MatmulObserver>(context, nullptr);
  const auto model = load_model(std::move(checkpoint), {.context = context, .devices = {observer}});
  const int64_t vocab = model->config().vocab_size, n = static_cast<int64_t>(ids.size());
  const auto run = [&](std::vector<float>& logits) {
    auto state = model->new_state();
    model->forward(ids, *state, LogitsFor::kEveryToken, logits);
  };
  std::vector<float> reference, logits;
  run(reference);
  std::vector<double> out;
  std::vector<double> kl(static_cast<size_t>(n));
  for (const StandIn& s : stand_ins) {
    observer->set_stand_ins({{data.at(s.name), s.matrix}});
    run(logits);
    context->run(n, [&](int64_t t, Scratch&) {
      kl[t] = token_kl_divergence(std::span(reference).subspan(t * vocab, vocab),
                                  std::span(logits).subspan(t * vocab, vocab));
    });
    double sum = 0;
    for (const double k : kl) sum += k;
    out.push_back(sum / static_cast<double>(n));
  }
  return out;
}

}  // namespace qhx
