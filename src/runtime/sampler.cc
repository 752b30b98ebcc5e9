#include "runtime/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "util/error.h"

namespace qhx {
namespace {

void require_not_nan(float value, const char* field) {
  if (std::isnan(value)) fail(std::string("sampling: ") + field, "is NaN");
}

}  // namespace

namespace {

// argmax, and in the same pass whether any logit is NaN (then the index means nothing).
int32_t argmax_checking_nan(std::span<const float> logits, bool& any_nan) {
  // Sixteen lanes, each with its largest value and the first index it appeared at, in one pass the
  // compiler vectorises; then the first index among the lanes holding the overall largest. Same
  // answer as a scan, several times faster over a 151,936-token vocabulary at every decode step.
  constexpr size_t kLanes = 16;
  const size_t n = logits.size();
  int32_t best = 0;
  size_t i = 1;
  bool nan = logits[0] != logits[0];
  if (n >= 2 * kLanes) {
    float lane_max[kLanes];
    int32_t lane_at[kLanes];
    for (size_t l = 0; l < kLanes; ++l) {
      nan |= logits[l] != logits[l];
      lane_max[l] = logits[l];
      lane_at[l] = static_cast<int32_t>(l);
    }
    for (i = kLanes; i + kLanes <= n; i += kLanes) {
      for (size_t l = 0; l < kLanes; ++l) {
        nan |= logits[i + l] != logits[i + l];
        const bool larger = logits[i + l] > lane_max[l];
        lane_max[l] = larger ? logits[i + l] : lane_max[l];
        lane_at[l] = larger ? static_cast<int32_t>(i + l) : lane_at[l];
      }
    }
    for (size_t l = 1; l < kLanes; ++l) {
      if (lane_max[l] > lane_max[best] ||
          (lane_max[l] == lane_max[best] && lane_at[l] < lane_at[best])) {
        best = static_cast<int32_t>(l);
      }
    }
    best = lane_at[best];
  }
  for (; i < n; ++i) {
    nan |= logits[i] != logits[i];
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  any_nan = nan;
  return best;
}

bool is_allowed(std::span<const uint32_t> allowed, size_t id) {
  return ((allowed[id / 32] >> (id % 32)) & 1u) != 0;
}

// Calls f(id) for each id below n whose bit is set, in ascending order.
template <typename F>
void for_each_allowed(std::span<const uint32_t> allowed, size_t n, F&& f) {
  for (size_t w = 0; w * 32 < n; ++w) {
    uint32_t bits = allowed[w];
    if (w * 32 + 32 > n) bits &= (1u << (n - w * 32)) - 1u;
    while (bits != 0) {
      f(w * 32 + static_cast<size_t>(std::countr_zero(bits)));
      bits &= bits - 1u;
    }
  }
}

void fail_on_nan(std::span<const float> logits) {
  const auto at = std::find_if(logits.begin(), logits.end(), [](float l) { return l != l; });
  if (at != logits.end()) fail("logits", "NaN at id " + std::to_string(at - logits.begin()));
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) return 0;
  bool any_nan = false;
  return argmax_checking_nan(logits, any_nan);
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    fail("logprobs", "token " + std::to_string(token) + " is outside the row");
  }
  const float max = logits[static_cast<size_t>(argmax(logits))];
  double total = 0.0;
  for (const float l : logits) total += std::exp(static_cast<double>(l) - max);
  const double log_total = static_cast<double>(max) + std::log(total);
  const auto logprob = [&](size_t id) {
    return static_cast<float>(static_cast<double>(logits[id]) - log_total);
  };
  TokenLogprobs out;
  out.token = token;
  out.logprob = logprob(static_cast<size_t>(token));
  // The `top` largest in one pass: a short list kept sorted, most likely first.
  const size_t n_top = std::min(static_cast<size_t>(std::max(top, 0)), logits.size());
  std::vector<int32_t>& ids = out.top_ids;
  ids.reserve(n_top + 1);
  for (size_t i = 0; i < logits.size() && n_top > 0; ++i) {
    if (ids.size() == n_top && !(logits[i] > logits[static_cast<size_t>(ids.back())])) continue;
    auto at = std::upper_bound(ids.begin(), ids.end(), logits[i], [&](float l, int32_t id) {
      return l > logits[static_cast<size_t>(id)];
    });
    ids.insert(at, static_cast<int32_t>(i));
    if (ids.size() > n_top) ids.pop_back();
  }
  for (const int32_t id : ids) out.top_logprobs.push_back(logprob(static_cast<size_t>(id)));
  return out;
}

void check_sampling_params(const SamplingParams& p, int64_t vocab_size) {
  require_not_nan(p.temperature, "temperature");
  require_not_nan(p.top_p, "top_p");
  require_not_nan(p.min_p, "min_p");
  require_not_nan(p.repetition_penalty, "repetition_penalty");
  require_not_nan(p.presence_penalty, "presence_penalty");
  require_not_nan(p.frequency_penalty, "frequency_penalty");
  if (!p.greedy && !(p.temperature > 0.0f && std::isfinite(p.temperature))) {
    fail("sampling: temperature", "must be > 0 (or use greedy)");
  }
  if (p.top_k < 0) fail("sampling: top_k", "must be >= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("sampling: top_p", "must be in (0, 1]");
  // 1 keeps only the most likely tokens (those as likely as the top one).
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("sampling: min_p", "must be in [0, 1]");
  if (!(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty))) {
    fail("sampling: repetition_penalty", "must be > 0 and finite");
  }
  if (!std::isfinite(p.presence_penalty)) fail("sampling: presence_penalty", "must be finite");
  if (!std::isfinite(p.frequency_penalty)) fail("sampling: frequency_penalty", "must be finite");
  for (const auto& [id, bias] : p.logit_bias) {
    // -inf bans a token; +inf or NaN would make the probabilities undefined.
    if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
      fail("sampling: logit_bias", "bias of id " + std::to_string(id) + " must be finite or -inf");
    }
    if (id < 0) fail("sampling: logit_bias", "id " + std::to_string(id) + " is negative");
    if (vocab_size > 0 && id >= vocab_size) {
      fail("sampling: logit_bias", "id " + std::to_string(id) + " is outside the vocabulary (" +
                                       std::to_string(vocab_size) + " tokens)");
    }
  }
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  check_sampling_params(params, 0);
}

