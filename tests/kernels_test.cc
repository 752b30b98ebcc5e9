// Reference kernels against straightforward double-precision formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu_context.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/thread_pool.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "util/error.h"

namespace qhx {
namespace {

using test::random_vector;

uint16_t f32_to_bf16_truncate(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return static_cast<uint16_t>(bits >> 16);
}

TEST(DType, HalfToFloatIsExactForEveryValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const int sign = (bits >> 15) ? -1 : 1;
    const int exponent = (bits >> 10) & 0x1F;
    const int mantissa = bits & 0x3FF;
    const float got = f16_to_f32(static_cast<uint16_t>(bits));
    if (exponent == 0x1F) {
      EXPECT_TRUE(mantissa ? std::isnan(got) : std::isinf(got)) << bits;
      continue;
    }
    const double expected = exponent == 0 ? sign * std::ldexp(mantissa, -24)
                                          : sign * std::ldexp(1024 + mantissa, exponent - 25);
    EXPECT_EQ(static_cast<double>(got), expected) << bits;
    EXPECT_EQ(std::signbit(got), sign < 0) << bits;
  }
}

TEST(Kernels, MatmulMatchesDoubleForEveryWeightType) {
  const int64_t rows = 13, cols = 37, tokens = 5;
  const std::vector<float> x = random_vector(tokens * cols, 1);
  const std::vector<float> w = random_vector(rows * cols, 2);
  std::vector<uint16_t> w_bf16(w.size()), w_f16(w.size());
  std::vector<float> w_bf16_exact(w.size()), w_f16_exact(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    w_bf16[i] = f32_to_bf16_truncate(w[i]);
    w_bf16_exact[i] = bf16_to_f32(w_bf16[i]);
    // Random halves of moderate magnitude; f16_to_f32 is checked exhaustively above.
    w_f16[i] = static_cast<uint16_t>((w_bf16[i] & 0x8000) | ((10 + i % 8) << 10) | (i * 37 % 1024));
    w_f16_exact[i] = f16_to_f32(w_f16[i]);
  }
  struct Case {
    MatrixRef m;
    const std::vector<float>* exact;
  } cases[] = {{{DType::kF32, w.data(), rows, cols}, &w},
               {{DType::kBF16, w_bf16.data(), rows, cols}, &w_bf16_exact},
               {{DType::kF16, w_f16.data(), rows, cols}, &w_f16_exact}};
  for (const Case& c : cases) {
    std::vector<float> y(tokens * rows), single(rows);
    ref::matmul(x.data(), tokens, c.m, y.data());
    for (int64_t t = 0; t < tokens; ++t) {
      ref::matmul(x.data() + t * cols, 1, c.m, single.data());
      for (int64_t r = 0; r < rows; ++r) {
        double expected = 0;
        for (int64_t k = 0; k < cols; ++k)
          expected += double(x[t * cols + k]) * (*c.exact)[r * cols + k];
        EXPECT_NEAR(y[t * rows + r], expected, 1e-4) << dtype_name(c.m.dtype);
        EXPECT_EQ(y[t * rows + r], single[r]) << "a row must not depend on the batch";
      }
    }
  }
}

// The fast matmul and attention are SIMD kernels on x86-64 CPUs with AVX2 and on aarch64 (NEON).
// Elsewhere (or with QHX_KERNELS=reference) they are the reference, and the tests comparing the
// two skip.
bool fast_kernels_are_the_reference() {
  return CpuKernels::from_environment().describe() == "scalar reference";
}

TEST(Kernels, SimdKernelsAreUsedWhereAvailable) {
  const char* choice = std::getenv("QHX_KERNELS");
  if (choice != nullptr && std::string_view(choice) == "reference") {
    GTEST_SKIP() << "QHX_KERNELS=reference";
  }
  const CpuKernels kernels = CpuKernels::from_environment();
#if defined(__aarch64__)
  EXPECT_TRUE(kernels.neon);  // NEON is part of the aarch64 baseline
  EXPECT_TRUE(kernels.describe().starts_with("neon")) << kernels.describe();
  for (const KvType kv : {KvType::kF16, KvType::kQ8, KvType::kQ4}) {
    EXPECT_STREQ(attention_kernel_path(kernels, 128, kv), "neon") << kv_type_name(kv);
  }
#elif defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "this CPU has no AVX2";
  EXPECT_TRUE(kernels.describe().starts_with("avx2+fma")) << kernels.describe();
  for (const KvType kv : {KvType::kF16, KvType::kQ8, KvType::kQ4}) {
    EXPECT_STREQ(attention_kernel_path(kernels, 128, kv), "avx2+fma") << kv_type_name(kv);
  }
  EXPECT_FALSE(CpuKernels::detect("avx2").avx512);
  EXPECT_FALSE(CpuKernels::detect("reference").avx2);
  EXPECT_EQ(CpuKernels::detect("reference").describe(), "scalar reference");
#else
  GTEST_SKIP() << "no SIMD kernels for this architecture";
#endif
}

// The fast matmul against the reference, for every weight dtype, on shapes that exercise the
// 32-, 16-, 8- and 1-column paths and W4 groups with and without a 16-column tail; five tokens
// make a block that shares weight loads and a remainder.
TEST(Kernels, FastMatmulMatchesTheReference) {
  if (fast_kernels_are_the_reference()) GTEST_SKIP() << "no SIMD matmul here";
  struct Shape {
    int64_t rows, cols, group;
  } shapes[] = {{7, 37, 0}, {5, 64, 32}, {9, 256, 64}, {3, 36, 6}, {4, 200, 40}, {2, 8, 8}};
  const int64_t tokens = 5;
  CpuContext cx(1, CpuKernels::from_environment());
  for (const Shape& s : shapes) {
    const std::vector<float> x = random_vector(tokens * s.cols, 11);
    const std::vector<float> w = random_vector(s.rows * s.cols, 12, 0.05f);
    std::vector<uint16_t> bf16(w.size()), f16(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      bf16[i] = f32_to_bf16(w[i]);
      f16[i] = f32_to_f16(w[i]);
    }
    std::vector<int8_t> q8(w.size());
    std::vector<float> scales8(s.rows);
    quantize_w8(w.data(), s.rows, s.cols, q8.data(), scales8.data());
    std::vector<MatrixRef> cases = {{DType::kF32, w.data(), s.rows, s.cols},
                                    {DType::kBF16, bf16.data(), s.rows, s.cols},
                                    {DType::kF16, f16.data(), s.rows, s.cols},
                                    {DType::kW8, q8.data(), s.rows, s.cols, scales8.data()}};
    std::vector<uint8_t> q4(w.size() / 2);
    std::vector<uint16_t> scales4(s.group ? s.rows * (s.cols / s.group) : 0);
    if (s.group) {
      quantize_w4(w.data(), s.rows, s.cols, s.group, q4.data(), scales4.data());
      cases.push_back({DType::kW4, q4.data(), s.rows, s.cols, scales4.data(), s.group});
    }
    for (const MatrixRef& m : cases) {
      std::vector<float> expected(tokens * s.rows), fast(tokens * s.rows), single(s.rows);
      ref::matmul(x.data(), tokens, m, expected.data());
      matmul(cx, x.data(), tokens, m, fast.data());
      std::vector<float> row(s.cols);
      for (int64_t r = 0; r < s.rows; ++r) {
        ref::read_row(m, r, row.data());
        for (int64_t t = 0; t < tokens; ++t) {
          double magnitude = 0;  // Σ|x·w|: the scale of a float32 summation's rounding
          for (int64_t c = 0; c < s.cols; ++c) magnitude += std::fabs(x[t * s.cols + c] * row[c]);
          EXPECT_NEAR(fast[t * s.rows + r], expected[t * s.rows + r], 1e-5 * magnitude + 1e-30)
              << dtype_name(m.dtype) << " " << s.rows << "x" << s.cols << " row " << r;
        }
      }
      for (int64_t t = 0; t < tokens; ++t) {
        matmul(cx, x.data() + t * s.cols, 1, m, single.data());
        for (int64_t r = 0; r < s.rows; ++r) {
          EXPECT_EQ(fast[t * s.rows + r], single[r])
              << dtype_name(m.dtype) << " " << s.rows << "x" << s.cols
              << ": a row must not depend on the batch";
        }
      }
    }
  }
  std::printf("matmul kernel path: %s\n", cx.kernels().describe().c_str());
}

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  for (const int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (const int64_t n : {0, 1, 2, 7, 64, 1000}) {
      for (int repeat = 0; repeat < 20; ++repeat) {  // back-to-back jobs reuse the workers
        std::vector<std::atomic<int>> hits(n);
        pool.run(n, [&](int64_t i, int worker) {
          EXPECT_GE(worker, 0);
          EXPECT_LT(worker, threads);
          hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
      }
    }
  }
}

// Threads of their own (packing at load): every task runs once, and a task's exception reaches
// the caller after the other tasks have run.
TEST(ThreadPool, OwnThreadsRunEveryTaskAndPassOnAFailure) {
  for (const int threads : {1, 2, 5}) {
    for (const int64_t n : {0, 1, 3, 50}) {
      std::vector<std::atomic<int>> hits(n);
      run_on_own_threads(n, threads, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
    std::vector<std::atomic<int>> hits(20);
    EXPECT_THROW(run_on_own_threads(20, threads,
                                    [&](int64_t i) {
                                      hits[i].fetch_add(1);
                                      if (i == 7) fail("task 7", "failed on purpose");
                                    }),
                 Error);
    for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(hits[i].load(), 1) << threads << " " << i;
  }
}

// Threads split the output rows; every row is computed the same way, so any thread count gives
// bitwise the same result.
TEST(ThreadPool, MatmulIsTheSameOnAnyNumberOfThreads) {
  const int64_t rows = 301, cols = 256, tokens = 3;
  const std::vector<float> x = random_vector(tokens * cols, 21);
  const std::vector<float> w = random_vector(rows * cols, 22, 0.05f);
  const MatrixRef m{DType::kF32, w.data(), rows, cols};
  std::vector<float> one(tokens * rows), many(tokens * rows);
  CpuContext single(1, CpuKernels::from_environment());
  matmul(single, x.data(), tokens, m, one.data());
  for (const int threads : {2, 3, 4}) {
    CpuContext cx(threads, CpuKernels::from_environment());
    matmul(cx, x.data(), tokens, m, many.data());
    EXPECT_EQ(one, many) << threads << " threads";
  }
  EXPECT_THROW(CpuContext(0, {}), Error);
  EXPECT_THROW(CpuContext(1000, {}), Error);
}

// A task that throws on a pool worker does not end the process: the caller gets the exception,
// the tasks not yet started are skipped, and the pool runs the next job normally.
TEST(ThreadPool, AFailingTaskReachesTheCaller) {
  for (const int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    std::atomic<int> ran{0};
    const auto failing = [&](int64_t i, int) {
      ran.fetch_add(1);
      if (i == 3) fail("task 3", "failed on purpose");
    };
    test::expect_error([&] { pool.run(1000, failing); }, {"task 3", "failed on purpose"});
    EXPECT_LE(ran.load(), 1000);
    std::vector<std::atomic<int>> hits(100);
    pool.run(100, [&](int64_t i, int) { hits[i].fetch_add(1); });
    for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << i;
    // Through a context, as the kernels use it.
    CpuContext cx(threads, {});
    EXPECT_THROW(cx.run(50,
                        [](int64_t i, Scratch&) {
                          if (i == 49) throw std::runtime_error("last task");
                        }),
                 std::runtime_error);
  }
}

TEST(CpuKernels, AnUnknownChoiceIsRefused) {
  test::expect_error([] { CpuKernels::detect("avx9"); }, {"QHX_KERNELS", "avx9 is not one of"});
  EXPECT_NO_THROW(CpuKernels::detect(""));
}

// A slot of a thread's scratch keeps its buffer (and its largest size) from one op to the next,
// and holds one type.
TEST(Scratch, SlotsKeepTheirBuffersAndOneType) {
  Scratch scratch;
  float* a = scratch.buffer<float>(Scratch::kConvTaps, 100);
  a[99] = 1.5f;
  EXPECT_EQ(scratch.buffer<float>(Scratch::kConvTaps, 10), a);
  EXPECT_EQ(scratch.buffer<float>(Scratch::kConvTaps, 100)[99], 1.5f);
  EXPECT_NE(scratch.buffer<float>(Scratch::kAttentionScores, 10), a);
  test::expect_error([&] { scratch.buffer<int32_t>(Scratch::kConvTaps, 4); },
                     {"used with two types"});
}

// The fast attention against the reference, for every KV type the head size fits (GQA groups 1,
// 2, 4; a cached prefix; head sizes with and without the AVX2 and NEON paths; prompts long enough
// that f32 heads' rows are gathered, on threads that take whole heads or parts of them, a gather
// that grows into the last block of keys the one before it held): the reference reads the same
// stored rows, a query decoded alone equals bitwise the same query in a batch, and a quantized
// cache's output stays close to attention over the f32 rows it was made from.
TEST(Kernels, FastAttentionMatchesTheReference) {
  if (fast_kernels_are_the_reference()) GTEST_SKIP() << "no SIMD attention here";
  struct Case {
    AttentionShape shape;
    int64_t first_pos, n_queries;
  } cases[] = {
      // First, as the first gathers on their threads: 67 then 72 rows (80 in whole blocks).
      {{16, 8, 128}, 30, 37}, {{16, 8, 128}, 30, 42}, {{4, 4, 32}, 0, 9},
      {{8, 4, 64}, 5, 7},     {{8, 2, 128}, 40, 3},   {{8, 2, 256}, 17, 21},
      {{4, 1, 12}, 3, 4},     {{2, 1, 6}, 2, 3},      {{8, 2, 64}, 3, 50}};
  for (const int threads : {1, 2, 3}) {
    CpuContext cx(threads, CpuKernels::from_environment());
    for (Case c : cases) {
      const int64_t n_keys = c.first_pos + c.n_queries;
      const int64_t q_width = c.shape.n_heads * c.shape.head_dim;
      const int64_t kv_width = c.shape.n_kv_heads * c.shape.head_dim;
      const std::vector<float> q = random_vector(c.n_queries * q_width, 31);
      const std::vector<float> k = random_vector(n_keys * kv_width, 32);
      const std::vector<float> v = random_vector(n_keys * kv_width, 33);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.shape.head_dim));
      std::vector<float> exact(c.n_queries * q_width), scores(n_keys);
      ref::causal_attention(q.data(), c.n_queries, c.first_pos, k.data(), v.data(), c.shape, scale,
                            exact.data(), scores.data());
      for (const KvType type : {KvType::kF32, KvType::kF16, KvType::kQ8, KvType::kQ4}) {
        if (!kv_type_fits(type, c.shape.head_dim)) continue;
        SCOPED_TRACE(std::string(kv_type_name(type)) + " head_dim " +
                     std::to_string(c.shape.head_dim) + " threads " + std::to_string(threads));
        c.shape.kv = type;
        const int64_t row_floats = c.shape.kv_row_floats();
        std::vector<float> kq(n_keys * row_floats), vq(kq.size());
        for (int64_t j = 0; j < n_keys; ++j) {
          kv_store_row(type, k.data() + j * kv_width, c.shape.n_kv_heads, c.shape.head_dim,
                       kq.data() + j * row_floats);
          kv_store_row(type, v.data() + j * kv_width, c.shape.n_kv_heads, c.shape.head_dim,
                       vq.data() + j * row_floats);
        }
        std::vector<float> expected(exact.size()), fast(exact.size());
        ref::causal_attention(q.data(), c.n_queries, c.first_pos, kq.data(), vq.data(), c.shape,
                              scale, expected.data(), scores.data());
        causal_attention(cx, q.data(), c.n_queries, c.first_pos, kq.data(), vq.data(), c.shape,
                         scale, fast.data());
        double error = 0.0, norm = 0.0;  // of the output against the f32 cache's
        for (size_t i = 0; i < fast.size(); ++i) {
          ASSERT_NEAR(fast[i], expected[i], 1e-5f) << "at " << i;
          error += (fast[i] - exact[i]) * static_cast<double>(fast[i] - exact[i]);
          norm += exact[i] * static_cast<double>(exact[i]);
        }
        // Measured on these uniform rows: f16 0.03 %, q8 0.6-0.9 %, q4 12-13 %.
        const double bound = type == KvType::kF32   ? 1e-6
                             : type == KvType::kF16 ? 0.001
                             : type == KvType::kQ8  ? 0.015
                                                    : 0.2;
        EXPECT_LT(std::sqrt(error / norm), bound);
        const int64_t last = c.n_queries - 1;  // the last query alone, as in decode
        std::vector<float> alone(q_width);
        causal_attention(cx, q.data() + last * q_width, 1, c.first_pos + last, kq.data(), vq.data(),
                         c.shape, scale, alone.data());
        ASSERT_TRUE(std::equal(alone.begin(), alone.end(), fast.begin() + last * q_width))
            << "decode must equal the batched row";
      }
    }
  }
}

// Each KV type's rows read back within the rounding its format promises: f32 exactly, f16 to
// half precision, q8 to half a step of max|head| / 127, q4 to half a step of max|group| / 7; a
// head of zeros is zeros, and one holding a NaN reads back NaN where a scale covers it.
TEST(KvLayout, RowsReadBackWithinTheirRounding) {
  const int64_t n_heads = 3, head_dim = 64;
  std::vector<float> x = random_vector(n_heads * head_dim, 51, 3.0f);
  std::fill_n(x.begin() + head_dim, head_dim, 0.0f);  // head 1: zeros
  for (const KvType type : {KvType::kF32, KvType::kF16, KvType::kQ8, KvType::kQ4}) {
    SCOPED_TRACE(kv_type_name(type));
    const int64_t head_floats = kv_head_floats(type, head_dim);
    std::vector<float> row(n_heads * head_floats), back(head_dim);
    kv_store_row(type, x.data(), n_heads, head_dim, row.data());
    for (int64_t h = 0; h < n_heads; ++h) {
      kv_load_head(type, row.data() + h * head_floats, head_dim, back.data());
      const float* xh = x.data() + h * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) {
        const int64_t run = type == KvType::kQ4 ? kKvQ4Group : head_dim;
        const float* group = xh + d / run * run;
        float m = 0.0f;
        for (int64_t i = 0; i < run; ++i) m = std::max(m, std::fabs(group[i]));
        const float bound = type == KvType::kF32   ? 0.0f
                            : type == KvType::kF16 ? std::fabs(xh[d]) / 2048.0f
                            : type == KvType::kQ8  ? m / 127.0f * 0.5f * 1.0001f
                                                   : m / 7.0f * 0.5f * 1.0001f;
        ASSERT_LE(std::fabs(back[d] - xh[d]), bound) << "head " << h << " element " << d;
      }
    }
  }
  EXPECT_EQ(kv_head_floats(KvType::kQ8, 128), 33);
  EXPECT_EQ(kv_head_floats(KvType::kQ4, 128), 20);
  EXPECT_FALSE(kv_type_fits(KvType::kQ4, 48));
  std::vector<float> nan_head(32, 1.0f), stored(kv_head_floats(KvType::kQ8, 32)), loaded(32);
  nan_head[5] = NAN;
  kv_store_row(KvType::kQ8, nan_head.data(), 1, 32, stored.data());
  kv_load_head(KvType::kQ8, stored.data(), 32, loaded.data());
  EXPECT_TRUE(std::isnan(loaded[0]) && std::isnan(loaded[31]));
  test::expect_error([] { parse_kv_type("q5", "--kv-type"); },
                     {"--kv-type", "'q5'", "f32, f16, q8, q4"});
}

// The fast bidirectional attention (the vision tower's) against the reference, on threads that
// take whole heads or parts of them, with and without the heads' rows gathered.
TEST(Kernels, FastBidirectionalAttentionMatchesTheReference) {
  if (fast_kernels_are_the_reference()) GTEST_SKIP() << "no SIMD attention here";
  const struct {
    AttentionShape shape;
    int64_t rows;
  } cases[] = {{{16, 16, 64}, 70}, {{2, 2, 16}, 9}, {{4, 2, 32}, 33}, {{12, 12, 64}, 5}};
  for (const int threads : {1, 2, 3}) {
    CpuContext cx(threads, CpuKernels::from_environment());
    for (const auto& c : cases) {
      const int64_t q_width = c.shape.n_heads * c.shape.head_dim;
      const int64_t kv_width = c.shape.n_kv_heads * c.shape.head_dim;
      const std::vector<float> q = random_vector(c.rows * q_width, 41);
      const std::vector<float> k = random_vector(c.rows * kv_width, 42);
      const std::vector<float> v = random_vector(c.rows * kv_width, 43);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.shape.head_dim));
      std::vector<float> expected(c.rows * q_width), fast(expected.size()), scores(c.rows);
      ref::bidirectional_attention(q.data(), c.rows, k.data(), v.data(), c.shape, scale,
                                   expected.data(), scores.data());
      bidirectional_attention(cx, q.data(), c.rows, k.data(), v.data(), c.shape, scale,
                              fast.data());
      for (size_t i = 0; i < fast.size(); ++i) {
        ASSERT_NEAR(fast[i], expected[i], 1e-5f) << "rows " << c.rows << " at " << i;
      }
    }
  }
}

