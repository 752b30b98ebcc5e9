// W8/W4 matmuls with int8 activations: the reference against its definition, and the fast
// kernels against the reference: on x86-64, AVX-512 VNNI panels for packed matrices and AVX2 for
// matrices as they lie (only AVX2 when run with QHX_KERNELS=avx2);
// NEON with the dot-product instructions, or without them when run with QHX_KERNELS=neon or on a
// CPU that lacks them (aarch64).
#include <gtest/gtest.h>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu_context.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"
#include "kernels/matmul_int8.h"
#include "kernels/quant.h"
#include "support/cpu.h"
#include "support/fixtures.h"
#include "support/test_matrix.h"

namespace qhx {
namespace {

using test::random_vector;

// A random matrix quantized to W8 or W4, multiplied with int8 activations.
struct QuantizedMatrix : test::TestMatrix {
  QuantizedMatrix(DType dtype, int64_t rows, int64_t cols, int64_t group, uint32_t seed)
      : TestMatrix(dtype, random_vector(rows * cols, seed, 0.05f), rows, cols,
                   dtype == DType::kW4 ? group : 0, Activations::kInt8) {}
};

// Activations with a few large outliers, as transformer activations have.
std::vector<float> activations(int64_t n, uint32_t seed) {
  std::vector<float> x = random_vector(n, seed, 2.0f);
  for (int64_t i = 5; i < n; i += 97) x[i] *= 40.0f;
  return x;
}

std::string_view qhx_kernels() {
  const char* choice = std::getenv("QHX_KERNELS");
  return choice != nullptr ? choice : "";
}

#if defined(__aarch64__)
// Whether this CPU has SDOT, asked of the kernel directly rather than through the code under test.
bool cpu_has_dotprod() {
#if defined(__ARM_FEATURE_DOTPROD)
  return true;
#elif defined(__linux__)
  return (getauxval(AT_HWCAP) & (1UL << 20)) != 0;  // HWCAP_ASIMDDP
#else
  return false;
#endif
}
#endif

// The int8 kernels this CPU and QHX_KERNELS call for (kernels/matmul_int8.h).
std::string expected_int8_kernel_path() {
  if (qhx_kernels() == "reference") return "scalar reference";
#if defined(__aarch64__)
#if defined(__clang__) && !defined(__ARM_FEATURE_DOTPROD)
  return "neon";  // clang's arm_neon.h offers SDOT only to files built for it
#else
  return cpu_has_dotprod() && qhx_kernels() != "neon" ? "neon-dotprod" : "neon";
#endif
#elif defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return "scalar reference";
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return vnni && qhx_kernels() != "avx2" ? "avx512-vnni" : "avx2";
#else
  return "scalar reference";
#endif
}

// The int8 path of these kernels, as expected_int8_kernel_path names them.
std::string int8_kernel_path(const CpuKernels& k) {
  if (k.avx512_vnni) return "avx512-vnni";
  if (k.avx2) return "avx2";
  if (k.neon) return k.neon_dotprod ? "neon-dotprod" : "neon";
  return "scalar reference";
}

// QHX_TEST_REQUIRE_DOTPROD=1 (tools/ci_aarch64.sh) makes sure a run covers the SDOT kernels.
TEST(Int8Activations, KernelPathFollowsTheCpuAndQhxKernels) {
#if defined(__aarch64__)
  if (std::getenv("QHX_TEST_REQUIRE_DOTPROD") != nullptr) {
    ASSERT_TRUE(cpu_has_dotprod()) << "QHX_TEST_REQUIRE_DOTPROD is set, but this CPU has no SDOT";
  }
#endif
  EXPECT_EQ(int8_kernel_path(CpuKernels::from_environment()), expected_int8_kernel_path());
}

TEST(Int8Activations, WhichMatricesUseThem) {
  MatrixRef w{DType::kW8, nullptr, 4, 64};
  EXPECT_FALSE(uses_int8_activations(w)) << "float32 activations unless asked";
  w.activations = Activations::kInt8;
  EXPECT_TRUE(uses_int8_activations(w));
  w.cols = 48;
  EXPECT_FALSE(uses_int8_activations(w)) << "cols must be whole blocks";
  w = {DType::kW4, nullptr, 4, 128, nullptr, 64, Activations::kInt8};
  EXPECT_TRUE(uses_int8_activations(w));
  w.group_size = 32;
  EXPECT_FALSE(uses_int8_activations(w)) << "W4 groups must be whole pairs of blocks";
  w = {DType::kBF16, nullptr, 4, 64, nullptr, 0, Activations::kInt8};
  EXPECT_FALSE(uses_int8_activations(w)) << "float weights keep float activations";
}

TEST(Int8Activations, QuantizationFollowsItsDefinition) {
  std::vector<float> x = random_vector(4 * kActivationBlock, 3, 1.0f);
  x[7] = -9.0f;  // block 0's largest magnitude
  std::fill(x.begin() + kActivationBlock, x.begin() + 2 * kActivationBlock, 0.0f);
  x[2 * kActivationBlock + 3] = std::numeric_limits<float>::infinity();
  x[3 * kActivationBlock + 1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int8_t> q(x.size());
  std::vector<float> scales(4);
  ref::quantize_activations(x.data(), static_cast<int64_t>(x.size()), q.data(), scales.data());
  EXPECT_EQ(scales[0], 9.0f / 127.0f);
  EXPECT_EQ(q[7], -127);
  for (int64_t i = 0; i < kActivationBlock; ++i) {
    EXPECT_EQ(q[i], std::nearbyint(x[i] * (127.0f / 9.0f))) << i;
  }
  EXPECT_EQ(scales[1], 0.0f);
  for (int b = 2; b < 4; ++b) EXPECT_TRUE(std::isnan(scales[b])) << "non-finite block " << b;
  for (int64_t i = kActivationBlock; i < 4 * kActivationBlock; ++i) EXPECT_EQ(q[i], 0);
}

// The reference int8 matmul is the float32 one up to the activations' rounding: each x moves by
// at most half its block's step, so |Δy| ≤ Σ_c |w_c| · step / 2 (plus float32 summation error).
TEST(Int8Activations, ReferenceStaysWithinTheRoundingOfTheActivations) {
  for (const DType dtype : {DType::kW8, DType::kW4}) {
    const int64_t rows = 5, cols = 256, tokens = 3;
    QuantizedMatrix w(dtype, rows, cols, 64, 4);
    const std::vector<float> x = activations(tokens * cols, 5);
    MatrixRef f32_activations = w.ref;
    f32_activations.activations = Activations::kF32;
    std::vector<float> y8(tokens * rows), y32(tokens * rows), row(cols), sx(cols / 32);
    std::vector<int8_t> qx(cols);
    ref::matmul(x.data(), tokens, w.ref, y8.data());
    ref::matmul(x.data(), tokens, f32_activations, y32.data());
    double largest_error = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      ref::quantize_activations(x.data() + t * cols, cols, qx.data(), sx.data());
      for (int64_t r = 0; r < rows; ++r) {
        ref::read_row(w.ref, r, row.data());
        double bound = 0, magnitude = 0;
        for (int64_t c = 0; c < cols; ++c) {
          bound += std::fabs(row[c]) * sx[c / kActivationBlock] / 2;
          magnitude += std::fabs(row[c] * x[t * cols + c]);
        }
        const double error = std::fabs(y8[t * rows + r] - y32[t * rows + r]);
        EXPECT_LE(error, bound + 1e-5 * magnitude) << dtype_name(dtype) << " row " << r;
        largest_error = std::max(largest_error, error / bound);
      }
    }
    EXPECT_GT(largest_error, 0.0) << "the int8 path must really quantize";
  }
}

// The fast kernels against the reference on shapes that hit the row and token tile tails, rows
// ending half-way through a vector (W8: 64 columns, W4: 128), and W4 groups that straddle
// vectors; and each token computed alone
// equal bitwise to its row of the batch, on any number of threads.
TEST(Int8Activations, FastMatmulMatchesTheReference) {
  auto cx = test::cpu();
  struct Shape {
    DType dtype;
    int64_t rows, cols, group;
  } shapes[] = {{DType::kW8, 13, 96, 0},
                {DType::kW8, 4, 32, 0},
                {DType::kW8, 9, 1024, 0},
                {DType::kW8, 67, 160, 0},
                {DType::kW4, 13, 192, 64},
                {DType::kW4, 5, 256, 128},
                {DType::kW4, 67, 128, 64},
                {DType::kW4, 1, 64, 64},
                {DType::kW4, 7, 384, 192},
                // Four panels, the last partial: decode walks two streams of two, prefill
                // two tiles of two panels; seven: tiles of 3, 2 and 2.
                {DType::kW8, 60, 96, 0},
                {DType::kW8, 100, 64, 0},
                {DType::kW4, 60, 128, 64}};
  std::printf("int8 kernel path: %s\n", int8_kernel_path(cx->kernels()).c_str());
  for (const Shape& s : shapes) {
    for (const bool packed : {false, true}) {
      for (const int64_t tokens : {1, 5, 13}) {
        SCOPED_TRACE(std::string(dtype_name(s.dtype)) + " " + std::to_string(s.rows) + "x" +
                     std::to_string(s.cols) + ", " + std::to_string(tokens) + " tokens" +
                     (packed ? ", packed" : ""));
        QuantizedMatrix w(s.dtype, s.rows, s.cols, s.group, 7);
        PackedMatrix layout;
        if (packed) {
          layout = pack_for_int8_kernels(cx->kernels(), w.ref);
          if (layout.data() == nullptr) continue;  // these kernels read this matrix as it lies
          w.ref.packed = layout.data();
        }
        const std::vector<float> x = activations(tokens * s.cols, 8);
        std::vector<float> expected(tokens * s.rows), fast(tokens * s.rows), single(s.rows);
        ref::matmul(x.data(), tokens, w.ref, expected.data());
        cx = test::cpu(1);
        matmul(*cx, x.data(), tokens, w.ref, fast.data());
        std::vector<float> row(s.cols);
        for (int64_t r = 0; r < s.rows; ++r) {
          ref::read_row(w.ref, r, row.data());
          for (int64_t t = 0; t < tokens; ++t) {
            // The kernels add the weights' offset (≤ 128) before subtracting it again.
            double magnitude = 0;
            for (int64_t c = 0; c < s.cols; ++c) {
              magnitude += (std::fabs(row[c]) + 128 * std::fabs(row[c]) / 127) *
                           std::fabs(x[t * s.cols + c]);
            }
            EXPECT_NEAR(fast[t * s.rows + r], expected[t * s.rows + r], 2e-6 * magnitude)
                << "row " << r << " token " << t;
          }
        }
        for (const int threads : {1, 2, 3}) {
          cx = test::cpu(threads);
          std::vector<float> again(tokens * s.rows);
          matmul(*cx, x.data(), tokens, w.ref, again.data());
          EXPECT_EQ(again, fast) << threads << " threads";
          for (int64_t t = 0; t < tokens; ++t) {
            matmul(*cx, x.data() + t * s.cols, 1, w.ref, single.data());
            for (int64_t r = 0; r < s.rows; ++r) {
              ASSERT_EQ(fast[t * s.rows + r], single[r]) << "a row must not depend on the batch";
            }
          }
        }
      }
    }
  }
}

// Matrices that read one input (a layer's q/k/v, or the delta rule's in_proj qkv, z, b and a,
// the last two a row a value head) multiplied together, x quantized once and their rows one job,
// give each the bits of its own matmul: W8 and W4 trios and quartets of different row counts,
// packed and as they lie, on 1-3 threads; and a W8/W4 mix, which cannot share, as well.
TEST(Int8Activations, SharedInputMatmulsEqualOneEach) {
  auto cx = test::cpu();
  constexpr DType W8 = DType::kW8, W4 = DType::kW4;
  struct Case {
    std::vector<DType> dtypes;
    std::vector<int64_t> rows;
    bool packed;
  };
  const std::vector<int64_t> qkv = {60, 13, 35}, delta = {192, 64, 4, 4};
  for (const Case& c : {Case{{W8, W8, W8}, qkv, false}, Case{{W8, W8, W8}, qkv, true},
                        Case{{W4, W4, W4}, qkv, true}, Case{{W4, W4, W4}, qkv, false},
                        Case{{W8, W4, W8}, qkv, true}, Case{{W8, W8, W8, W8}, delta, true},
                        Case{{W8, W8, W8, W8}, delta, false}, Case{{W4, W4, W4, W4}, delta, true},
                        Case{{W4, W4, W4, W4}, delta, false}}) {
    const int64_t cols = 256;
    const size_t n = c.rows.size();
    std::vector<QuantizedMatrix> w;
    std::vector<PackedMatrix> layouts(n);
    for (size_t i = 0; i < n; ++i) {
      w.emplace_back(c.dtypes[i], c.rows[i], cols, 64, 20 + static_cast<uint32_t>(i));
    }
    for (size_t i = 0; i < n && c.packed; ++i) {
      layouts[i] = pack_for_int8_kernels(cx->kernels(), w[i].ref);
      w[i].ref.packed = layouts[i].data();
    }
    const bool mixed = c.dtypes[1] != c.dtypes[0];
    for (const int64_t tokens : {1, 6}) {
      const std::vector<float> x = activations(tokens * cols, 9);
      for (const int threads : {1, 2, 3}) {
        cx = test::cpu(threads);
        std::vector<std::vector<float>> alone(n), together(n);
        std::vector<MatmulOutput> outputs;
        for (size_t i = 0; i < n; ++i) {
          alone[i].resize(tokens * c.rows[i]);
          together[i].resize(tokens * c.rows[i]);
          matmul(*cx, x.data(), tokens, w[i].ref, alone[i].data());
          outputs.push_back({w[i].ref, together[i].data()});
        }
        EXPECT_EQ(share_int8_activations(outputs), !mixed);
        if (n == 3) {
          matmul(*cx, x.data(), tokens, {outputs[0], outputs[1], outputs[2]});
        } else {
          matmul(*cx, x.data(), tokens, {outputs[0], outputs[1], outputs[2], outputs[3]});
        }
        for (size_t i = 0; i < n; ++i) {
          EXPECT_EQ(together[i], alone[i])
              << "matrix " << i << " of " << n << ", " << tokens << " tokens, " << threads
              << " threads, packed " << c.packed;
        }
      }
    }
  }
}

// Bitwise float equality that also holds between two NaNs.
bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

// With one weight 1 per row (row r picks column r) and unit scales, each output is a single
// quantized activation times its block scale, y[t, r] = sx · q_x[t, r], exactly on kernels that
// sum without offsets. So they must quantize to the reference's bits: ties to even, extreme
// magnitudes, all-zero and non-finite blocks (whose NaN scale reaches every output of the token),
// in the first sixteen blocks and the four after them (kernels may take blocks sixteen at a time).
TEST(Int8Activations, KernelsQuantizeExactlyAsTheReference) {
  auto cx = test::cpu();
  const std::string path = int8_kernel_path(cx->kernels());
  constexpr int64_t n = 20 * kActivationBlock;  // rows = cols
  constexpr int64_t tokens = 6;
  std::vector<float> x = activations(tokens * n, 11);
  float* ties = &x[1 * n];  // each block's largest is 127 or 63.5: x · 1 or x · 2 lands on halves
  for (int64_t c = 0; c < n; ++c) {
    ties[c] = (c % 2 == 0 ? 1.0f : -1.0f) * (static_cast<float>(c % 29) + 0.5f);
    if (c % kActivationBlock == 0) ties[c] = 127.0f;
    if (c / kActivationBlock == 2) ties[c] = c % kActivationBlock == 0 ? -63.5f : ties[c] / 2;
  }
  float* special = &x[2 * n];
  std::fill(special, special + kActivationBlock, 0.0f);  // scale 0, as is the next block
  std::fill(special + kActivationBlock, special + 2 * kActivationBlock, -0.0f);
  for (int64_t c = 2 * kActivationBlock; c < n; ++c) special[c] *= c < 3 * n / 4 ? 1e-30f : 1e30f;
  for (const int64_t b : {9, 18}) {
    std::fill(special + b * kActivationBlock, special + (b + 1) * kActivationBlock, 0.0f);
  }
  x[3 * n + 40] = std::numeric_limits<float>::infinity();                          // block 1
  x[4 * n + 12 * kActivationBlock + 4] = -std::numeric_limits<float>::infinity();  // block 12
  x[5 * n + 17 * kActivationBlock + 7] = std::numeric_limits<float>::quiet_NaN();  // block 17

  for (const DType dtype : {DType::kW8, DType::kW4}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<int8_t> q8(n * n, 0);
    std::vector<uint8_t> q4(n * n / 2, 0);
    std::vector<float> scales8(n, 1.0f);
    std::vector<uint16_t> scales4(n * n / 64, 0x3C00);  // f16 1.0
    MatrixRef w{DType::kW8, q8.data(), n, n, scales8.data()};
    if (dtype == DType::kW4) w = {DType::kW4, q4.data(), n, n, scales4.data(), 64};
    w.activations = Activations::kInt8;
    for (int64_t r = 0; r < n; ++r) {
      q8[r * n + r] = 1;
      q4[(r * n + r) / 2] = r % 2 == 0 ? 0x01 : 0x10;
    }
    // Packed (the panels of AVX-512 VNNI CPUs) where this CPU packs, else as it lies (AVX2).
    const PackedMatrix layout = pack_for_int8_kernels(cx->kernels(), w);
    w.packed = layout.data();
    EXPECT_EQ(w.packed != nullptr, path == "avx512-vnni");
    std::vector<float> expected(tokens * n), fast(tokens * n);
    ref::matmul(x.data(), tokens, w, expected.data());
    matmul(*cx, x.data(), tokens, w, fast.data());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < n; ++r) {
        EXPECT_PRED2(same_bits, fast[t * n + r], expected[t * n + r])
            << "token " << t << " column " << r << " x = " << x[t * n + r];
      }
    }
    for (int64_t t = 3; t < tokens; ++t) {
      EXPECT_TRUE(std::isnan(fast[t * n])) << "token " << t << " holds an inf or a NaN";
    }
  }
}

