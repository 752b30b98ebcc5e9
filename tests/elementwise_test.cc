// The fast elementwise kernels (kernels/elementwise.h) against their scalar references, on lengths
// that end in a partial vector, and the promise that an element's result does not depend on where
// the array ends (what keeps a decoded token equal to the same token inside a prefill).
#include "kernels/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu_context.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"
#include "kernels/simd_avx2.h"
#include "kernels/simd_avx512.h"
#include "support/cpu.h"
#include "support/fixtures.h"

namespace qhx {
namespace {

using test::random_vector;

constexpr int64_t kLengths[] = {1, 5, 8, 13, 64, 133};

// |fast − expected| ≤ relative · |expected| + absolute, element by element.
void expect_close(const std::vector<float>& fast, const std::vector<float>& expected,
                  float relative, float absolute, const std::string& what) {
  ASSERT_EQ(fast.size(), expected.size()) << what;
  for (size_t i = 0; i < fast.size(); ++i) {
    ASSERT_NEAR(fast[i], expected[i], relative * std::fabs(expected[i]) + absolute)
        << what << " at " << i;
  }
}

TEST(Elementwise, RmsNormMatchesTheReference) {
  auto cx = test::cpu();
  for (const int64_t n : kLengths) {
    const std::vector<float> x = random_vector(n, 1, 3.0f), w = random_vector(n, 2);
    std::vector<float> expected(n), fast(n), in_place = x;
    ref::rms_norm(x.data(), w.data(), n, 1e-6f, expected.data());
    rms_norm(*cx, x.data(), w.data(), n, 1e-6f, fast.data());
    rms_norm(*cx, in_place.data(), w.data(), n, 1e-6f, in_place.data());
    expect_close(fast, expected, 1e-6f, 1e-30f, "n=" + std::to_string(n));
    EXPECT_EQ(in_place, fast) << "y aliasing x, n=" << n;
  }
}

TEST(Elementwise, L2NormalizeMatchesTheReference) {
  auto cx = test::cpu();
  for (const int64_t n : kLengths) {
    std::vector<float> expected = random_vector(n, 3, 2.0f), fast = expected;
    ref::l2_normalize(expected.data(), n, 1e-6f);
    l2_normalize(*cx, fast.data(), n, 1e-6f);
    expect_close(fast, expected, 1e-6f, 1e-30f, "n=" + std::to_string(n));
  }
}

TEST(Elementwise, RopeMatchesTheReferenceAndPassesTheRestThrough) {
  auto cx = test::cpu();
  for (const int64_t rotary : {4, 12, 24, 64}) {
    const int64_t stride = rotary + 5, n_vectors = 3, half = rotary / 2;
    const std::vector<float> x = random_vector(n_vectors * stride, 4);
    const std::vector<float> angles = random_vector(half, 5, 3.0f);
    std::vector<float> cos(half), sin(half);
    for (int64_t i = 0; i < half; ++i) {
      cos[i] = std::cos(angles[i]);
      sin[i] = std::sin(angles[i]);
    }
    std::vector<float> expected = x, fast = x;
    ref::rope_rotate_half(expected.data(), n_vectors, stride, rotary, cos.data(), sin.data());
    rope_rotate_half(*cx, fast.data(), n_vectors, stride, rotary, cos.data(), sin.data());
    // a·cos − b·sin may cancel: an absolute bound at the inputs' scale
    expect_close(fast, expected, 0.0f, 1e-6f, "rotary " + std::to_string(rotary));
    for (int64_t v = 0; v < n_vectors; ++v) {
      for (int64_t i = rotary; i < stride; ++i) EXPECT_EQ(fast[v * stride + i], x[v * stride + i]);
    }
  }
}

// Gate inputs the exponential sees over its whole range, saturated ends included: a dense sweep
// of [-95, 95) when n is large, random values and the extremes otherwise.
std::vector<float> gate_inputs(int64_t n, uint32_t seed) {
  std::vector<float> g = random_vector(n, seed, 6.0f);
  if (n >= 19000) {
    for (int64_t i = 0; i < 19000; ++i) g[i] = -95.0f + 0.01f * static_cast<float>(i);
  }
  const float extremes[] = {-100.0f, -88.5f, -87.0f, -20.0f, -1e-3f, 0.0f,
                            1e-3f,   20.0f,  87.0f,  88.5f,  100.0f};
  for (size_t i = 0; i < std::size(extremes) && i < g.size(); ++i)
    g[i * 3 % g.size()] = extremes[i];
  return g;
}

// Relative bounds: e^x is within a few ulp everywhere. Where it saturates (x < -87.3 or > 88),
// the absolute floor covers 1e-38 given for 0.
TEST(Elementwise, GatesMatchTheReferenceOverTheWholeRange) {
  auto cx = test::cpu();
  std::vector<int64_t> lengths(std::begin(kLengths), std::end(kLengths));
  lengths.push_back(19005);
  for (const int64_t n : lengths) {
    const std::vector<float> gate = gate_inputs(n, 6), up = random_vector(n, 7);
    std::vector<float> expected(n), fast(n);
    ref::silu_mul(gate.data(), up.data(), n, expected.data());
    silu_mul(*cx, gate.data(), up.data(), n, fast.data());
    expect_close(fast, expected, 1e-6f, 1e-30f, "silu_mul n=" + std::to_string(n));

    std::vector<float> gated = up;
    expected = up;
    ref::sigmoid_gate(gate.data(), n, expected.data());
    sigmoid_gate(*cx, gate.data(), n, gated.data());
    expect_close(gated, expected, 1e-6f, 1e-30f, "sigmoid_gate n=" + std::to_string(n));
  }
}

#if defined(__x86_64__)
QHX_TARGET_AVX2 void exp_avx2(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, avx2::exp(_mm256_loadu_ps(x + i)));
}
QHX_TARGET_AVX512 void exp_avx512(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(y + i, avx512::exp(_mm512_loadu_ps(x + i)));
}

// The AVX-512 kernels' e^x (the attention's softmax) is the AVX2 one's, bit for bit, over the
// whole range (clamps included).
TEST(Elementwise, Avx512ExpIsTheAvx2ExpBitwise) {
  if (!CpuKernels::detect().avx512) GTEST_SKIP() << "no AVX-512 here";
  const std::vector<float> x = gate_inputs(19008, 12);  // a whole number of vectors
  std::vector<float> y2(x.size()), y512(x.size());
  exp_avx2(x.data(), static_cast<int64_t>(x.size()), y2.data());
  exp_avx512(x.data(), static_cast<int64_t>(x.size()), y512.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(std::memcmp(&y2[i], &y512[i], sizeof(float)), 0) << "e^" << x[i];
  }
}
#endif

// Each op on the suffix [offset, n) of an array gives bitwise the values it gives there in the
// whole array: the masked last block runs the same arithmetic as the full ones.
TEST(Elementwise, AnElementsResultDoesNotDependOnWhereTheArrayEnds) {
  auto cx = test::cpu();
  const int64_t n = 21;
  const std::vector<float> gate = gate_inputs(n, 8), up = random_vector(n, 9);
  std::vector<float> silu_all(n), sigmoid_all = up;
  silu_mul(*cx, gate.data(), up.data(), n, silu_all.data());
  sigmoid_gate(*cx, gate.data(), n, sigmoid_all.data());
  for (const int64_t offset : {1, 3, 8, 13, 16}) {
    const int64_t len = n - offset;
    std::vector<float> silu_part(len), sigmoid_part(up.begin() + offset, up.end());
    silu_mul(*cx, gate.data() + offset, up.data() + offset, len, silu_part.data());
    sigmoid_gate(*cx, gate.data() + offset, len, sigmoid_part.data());
    EXPECT_TRUE(std::equal(silu_part.begin(), silu_part.end(), silu_all.begin() + offset))
        << "silu_mul from " << offset;
    EXPECT_TRUE(std::equal(sigmoid_part.begin(), sigmoid_part.end(), sigmoid_all.begin() + offset))
        << "sigmoid_gate from " << offset;
  }
  // RoPE of one vector alone equals the same vector among others.
  const int64_t rotary = 20, stride = 26;
  const std::vector<float> angles = random_vector(rotary / 2, 10);
  std::vector<float> cos(rotary / 2), sin(rotary / 2);
  for (int64_t i = 0; i < rotary / 2; ++i) {
    cos[i] = std::cos(angles[i]);
    sin[i] = std::sin(angles[i]);
  }
  std::vector<float> batch = random_vector(3 * stride, 11);
  std::vector<float> alone(batch.begin() + 2 * stride, batch.end());
  rope_rotate_half(*cx, batch.data(), 3, stride, rotary, cos.data(), sin.data());
  rope_rotate_half(*cx, alone.data(), 1, stride, rotary, cos.data(), sin.data());
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + 2 * stride));
}

