// Qwen3.5's image preprocessing, as transformers' Qwen2VLImageProcessor (the torchvision backend,
// which AutoImageProcessor picks for model_type qwen3_5 when torchvision is installed) computes
// it: smart_resize to a multiple of patch·merge within [min_pixels, max_pixels], torch's uint8
// antialiased bicubic resize (PIL's filter in fixed point, width first), rescale and normalize
// fused as (x − mean/rescale) / (std/rescale) in float32, a still image repeated over the
// temporal patch, and the patches in merge-block order.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "vision/image.h"

namespace qhx {

// preprocessor_config.json's fields (defaults: Qwen3.5's file).
struct ImageProcessorConfig {
  int64_t patch_size = 16, merge_size = 2, temporal_patch_size = 2;
  int64_t min_pixels = 65536, max_pixels = 16777216;  // size.shortest_edge, size.longest_edge
  bool do_resize = true, do_rescale = true, do_normalize = true;
  double rescale_factor = 1.0 / 255.0;
  std::array<double, 3> image_mean{0.5, 0.5, 0.5}, image_std{0.5, 0.5, 0.5};

  int64_t factor() const { return patch_size * merge_size; }
  int64_t patch_values() const { return 3 * temporal_patch_size * patch_size * patch_size; }
};

// Reads `dir`/preprocessor_config.json (the defaults when there is none). What would change the
// pixels in a way qhx does not follow (another resample filter, do_convert_rgb false, a processor
// of another family) is refused naming the field.
ImageProcessorConfig read_image_processor_config(const std::filesystem::path& dir);

// An image's grid of patches: t temporal, h × w spatial.
struct ImageGrid {
  int64_t t = 1, h = 0, w = 0;
  int64_t patches() const { return t * h * w; }
  int64_t tokens(int64_t merge_size) const { return patches() / (merge_size * merge_size); }
  bool operator==(const ImageGrid&) const = default;
};

struct PixelValues {
  ImageGrid grid;
  int64_t cols = 0;           // values per patch: 3 · temporal_patch_size · patch_size²
  std::vector<float> values;  // [grid.patches(), cols], each patch [channel][t][y][x]
};

// (height, width) as transformers' smart_resize computes them (Python's round: half to even).
// Throws Error naming `name` for an aspect ratio above 200.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor,
                                         int64_t min_pixels, int64_t max_pixels,
                                         const std::string& name);

// torch.nn.functional.interpolate(uint8, mode="bicubic", antialias=True) of an RGB image, to the
// bit: weights in double normalised and rounded to int16 at the precision the axis's largest
// weight allows, the width pass first into uint8, then the height pass.
RgbImage resize_bicubic_antialiased(const RgbImage& image, int64_t height, int64_t width);

PixelValues preprocess_image(const RgbImage& image, const ImageProcessorConfig& config,
                             const std::string& name);

}  // namespace qhx