TEST(Kernels, RmsNorm) {
  const std::vector<float> x = random_vector(64, 3, 5.0f), w = random_vector(64, 4);
  std::vector<float> y(64);
  ref::rms_norm(x.data(), w.data(), 64, 1e-6f, y.data());
  double ms = 0;
  for (float v : x) ms += double(v) * v;
  const double inv = 1.0 / std::sqrt(ms / 64 + 1e-6);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(y[i], w[i] * x[i] * inv, 1e-5);
}

TEST(Kernels, RopeRotatesHalvesAndPassesTheRestThrough) {
  const int64_t stride = 12, rotary = 8;
  std::vector<float> x = random_vector(2 * stride, 5);
  const std::vector<float> original = x;
  const float cos[4] = {1.0f, 0.5f, 0.0f, -0.8f};
  float sin[4];
  for (int i = 0; i < 4; ++i) sin[i] = std::sqrt(1.0f - cos[i] * cos[i]);
  ref::rope_rotate_half(x.data(), 2, stride, rotary, cos, sin);
  for (int v = 0; v < 2; ++v) {
    const float* a = original.data() + v * stride;
    const float* r = x.data() + v * stride;
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(r[i], a[i] * cos[i] - a[i + 4] * sin[i], 1e-6);
      EXPECT_NEAR(r[i + 4], a[i + 4] * cos[i] + a[i] * sin[i], 1e-6);
    }
    for (int i = rotary; i < stride; ++i) EXPECT_EQ(r[i], a[i]);
  }
}

