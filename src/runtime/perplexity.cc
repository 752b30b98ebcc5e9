#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "util/error.h"

namespace qhx {
namespace {

// One window: ids[start, start + length) read from an empty state; the logits at positions
// first .. length-1 are scored against the token after each.
struct Window {
  int64_t start, length, first;
};

std::vector<Window> cut(int64_t n, const PerplexityWindows& w, const ModelConfig& config) {
  if (w.window < (w.second_half ? 3 : 1)) {
    fail("perplexity", w.second_half ? "a window scored in its second half needs 3 tokens or more"
                                     : "the window must hold at least one token");
  }
  if (w.window > config.max_position_embeddings) {
    fail("perplexity", "window " + std::to_string(w.window) + " exceeds the model's context of " +
                           std::to_string(config.max_position_embeddings) + " tokens");
  }
  std::vector<Window> out;
  if (w.second_half) {
    // llama-perplexity: chunk k is ids[k·window, (k+1)·window); its last token is only a target.
    for (int64_t start = 0; start + w.window <= n; start += w.window) {
      out.push_back({start, w.window - 1, w.window / 2});
    }
    if (out.empty()) {
      fail("perplexity", "the text has " + std::to_string(n) +
                             " tokens, fewer than one window of " + std::to_string(w.window));
    }
    return out;
  }
  if (n < 2) fail("perplexity", "the text has fewer than two tokens");
  for (int64_t start = 0; start + 1 < n; start += w.window) {
    out.push_back({start, std::min(w.window, n - 1 - start), 0});  // targets are shifted by one
  }
  return out;
}

double log_sum_exp(std::span<const float> logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(x - max);
  return max + std::log(sum);
}

// KL(softmax(b) ‖ softmax(q)) given each one's log-sum-exp; ≥ 0 but for rounding.
double kl_of(std::span<const float> b, double lse_b, std::span<const float> q, double lse_q) {
  double sum = 0;
  for (size_t v = 0; v < b.size(); ++v) {
    const double log_pb = b[v] - lse_b;
    sum += std::exp(log_pb) * (log_pb - (q[v] - lse_q));
  }
  return std::max(0.0, sum);
}

double mean(std::span<const double> v) {
  double s = 0;
  for (const double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// Standard error of the mean of v.
template <typename T>
double mean_error(std::span<const T> v) {
  const auto n = static_cast<double>(v.size());
  if (v.size() < 2) return 0;
  double s = 0, s2 = 0;
  for (const T x : v) s += x, s2 += static_cast<double>(x) * x;
  const double m = s / n;
  return std::sqrt(std::max(0.0, (s2 / n - m * m) / (n - 1)));
}

}  // namespace

double PerplexityResult::perplexity() const {
  return scored > 0 ? std::exp(nll_sum / static_cast<double>(scored)) : 0.0;
}

double token_kl_divergence(std::span<const float> base, std::span<const float> model) {
  return kl_of(base, log_sum_exp(base), model, log_sum_exp(model));
}

double negative_log_likelihood(std::span<const float> logits, int32_t target) {
  return log_sum_exp(logits) - logits[target];
}

PerplexityResult perplexity(const Model& model, std::span<const int32_t> ids,
                            const PerplexityWindows& windows,
                            const std::function<void(int64_t, int64_t)>& on_window) {
  const std::vector<Window> cuts = cut(static_cast<int64_t>(ids.size()), windows, model.config());
  const int64_t vocab = model.config().vocab_size;
  PerplexityResult result;
  const auto state = model.new_state();
  std::vector<float> logits;
  for (const Window& w : cuts) {
    state->reset();
    model.forward(ids.subspan(w.start, w.length), *state, LogitsFor::kEveryToken, logits);
    for (int64_t t = w.first; t < w.length; ++t) {
      result.nll_sum += negative_log_likelihood(
          std::span<const float>(logits).subspan(t * vocab, vocab), ids[w.start + t + 1]);
    }
    result.scored += w.length - w.first;
    ++result.windows;
    if (on_window) on_window(result.windows, static_cast<int64_t>(cuts.size()));
  }
  return result;
}

DivergenceResult kl_divergence(const Model& base, const Model& model, std::span<const int32_t> ids,
                               const PerplexityWindows& windows,
                               const std::function<void(int64_t, int64_t)>& on_window) {
  const int64_t vocab = model.config().vocab_size;
  if (base.config().vocab_size != vocab) {
    fail("--kl-divergence", "the base model's vocabulary has " +
                                std::to_string(base.config().vocab_size) + " tokens, the model's " +
                                std::to_string(vocab));
  }
  std::vector<Window> cuts = cut(static_cast<int64_t>(ids.size()), windows, model.config());
  cut(static_cast<int64_t>(ids.size()), windows, base.config());  // fits the base's context too
  DivergenceResult r;
  const auto base_state = base.new_state();
  const auto state = model.new_state();
  std::vector<float> base_logits, logits;
  for (const Window& w : cuts) {
    base_state->reset();
    state->reset();
    base.forward(ids.subspan(w.start, w.length), *base_state, LogitsFor::kEveryToken, base_logits);
    model.forward(ids.subspan(w.start, w.length), *state, LogitsFor::kEveryToken, logits);
    // Token by token on the model's threads (each token's figures are its own: any thread count
    // gives the same), then summed in order.
    const int64_t count = w.length - w.first;
    std::vector<double> kl(count), nll_b(count), nll_q(count);
    std::vector<char> same(count);
    model.context().run(count, [&](int64_t i, Scratch&) {
      const int64_t t = w.first + i;
      const std::span<const float> b =
          std::span<const float>(base_logits).subspan(t * vocab, vocab);
      const std::span<const float> q = std::span<const float>(logits).subspan(t * vocab, vocab);
      const double lse_b = log_sum_exp(b), lse_q = log_sum_exp(q);
      const int32_t target = ids[w.start + t + 1];
      kl[i] = kl_of(b, lse_b, q, lse_q);
      nll_b[i] = lse_b - b[target];
      nll_q[i] = lse_q - q[target];
      same[i] = std::max_element(b.begin(), b.end()) - b.begin() ==
                std::max_element(q.begin(), q.end()) - q.begin();
    });
    for (int64_t i = 0; i < count; ++i) {
      r.base.nll_sum += nll_b[i];
      r.model.nll_sum += nll_q[i];
      r.kl.push_back(static_cast<float>(kl[i]));
      r.nll_gap.push_back(nll_q[i] - nll_b[i]);
      r.p_gap.push_back(static_cast<float>(std::exp(-nll_q[i]) - std::exp(-nll_b[i])));
      r.top1_same += same[i];
    }
    r.base.scored = r.model.scored += count;
    r.base.windows = ++r.model.windows;
    if (on_window) on_window(r.model.windows, static_cast<int64_t>(cuts.size()));
  }
  return r;
}

double DivergenceResult::kl_mean() const {
  double s = 0;
  for (const float x : kl) s += x;
  return kl.empty() ? 0 : s / static_cast<double>(kl.size());
}

double DivergenceResult::kl_mean_error() const {
  return mean_error(std::span<const float>(kl));
}

double DivergenceResult::kl_quantile(double q) const {
  if (kl.empty()) return 0;
  std::vector<float> sorted = kl;
  const auto i = static_cast<size_t>(std::clamp(q, 0.0, 1.0) * static_cast<double>(kl.size() - 1));
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(i), sorted.end());
  return sorted[i];
}

double DivergenceResult::top1_agreement() const {
  return kl.empty() ? 0 : static_cast<double>(top1_same) / static_cast<double>(kl.size());
}

double DivergenceResult::log_ppl_ratio() const {
  return mean(nll_gap);
}

double DivergenceResult::log_ppl_ratio_error() const {
  return mean_error(std::span<const double>(nll_gap));
}

double DivergenceResult::ppl_delta() const {
  return model.perplexity() - base.perplexity();
}

double DivergenceResult::ppl_delta_error() const {
  // d PPL(model) / d ln(PPL(model)/PPL(base)) = PPL(model), the base's perplexity held fixed.
  return model.perplexity() * log_ppl_ratio_error();
}

double DivergenceResult::rms_p_gap() const {
  double s = 0;
  for (const float x : p_gap) s += static_cast<double>(x) * x;
  return p_gap.empty() ? 0 : std::sqrt(s / static_cast<double>(p_gap.size()));
}

}  // namespace qhx
