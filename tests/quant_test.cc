// 16-bit float rounding, the W8/W4 quantisers and layouts, and the reference kernels on them.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "support/expect_error.h"
#include "support/fixtures.h"

namespace qhx {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

using test::random_vector;

bool is_f16_nan(uint16_t h) {
  return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
}
bool is_bf16_nan(uint16_t b) {
  return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0;
}

// x rounded to a float format with `mantissa_bits` stored bits and smallest normal exponent
// `min_exponent`, computed independently in double: nearbyint rounds ties to even.
double round_to_format(float x, int mantissa_bits, int min_exponent, double overflow) {
  if (x == 0.0f) return x;
  int exponent;
  std::frexp(x, &exponent);  // |x| in [2^(exponent-1), 2^exponent)
  const int ulp_exponent = std::max(exponent - 1, min_exponent) - mantissa_bits;
  const double rounded =
      std::ldexp(std::nearbyint(std::ldexp(double{x}, -ulp_exponent)), ulp_exponent);
  if (std::fabs(rounded) >= overflow) return std::copysign(INFINITY, x);
  return rounded == 0.0 ? std::copysign(0.0, x) : rounded;
}

TEST(F16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t got = f32_to_f16(f16_to_f32(static_cast<uint16_t>(h)));
    if (is_f16_nan(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(is_f16_nan(got)) << h;
      EXPECT_EQ(got & 0x8000, h & 0x8000) << h;
    } else {
      EXPECT_EQ(got, h);
    }
  }
}

// Between every pair of neighbouring halves (and past the largest, towards 2^16 = inf): the
// midpoint goes to the even one, anything off it to the nearer one. Covers subnormals.
TEST(F16, MidpointsRoundToEven) {
  for (uint16_t sign : {0x0000, 0x8000}) {
    for (uint16_t h = 0; h < 0x7C00; ++h) {
      const uint16_t lo_bits = sign | h, hi_bits = sign | (h + 1);
      const float lo = f16_to_f32(lo_bits);
      const float hi = h == 0x7BFF ? std::copysign(65536.0f, lo) : f16_to_f32(hi_bits);
      const float mid = (lo + hi) / 2;  // exact: halves have 11 significant bits
      ASSERT_TRUE(std::fabs(lo) < std::fabs(mid) && std::fabs(mid) < std::fabs(hi)) << h;
      EXPECT_EQ(f32_to_f16(mid), (h & 1) ? hi_bits : lo_bits) << h;
      EXPECT_EQ(f32_to_f16(std::nextafter(mid, lo)), lo_bits) << h;
      EXPECT_EQ(f32_to_f16(std::nextafter(mid, hi)), hi_bits) << h;
      EXPECT_EQ(f32_to_f16(lo), lo_bits) << h;
    }
  }
}

TEST(F16, SpecialValues) {
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // the tie goes to the even "2^16", inf
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(FLT_MAX), 0x7C00);
  EXPECT_EQ(f32_to_f16(kInf), 0x7C00);
  EXPECT_EQ(f32_to_f16(-kInf), 0xFC00);
  // Subnormals: units of 2^-24.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie: to even 0
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -24)), 0x0002);  // tie: to even 2
  EXPECT_EQ(f32_to_f16(std::ldexp(2.5f, -24)), 0x0002);
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(f32_to_f16(FLT_MIN), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  // NaN stays NaN with its sign, whatever its payload (even one only in the dropped bits).
  for (uint32_t bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu}) {
    const uint16_t h = f32_to_f16(std::bit_cast<float>(bits));
    EXPECT_TRUE(is_f16_nan(h)) << bits;
    EXPECT_EQ(h >> 15, bits >> 31) << bits;
  }
}

TEST(F16, MatchesIndependentRoundingOnRandomFloats) {
  std::mt19937 rng(7);
  // Exponents around the half range, subnormal and overflow edges included.
  std::uniform_int_distribution<uint32_t> exponent(127 - 30, 127 + 17), any(0, 0xFFFFFFFF);
  for (int i = 0; i < 2000000; ++i) {
    const float x = std::bit_cast<float>((exponent(rng) << 23) | (any(rng) & 0x807FFFFFu));
    const float got = f16_to_f32(f32_to_f16(x));
    const double want = round_to_format(x, 10, -14, 65520.0);
    ASSERT_EQ(got, want) << x;
    ASSERT_EQ(std::signbit(got), std::signbit(x)) << x;
  }
}

