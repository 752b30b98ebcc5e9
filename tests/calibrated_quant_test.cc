// Calibrated quantization (forge/calibrated_quant.h): on inputs with uneven columns, each method
// makes the product's error over those inputs smaller than plain rounding, GPTQ the smallest, and
// the stored values stay within the format; and what forge measures for it on a fixture
// (forge/weight_calibration.h).
#include "forge/calibrated_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "forge/weight_calibration.h"
#include "io/checkpoint.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "support/fixtures.h"

namespace qhx {
namespace {

struct Problem {
  int64_t rows = 24, cols = 128, tokens = 256;
  std::vector<float> w, x;  // x: [tokens, cols]
  std::vector<double> gram;
};

Problem make_problem() {
  Problem p;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  p.w.resize(p.rows * p.cols);
  for (float& v : p.w) v = normal(rng);
  p.x.resize(p.tokens * p.cols);
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t c = 0; c < p.cols; ++c) {
      // Columns of very different magnitude, correlated through a shared component.
      const float scale = c % 16 == 0 ? 8.0f : 1.0f;
      p.x[t * p.cols + c] = scale * (normal(rng) + 0.5f * p.x[t * p.cols]);
    }
  }
  p.gram.assign(p.cols * p.cols, 0.0);
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t i = 0; i < p.cols; ++i) {
      for (int64_t j = 0; j < p.cols; ++j) {
        p.gram[i * p.cols + j] += double(p.x[t * p.cols + i]) * p.x[t * p.cols + j];
      }
    }
  }
  return p;
}

// Σ over the inputs of |x·wᵀ − x·ŵᵀ|², ŵ read back through the reference.
double product_error(const Problem& p, const MatrixRef& q) {
  std::vector<float> exact(p.tokens * p.rows), got(p.tokens * p.rows);
  ref::matmul(p.x.data(), p.tokens, MatrixRef{DType::kF32, p.w.data(), p.rows, p.cols},
              exact.data());
  ref::matmul(p.x.data(), p.tokens, q, got.data());
  double e = 0;
  for (size_t i = 0; i < exact.size(); ++i) e += std::pow(double(exact[i]) - got[i], 2);
  return e;
}

TEST(CalibratedQuant, W4ProductErrorFallsBelowPlainRounding) {
  const Problem p = make_problem();
  const int64_t group = 32;
  std::vector<uint8_t> packed(p.rows * p.cols / 2);
  std::vector<uint16_t> scales(p.rows * p.cols / group);
  MatrixRef q{DType::kW4, packed.data(), p.rows, p.cols};
  q.scales = scales.data();
  q.group_size = group;
  quantize_w4(p.w.data(), p.rows, p.cols, group, packed.data(), scales.data());
  const double plain = product_error(p, q);
  quantize_w4_calibrated(p.w.data(), p.rows, p.cols, group, p.gram, CalibrationMethod::kWeighted,
                         packed.data(), scales.data());
  const double weighted = product_error(p, q);
  quantize_w4_calibrated(p.w.data(), p.rows, p.cols, group, p.gram, CalibrationMethod::kGptq,
                         packed.data(), scales.data());
  const double gptq = product_error(p, q);
  EXPECT_LT(weighted, plain);
  EXPECT_LT(gptq, 0.8 * weighted);
  for (const uint16_t s : scales) EXPECT_GE(f16_to_f32(s), 0.0f);
}

TEST(CalibratedQuant, W8ProductErrorFallsBelowPlainRounding) {
  const Problem p = make_problem();
  std::vector<int8_t> codes(p.rows * p.cols);
  std::vector<float> scales(p.rows);
  MatrixRef q{DType::kW8, codes.data(), p.rows, p.cols};
  q.scales = scales.data();
  quantize_w8(p.w.data(), p.rows, p.cols, codes.data(), scales.data());
  const double plain = product_error(p, q);
  quantize_w8_calibrated(p.w.data(), p.rows, p.cols, p.gram, CalibrationMethod::kGptq, codes.data(),
                         scales.data());
  EXPECT_LT(product_error(p, q), plain);
  for (const int8_t c : codes) EXPECT_GE(c, -127);
}

TEST(CalibratedQuant, RefusesStatisticsOfTheWrongSize) {
  const Problem p = make_problem();
  std::vector<uint8_t> packed(p.rows * p.cols / 2);
  std::vector<uint16_t> scales(p.rows * p.cols / 32);
  const std::vector<double> small(10, 1.0);
  EXPECT_THROW(quantize_w4_calibrated(p.w.data(), p.rows, p.cols, 32, small,
                                      CalibrationMethod::kGptq, packed.data(), scales.data()),
               std::exception);
}

// On a fixture: every layer matrix gets statistics over the rows it read, q/k/v (one input)
// share theirs, and a matrix's sensitivity is zero for itself and positive once quantized.
TEST(WeightCalibration, StatisticsAndSensitivityOfAFixture) {
  const std::filesystem::path dir = test::source_dir() / "tests/fixtures/qwen3/gqa2_f16";
  std::vector<std::vector<int32_t>> sequences = {{}, {}};
  for (int32_t i = 0; i < 40; ++i) sequences[0].push_back((i * 37) % 384);
  for (int32_t i = 0; i < 24; ++i) sequences[1].push_back((i * 11 + 5) % 384);
  const InputStatistics stats = collect_input_statistics(dir, sequences, {.pass_tokens = 16});
  EXPECT_EQ(stats.tokens, 64);
  const auto& grams = stats.grams;
  const std::string l0 = "model.layers.0.";
  ASSERT_TRUE(grams.contains(l0 + "self_attn.q_proj.weight"));
  EXPECT_EQ(grams.at(l0 + "self_attn.q_proj.weight"), grams.at(l0 + "self_attn.v_proj.weight"));
  EXPECT_NE(grams.at(l0 + "self_attn.q_proj.weight"), grams.at(l0 + "mlp.down_proj.weight"));
  const InputGram& g = *grams.at(l0 + "mlp.down_proj.weight");
  EXPECT_EQ(g.rows, 64);
  for (int64_t i = 0; i < g.cols; ++i) {
    EXPECT_GE(g.sum[i * g.cols + i], 0);
    for (int64_t j = 0; j < i; ++j) {
      EXPECT_NEAR(g.sum[i * g.cols + j], g.sum[j * g.cols + i],
                  1e-4 * (1 + std::fabs(g.sum[i * g.cols + j])));
    }
  }

  const Checkpoint checkpoint = Checkpoint::open(dir);
  const TensorView& down = *checkpoint.find(l0 + "mlp.down_proj.weight");
  const int64_t rows = down.shape[0], cols = down.shape[1];
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    ref::read_row(MatrixRef{down.dtype, down.data, rows, cols}, r, w.data() + r * cols);
  }
  std::vector<uint8_t> packed(rows * cols / 2);
  std::vector<uint16_t> scales(rows * cols / 16);
  quantize_w4(w.data(), rows, cols, 16, packed.data(), scales.data());
  MatrixRef w4{DType::kW4, packed.data(), rows, cols};
  w4.scales = scales.data();
  w4.group_size = 16;
  const std::vector<double> kl = measure_sensitivity(
      dir, sequences[0],
      std::vector<StandIn>{{down.name, MatrixRef{DType::kF32, w.data(), rows, cols}},
                           {down.name, w4}});
  ASSERT_EQ(kl.size(), 2u);
  EXPECT_LT(kl[0], 1e-9);
  EXPECT_GT(kl[1], 1e-7);
}

}  // namespace
}  // namespace qhx
