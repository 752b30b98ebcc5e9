#include "vision/image_processor.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"
#include "util/json_file.h"

namespace qhx {
namespace {

// Keys' cubic convolution with a = −0.5, PIL's bicubic (and torch's when antialiasing).
double keys_cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

// One axis of the resize: per output index, its first input index, its taps and their int16
// weights (taps_max apart), and the precision (bits) they are scaled to.
struct AxisTaps {
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;
  int64_t taps_max = 0;
  int precision = 0;
};

AxisTaps axis_taps(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  AxisTaps a;
  a.taps_max = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  a.first.resize(out);
  a.count.resize(out);
  std::vector<double> w(out * a.taps_max, 0.0);
  double w_max = 0.0;
  for (int64_t i = 0; i < out; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    const int64_t xsize = std::clamp(
        std::min(static_cast<int64_t>(center + support + 0.5), in) - xmin, int64_t{0}, a.taps_max);
    double total = 0.0;
    double* wi = &w[i * a.taps_max];
    for (int64_t j = 0; j < xsize; ++j) {
      wi[j] = keys_cubic((static_cast<double>(j + xmin) - center + 0.5) * invscale);
      total += wi[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < xsize; ++j) {
        wi[j] /= total;
        w_max = std::max(w_max, wi[j]);
      }
    }
    a.first[i] = xmin;
    a.count[i] = xsize;
  }
  // The largest precision (< 22 bits) at which the largest weight still fits 15 bits.
  for (a.precision = 0; a.precision < 22; ++a.precision) {
    if (static_cast<int>(0.5 + w_max * (1 << (a.precision + 1))) >= (1 << 15)) break;
  }
  a.weights.resize(w.size());
  for (size_t k = 0; k < w.size(); ++k) {
    const double v = w[k] * (1 << a.precision);
    a.weights[k] =
        static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return a;
}

uint8_t fixed_to_u8(int32_t sum, int precision) {
  return static_cast<uint8_t>(std::clamp(sum >> precision, 0, 255));
}

// Python's round(): to nearest, ties to even.
int64_t round_half_even(double x) {
  return static_cast<int64_t>(std::nearbyint(x));
}

}  // namespace

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor,
                                         int64_t min_pixels, int64_t max_pixels,
                                         const std::string& name) {
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  if (std::max(h, w) / std::min(h, w) > 200) {
    fail(name, "the image is " + std::to_string(width) + "x" + std::to_string(height) +
                   ": its aspect ratio is above 200, which the processor refuses");
  }
  const double f = static_cast<double>(factor);
  int64_t h_bar = round_half_even(h / f) * factor, w_bar = round_half_even(w / f) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

RgbImage resize_bicubic_antialiased(const RgbImage& image, int64_t height, int64_t width) {
  RgbImage current = image;
  if (width != current.width) {
    const AxisTaps a = axis_taps(current.width, width);
    RgbImage next{width, current.height, std::vector<uint8_t>(width * current.height * 3)};
    for (int64_t y = 0; y < current.height; ++y) {
      for (int64_t x = 0; x < width; ++x) {
        const int32_t* wx = &a.weights[x * a.taps_max];
        for (int c = 0; c < 3; ++c) {
          int32_t sum = 1 << (a.precision - 1);
          for (int64_t j = 0; j < a.count[x]; ++j) sum += wx[j] * current.at(y, a.first[x] + j, c);
          next.pixels[(y * width + x) * 3 + c] = fixed_to_u8(sum, a.precision);
        }
      }
    }
    current = std::move(next);
  }
  if (height != current.height) {
    const AxisTaps a = axis_taps(current.height, height);
    RgbImage next{current.width, height, std::vector<uint8_t>(current.width * height * 3)};
    for (int64_t y = 0; y < height; ++y) {
      const int32_t* wy = &a.weights[y * a.taps_max];
      for (int64_t x = 0; x < current.width; ++x) {
        for (int c = 0; c < 3; ++c) {
          int32_t sum = 1 << (a.precision - 1);
          for (int64_t j = 0; j < a.count[y]; ++j) sum += wy[j] * current.at(a.first[y] + j, x, c);
          next.pixels[(y * current.width + x) * 3 + c] = fixed_to_u8(sum, a.precision);
        }
      }
    }
    current = std::move(next);
  }
  return current;
}

PixelValues preprocess_image(const RgbImage& image, const ImageProcessorConfig& config,
                             const std::string& name) {
  const int64_t p = config.patch_size, m = config.merge_size, T = config.temporal_patch_size;
  RgbImage resized;
  if (config.do_resize) {
    const auto [h, w] = smart_resize(image.height, image.width, config.factor(), config.min_pixels,
                                     config.max_pixels, name);
    resized = resize_bicubic_antialiased(image, h, w);
  } else {
    resized = image;
  }
  if (resized.height % (p * m) != 0 || resized.width % (p * m) != 0) {
    fail(name, "the image is " + std::to_string(resized.width) + "x" +
                   std::to_string(resized.height) +
                   ", not a multiple of patch_size x merge_size (" + std::to_string(p * m) +
                   ") with do_resize false");
  }
  // torchvision's fused rescale and normalize: mean and std divided by the rescale factor.
  float mean[3], std[3], scale = static_cast<float>(config.rescale_factor);
  for (int c = 0; c < 3; ++c) {
    const float inverse = static_cast<float>(1.0 / config.rescale_factor);
    mean[c] = static_cast<float>(config.image_mean[c]) * inverse;
    std[c] = static_cast<float>(config.image_std[c]) * inverse;
  }
  const auto value = [&](uint8_t x, int c) {
    const float v = static_cast<float>(x);
    if (config.do_normalize) {
      if (config.do_rescale) return (v - mean[c]) / std[c];
      return (v - static_cast<float>(config.image_mean[c])) /
             static_cast<float>(config.image_std[c]);
    }
    return config.do_rescale ? v * scale : v;
  };
  PixelValues out;
  out.grid = {1, resized.height / p, resized.width / p};
  out.cols = config.patch_values();
  out.values.resize(out.grid.patches() * out.cols);
  float* dst = out.values.data();
  for (int64_t by = 0; by < out.grid.h / m; ++by) {
    for (int64_t bx = 0; bx < out.grid.w / m; ++bx) {
      for (int64_t my = 0; my < m; ++my) {
        for (int64_t mx = 0; mx < m; ++mx) {
          const int64_t y0 = (by * m + my) * p, x0 = (bx * m + mx) * p;
          for (int c = 0; c < 3; ++c) {
            for (int64_t t = 0; t < T; ++t) {  // a still image: the same frame T times
              for (int64_t y = 0; y < p; ++y) {
                for (int64_t x = 0; x < p; ++x) *dst++ = value(resized.at(y0 + y, x0 + x, c), c);
              }
            }
          }
        }
      }
    }
  }
  return out;
}

ImageProcessorConfig read_image_processor_config(const std::filesystem::path& dir) {
  ImageProcessorConfig c;
  const std::filesystem::path path = dir / "preprocessor_config.json";
  if (!std::filesystem::exists(path)) return c;
  const nlohmann::json j = read_json_file(path);
  const std::string where = path.string();
  if (!j.is_object()) fail(where, "not a JSON object");
  const auto integer = [&](const char* key, int64_t& v, int64_t lo, int64_t hi) {
    if (!j.contains(key)) return;
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < lo || j[key].get<int64_t>() > hi) {
      fail(where + ": " + key,
           "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    v = j[key].get<int64_t>();
  };
  const auto boolean = [&](const char* key, bool& v) {
    if (!j.contains(key)) return;
    if (!j[key].is_boolean()) fail(where + ": " + key, "expected true or false");
    v = j[key].get<bool>();
  };
  if (j.contains("image_processor_type")) {
    const auto& t = j["image_processor_type"];
    if (!t.is_string() || (t != "Qwen2VLImageProcessor" && t != "Qwen2VLImageProcessorFast")) {
      fail(where + ": image_processor_type",
           "qhx follows Qwen2VLImageProcessor (Qwen3.5's), not " + t.dump());
    }
  }
  integer("patch_size", c.patch_size, 1, 1024);
  integer("merge_size", c.merge_size, 1, 16);
  integer("temporal_patch_size", c.temporal_patch_size, 1, 16);
  if (j.contains("size")) {
    const auto& s = j["size"];
    if (!s.is_object() || !s.contains("shortest_edge") || !s.contains("longest_edge") ||
        !s["shortest_edge"].is_number_integer() || !s["longest_edge"].is_number_integer() ||
        s["shortest_edge"].get<int64_t>() < 1 || s["longest_edge"].get<int64_t>() < 1) {
      fail(where + ": size", "expected {\"shortest_edge\": pixels, \"longest_edge\": pixels}");
    }
    c.min_pixels = s["shortest_edge"].get<int64_t>();
    c.max_pixels = s["longest_edge"].get<int64_t>();
  }
  // min_pixels and max_pixels, when given, override size (as the processor's constructor does).
  integer("min_pixels", c.min_pixels, 1, int64_t{1} << 40);
  integer("max_pixels", c.max_pixels, 1, int64_t{1} << 40);
  if (c.min_pixels > c.max_pixels) fail(where + ": size", "shortest_edge exceeds longest_edge");
  boolean("do_resize", c.do_resize);
  boolean("do_rescale", c.do_rescale);
  boolean("do_normalize", c.do_normalize);
  bool convert_rgb = true;
  boolean("do_convert_rgb", convert_rgb);
  if (!convert_rgb) fail(where + ": do_convert_rgb", "qhx reads images as RGB: false is refused");
  if (j.contains("resample") && j["resample"] != 3) {
    fail(where + ": resample", "qhx resizes with bicubic (3) only, not " + j["resample"].dump());
  }
  if (j.contains("rescale_factor")) {
    if (!j["rescale_factor"].is_number() || !(j["rescale_factor"].get<double>() > 0)) {
      fail(where + ": rescale_factor", "expected a positive number");
    }
    c.rescale_factor = j["rescale_factor"].get<double>();
  }
  for (const char* key : {"image_mean", "image_std"}) {
    if (!j.contains(key)) continue;
    const auto& v = j[key];
    if (!v.is_array() || v.size() != 3 ||
        !std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_number(); })) {
      fail(where + ": " + key, "expected three numbers (R, G, B)");
    }
    auto& dst = std::string(key) == "image_mean" ? c.image_mean : c.image_std;
    for (int i = 0; i < 3; ++i) dst[i] = v[i].get<double>();
    if (std::string(key) == "image_std" &&
        std::any_of(dst.begin(), dst.end(), [](double x) { return !(x > 0); })) {
      fail(where + ": image_std", "expected positive numbers");
    }
  }
  return c;
}

}  // namespace qhx
