#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "util/error.h"

namespace qhx {

double PerplexityResult::perplexity() const {
  return scored > 0 ? std::exp(nll_sum / static_cast<double>(scored)) : 0.0;
}

double negative_log_likelihood(std::span<const float> logits, int32_t target) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(x - max);
  return max + std::log(sum) - logits[target];
}

PerplexityResult perplexity(const Model& model, std::span<const int32_t> ids, int64_t window,
                            const std::function<void(int64_t, int64_t)>& on_window) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n < 2) fail("perplexity", "the text has fewer than two tokens");
  if (window < 1) fail("perplexity", "the window must hold at least one token");
  if (window > model.config().max_position_embeddings) {
    fail("perplexity", "window " + std::to_string(window) + " exceeds the model's context of " +
                           std::to_string(model.config().max_position_embeddings) + " tokens");
  }
  const int64_t vocab = model.config().vocab_size;
  const int64_t total = (n - 1 + window - 1) / window;
  PerplexityResult result;
  const auto state = model.new_state();
  std::vector<float> logits;
  for (int64_t start = 0; start + 1 < n; start += window) {
    const int64_t length = std::min(window, n - 1 - start);  // inputs; targets are shifted by one
    state->reset();
    model.forward(ids.subspan(start, length), *state, LogitsFor::kEveryToken, logits);
    for (int64_t t = 0; t < length; ++t) {
      result.nll_sum += negative_log_likelihood(
          std::span<const float>(logits).subspan(t * vocab, vocab), ids[start + t + 1]);
    }
    result.scored += length;
    ++result.windows;
    if (on_window) on_window(result.windows, total);
  }
  return result;
}

}  // namespace qhx