TEST(BF16, EveryBfloatRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t got = f32_to_bf16(bf16_to_f32(static_cast<uint16_t>(b)));
    if (is_bf16_nan(static_cast<uint16_t>(b))) {
      EXPECT_TRUE(is_bf16_nan(got)) << b;
      EXPECT_EQ(got & 0x8000, b & 0x8000) << b;
    } else {
      EXPECT_EQ(got, b);
    }
  }
}

TEST(BF16, MidpointsRoundToEven) {
  for (uint16_t sign : {0x0000, 0x8000}) {
    for (uint16_t b = 0; b < 0x7F80; ++b) {
      const uint16_t lo_bits = sign | b, hi_bits = sign | (b + 1);
      // Built from bits: the midpoint sets the highest dropped bit.
      const float mid = std::bit_cast<float>(uint32_t{lo_bits} << 16 | 0x8000u);
      EXPECT_EQ(f32_to_bf16(mid), (b & 1) ? hi_bits : lo_bits) << b;
      EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(uint32_t{lo_bits} << 16 | 0x7FFFu)), lo_bits);
      EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(uint32_t{lo_bits} << 16 | 0x8001u)), hi_bits);
    }
  }
}

TEST(BF16, SpecialValues) {
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(FLT_MAX), 0x7F80);  // past the largest bfloat by more than half an ulp
  EXPECT_EQ(f32_to_bf16(-kInf), 0xFF80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie, to even
  for (uint32_t bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF80FFFFu, 0x7FFFFFFFu}) {
    const uint16_t b = f32_to_bf16(std::bit_cast<float>(bits));
    EXPECT_TRUE(is_bf16_nan(b)) << bits;
    EXPECT_EQ(b >> 15, bits >> 31) << bits;
  }
}

TEST(BF16, MatchesIndependentRoundingOnRandomFloats) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<uint32_t> any(0, 0xFFFFFFFF);
  const double overflow = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);
  for (int i = 0; i < 2000000; ++i) {
    const float x = std::bit_cast<float>(any(rng));
    if (std::isnan(x)) continue;
    const float got = bf16_to_f32(f32_to_bf16(x));
    const double want = std::isinf(x) ? x : round_to_format(x, 7, -126, overflow);
    ASSERT_EQ(got, want) << x;
    ASSERT_EQ(std::signbit(got), std::signbit(x)) << x;
  }
}

TEST(Layout, Bytes) {
  EXPECT_EQ(matrix_bytes(DType::kF32, 3, 8, 0), 96u);
  EXPECT_EQ(matrix_bytes(DType::kBF16, 3, 8, 0), 48u);
  EXPECT_EQ(matrix_bytes(DType::kF16, 0, 8, 0), 0u);
  EXPECT_EQ(matrix_bytes(DType::kW8, 3, 8, 0), 24u);
  EXPECT_EQ(matrix_bytes(DType::kW4, 3, 8, 4), 12u);
  EXPECT_EQ(matrix_scale_bytes(DType::kF32, 3, 8, 0), 0u);
  EXPECT_EQ(matrix_scale_bytes(DType::kW8, 3, 8, 0), 12u);
  EXPECT_EQ(matrix_scale_bytes(DType::kW4, 3, 8, 4), 12u);
  EXPECT_EQ(matrix_scale_bytes(DType::kW4, 3, 8, 8), 6u);
}

TEST(Layout, ImpossibleLayoutsAreErrors) {
  using test::expect_error;
  expect_error([] { matrix_bytes(DType::kW4, 2, 96, 64); }, {"W4 [2, 96], group 64", "divide"});
  expect_error([] { matrix_bytes(DType::kW4, 2, 96, 3); }, {"group 3", "even"});
  expect_error([] { matrix_scale_bytes(DType::kW4, 2, 96, 0); }, {"W4 [2, 96]", "even"});
  expect_error([] { matrix_bytes(DType::kW8, 2, 96, 32); }, {"W8", "only W4 has groups"});
  expect_error([] { matrix_bytes(DType::kF32, -1, 4, 0); }, {"F32 [-1, 4]", "negative"});
  expect_error([] { matrix_bytes(DType::kF32, int64_t{1} << 40, int64_t{1} << 40, 0); },
               {"too many"});
  expect_error([] { dtype_size(DType::kW8); }, {"W8", "matrix_bytes"});
  expect_error([] { dtype_size(DType::kW4); }, {"W4"});
}