TEST(Kernels, SoftmaxIsStableForLargeInputs) {
  std::vector<float> x = {1000.0f, 1001.0f, 999.0f, -1e30f};
  ref::softmax(x.data(), 4);
  const double z = std::exp(-1.0) + 1 + std::exp(-2.0);
  EXPECT_NEAR(x[0], std::exp(-1.0) / z, 1e-6);
  EXPECT_NEAR(x[1], 1 / z, 1e-6);
  EXPECT_EQ(x[3], 0.0f);
}

TEST(Kernels, CausalGqaAttentionMatchesDouble) {
  const AttentionShape shape{4, 2, 8};
  const int64_t first_pos = 3, n_queries = 2, n_keys = first_pos + n_queries;
  const int64_t qw = shape.n_heads * shape.head_dim, kvw = shape.n_kv_heads * shape.head_dim;
  const std::vector<float> q = random_vector(n_queries * qw, 6), k = random_vector(n_keys * kvw, 7),
                           v = random_vector(n_keys * kvw, 8);
  std::vector<float> out(n_queries * qw), scores(n_keys);
  const float scale = 0.35f;
  ref::causal_attention(q.data(), n_queries, first_pos, k.data(), v.data(), shape, scale,
                        out.data(), scores.data());
  for (int64_t t = 0; t < n_queries; ++t) {
    for (int64_t h = 0; h < shape.n_heads; ++h) {
      const int64_t kv = h / 2;  // consecutive query heads share a kv head
      std::vector<double> p(first_pos + t + 1);
      double z = 0;
      for (size_t j = 0; j < p.size(); ++j) {
        double dot = 0;
        for (int64_t d = 0; d < 8; ++d)
          dot += double(q[t * qw + h * 8 + d]) * k[j * kvw + kv * 8 + d];
        p[j] = std::exp(dot * scale);
        z += p[j];
      }
      for (int64_t d = 0; d < 8; ++d) {
        double expected = 0;
        for (size_t j = 0; j < p.size(); ++j) expected += p[j] / z * v[j * kvw + kv * 8 + d];
        EXPECT_NEAR(out[t * qw + h * 8 + d], expected, 1e-5);
      }
    }
  }
}

