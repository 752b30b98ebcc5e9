// The sampler: penalties and filters on hand-computed rows, seeded draws against their
// probabilities, reproducibility, and parameter errors. (The golden distributions from
// transformers are checked in generation_test.cc, which needs the JSON reader.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "runtime/sampler.h"
#include "support/expect_error.h"
#include "support/fixtures.h"

namespace qhx {
namespace {

using Ids = std::vector<int32_t>;

SamplingParams sampling() {
  SamplingParams p;
  p.greedy = false;
  return p;
}

// log of each probability: a row whose softmax is exactly `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (const double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

Ids ids_of(const std::vector<TokenProb>& dist) {
  Ids out;
  for (const TokenProb& t : dist) out.push_back(t.id);
  return out;
}

void expect_softmax(const std::vector<TokenProb>& dist, const std::vector<double>& logits) {
  ASSERT_EQ(dist.size(), logits.size());
  double total = 0.0;
  for (const double l : logits) total += std::exp(l);
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_EQ(dist[i].id, static_cast<int32_t>(i));
    EXPECT_NEAR(dist[i].prob, std::exp(logits[i]) / total, 1e-6) << i;
  }
}

TEST(Sampler, ArgmaxTakesTheFirstOfTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(argmax(logits), 1);
  // Against a plain scan, on lengths around the vectorised loop's 16 lanes and a vocabulary's,
  // with values drawn from a few levels so that the largest one repeats across lanes.
  std::mt19937 rng(5);
  for (const size_t n : {1, 2, 15, 16, 31, 32, 33, 47, 48, 100, 151936}) {
    for (const int levels : {3, 50}) {
      std::uniform_int_distribution<int> level(-levels, levels);
      std::vector<float> x(n);
      for (float& v : x) v = static_cast<float>(level(rng)) * 0.25f;
      size_t expected = 0;
      for (size_t i = 1; i < n; ++i) {
        if (x[i] > x[expected]) expected = i;
      }
      EXPECT_EQ(argmax(x), static_cast<int32_t>(expected)) << "n " << n << " levels " << levels;
      x[n - 1] = 100.0f;  // a maximum in the tail that the lanes do not cover
      EXPECT_EQ(argmax(x), static_cast<int32_t>(n - 1)) << "n " << n;
    }
  }
}

TEST(Sampler, PenaltiesFollowTheirFormulas) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 1.0f, 0.0f};
  const Ids prompt = {0, 0, 1};
  const Ids generated = {2, 2, 3};
  SamplingParams p = sampling();
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.logit_bias = {{4, -1.0f}, {3, 0.5f}};
  Sampler s(p);
  // Bias and the OpenAI terms first (generated only), then the repetition penalty once per
  // distinct id of prompt + generated: positive logits divided, negative ones multiplied.
  expect_softmax(s.distribution(logits, prompt, generated),
                 {2.0 / 2,                         // prompt twice: once penalized
                  -1.0 * 2,                        // negative: multiplied
                  (0.5 - (0.25 * 2 + 0.5)) * 2,    // count 2, then negative: multiplied
                  (1.0 + 0.5 - (0.25 + 0.5)) / 2,  // biased, count 1
                  0.0 - 1.0});                     // biased, never seen
}

TEST(Sampler, PresenceAndFrequencyIgnoreThePrompt) {
  const std::vector<float> logits = {1.0f, 1.0f};
  SamplingParams p = sampling();
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 1.0f;
  Sampler s(p);
  expect_softmax(s.distribution(logits, Ids{0, 0, 1}, Ids{}), {1.0, 1.0});
  expect_softmax(s.distribution(logits, Ids{}, Ids{1, 1, 1}), {1.0, 1.0 - 4.0});
}

TEST(Sampler, GreedyAppliesBiasAndPenalties) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.5f};
  SamplingParams p;  // greedy
  EXPECT_EQ(Sampler(p).sample(logits, {}, {}), 1);
  p.repetition_penalty = 1.5f;  // 3 / 1.5 = 2 < 2.5
  EXPECT_EQ(Sampler(p).sample(logits, Ids{1}, {}), 2);
  p.logit_bias = {{0, 5.0f}};
  Sampler biased(p);
  EXPECT_EQ(biased.sample(logits, Ids{1}, {}), 0);
  const auto dist = biased.distribution(logits, Ids{1}, {});
  ASSERT_EQ(dist.size(), 1u);
  EXPECT_EQ(dist[0].id, 0);
  EXPECT_EQ(dist[0].prob, 1.0);
}

