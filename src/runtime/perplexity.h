// Perplexity of a model on a token stream, and its divergence from a base model's predictions on
// the same tokens (how llama-perplexity --kl-divergence compares a quantized file with the float
// one).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "models/model.h"

namespace qhx {

// How the stream is cut. By default (the training script's way) into consecutive windows of
// `window` + 1 tokens that overlap by one token, each from an empty state, every token after its
// first scored. second_half: llama-perplexity's chunks instead — consecutive windows of `window`
// tokens that do not overlap (a tail shorter than one is left out), of which only the tokens
// after the first half are scored, so that each sees at least window/2 before it: the same tokens
// llama.cpp scores, for figures comparable with its own.
struct PerplexityWindows {
  int64_t window = 512;
  bool second_half = false;
};

struct PerplexityResult {
  double nll_sum = 0;  // natural log, summed over the scored tokens
  int64_t scored = 0;  // tokens predicted
  int64_t windows = 0;
  double perplexity() const;  // exp(nll_sum / scored)
};

// Calls on_window(done, total) after each window (progress). Throws Error if the stream has no
// token to score or the window does not fit the model's context.
PerplexityResult perplexity(const Model& model, std::span<const int32_t> ids,
                            const PerplexityWindows& windows,
                            const std::function<void(int64_t, int64_t)>& on_window = {});

// A model's predictions against a base model's (the float one) on the same windows, per scored
// token: KL(base ‖ model) over the whole vocabulary, whether their top-1 tokens agree, and the
// difference of their negative log-likelihoods of the true token (what the perplexities' ratio is
// made of).
struct DivergenceResult {
  PerplexityResult base, model;
  std::vector<float> kl;        // nats, per scored token
  std::vector<double> nll_gap;  // nll_model − nll_base, per scored token
  std::vector<float> p_gap;     // p_model(target) − p_base(target), per scored token
  int64_t top1_same = 0;

  double kl_mean() const;
  double kl_mean_error() const;        // standard error of the mean
  double kl_quantile(double q) const;  // q in [0, 1]
  double top1_agreement() const;       // fraction of scored tokens
  // ln(PPL(model)/PPL(base)) = mean nll_gap, with its standard error (the tokens' gaps paired,
  // so the two perplexities' shared variance cancels, as llama.cpp computes it).
  double log_ppl_ratio() const;
  double log_ppl_ratio_error() const;
  double ppl_delta() const;        // PPL(model) − PPL(base)
  double ppl_delta_error() const;  // its standard error, propagated from log_ppl_ratio's
  double rms_p_gap() const;
};

// Throws Error as perplexity() does, and when the two models' vocabularies differ.
DivergenceResult kl_divergence(const Model& base, const Model& model, std::span<const int32_t> ids,
                               const PerplexityWindows& windows,
                               const std::function<void(int64_t, int64_t)>& on_window = {});

// KL(softmax(base) ‖ softmax(model)) over the whole vocabulary, in double.
double token_kl_divergence(std::span<const float> base, std::span<const float> model);

// −log softmax(logits)[target], in double.
double negative_log_likelihood(std::span<const float> logits, int32_t target);

}  // namespace qhx