TEST(Layout, QuantizedTypesAreNotSafetensorsTypes) {
  EXPECT_EQ(dtype_name(DType::kW8), "W8");
  EXPECT_EQ(dtype_name(DType::kW4), "W4");
  EXPECT_FALSE(dtype_from_safetensors_name("W8"));
  EXPECT_FALSE(dtype_from_safetensors_name("W4"));
}

// Hand-derived bytes. W8, scale 127/127 = 1: the ties -62.5 and 0.5 go to the even -62 and 0.
TEST(Quantize, W8LayoutByHand) {
  const float w[] = {127.0f, -62.5f, 0.5f,  1.0f,  //
                     0.0f,   0.0f,   -0.0f, 0.0f};
  int8_t q[8];
  float scales[2];
  quantize_w8(w, 2, 4, q, scales);
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(scales[1], 0.0f);
  const int8_t want[] = {127, -62, 0, 1, 0, 0, 0, 0};
  EXPECT_EQ(std::memcmp(q, want, sizeof(q)), 0);
}

// W4, one group of 4 with max 7, so scale 1 (f16 0x3C00):
//   [1, -1, 7, -7] → nibbles 1, 0xF, 7, 9 → bytes 0xF1 (col 1 high, col 0 low), 0x97;
//   [3.5, 2.5, -0.5, 7] → 4, 2, -0 (ties to even), 7 → bytes 0x24, 0x70.
TEST(Quantize, W4LayoutByHand) {
  const float w[] = {1.0f, -1.0f, 7.0f,  -7.0f,  //
                     3.5f, 2.5f,  -0.5f, 7.0f};
  uint8_t packed[4];
  uint16_t scales[2];
  quantize_w4(w, 2, 4, 4, packed, scales);
  EXPECT_EQ(scales[0], 0x3C00);
  EXPECT_EQ(scales[1], 0x3C00);
  EXPECT_EQ(packed[0], 0xF1);
  EXPECT_EQ(packed[1], 0x97);
  EXPECT_EQ(packed[2], 0x24);
  EXPECT_EQ(packed[3], 0x70);

  const MatrixRef m{DType::kW4, packed, 2, 4, scales, 4};
  float row[4];
  ref::read_row(m, 0, row);
  EXPECT_EQ(std::vector<float>(row, row + 4), std::vector<float>({1, -1, 7, -7}));
  ref::read_row(m, 1, row);
  EXPECT_EQ(std::vector<float>(row, row + 4), std::vector<float>({4, 2, 0, 7}));
}

// Groups of 2: one scale per group, in row order; an all-zero group gets scale 0.
//   row 0: [7, 1 | 14, -14] → scales 1 (0x3C00), 2 (0x4000); q 7, 1 | 7, -7 → 0x17, 0x97.
//   row 1: [0, 0 | -3.5, 0] → scales 0, 0.5 (0x3800); q 0, 0 | -7, 0 → 0x00, 0x09.
TEST(Quantize, W4GroupsByHand) {
  const float w[] = {7.0f, 1.0f, 14.0f, -14.0f,  //
                     0.0f, 0.0f, -3.5f, 0.0f};
  uint8_t packed[4];
  uint16_t scales[4];
  quantize_w4(w, 2, 4, 2, packed, scales);
  const uint16_t want_scales[] = {0x3C00, 0x4000, 0x0000, 0x3800};
  const uint8_t want_packed[] = {0x17, 0x97, 0x00, 0x09};
  EXPECT_EQ(std::memcmp(scales, want_scales, sizeof(scales)), 0);
  EXPECT_EQ(std::memcmp(packed, want_packed, sizeof(packed)), 0);

  const MatrixRef m{DType::kW4, packed, 2, 4, scales, 2};
  float row[4];
  ref::read_row(m, 0, row);
  EXPECT_EQ(std::vector<float>(row, row + 4), std::vector<float>({7, 1, 14, -14}));
  ref::read_row(m, 1, row);
  EXPECT_EQ(std::vector<float>(row, row + 4), std::vector<float>({0, 0, -3.5f, 0}));
}