TEST(Sampler, TopKKeepsTiesWithTheKth) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 2.0f, 0.0f};
  SamplingParams p = sampling();
  p.top_k = 2;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {}, {})), (Ids{1, 2, 3}));
  p.top_k = 1;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {}, {})), (Ids{1}));
  p.top_k = 50;  // more than the vocabulary: no limit
  EXPECT_EQ(Sampler(p).distribution(logits, {}, {}).size(), logits.size());
}

TEST(Sampler, TopPDropsTheTailWhoseMassIsAtMostOneMinusP) {
  const std::vector<float> logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = sampling();
  p.top_p = 0.75f;  // tail 0.05, 0.2 ≤ 0.25 go; 0.5 > 0.25 stays
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {}, {})), (Ids{0, 1}));
  p.top_p = 0.9f;  // 0.05 ≤ 0.1 goes; 0.2 > 0.1 stays
  const auto dist = Sampler(p).distribution(logits, {}, {});
  EXPECT_EQ(ids_of(dist), (Ids{0, 1, 2}));
  EXPECT_NEAR(dist[0].prob, 0.5 / 0.95, 1e-6);
  p.top_p = 0.01f;  // the most likely token always stays
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {}, {})), (Ids{0}));
}

// transformers' TopPLogitsWarper written out: sort ascending, drop while the cumulative
// probability (the token's own included) is <= 1 - top_p, keep the most likely.
Ids top_p_by_full_sort(const std::vector<float>& logits, float temperature, float top_p) {
  std::vector<std::pair<float, int32_t>> order;
  for (size_t i = 0; i < logits.size(); ++i) {
    order.push_back({logits[i] / temperature, static_cast<int32_t>(i)});
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second > b.second);
  });
  const double top = order.back().first;
  double total = 0.0;
  for (const auto& [l, id] : order) total += std::exp(static_cast<double>(l) - top);
  double cumulative = 0.0;
  size_t first = 0;
  while (first + 1 < order.size()) {
    cumulative += std::exp(static_cast<double>(order[first].first) - top) / total;
    if (cumulative > 1.0 - static_cast<double>(top_p)) break;
    ++first;
  }
  Ids kept;
  for (size_t i = first; i < order.size(); ++i) kept.push_back(order[i].second);
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST(Sampler, TopPOverAWholeVocabularyKeepsWhatAFullSortKeeps) {
  // Flat and peaked rows of Qwen3's size, where the bucketed cut must find the same tokens.
  for (const float scale : {0.5f, 3.0f, 12.0f}) {
    const std::vector<float> logits = test::random_vector(151936, 17, scale);
    for (const float top_p : {0.5f, 0.9f, 0.95f, 0.999f}) {
      SamplingParams p = sampling();
      p.temperature = 0.7f;
      p.top_p = top_p;
      EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {}, {})),
                top_p_by_full_sort(logits, 0.7f, top_p))
          << "scale " << scale << ", top_p " << top_p;
    }
  }
}

TEST(Sampler, TokenLogprobsAreTheLogSoftmaxWithTheMostLikelyFirst) {
  std::vector<float> logits = test::random_vector(1000, 5, 4.0f);
  logits[20] = logits[10] = 30.0f;  // tied at the top: the lower id first
  logits[30] = -std::numeric_limits<float>::infinity();
  double total = 0.0;
  for (const float l : logits) total += std::exp(static_cast<double>(l) - 30.0);
  const double log_total = 30.0 + std::log(total);
  const TokenLogprobs lp = token_logprobs(logits, 42, 5);
  EXPECT_EQ(lp.token, 42);
  EXPECT_NEAR(lp.logprob, logits[42] - log_total, 1e-5);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ASSERT_EQ(lp.top_ids.size(), 5u);
  ASSERT_EQ(lp.top_logprobs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top_ids[i], order[i]) << i;
    EXPECT_NEAR(lp.top_logprobs[i], logits[order[i]] - log_total, 1e-5) << i;
  }
  EXPECT_EQ(lp.top_ids[0], 10);
  // Over the whole row the probabilities sum to 1; a logit of -inf has none.
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    sum +=
        std::exp(static_cast<double>(token_logprobs(logits, static_cast<int32_t>(i), 0).logprob));
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  const TokenLogprobs none = token_logprobs(logits, 30, 0);
  EXPECT_EQ(none.logprob, -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(none.top_ids.empty());
  EXPECT_EQ(token_logprobs(logits, 1, 2000).top_ids.size(), logits.size());
  test::expect_error([&] { token_logprobs(logits, 1000, 0); }, {"logprobs", "outside"});
}