TEST(Kernels, CausalConv1dContinuesFromItsState) {
  const int64_t channels = 3, kernel = 4, n = 7;
  const std::vector<float> u = random_vector(n * channels, 10),
                           w = random_vector(channels * kernel, 11);
  std::vector<float> state((kernel - 1) * channels, 0.0f), out(n * channels);
  ref::causal_conv1d_silu(u.data(), n, channels, w.data(), kernel, state.data(), out.data());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      double acc = 0;  // w[c, kernel-1] meets the current token; zeros before the start
      for (int64_t j = 0; j < kernel; ++j) {
        const int64_t tau = t - (kernel - 1) + j;
        if (tau >= 0) acc += double(w[c * kernel + j]) * u[tau * channels + c];
      }
      EXPECT_NEAR(out[t * channels + c], acc / (1 + std::exp(-acc)), 1e-5);
    }
  }
  // The state holds the last kernel-1 inputs, and splitting the sequence changes nothing.
  for (int64_t h = 0; h < kernel - 1; ++h) {
    for (int64_t c = 0; c < channels; ++c) {
      EXPECT_EQ(state[h * channels + c], u[(n - (kernel - 1) + h) * channels + c]);
    }
  }
  std::vector<float> split_state((kernel - 1) * channels, 0.0f), split(n * channels);
  for (int64_t t = 0; t < n; t += 2) {
    const int64_t len = std::min<int64_t>(2, n - t);
    ref::causal_conv1d_silu(u.data() + t * channels, len, channels, w.data(), kernel,
                            split_state.data(), split.data() + t * channels);
  }
  EXPECT_EQ(split, out);
}