// max = 7·(1 + 2^-12): max / 7 is a quarter of an f16 ulp above 1, so the scale rounds to 1 and
// 2.5005 quantises to 3 (with the unrounded scale it would be 2.4999…, so 2): bytes 0x37.
TEST(Quantize, W4UsesTheRoundedScale) {
  const float w[] = {7.001708984375f, 2.5005f};
  uint8_t packed;
  uint16_t scale;
  quantize_w4(w, 1, 2, 2, &packed, &scale);
  EXPECT_EQ(scale, 0x3C00);
  EXPECT_EQ(packed, 0x37);
}

// A quantised matrix with its original weights; m points into the vectors (a move keeps them).
struct Quantized {
  std::vector<float> w;
  std::vector<int8_t> q8;
  std::vector<uint8_t> q4;
  std::vector<float> scales8;
  std::vector<uint16_t> scales4;
  MatrixRef m;

  // The scale of weight [r, c].
  float scale(int64_t r, int64_t c) const {
    if (m.dtype == DType::kW8) return scales8[r];
    return f16_to_f32(scales4[r * (m.cols / m.group_size) + c / m.group_size]);
  }
};

Quantized quantize(DType dtype, int64_t rows, int64_t cols, int64_t group_size, uint32_t seed) {
  Quantized out;
  out.w = random_vector(rows * cols, seed, 0.05f);
  // Rows of very different magnitude, one all zero, one with an outlier.
  for (int64_t c = 0; c < cols; ++c) {
    out.w[1 * cols + c] *= 1000.0f;
    out.w[2 * cols + c] *= 1e-3f;
    out.w[3 * cols + c] = 0.0f;
  }
  out.w[4 * cols + 5] = 3.0f;
  if (dtype == DType::kW8) {
    out.q8.resize(matrix_bytes(dtype, rows, cols, 0));
    out.scales8.resize(rows);
    quantize_w8(out.w.data(), rows, cols, out.q8.data(), out.scales8.data());
    out.m = {dtype, out.q8.data(), rows, cols, out.scales8.data(), 0};
  } else {
    out.q4.resize(matrix_bytes(dtype, rows, cols, group_size));
    out.scales4.resize(matrix_scale_bytes(dtype, rows, cols, group_size) / 2);
    quantize_w4(out.w.data(), rows, cols, group_size, out.q4.data(), out.scales4.data());
    out.m = {dtype, out.q4.data(), rows, cols, out.scales4.data(), group_size};
  }
  return out;
}

struct Format {
  DType dtype;
  int64_t group_size;
  float q_max;
};
const Format kFormats[] = {
    {DType::kW8, 0, 127}, {DType::kW4, 32, 7}, {DType::kW4, 64, 7}, {DType::kW4, 128, 7}};

// |w − ŵ| ≤ scale / 2 (plus the f32 rounding of w / scale, a few ulps of q), the largest
// weight of each row or group lands on ±q_max, and W4 scales are f16(max / 7) exactly.
TEST(Quantize, RoundTripErrorIsAtMostHalfAScale) {
  const int64_t rows = 8, cols = 256;
  for (const Format& f : kFormats) {
    const Quantized qm = quantize(f.dtype, rows, cols, f.group_size, 3);
    const int64_t group = f.dtype == DType::kW8 ? cols : f.group_size;
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      ref::read_row(qm.m, r, row.data());
      for (int64_t first = 0; first < cols; first += group) {
        float max = 0.0f;
        int64_t argmax = first;
        for (int64_t c = first; c < first + group; ++c) {
          if (std::fabs(qm.w[r * cols + c]) > max) max = std::fabs(qm.w[r * cols + c]), argmax = c;
        }
        const float scale = qm.scale(r, first);
        if (f.dtype == DType::kW4) {
          EXPECT_EQ(scale, f16_to_f32(f32_to_f16(max / 7.0f)));
        }
        if (max == 0.0f) {
          EXPECT_EQ(scale, 0.0f);
          continue;
        }
        EXPECT_NEAR(std::fabs(row[argmax]) / scale, f.q_max, 1e-6 * f.q_max) << r;
        for (int64_t c = first; c < first + group; ++c) {
          const double err = std::fabs(double{qm.w[r * cols + c]} - row[c]);
          EXPECT_LE(err, scale * (0.5 + 2 * f.q_max * FLT_EPSILON)) << r << ", " << c;
          EXPECT_EQ(row[c], scale * std::nearbyint(row[c] / scale)) << "not a multiple of scale";
        }
      }
    }
  }
}