TEST(Sampler, MinPIsRelativeToTheMostLikelyAfterTemperature) {
  const std::vector<float> logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = sampling();
  p.min_p = 0.5f;  // 0.3 / 0.5 = 0.6 stays, 0.15 / 0.5 = 0.3 goes
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {}, {})), (Ids{0, 1}));
  p.temperature = 4.0f;  // ratios become 0.6^(1/4) = 0.88 and 0.3^(1/4) = 0.74, 0.1^(1/4) = 0.56
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {}, {})), (Ids{0, 1, 2, 3}));
  p.min_p = 0.8f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {}, {})), (Ids{0, 1}));
  p.min_p = 1.0f;  // only what is as likely as the top
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {}, {})), (Ids{0}));
}

TEST(Sampler, NegativeInfiniteBiasBansAToken) {
  const std::vector<float> logits = {5.0f, 0.0f, 0.0f};
  SamplingParams p = sampling();
  p.logit_bias = {{0, -std::numeric_limits<float>::infinity()}};
  Sampler s(p);
  EXPECT_EQ(ids_of(s.distribution(logits, {}, {})), (Ids{1, 2}));
  for (int i = 0; i < 100; ++i) EXPECT_NE(s.sample(logits, {}, {}), 0);
}

// Each frequency of `draw()`'s ids within 5 standard deviations of its probability (a false
// alarm once in ~10^6).
template <typename Draw>
void expect_frequencies_of(Draw draw, const std::map<int32_t, double>& expected) {
  const int n = 20000;
  std::map<int32_t, int> seen;
  for (int i = 0; i < n; ++i) ++seen[draw()];
  for (const auto& [id, count] : seen) {
    EXPECT_TRUE(expected.count(id)) << "id " << id << " drawn " << count << " times";
  }
  for (const auto& [id, prob] : expected) {
    const double sigma = std::sqrt(prob * (1 - prob) / n);
    EXPECT_NEAR(static_cast<double>(seen[id]) / n, prob, 5 * sigma + 1e-12) << "id " << id;
  }
}

void expect_frequencies(Sampler& s, const std::vector<float>& logits,
                        const std::map<int32_t, double>& expected) {
  expect_frequencies_of([&] { return s.sample(logits, {}, {}); }, expected);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  const std::vector<float> logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = sampling();
  p.seed = 11;
  Sampler all(p);
  expect_frequencies(all, logits, {{0, 0.5}, {1, 0.3}, {2, 0.15}, {3, 0.05}});
  p.top_k = 2;
  Sampler top2(p);
  expect_frequencies(top2, logits, {{0, 0.625}, {1, 0.375}});
  p.top_k = 0;
  p.temperature = 0.5f;  // squares the probabilities: 0.25, 0.09, 0.0225, 0.0025 of 0.365
  Sampler cold(p);
  expect_frequencies(
      cold, logits,
      {{0, 0.25 / 0.365}, {1, 0.09 / 0.365}, {2, 0.0225 / 0.365}, {3, 0.0025 / 0.365}});
}

