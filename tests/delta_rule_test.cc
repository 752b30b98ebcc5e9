// The fast gated delta rule (kernels/delta_rule.h) against the scalar references, on head sizes
// that end in partial vectors and blocks, with GQA, a partial last chunk and any thread count.
#include "kernels/delta_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu_context.h"
#include "kernels/kernels.h"
#include "support/cpu.h"
#include "support/fixtures.h"

namespace qhx {
namespace {

using test::random_vector;

// Inputs as the model makes them: unit q and k, β in (0, 1), g ≤ 0.
struct Inputs {
  DeltaRuleShape shape;
  int64_t n_tokens;
  std::vector<float> q, k, v, beta, g, state;

  Inputs(const DeltaRuleShape& s, int64_t n, uint32_t seed) : shape(s), n_tokens(n) {
    q = random_vector(n * s.n_k_heads * s.k_dim, seed);
    k = random_vector(n * s.n_k_heads * s.k_dim, seed + 1);
    v = random_vector(n * s.n_v_heads * s.v_dim, seed + 2);
    beta = random_vector(n * s.n_v_heads, seed + 3, 2.0f);
    g = random_vector(n * s.n_v_heads, seed + 4, 0.5f);
    state = random_vector(s.n_v_heads * s.k_dim * s.v_dim, seed + 5, 0.5f);
    for (int64_t i = 0; i < n * s.n_k_heads; ++i) {
      ref::l2_normalize(q.data() + i * s.k_dim, s.k_dim, 1e-6f);
      ref::l2_normalize(k.data() + i * s.k_dim, s.k_dim, 1e-6f);
    }
    for (float& b : beta) b = 1.0f / (1.0f + std::exp(-b));
    for (float& x : g) x = -std::fabs(x);
  }
  size_t out_size() const { return n_tokens * shape.n_v_heads * shape.v_dim; }
};

constexpr DeltaRuleShape kShapes[] = {
    {2, 4, 8, 6},       // two value heads per key head; rows shorter than a vector
    {1, 1, 20, 37},     // a full column block plus a partial vector
    {1, 2, 16, 16},     // GQA with whole vectors
    {2, 2, 128, 128}};  // the real head size

std::string name(const DeltaRuleShape& s) {
  return std::to_string(s.n_k_heads) + "/" + std::to_string(s.n_v_heads) + " heads, " +
         std::to_string(s.k_dim) + "x" + std::to_string(s.v_dim);
}

// max |a − b| / max |a|, as the parity tests measure.
float relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0.0f, scale = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(a[i]));
  }
  return worst / scale;
}

TEST(DeltaRule, RecurrentMatchesTheReference) {
  auto cx = test::cpu();
  for (const DeltaRuleShape& s : kShapes) {
    const Inputs in(s, 9, 20);
    std::vector<float> expected_state = in.state, state = in.state;
    std::vector<float> expected(in.out_size()), fast(in.out_size());
    ref::gated_delta_rule_recurrent(in.q.data(), in.k.data(), in.v.data(), in.beta.data(),
                                    in.g.data(), in.n_tokens, s, expected_state.data(),
                                    expected.data());
    gated_delta_rule_recurrent(*cx, in.q.data(), in.k.data(), in.v.data(), in.beta.data(),
                               in.g.data(), in.n_tokens, s, state.data(), fast.data());
    EXPECT_LE(relative_diff(expected, fast), 1e-6f) << name(s);
    EXPECT_LE(relative_diff(expected_state, state), 1e-6f) << name(s);
  }
}

TEST(DeltaRule, ChunkedMatchesTheReference) {
  auto cx = test::cpu();
  for (const DeltaRuleShape& s : kShapes) {
    const Inputs in(s, 37, 30);
    for (const int64_t chunk : {1, 5, 8, 64}) {
      std::vector<float> expected_state = in.state, state = in.state;
      std::vector<float> expected(in.out_size()), fast(in.out_size());
      ref::gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.beta.data(),
                                    in.g.data(), in.n_tokens, s, chunk, expected_state.data(),
                                    expected.data());
      gated_delta_rule_chunked(*cx, in.q.data(), in.k.data(), in.v.data(), in.beta.data(),
                               in.g.data(), in.n_tokens, s, chunk, state.data(), fast.data());
      EXPECT_LE(relative_diff(expected, fast), 2e-6f) << name(s) << ", chunk " << chunk;
      EXPECT_LE(relative_diff(expected_state, state), 2e-6f) << name(s) << ", chunk " << chunk;
    }
  }
}

// Decode calls the recurrent rule one token at a time: the same bits as one call over all.
TEST(DeltaRule, RecurrentTokenByTokenEqualsOneCall) {
  auto cx = test::cpu();
  for (const DeltaRuleShape& s : kShapes) {
    const Inputs in(s, 6, 40);
    std::vector<float> state = in.state, out(in.out_size());
    gated_delta_rule_recurrent(*cx, in.q.data(), in.k.data(), in.v.data(), in.beta.data(),
                               in.g.data(), in.n_tokens, s, state.data(), out.data());
    std::vector<float> stepped_state = in.state, stepped(in.out_size());
    const int64_t qk = s.n_k_heads * s.k_dim, vw = s.n_v_heads * s.v_dim, hv = s.n_v_heads;
    for (int64_t t = 0; t < in.n_tokens; ++t) {
      gated_delta_rule_recurrent(*cx, in.q.data() + t * qk, in.k.data() + t * qk,
                                 in.v.data() + t * vw, in.beta.data() + t * hv,
                                 in.g.data() + t * hv, 1, s, stepped_state.data(),
                                 stepped.data() + t * vw);
    }
    EXPECT_EQ(stepped, out) << name(s);
    EXPECT_EQ(stepped_state, state) << name(s);
  }
}

TEST(DeltaRule, SameBitsOnAnyNumberOfThreads) {
  auto cx = test::cpu();
  const DeltaRuleShape s = kShapes[3];
  const Inputs in(s, 21, 50);
  const auto run = [&](int threads, bool chunked) {
    cx = test::cpu(threads);
    std::vector<float> state = in.state, out(in.out_size());
    if (chunked) {
      gated_delta_rule_chunked(*cx, in.q.data(), in.k.data(), in.v.data(), in.beta.data(),
                               in.g.data(), in.n_tokens, s, 8, state.data(), out.data());
    } else {
      gated_delta_rule_recurrent(*cx, in.q.data(), in.k.data(), in.v.data(), in.beta.data(),
                                 in.g.data(), in.n_tokens, s, state.data(), out.data());
    }
    out.insert(out.end(), state.begin(), state.end());
    return out;
  };
  for (const bool chunked : {false, true}) {
    const std::vector<float> one = run(1, chunked);
    for (const int threads : {2, 3}) EXPECT_EQ(run(threads, chunked), one) << threads;
  }
}

}  // namespace
}  // namespace qhx
