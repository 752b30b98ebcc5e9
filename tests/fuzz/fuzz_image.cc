// Fuzz target: any bytes as an image file (PNG, JPEG, EXIF blocks) must decode, within small
// limits, and preprocess, or give qhx::Error, never crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <span>

#include "util/error.h"
#include "vision/image.h"
#include "vision/image_processor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  qhx::ImageLimits limits;
  limits.max_pixels = 1 << 20;  // a fuzzed header may declare any size
  try {
    const qhx::RgbImage image = qhx::decode_image(bytes, "fuzz", limits);
    qhx::ImageProcessorConfig config;
    config.min_pixels = 32 * 32;
    config.max_pixels = 256 * 256;
    (void)qhx::preprocess_image(image, config, "fuzz");
  } catch (const qhx::Error&) {
  }
  // The bytes as an EXIF block too.
  (void)qhx::exif_orientation(std::span(data, size));
  return 0;
}
