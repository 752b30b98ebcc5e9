#include "forge/calibrated_quant.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "util/error.h"

namespace qhx {
namespace {

// A quantization grid: q in [lowest, highest], the scale stored as `round` gives it back.
struct Grid {
  int lowest, highest;
  float (*round)(double scale);
};

float as_f32(double s) {
  return static_cast<float>(s);
}
float as_f16(double s) {
  return f16_to_f32(f32_to_f16(static_cast<float>(s)));
}

constexpr Grid kW8Grid{-127, 127, as_f32};
constexpr Grid kW4Grid{-8, 7, as_f16};

int quantize_one(double w, float scale, const Grid& grid) {
  if (scale == 0.0f) return 0;
  return static_cast<int>(std::clamp(std::nearbyint(w / scale), static_cast<double>(grid.lowest),
                                     static_cast<double>(grid.highest)));
}

// Σ h (w − s·q(w, s))² for the stored scale s.
double weighted_error(std::span<const double> w, std::span<const double> h, float scale,
                      const Grid& grid) {
  double e = 0;
  for (size_t c = 0; c < w.size(); ++c) {
    const double d = w[c] - static_cast<double>(scale) * quantize_one(w[c], scale, grid);
    e += h[c] * d * d;
  }
  return e;
}

// The stored scale of one group (or W8 row) that makes Σ h (w − s·q)² smallest among candidates
// around the one that maps the group's extreme to the grid's end on its side: clipping down to
// 70 % of it, or widening to 110 %, each taken as it is and refined by weighted least squares
// for the q it gives (s = Σ h w q / Σ h q²).
float best_scale(std::span<const double> w, std::span<const double> h, const Grid& grid) {
  double extreme = 0;
  for (const double x : w) {
    if (std::fabs(x) > std::fabs(extreme)) extreme = x;
  }
  if (extreme == 0) return 0.0f;
  const double base = extreme > 0 ? extreme / grid.highest : extreme / grid.lowest;
  float best = grid.round(base);
  double best_error = weighted_error(w, h, best, grid);
  const auto consider = [&](float s) {
    if (!(s > 0.0f) || std::isinf(s)) return;
    const double e = weighted_error(w, h, s, grid);
    if (e < best_error) best = s, best_error = e;
  };
  for (int step = -15; step <= 5; ++step) {
    const float s = grid.round(base * (1.0 + 0.02 * step));
    consider(s);
    double hwq = 0, hqq = 0;
    for (size_t c = 0; c < w.size(); ++c) {
      const int q = quantize_one(w[c], s, grid);
      hwq += h[c] * w[c] * q;
      hqq += h[c] * static_cast<double>(q) * q;
    }
    if (hqq > 0) consider(grid.round(hwq / hqq));
  }
  return best;
}

// The rows' weights for the scale search: G's diagonal (mean square of each input column), the
// columns no calibration row reached weighted as the group's average so that they still count.
std::vector<double> importance(std::span<const double> gram, int64_t cols) {
  std::vector<double> h(static_cast<size_t>(cols));
  double sum = 0;
  for (int64_t c = 0; c < cols; ++c) sum += h[c] = gram[c * cols + c];
  const double floor = sum > 0 ? 1e-6 * sum / static_cast<double>(cols) : 1.0;
  for (double& x : h) x = std::max(x, floor);
  return h;
}

// In place: the lower Cholesky factor L of a symmetric positive definite [n, n] (A = L Lᵀ; the
// upper triangle is left as it was).
void cholesky(std::vector<double>& a, size_t n, const std::string& where) {
  for (size_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (size_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0)) fail(where, "its calibration statistics are not positive definite");
    a[j * n + j] = std::sqrt(d);
    for (size_t i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      for (size_t k = 0; k < j; ++k) s -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = s / a[j * n + j];
    }
  }
}

// GPTQ's U: the upper Cholesky factor of (G + λI)^-1, λ 1 % of G's mean diagonal (columns no row
// reached get the mean on the diagonal: nothing to feed their error to). [cols, cols], row-major.
std::vector<double> inverse_factor(std::span<const double> gram, int64_t cols,
                                   const std::string& where) {
  const auto n = static_cast<size_t>(cols);
  std::vector<double> a(gram.begin(), gram.end());
  double mean = 0;
  for (size_t c = 0; c < n; ++c) mean += a[c * n + c];
  mean = mean > 0 ? mean / static_cast<double>(n) : 1.0;
  for (size_t c = 0; c < n; ++c) {
    if (a[c * n + c] <= 0) {
      for (size_t j = 0; j < n; ++j) a[c * n + j] = a[j * n + c] = 0;
      a[c * n + c] = mean;
    }
    a[c * n + c] += 0.01 * mean;
  }
  cholesky(a, n, where);
  // A⁻¹ = L⁻ᵀ L⁻¹: first M = L⁻¹ (lower), then A⁻¹ = Mᵀ M.
  std::vector<double> m(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    m[i * n + i] = 1.0 / a[i * n + i];
    for (size_t j = 0; j < i; ++j) {
      double s = 0;
      for (size_t k = j; k < i; ++k) s -= a[i * n + k] * m[k * n + j];
      m[i * n + j] = s / a[i * n + i];
    }
  }
  std::vector<double> inv(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double s = 0;
      for (size_t k = i; k < n; ++k) s += m[k * n + i] * m[k * n + j];
      inv[i * n + j] = inv[j * n + i] = s;
    }
  }
  // A⁻¹ = L' L'ᵀ, so U = L'ᵀ.
  cholesky(inv, n, where);
  std::vector<double> u(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i; j < n; ++j) u[i * n + j] = inv[j * n + i];
  }
  return u;
}

