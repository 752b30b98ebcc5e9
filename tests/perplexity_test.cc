// Perplexity and the divergence between two models (runtime/perplexity.h) against the
// definitions, computed here from each model's own logits: both ways of cutting windows, KL over
// the whole vocabulary, top-1 agreement and the perplexities' paired gap.
#include "runtime/perplexity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "support/expect_error.h"
#include "support/fixtures.h"

namespace qhx {
namespace {

const std::filesystem::path kFixtures = test::source_dir() / "tests/fixtures/qwen3";

std::vector<int32_t> random_ids(int64_t n, int32_t vocab) {
  std::mt19937 rng(7);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

struct Expected {
  double nll_base = 0, nll_model = 0, kl = 0;
  int64_t scored = 0, top1_same = 0;
};

// The definitions, window by window: `first` is where scoring starts in each window.
Expected expected(const Model& base, const Model& model, std::span<const int32_t> ids,
                  int64_t window, bool second_half) {
  const int64_t vocab = model.config().vocab_size, n = static_cast<int64_t>(ids.size());
  Expected e;
  for (int64_t start = 0; second_half ? start + window <= n : start + 1 < n; start += window) {
    const int64_t length = second_half ? window - 1 : std::min(window, n - 1 - start);
    const int64_t first = second_half ? window / 2 : 0;
    std::vector<float> lb, lq;
    auto sb = base.new_state(), sq = model.new_state();
    base.forward(ids.subspan(start, length), *sb, LogitsFor::kEveryToken, lb);
    model.forward(ids.subspan(start, length), *sq, LogitsFor::kEveryToken, lq);
    for (int64_t t = first; t < length; ++t) {
      std::vector<double> pb(vocab), pq(vocab);
      double zb = 0, zq = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        zb += pb[v] = std::exp(static_cast<double>(lb[t * vocab + v]));
        zq += pq[v] = std::exp(static_cast<double>(lq[t * vocab + v]));
      }
      const int32_t target = ids[start + t + 1];
      e.nll_base -= std::log(pb[target] / zb);
      e.nll_model -= std::log(pq[target] / zq);
      for (int64_t v = 0; v < vocab; ++v)
        e.kl += pb[v] / zb * std::log((pb[v] / zb) / (pq[v] / zq));
      e.top1_same += std::max_element(pb.begin(), pb.end()) ==
                     pb.begin() + (std::max_element(pq.begin(), pq.end()) - pq.begin());
      ++e.scored;
    }
  }
  return e;
}

TEST(Perplexity, DivergenceFollowsTheDefinitionsInBothWindowings) {
  const auto base = load_model(kFixtures / "gqa2_f16");
  const auto model = load_model(kFixtures / "gqa2_tied_bf16");
  ASSERT_EQ(base->config().vocab_size, model->config().vocab_size);
  const std::vector<int32_t> ids = random_ids(70, static_cast<int32_t>(model->config().vocab_size));
  for (const bool second_half : {false, true}) {
    const PerplexityWindows windows{.window = 16, .second_half = second_half};
    const DivergenceResult r = kl_divergence(*base, *model, ids, windows);
    const Expected e = expected(*base, *model, ids, 16, second_half);
    EXPECT_EQ(r.model.scored, e.scored);
    EXPECT_EQ(r.model.windows, second_half ? 4 : 5);
    EXPECT_EQ(static_cast<int64_t>(r.kl.size()), e.scored);
    EXPECT_NEAR(r.base.nll_sum, e.nll_base, 1e-9 * e.nll_base);
    EXPECT_NEAR(r.model.nll_sum, e.nll_model, 1e-9 * e.nll_model);
    EXPECT_NEAR(r.kl_mean(), e.kl / static_cast<double>(e.scored), 1e-6 * e.kl / e.scored);
    EXPECT_GT(r.kl_mean(), 0.01);  // two different random models
    EXPECT_EQ(r.top1_same, e.top1_same);
    EXPECT_NEAR(r.log_ppl_ratio(), (e.nll_model - e.nll_base) / static_cast<double>(e.scored),
                1e-9);
    // The perplexities are each model's own, as perplexity() scores them alone.
    EXPECT_EQ(r.base.nll_sum, perplexity(*base, ids, windows).nll_sum);
    EXPECT_EQ(r.model.perplexity(), perplexity(*model, ids, windows).perplexity());
    EXPECT_NEAR(r.ppl_delta(), r.model.perplexity() - r.base.perplexity(), 1e-12);
    EXPECT_GT(r.log_ppl_ratio_error(), 0);
    EXPECT_LE(r.kl_quantile(0.5), r.kl_quantile(0.99));
    EXPECT_LE(r.kl_quantile(0.99), r.kl_quantile(1));
  }
}

TEST(Perplexity, AModelDivergesFromItselfByNothing) {
  const auto model = load_model(kFixtures / "gqa2_f16");
  const std::vector<int32_t> ids = random_ids(40, static_cast<int32_t>(model->config().vocab_size));
  const DivergenceResult r = kl_divergence(*model, *model, ids, {.window = 12});
  EXPECT_EQ(r.kl_mean(), 0);
  EXPECT_EQ(r.top1_agreement(), 1);
  EXPECT_EQ(r.ppl_delta(), 0);
  EXPECT_EQ(r.rms_p_gap(), 0);
}

TEST(Perplexity, RefusesWhatItCannotScore) {
  const auto model = load_model(kFixtures / "gqa2_f16");
  const auto other_vocab = load_model(kFixtures / "gqa4_sharded_f32");
  const std::vector<int32_t> ids = random_ids(40, 320);
  test::expect_error([&] { kl_divergence(*other_vocab, *model, ids, {.window = 8}); },
                     {"--kl-divergence", "320 tokens", "384"});
  test::expect_error([&] { perplexity(*model, ids, {.window = 41, .second_half = true}); },
                     {"40 tokens", "fewer than one window of 41"});
  test::expect_error([&] { perplexity(*model, ids, {.window = 2, .second_half = true}); },
                     {"second half", "3 tokens"});
}

}  // namespace
}  // namespace qhx