void Sampler::apply_penalties(std::span<const int32_t> prompt, std::span<const int32_t> generated) {
  const auto vocab = static_cast<int64_t>(scratch_.size());
  const bool additive = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  const bool repetition = params_.repetition_penalty != 1.0f;
  if (!additive && !repetition) return;
  const auto check = [&](std::span<const int32_t> ids, const char* what) {
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab) {
        fail(std::string("sampling: ") + what, "token id " + std::to_string(id) +
                                                   " is outside the vocabulary (" +
                                                   std::to_string(vocab) + " tokens)");
      }
    }
  };
  check(prompt, "prompt");
  check(generated, "generated");
  // counts_ is all zeros between calls; each pass below leaves it so.
  if (counts_.size() != scratch_.size()) counts_.assign(scratch_.size(), 0);
  if (additive) {
    for (const int32_t id : generated) ++counts_[id];
    for (const int32_t id : generated) {
      if (counts_[id] == 0) continue;  // already applied
      scratch_[id] -=
          params_.frequency_penalty * static_cast<float>(counts_[id]) + params_.presence_penalty;
      counts_[id] = 0;
    }
  }
  if (repetition) {
    const float r = params_.repetition_penalty;
    const auto penalize = [&](std::span<const int32_t> ids) {
      for (const int32_t id : ids) {
        if (counts_[id] != 0) continue;  // once per distinct id, as transformers' gather/scatter
        counts_[id] = 1;
        float& l = scratch_[id];
        l = l < 0.0f ? l * r : l / r;
      }
    };
    penalize(prompt);
    penalize(generated);
    for (const int32_t id : prompt) counts_[id] = 0;
    for (const int32_t id : generated) counts_[id] = 0;
  }
}

