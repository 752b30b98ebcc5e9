#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace qhx {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  if (params.greedy) return;
  if (!(params.temperature > 0.0f)) fail("sampling", "temperature must be > 0 (or use greedy)");
  if (params.top_k < 0) fail("sampling", "top_k must be >= 0");
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) fail("sampling", "top_p must be in (0, 1]");
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.greedy) return argmax(logits);
  // Same order as transformers' logits processors: temperature, then top-k, then top-p.
  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates_[i] = {logits[i] / params_.temperature, static_cast<int32_t>(i)};
  }
  const auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);

  std::vector<double> probs(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(static_cast<double>(candidates_[i].logit - candidates_[0].logit));
    sum += probs[i];
  }
  if (params_.top_p < 1.0f) {
    // Keep the smallest prefix whose mass reaches top_p (at least one token).
    double cumulative = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i] / sum;
      if (cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    probs.resize(cut);
  }
  std::discrete_distribution<size_t> pick(probs.begin(), probs.end());
  return candidates_[pick(rng_)].id;
}

}  // namespace qhx