// One row of either method into q (one int per column) and its group scales.
void quantize_row(const float* w, int64_t cols, int64_t group, std::span<const double> h,
                  const std::vector<double>* u, const Grid& grid, int* q, float* scales) {
  std::vector<double> row(w, w + cols);
  for (int64_t c = 0; c < cols; ++c) {
    if (c % group == 0) {
      scales[c / group] = best_scale(std::span(row).subspan(c, group), h.subspan(c, group), grid);
    }
    const float s = scales[c / group];
    q[c] = quantize_one(row[c], s, grid);
    if (u == nullptr) continue;
    const double* uc = u->data() + c * cols;
    const double error = (row[c] - static_cast<double>(s) * q[c]) / uc[c];
    for (int64_t j = c + 1; j < cols; ++j) row[j] -= error * uc[j];
  }
}

void check_gram(std::span<const double> gram, int64_t cols, const std::string& where) {
  if (static_cast<int64_t>(gram.size()) != cols * cols) {
    fail(where, "calibration statistics of " + std::to_string(gram.size()) + " values, not " +
                    std::to_string(cols) + "²");
  }
  for (const double g : gram) {
    if (!std::isfinite(g)) fail(where, "its calibration statistics are not finite");
  }
}

void require_finite(const float* w, int64_t n, const std::string& where) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(w[i])) fail(where, "holds a weight that is inf or NaN");
  }
}

}  // namespace

std::optional<CalibrationMethod> parse_calibration_method(std::string_view name) {
  if (name == "weighted") return CalibrationMethod::kWeighted;
  if (name == "gptq") return CalibrationMethod::kGptq;
  return std::nullopt;
}

std::string_view calibration_method_name(CalibrationMethod method) {
  return method == CalibrationMethod::kGptq ? "gptq" : "weighted";
}

void quantize_w8_calibrated(const float* w, int64_t rows, int64_t cols,
                            std::span<const double> gram, CalibrationMethod method, int8_t* q,
                            float* scales) {
  matrix_elements(DType::kW8, rows, cols, 0);
  const std::string where = matrix_name(DType::kW8, rows, cols, 0);
  require_finite(w, rows * cols, where);
  check_gram(gram, cols, where);
  const std::vector<double> h = importance(gram, cols);
  std::vector<double> u;
  if (method == CalibrationMethod::kGptq) u = inverse_factor(gram, cols, where);
  std::vector<int> row_q(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(w + r * cols, cols, cols, h, u.empty() ? nullptr : &u, kW8Grid, row_q.data(),
                 scales + r);
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = static_cast<int8_t>(row_q[c]);
  }
}

void quantize_w4_calibrated(const float* w, int64_t rows, int64_t cols, int64_t group_size,
                            std::span<const double> gram, CalibrationMethod method, uint8_t* packed,
                            uint16_t* scales) {
  matrix_elements(DType::kW4, rows, cols, group_size);
  const std::string where = matrix_name(DType::kW4, rows, cols, group_size);
  require_finite(w, rows * cols, where);
  check_gram(gram, cols, where);
  const std::vector<double> h = importance(gram, cols);
  std::vector<double> u;
  if (method == CalibrationMethod::kGptq) u = inverse_factor(gram, cols, where);
  const int64_t groups = cols / group_size;
  std::vector<int> row_q(static_cast<size_t>(cols));
  std::vector<float> row_scales(static_cast<size_t>(groups));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(w + r * cols, cols, group_size, h, u.empty() ? nullptr : &u, kW4Grid, row_q.data(),
                 row_scales.data());
    for (int64_t g = 0; g < groups; ++g) {
      if (std::isinf(row_scales[g])) {
        fail(where, "row " + std::to_string(r) + ", columns from " +
                        std::to_string(g * group_size) + " need a scale past f16's range");
      }
      scales[r * groups + g] = f32_to_f16(row_scales[g]);
    }
    for (int64_t c = 0; c < cols; c += 2) {
      packed[(r * cols + c) / 2] =
          static_cast<uint8_t>((row_q[c] & 0xF) | ((row_q[c + 1] & 0xF) << 4));
    }
  }
}

}  // namespace qhx
