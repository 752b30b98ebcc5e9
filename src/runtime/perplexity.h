// Perplexity of a model on a token stream, the way llama.cpp and the training script measure it:
// the stream is cut into consecutive windows of `window` + 1 tokens that overlap by one token;
// each window starts from an empty state and every token after its first is scored.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "models/model.h"

namespace qhx {

struct PerplexityResult {
  double nll_sum = 0;  // natural log, summed over the scored tokens
  int64_t scored = 0;  // tokens predicted
  int64_t windows = 0;
  double perplexity() const;  // exp(nll_sum / scored)
};

// Calls on_window(done, total) after each window (progress). Throws Error if the stream has fewer
// than two tokens or the window does not fit the model's context.
PerplexityResult perplexity(const Model& model, std::span<const int32_t> ids, int64_t window,
                            const std::function<void(int64_t, int64_t)>& on_window = {});

// −log softmax(logits)[target], in double.
double negative_log_likelihood(std::span<const float> logits, int32_t target);

}  // namespace qhx