// A constraint's mask: the tokens it leaves out get nothing, the rest keep their relative odds,
// greedy takes the best allowed one (whether or not a bias rewrote the row first).
TEST(Sampler, AMaskLeavesOnlyTheAllowedTokens) {
  std::vector<float> logits(70, -3.0f);
  logits[0] = 9.0f;   // the best, masked
  logits[33] = 2.0f;  // the best allowed, in the second word
  logits[64] = 1.0f;
  const std::vector<uint32_t> allowed = {0x2u, 0x2u, 0x1u};  // ids 1, 33, 64
  SamplingParams greedy;
  EXPECT_EQ(Sampler(greedy).sample(logits, {}, {}, allowed), 33);
  EXPECT_EQ(Sampler(greedy).sample(logits, {}, {}), 0);
  greedy.logit_bias = {{64, 5.0f}};
  EXPECT_EQ(Sampler(greedy).sample(logits, {}, {}, allowed), 64);
  greedy.logit_bias = {{0, -100.0f}};  // the unmasked argmax is allowed: the fast path
  const std::vector<uint32_t> all = {~0u, ~0u, ~0u};
  EXPECT_EQ(Sampler(greedy).sample(logits, {}, {}, all), 33);

  SamplingParams p = sampling();
  p.seed = 5;
  Sampler s(p);
  EXPECT_EQ(ids_of(s.distribution(logits, {}, {}, allowed)), (Ids{1, 33, 64}));
  const double e1 = std::exp(-3.0), e33 = std::exp(2.0), e64 = std::exp(1.0);
  const double total = e1 + e33 + e64;
  expect_frequencies_of([&] { return s.sample(logits, {}, {}, allowed); },
                        {{1, e1 / total}, {33, e33 / total}, {64, e64 / total}});
  // A mask too short for the row is an error, not a read past it.
  EXPECT_THROW(s.sample(logits, {}, {}, std::vector<uint32_t>{~0u}), Error);
  // Nothing allowed with any probability: said so.
  logits[1] = logits[33] = logits[64] = -std::numeric_limits<float>::infinity();
  EXPECT_THROW(Sampler(SamplingParams{}).sample(logits, {}, {}, allowed), Error);
}