// The gated delta rule straight from its definition, in double precision.
void delta_rule_double(const std::vector<float>& q, const std::vector<float>& k,
                       const std::vector<float>& v, const std::vector<float>& beta,
                       const std::vector<float>& g, int64_t n, const DeltaRuleShape& s,
                       std::vector<double>& state, std::vector<double>& out) {
  const int64_t r = s.n_v_heads / s.n_k_heads;
  out.assign(n * s.n_v_heads * s.v_dim, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < s.n_v_heads; ++j) {
      double* S = state.data() + j * s.k_dim * s.v_dim;
      const int64_t kh = j / r;
      const double alpha = std::exp(double(g[t * s.n_v_heads + j]));
      for (int64_t i = 0; i < s.k_dim * s.v_dim; ++i) S[i] *= alpha;
      for (int64_t c = 0; c < s.v_dim; ++c) {
        double m = 0;
        for (int64_t a = 0; a < s.k_dim; ++a)
          m += S[a * s.v_dim + c] * k[(t * s.n_k_heads + kh) * s.k_dim + a];
        const double delta =
            beta[t * s.n_v_heads + j] * (v[(t * s.n_v_heads + j) * s.v_dim + c] - m);
        for (int64_t a = 0; a < s.k_dim; ++a)
          S[a * s.v_dim + c] += k[(t * s.n_k_heads + kh) * s.k_dim + a] * delta;
        double o = 0;
        for (int64_t a = 0; a < s.k_dim; ++a)
          o += S[a * s.v_dim + c] * q[(t * s.n_k_heads + kh) * s.k_dim + a];
        out[(t * s.n_v_heads + j) * s.v_dim + c] = o;
      }
    }
  }
}