void Sampler::keep_top_p(float top) {
  // transformers sorts ascending and drops tokens while the cumulative probability, the token
  // itself included, is <= 1 - top_p; the most likely token always stays. That is: in descending
  // order (ties: the lower id first) a token stays while the mass before it is < top_p. Sorting
  // a whole 152k-248k vocabulary per token would cost as much as a decode step, so the mass is
  // first summed in buckets of the logit's distance below the top, and only the tokens of the
  // buckets that reach top_p (and one more, for rounding) are sorted and counted exactly.
  constexpr int kBucketsPerUnit = 4, kBuckets = 256;  // distances 0 to 64, the rest in the last
  const auto bucket = [top](float logit) {
    const float below = top - logit;
    return below < kBuckets / kBucketsPerUnit ? static_cast<int>(below * kBucketsPerUnit)
                                              : kBuckets - 1;
  };
  std::array<double, kBuckets> bucket_mass{};
  double total = 0.0;
  for (const Candidate& c : candidates_) {
    const double w = std::exp(c.logit - top);  // in float: the cut is then counted in double
    total += w;
    bucket_mass[static_cast<size_t>(bucket(c.logit))] += w;
  }
  const double keep_mass = static_cast<double>(params_.top_p) * total;
  int last = 0;
  for (double mass = bucket_mass[0]; mass < keep_mass && last + 1 < kBuckets;) {
    mass += bucket_mass[static_cast<size_t>(++last)];
  }
  const auto descending = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  auto head_end = candidates_.end();
  if (last + 1 < kBuckets - 1) {
    head_end = std::partition(candidates_.begin(), candidates_.end(),
                              [&](const Candidate& c) { return bucket(c.logit) <= last + 1; });
  }
  std::sort(candidates_.begin(), head_end, descending);
  double mass = 0.0;
  auto kept = candidates_.begin();
  for (; kept != head_end && (kept == candidates_.begin() || mass < keep_mass); ++kept) {
    mass += std::exp(static_cast<double>(kept->logit) - top);
  }
  if (kept == head_end && mass < keep_mass && head_end != candidates_.end()) {
    // Rounding put the cut past the margin: count the rest too.
    std::sort(head_end, candidates_.end(), descending);
    for (; kept != candidates_.end() && mass < keep_mass; ++kept) {
      mass += std::exp(static_cast<double>(kept->logit) - top);
    }
  }
  candidates_.erase(kept, candidates_.end());
  std::sort(candidates_.begin(), candidates_.end(),
            [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
}

float Sampler::process(std::span<const float> logits, std::span<const int32_t> prompt,
                       std::span<const int32_t> generated, std::span<const uint32_t> allowed) {
  if (logits.empty()) fail("logits", "empty row");
  const bool masked = !allowed.empty();
  if (masked && allowed.size() * 32 < logits.size()) {
    fail("constraint", "its mask covers " + std::to_string(allowed.size() * 32) + " of " +
                           std::to_string(logits.size()) + " tokens");
  }
  // The row as given, unless a bias or a penalty rewrites it (a copy of the vocabulary per token
  // otherwise, which greedy decoding and verifying drafts do not need). A mask is not written
  // into it: the steps below read only the ids it allows.
  const bool penalized = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f ||
                         params_.repetition_penalty != 1.0f;
  std::span<const float> row = logits;
  if (!params_.logit_bias.empty() || penalized) {
    scratch_.assign(logits.begin(), logits.end());
    for (const auto& [id, bias] : params_.logit_bias) {
      if (static_cast<size_t>(id) >= scratch_.size()) {
        fail("sampling: logit_bias", "id " + std::to_string(id) + " is outside the vocabulary (" +
                                         std::to_string(scratch_.size()) + " tokens)");
      }
      scratch_[id] += bias;
    }
    apply_penalties(prompt, generated);
    row = scratch_;
  }

  bool any_nan = false;
  int32_t best = argmax_checking_nan(row, any_nan);
  if (any_nan) {
    fail_on_nan(logits);
    // The model's logits hold none: an infinite logit met the opposite infinite bias.
    fail("sampling: logit_bias", "an infinite logit plus the opposite infinite bias is NaN");
  }
  // The row's argmax, when allowed, is the masked row's.
  if (masked && !is_allowed(allowed, static_cast<size_t>(best))) {
    best = -1;
    for_each_allowed(allowed, row.size(), [&](size_t id) {
      if (best < 0 || row[id] > row[static_cast<size_t>(best)]) best = static_cast<int32_t>(id);
    });
  }
  const float max_logit = best < 0 ? -std::numeric_limits<float>::infinity() : row[best];
  if (max_logit == -std::numeric_limits<float>::infinity()) {
    fail("logits", masked ? "every token the constraint allows has a logit of -inf"
                          : "every token has a logit of -inf after logit_bias");
  }
  if (params_.greedy) {
    candidates_.assign(1, {max_logit, best});
    return max_logit;
  }

  const float t = params_.temperature;
  candidates_.clear();
  const auto add = [&](size_t i) {
    const float l = row[i] / t;
    if (l != -std::numeric_limits<float>::infinity()) {
      candidates_.push_back({l, static_cast<int32_t>(i)});
    }
  };
  if (masked) {
    for_each_allowed(allowed, row.size(), add);
  } else {
    for (size_t i = 0; i < row.size(); ++i) add(i);
  }
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < candidates_.size()) {
    // Every token tied with the k-th largest logit stays, as in transformers' TopKLogitsWarper.
    std::vector<Candidate> order = candidates_;
    const auto kth = order.begin() + (params_.top_k - 1);
    std::nth_element(order.begin(), kth, order.end(),
                     [](const Candidate& a, const Candidate& b) { return a.logit > b.logit; });
    const float threshold = kth->logit;
    std::erase_if(candidates_, [&](const Candidate& c) { return c.logit < threshold; });
  }
  // The largest candidate: l / t is monotonic in l, and top_k keeps the largest.
  if (params_.top_p < 1.0f) keep_top_p(max_logit / t);
  float top = -std::numeric_limits<float>::infinity();
  for (const Candidate& c : candidates_) top = std::max(top, c.logit);
  if (params_.min_p > 0.0f) {
    // p / p_max = exp(l - l_max): the softmax's normalization cancels.
    const double min_p = params_.min_p;
    std::erase_if(candidates_, [&](const Candidate& c) {
      return std::exp(static_cast<double>(c.logit) - top) < min_p;
    });
  }
  return top;
}

double Sampler::weigh(double top) {
  weights_.resize(candidates_.size());
  double total = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    weights_[i] = std::exp(static_cast<double>(candidates_[i].logit) - top);
    total += weights_[i];
  }
  return total;
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits,
                                             std::span<const int32_t> prompt,
                                             std::span<const int32_t> generated,
                                             std::span<const uint32_t> allowed) {
  const double total = weigh(process(logits, prompt, generated, allowed));
  std::vector<TokenProb> out(candidates_.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = {candidates_[i].id, weights_[i] / total};
  return out;
}

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::draw(double total) {
  const double target = uniform() * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    cumulative += weights_[i];
    if (cumulative > target) return candidates_[i].id;
  }
  // Rounding left the target at the very top: the last candidate with any weight.
  for (size_t i = candidates_.size(); i-- > 0;) {
    if (weights_[i] > 0.0) return candidates_[i].id;
  }
  return candidates_.back().id;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt,
                        std::span<const int32_t> generated, std::span<const uint32_t> allowed) {
  const double top = process(logits, prompt, generated, allowed);
  if (params_.greedy) return candidates_[0].id;
  return draw(weigh(top));
}

int32_t Sampler::sample_with_draft(std::span<const float> logits, std::span<const int32_t> prompt,
                                   std::span<const int32_t> generated, int32_t draft) {
  const double top = process(logits, prompt, generated, {});
  if (params_.greedy) return candidates_[0].id;
  const double total = weigh(top);
  const auto at = std::lower_bound(candidates_.begin(), candidates_.end(), draft,
                                   [](const Candidate& c, int32_t id) { return c.id < id; });
  if (at == candidates_.end() || at->id != draft) return draw(total);  // p(draft) = 0
  const size_t index = static_cast<size_t>(at - candidates_.begin());
  if (uniform() * total < weights_[index]) return draft;
  // The residual: p without the draft. Its total is summed afresh rather than subtracted, which
  // would cancel when the draft held nearly all the mass.
  weights_[index] = 0.0;
  double rest = 0.0;
  for (const double w : weights_) rest += w;
  return rest > 0.0 ? draw(rest) : draft;
}

}  // namespace qhx