// The quantised matmul is the f32 matmul of the dequantised matrix, bit for bit and whatever
// the batch, and stays within the analytic bound of the unquantised product:
//   |y − Σ x·w| ≤ Σ |x|·|w − ŵ| + γ_n Σ |x·ŵ|,  γ_n = n·u / (1 − n·u), u = 2^-24.
TEST(Quantize, MatmulIsTheF32MatmulOfTheDequantisedMatrix) {
  const int64_t rows = 8, cols = 256, tokens = 5;
  const std::vector<float> x = random_vector(tokens * cols, 4);
  for (const Format& f : kFormats) {
    const Quantized qm = quantize(f.dtype, rows, cols, f.group_size, 5);
    std::vector<float> dequantised(rows * cols);
    for (int64_t r = 0; r < rows; ++r) ref::read_row(qm.m, r, dequantised.data() + r * cols);
    const MatrixRef plain{DType::kF32, dequantised.data(), rows, cols};
    std::vector<float> y(tokens * rows), want(tokens * rows), single(rows);
    ref::matmul(x.data(), tokens, qm.m, y.data());
    ref::matmul(x.data(), tokens, plain, want.data());
    const double u = std::ldexp(1.0, -24), gamma = (cols + 1) * u / (1 - (cols + 1) * u);
    for (int64_t t = 0; t < tokens; ++t) {
      ref::matmul(x.data() + t * cols, 1, qm.m, single.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float got = y[t * rows + r];
        EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want[t * rows + r]));
        EXPECT_EQ(got, single[r]) << "a row must not depend on the batch";
        double exact = 0, bound = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double xc = x[t * cols + c], wc = qm.w[r * cols + c];
          const double wq = dequantised[r * cols + c];
          exact += xc * wc;
          bound += std::fabs(xc) * std::fabs(wc - wq) + gamma * std::fabs(xc * wq);
        }
        EXPECT_LE(std::fabs(got - exact), bound) << dtype_name(f.dtype) << " " << r;
      }
    }
  }
}

TEST(Quantize, BadInputsAreErrors) {
  using test::expect_error;
  std::vector<float> w(2 * 64, 0.5f);
  std::vector<int8_t> q8(w.size());
  std::vector<uint8_t> q4(w.size() / 2);
  std::vector<float> s8(2);
  std::vector<uint16_t> s4(w.size());
  expect_error([&] { quantize_w4(w.data(), 2, 64, 48, q4.data(), s4.data()); },
               {"W4 [2, 64], group 48", "divide"});
  expect_error([&] { quantize_w4(w.data(), 2, 63, 7, q4.data(), s4.data()); }, {"even"});
  expect_error([&] { quantize_w4(w.data(), 2, 64, 0, q4.data(), s4.data()); }, {"even"});
  w[64 + 3] = std::nanf("");
  expect_error([&] { quantize_w8(w.data(), 2, 64, q8.data(), s8.data()); },
               {"W8 [2, 64]", "row 1, column 3", "NaN"});
  expect_error([&] { quantize_w4(w.data(), 2, 64, 32, q4.data(), s4.data()); },
               {"row 1, column 3", "NaN"});
  w[64 + 3] = -kInf;
  expect_error([&] { quantize_w8(w.data(), 2, 64, q8.data(), s8.data()); }, {"infinite"});
  w[64 + 3] = 1e6f;  // 1e6 / 7 is past the largest half
  expect_error([&] { quantize_w4(w.data(), 2, 64, 32, q4.data(), s4.data()); },
               {"row 1, columns from 0", "f16"});
  quantize_w8(w.data(), 2, 64, q8.data(), s8.data());  // an f32 scale takes it
  EXPECT_EQ(q8[64 + 3], 127);
}

}  // namespace
}  // namespace qhx