TEST(Kernels, GatedDeltaRuleRecurrentAndChunkedMatchTheDefinition) {
  const DeltaRuleShape s{2, 4, 8, 6};  // two value heads per key head
  const int64_t n = 37;
  std::vector<float> q = random_vector(n * s.n_k_heads * s.k_dim, 12),
                     k = random_vector(n * s.n_k_heads * s.k_dim, 13),
                     v = random_vector(n * s.n_v_heads * s.v_dim, 14),
                     beta = random_vector(n * s.n_v_heads, 15),
                     g = random_vector(n * s.n_v_heads, 16);
  for (int64_t i = 0; i < n * s.n_k_heads; ++i) {
    ref::l2_normalize(q.data() + i * s.k_dim, s.k_dim, 1e-6f);
    ref::l2_normalize(k.data() + i * s.k_dim, s.k_dim, 1e-6f);
  }
  for (float& b : beta) b = 1.0f / (1.0f + std::exp(-b));
  for (float& x : g) x = -std::fabs(x);
  const std::vector<float> initial = random_vector(s.n_v_heads * s.k_dim * s.v_dim, 17, 0.5f);
  std::vector<double> expected_state(initial.begin(), initial.end()), expected;
  delta_rule_double(q, k, v, beta, g, n, s, expected_state, expected);

  for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{8}, int64_t{64}}) {  // 0: recurrent
    std::vector<float> state = initial, out(expected.size());
    if (chunk == 0) {
      ref::gated_delta_rule_recurrent(q.data(), k.data(), v.data(), beta.data(), g.data(), n, s,
                                      state.data(), out.data());
    } else {
      ref::gated_delta_rule_chunked(q.data(), k.data(), v.data(), beta.data(), g.data(), n, s,
                                    chunk, state.data(), out.data());
    }
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 1e-5) << chunk;
    for (size_t i = 0; i < state.size(); ++i)
      ASSERT_NEAR(state[i], expected_state[i], 1e-5) << chunk;
  }
}

}  // namespace
}  // namespace qhx