// A packed matrix's rows read back (embedding lookups of a tied table whose mapped pages were
// released) are the reference's rows, bit for bit, in every row of a partial last panel too.
TEST(Int8Activations, PackedRowsReadAsTheReference) {
  auto cx = test::cpu();
  for (const DType dtype : {DType::kW8, DType::kW4}) {
    QuantizedMatrix w(dtype, 37, 192, 64, 12);
    const PackedMatrix layout = pack_for_int8_kernels(cx->kernels(), w.ref);
    if (layout.data() == nullptr)
      GTEST_SKIP() << "this CPU's int8 kernels read matrices as they lie";
    MatrixRef packed = w.ref;
    packed.packed = layout.data();
    std::vector<float> expected(192), got(192);
    for (int64_t r = 0; r < 37; ++r) {
      ref::read_row(w.ref, r, expected.data());
      read_row(*cx, packed, r, got.data());
      EXPECT_EQ(got, expected) << dtype_name(dtype) << " row " << r;
    }
  }
}

TEST(Int8Activations, NonFiniteActivationsReachTheOutput) {
  auto cx = test::cpu();
  for (const DType dtype : {DType::kW8, DType::kW4}) {
    QuantizedMatrix w(dtype, 8, 128, 64, 9);
    std::vector<float> x = activations(2 * 128, 10);
    x[128 + 70] = std::numeric_limits<float>::infinity();
    std::vector<float> y(2 * 8);
    matmul(*cx, x.data(), 2, w.ref, y.data());
    for (int r = 0; r < 8; ++r) {
      EXPECT_TRUE(std::isfinite(y[r])) << dtype_name(dtype);
      EXPECT_TRUE(std::isnan(y[8 + r])) << dtype_name(dtype) << " row " << r;
    }
  }
}

}  // namespace
}  // namespace qhx