TEST(Elementwise, CausalConvMatchesTheReferenceAndContinuesFromItsState) {
  auto cx = test::cpu();
  const int64_t kernel = 4, history = kernel - 1, n = 7;
  for (const int64_t channels : {3, 13, 40}) {
    const std::vector<float> u = random_vector(n * channels, 12, 2.0f),
                             w = random_vector(channels * kernel, 13);
    const std::vector<float> initial = random_vector(history * channels, 14);
    std::vector<float> expected_state = initial, state = initial;
    std::vector<float> expected(n * channels), fast(n * channels);
    ref::causal_conv1d_silu(u.data(), n, channels, w.data(), kernel, expected_state.data(),
                            expected.data());
    causal_conv1d_silu(*cx, u.data(), n, channels, w.data(), kernel, state.data(), fast.data());
    expect_close(fast, expected, 1e-6f, 1e-6f, "channels " + std::to_string(channels));
    EXPECT_EQ(state, expected_state) << "channels " << channels;

    // In pieces shorter and longer than the history, bitwise the same outputs and state.
    for (const int64_t piece : {1, 2, 5}) {
      std::vector<float> split_state = initial, split(n * channels);
      for (int64_t t = 0; t < n; t += piece) {
        const int64_t len = std::min(piece, n - t);
        causal_conv1d_silu(*cx, u.data() + t * channels, len, channels, w.data(), kernel,
                           split_state.data(), split.data() + t * channels);
      }
      EXPECT_EQ(split, fast) << "channels " << channels << " in pieces of " << piece;
      EXPECT_EQ(split_state, state) << "channels " << channels << " in pieces of " << piece;
    }
  }
}

}  // namespace
// A prompt's norms and gates are spread over the context's threads: on 1, 2 and 3 threads every
// element equals what one thread computes element by element (the gates on a length past a part
// boundary and not a multiple of the vector, the norms over rows whose count is not a multiple of
// the threads).
TEST(Elementwise, ThreadsDoNotChangeAResult) {
  auto cx = test::cpu();
  const int64_t n = 200003, rows = 517, width = 128;
  const std::vector<float> gate = gate_inputs(n, 12), up = random_vector(n, 13);
  const std::vector<float> x = random_vector(rows * width, 14, 3.0f), w = random_vector(width, 15);
  std::vector<float> silu_one(n), sigmoid_one = up, norm_one(rows * width);
  silu_mul(*cx, gate.data(), up.data(), n, silu_one.data());
  sigmoid_gate(*cx, gate.data(), n, sigmoid_one.data());
  for (int64_t r = 0; r < rows; ++r) {
    rms_norm(*cx, x.data() + r * width, w.data(), width, 1e-6f, norm_one.data() + r * width);
  }
  // The residual add fused with the norm: the sum, then the norm of the sum.
  const std::vector<float> y = random_vector(rows * width, 16, 3.0f);
  std::vector<float> sum_one = x, added_norm_one(rows * width);
  for (int64_t i = 0; i < rows * width; ++i) sum_one[i] += y[i];
  for (int64_t r = 0; r < rows; ++r) {
    rms_norm(*cx, sum_one.data() + r * width, w.data(), width, 1e-6f,
             added_norm_one.data() + r * width);
  }
  for (const int threads : {1, 2, 3}) {
    cx = test::cpu(threads);
    std::vector<float> silu(n), sigmoid = up, norm(rows * width), sum = x, added_norm(rows * width);
    silu_mul(*cx, gate.data(), up.data(), n, silu.data());
    sigmoid_gate(*cx, gate.data(), n, sigmoid.data());
    rms_norm_rows(*cx, x.data(), w.data(), rows, width, 1e-6f, norm.data());
    add_rms_norm_rows(*cx, sum.data(), y.data(), w.data(), rows, width, 1e-6f, added_norm.data());
    EXPECT_EQ(silu, silu_one) << threads << " threads";
    EXPECT_EQ(sigmoid, sigmoid_one) << threads << " threads";
    EXPECT_EQ(norm, norm_one) << threads << " threads";
    EXPECT_EQ(sum, sum_one) << threads << " threads";
    EXPECT_EQ(added_norm, added_norm_one) << threads << " threads";
  }
}

}  // namespace qhx