// Speculative sampling: whatever the draft (likely, unlikely, filtered out, the only survivor),
// the token kept or drawn instead follows the distribution sample() draws from, and the draft is
// kept as often as its probability.
TEST(Sampler, DraftKeptOrReplacedFollowsTheDistribution) {
  const std::vector<float> logits = logits_of({0.5, 0.3, 0.15, 0.05, 1e-4});
  SamplingParams p = sampling();
  p.top_k = 4;  // id 4 is filtered out
  p.seed = 5;
  const std::map<int32_t, double> expected = {{0, 0.5}, {1, 0.3}, {2, 0.15}, {3, 0.05}};
  for (const int32_t draft : {0, 1, 3, 4, 7}) {
    SCOPED_TRACE("draft " + std::to_string(draft));
    Sampler s(p);
    int kept = 0, draws = 0;
    expect_frequencies_of(
        [&] {
          const int32_t id = s.sample_with_draft(logits, {}, {}, draft);
          kept += id == draft;
          ++draws;
          return id;
        },
        expected);
    const double p_draft = expected.count(draft) ? expected.at(draft) : 0.0;
    EXPECT_NEAR(static_cast<double>(kept) / draws, p_draft,
                5 * std::sqrt(p_draft * (1 - p_draft) / draws) + 1e-12);
  }
  p.top_k = 1;  // the draft is the only survivor: always kept
  Sampler only(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(only.sample_with_draft(logits, {}, {}, 0), 0);
  SamplingParams greedy;  // greedy: the argmax, whatever the draft
  EXPECT_EQ(Sampler(greedy).sample_with_draft(logits, {}, {}, 2), 0);
}

TEST(Sampler, DrawFollowsTheDocumentedRule) {
  const std::vector<float> logits = test::random_vector(300, 5, 2.0f);
  SamplingParams p = sampling();
  p.top_k = 40;
  p.seed = 99;
  Sampler s(p);
  std::mt19937_64 engine(p.seed);
  for (int i = 0; i < 200; ++i) {
    const auto dist = s.distribution(logits, {}, {});
    const double u = static_cast<double>(engine() >> 11) * 0x1.0p-53;
    double cumulative = 0.0;
    int32_t expected = dist.back().id;
    for (const TokenProb& t : dist) {
      cumulative += t.prob;
      if (cumulative > u) {
        expected = t.id;
        break;
      }
    }
    ASSERT_EQ(s.sample(logits, {}, {}), expected) << "draw " << i;
  }
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  const std::vector<float> logits = test::random_vector(500, 9, 2.0f);
  SamplingParams p = sampling();
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.seed = 1234;
  Sampler a(p), b(p);
  p.seed = 1235;
  Sampler c(p);
  int differ = 0;
  for (int i = 0; i < 50; ++i) {
    const int32_t token = a.sample(logits, {}, {});
    EXPECT_EQ(token, b.sample(logits, {}, {}));
    differ += token != c.sample(logits, {}, {});
  }
  EXPECT_GT(differ, 10);
}

TEST(Sampler, RejectsBadParametersNamingTheField) {
  const auto expect_rejected = [](auto change, const char* field) {
    SamplingParams p = sampling();
    change(p);
    test::expect_error([&] { Sampler s(p); }, {field});
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect_rejected([](SamplingParams& p) { p.temperature = 0.0f; }, "temperature");
  expect_rejected([&](SamplingParams& p) { p.temperature = nan; }, "temperature");
  expect_rejected([](SamplingParams& p) { p.top_k = -1; }, "top_k");
  expect_rejected([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  expect_rejected([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p");
  expect_rejected([&](SamplingParams& p) { p.top_p = nan; }, "top_p");
  expect_rejected([](SamplingParams& p) { p.min_p = 1.01f; }, "min_p");
  expect_rejected([](SamplingParams& p) { p.min_p = -0.1f; }, "min_p");
  expect_rejected([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  expect_rejected([&](SamplingParams& p) { p.presence_penalty = nan; }, "presence_penalty");
  expect_rejected([&](SamplingParams& p) { p.frequency_penalty = nan; }, "frequency_penalty");
  expect_rejected([&](SamplingParams& p) { p.logit_bias = {{3, nan}}; }, "logit_bias");
  expect_rejected([](SamplingParams& p) { p.logit_bias = {{-2, 1.0f}}; }, "logit_bias");

  SamplingParams greedy;
  greedy.temperature = 0.0f;  // unused when greedy
  EXPECT_EQ(Sampler(greedy).sample(std::vector<float>{0.0f, 1.0f}, {}, {}), 1);
  greedy.temperature = nan;  // but never NaN
  test::expect_error([&] { Sampler s(greedy); }, {"temperature"});
}

TEST(Sampler, RejectsBadRowsAtSampleTime) {
  SamplingParams p = sampling();
  p.logit_bias = {{7, 1.0f}};
  Sampler biased(p);
  test::expect_error([&] { biased.sample(std::vector<float>(4, 0.0f), {}, {}); },
                     {"logit_bias", "7", "outside the vocabulary (4 tokens)"});
  Sampler plain(sampling());
  std::vector<float> logits(4, 0.0f);
  logits[2] = std::numeric_limits<float>::quiet_NaN();
  test::expect_error([&] { plain.sample(logits, {}, {}); }, {"logits", "NaN at id 2"});
  // Wherever it is in a vocabulary-sized row (the vectorised pass's lanes, their seeds, the
  // tail), greedy or sampling, with or without a bias rewriting the row.
  SamplingParams hot = sampling();
  hot.greedy = false;
  hot.temperature = 0.8f;
  SamplingParams bias = sampling();
  bias.logit_bias = {{0, 1.0f}};
  for (const SamplingParams& params : {sampling(), hot, bias}) {
    for (const size_t at : {size_t{0}, size_t{5}, size_t{15}, size_t{16}, size_t{40}, size_t{99}}) {
      Sampler sampler(params);
      std::vector<float> row(100, 0.5f);
      row[at] = std::numeric_limits<float>::quiet_NaN();
      test::expect_error([&] { sampler.sample(row, {}, {}); },
                         {"logits", "NaN at id " + std::to_string(at)});
    }
  }
  // An infinite logit and the opposite infinite bias: the bias is named, not the model.
  SamplingParams ban = sampling();
  ban.logit_bias = {{3, -std::numeric_limits<float>::infinity()}};
  Sampler banning(ban);
  std::vector<float> row(64, 0.0f);
  row[3] = std::numeric_limits<float>::infinity();
  test::expect_error([&] { banning.sample(row, {}, {}); }, {"logit_bias", "NaN"});
  p.logit_bias.clear();
  p.repetition_penalty = 1.2f;
  Sampler penalized(p);
  test::expect_error(
      [&] {
        penalized.sample(std::vector<float>(4, 0.0f), Ids{1, 9}, {});
      },
      {"prompt", "9", "outside the vocabulary"});
}

}  // namespace
}  // namespace qhx
