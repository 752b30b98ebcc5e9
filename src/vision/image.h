// Images in: PNG (libpng) and JPEG (libjpeg-turbo), decoded to 8-bit RGB upright, as Hugging
// Face's loader for Qwen3.5 gives them (transformers' torchvision backend: torchvision decodes the
// file with its EXIF orientation applied and alpha dropped, not composited).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace qhx {

// Row-major RGB, 3 bytes a pixel.
struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;
  uint8_t at(int64_t y, int64_t x, int c) const { return pixels[(y * width + x) * 3 + c]; }
};

struct ImageLimits {
  // Decoded pixels an image may declare (PIL's own default limit): a larger one is refused from
  // its header, before anything is decoded (a decompression bomb).
  int64_t max_pixels = 89'478'485;
  int64_t max_file_bytes = int64_t{256} << 20;
};

// Decodes a PNG or JPEG (told apart by their signatures). `name` names it in errors: a bad or
// truncated file, another format, a CMYK JPEG, an image larger than the limits, each a one-line
// Error. 16-bit PNG samples keep their high byte, gray becomes RGB, palettes are expanded.
RgbImage decode_image(std::span<const std::byte> bytes, const std::string& name,
                      const ImageLimits& limits = {});
RgbImage read_image(const std::filesystem::path& path, const ImageLimits& limits = {});

// The EXIF orientation (1-8) a TIFF-structured EXIF block declares (with or without the
// "Exif\0\0" prefix JPEG's APP1 carries), 1 when it declares none or cannot be read.
int exif_orientation(std::span<const uint8_t> exif);
// The image as orientation `o` says to show it (2: mirrored, 3: turned 180°, 6: turned 90°
// clockwise, ...: PIL's ImageOps.exif_transpose).
RgbImage apply_orientation(const RgbImage& image, int o);

}  // namespace qhx
