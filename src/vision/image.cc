#include "vision/image.h"

// clang-format off
#include <csetjmp>
#include <cstdio>
#include <png.h>
#include <jpeglib.h>
// clang-format on

#include <algorithm>
#include <cstring>

#include "util/error.h"
#include "util/mapped_file.h"

namespace qhx {
namespace {

// libpng and libjpeg report errors by longjmp: the functions that call them keep no object with
// a destructor alive across setjmp, and write into storage their caller owns.
struct PngJob {
  std::span<const std::byte> bytes;
  size_t read = 0;
  std::vector<png_bytep> rows;  // here, not on decode_png's stack, which a longjmp abandons
  char error[200] = {};
  jmp_buf jump;
};

void png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (n > job->bytes.size() - job->read) png_error(png, "the file is truncated");
  std::memcpy(out, job->bytes.data() + job->read, n);
  job->read += n;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->error, sizeof job->error, "%s", message);
  std::longjmp(job->jump, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

// Returns false with job.error set on a decoding error, or with it empty when the image is too
// large (size_error set).
bool decode_png(PngJob& job, const ImageLimits& limits, RgbImage& out, std::string& size_error,
                std::vector<uint8_t>& exif) {
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, png_on_error, png_on_warning);
  if (png == nullptr) {
    std::snprintf(job.error, sizeof job.error, "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  png_infop end = png_create_info_struct(png);
  if (setjmp(job.jump)) {
    png_destroy_read_struct(&png, &info, &end);
    return false;
  }
  if (info == nullptr || end == nullptr) png_error(png, "out of memory");
  png_set_read_fn(png, &job, png_read_bytes);
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  const int64_t width = png_get_image_width(png, info), height = png_get_image_height(png, info);
  if (width <= 0 || height <= 0 || width > limits.max_pixels / height) {
    size_error = std::to_string(width) + "x" + std::to_string(height);
    png_destroy_read_struct(&png, &info, &end);
    return false;
  }
  const int color = png_get_color_type(png, info);
  // RGB as torchvision reads it: palettes expanded, alpha stripped, gray replicated; 16-bit
  // samples to their high byte, 1/2/4-bit gray scaled to 8 bits (as PIL).
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) {
    png_set_expand_gray_1_2_4_to_8(png);
  }
  if (color & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  if (!(color & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(width) * 3) {
    png_error(png, "unexpected row layout after conversion to RGB");
  }
  out.width = width;
  out.height = height;
  out.pixels.resize(width * height * 3);
  job.rows.resize(height);
  for (int64_t y = 0; y < height; ++y) job.rows[y] = out.pixels.data() + y * width * 3;
  png_read_image(png, job.rows.data());
  png_read_end(png, end);
  for (png_infop where : {info, end}) {
    png_uint_32 n = 0;
    png_bytep data = nullptr;
    if (png_get_eXIf_1(png, where, &n, &data) != 0 && data != nullptr) {
      exif.assign(data, data + n);
    }
  }
  png_destroy_read_struct(&png, &info, &end);
  return true;
}

struct JpegError {
  jpeg_error_mgr manager;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_no_message(j_common_ptr, int) {}

enum class JpegResult { kOk, kError, kTooLarge, kCmyk };

JpegResult decode_jpeg(std::span<const std::byte> bytes, const ImageLimits& limits,
                       JpegError& error, RgbImage& out, std::string& size_error,
                       std::vector<uint8_t>& exif) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = jpeg_on_error;
  error.manager.emit_message = jpeg_no_message;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return JpegResult::kError;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xffff);
  jpeg_read_header(&cinfo, TRUE);
  const int64_t width = cinfo.image_width, height = cinfo.image_height;
  if (width <= 0 || height <= 0 || width > limits.max_pixels / height) {
    size_error = std::to_string(width) + "x" + std::to_string(height);
    jpeg_destroy_decompress(&cinfo);
    return JpegResult::kTooLarge;
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return JpegResult::kCmyk;
  }
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m != nullptr; m = m->next) {
    if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 &&
        std::memcmp(m->data, "Exif\0\0", 6) == 0) {
      exif.assign(m->data, m->data + m->data_length);
      break;
    }
  }
  cinfo.out_color_space = JCS_RGB;  // libjpeg's defaults otherwise: islow DCT, fancy upsampling
  jpeg_start_decompress(&cinfo);
  out.width = width;
  out.height = height;
  out.pixels.resize(width * height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.pixels.data() + static_cast<int64_t>(cinfo.output_scanline) * width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return JpegResult::kOk;
}

uint32_t read_u32(const uint8_t* p, bool little) {
  return little ? p[0] | p[1] << 8 | p[2] << 16 | uint32_t{p[3]} << 24
                : uint32_t{p[0]} << 24 | p[1] << 16 | p[2] << 8 | p[3];
}
uint16_t read_u16(const uint8_t* p, bool little) {
  return static_cast<uint16_t>(little ? p[0] | p[1] << 8 : p[0] << 8 | p[1]);
}

}  // namespace

int exif_orientation(std::span<const uint8_t> exif) {
  if (exif.size() >= 6 && std::memcmp(exif.data(), "Exif\0\0", 6) == 0) exif = exif.subspan(6);
  if (exif.size() < 8) return 1;
  const bool little = exif[0] == 'I' && exif[1] == 'I';
  if (!little && !(exif[0] == 'M' && exif[1] == 'M')) return 1;
  if (read_u16(&exif[2], little) != 42) return 1;
  const uint64_t ifd = read_u32(&exif[4], little);
  if (ifd + 2 > exif.size()) return 1;
  const int n = read_u16(&exif[ifd], little);
  for (int i = 0; i < n; ++i) {
    const uint64_t entry = ifd + 2 + 12 * static_cast<uint64_t>(i);
    if (entry + 12 > exif.size()) return 1;
    if (read_u16(&exif[entry], little) != 0x0112) continue;
    // A SHORT (type 3), one of them, held in the entry itself.
    if (read_u16(&exif[entry + 2], little) != 3 || read_u32(&exif[entry + 4], little) != 1) {
      return 1;
    }
    const int o = read_u16(&exif[entry + 8], little);
    return o >= 1 && o <= 8 ? o : 1;
  }
  return 1;
}

RgbImage apply_orientation(const RgbImage& in, int o) {
  if (o <= 1 || o > 8) return in;
  const int64_t H = in.height, W = in.width;
  const bool swaps = o >= 5;  // transpose, rotations by 90°, transverse
  RgbImage out;
  out.height = swaps ? W : H;
  out.width = swaps ? H : W;
  out.pixels.resize(in.pixels.size());
  for (int64_t y = 0; y < out.height; ++y) {
    for (int64_t x = 0; x < out.width; ++x) {
      int64_t sy = y, sx = x;
      switch (o) {
        case 2:
          sx = W - 1 - x;
          break;  // mirrored
        case 3:
          sy = H - 1 - y;
          sx = W - 1 - x;
          break;  // turned 180°
        case 4:
          sy = H - 1 - y;
          break;  // flipped
        case 5:
          sy = x;
          sx = y;
          break;  // transposed
        case 6:
          sy = H - 1 - x;
          sx = y;
          break;  // turned 90° clockwise
        case 7:
          sy = H - 1 - x;
          sx = W - 1 - y;
          break;  // transversed
        case 8:
          sy = x;
          sx = W - 1 - y;
          break;  // turned 90° counter-clockwise
      }
      std::copy_n(&in.pixels[(sy * W + sx) * 3], 3, &out.pixels[(y * out.width + x) * 3]);
    }
  }
  return out;
}

RgbImage decode_image(std::span<const std::byte> bytes, const std::string& name,
                      const ImageLimits& limits) {
  if (static_cast<int64_t>(bytes.size()) > limits.max_file_bytes) {
    fail(name, "the file is " + std::to_string(bytes.size()) + " bytes, more than the limit of " +
                   std::to_string(limits.max_file_bytes));
  }
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  RgbImage image;
  std::string size_error;
  std::vector<uint8_t> exif;
  if (bytes.size() >= 8 && std::memcmp(b, kPng, 8) == 0) {
    PngJob job;
    job.bytes = bytes;
    if (!decode_png(job, limits, image, size_error, exif) && size_error.empty()) {
      fail(name, std::string("not a valid PNG: ") + job.error);
    }
  } else if (bytes.size() >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) {
    JpegError error;
    switch (decode_jpeg(bytes, limits, error, image, size_error, exif)) {
      case JpegResult::kOk:
        break;
      case JpegResult::kError:
        fail(name, std::string("not a valid JPEG: ") + error.message);
      case JpegResult::kTooLarge:
        break;
      case JpegResult::kCmyk:
        fail(name, "a CMYK JPEG: qhx reads RGB and grayscale JPEGs");
    }
  } else {
    fail(name, "not a PNG or JPEG image (qhx reads those two formats)");
  }
  if (!size_error.empty()) {
    fail(name, "the image declares " + size_error + " pixels, more than the limit of " +
                   std::to_string(limits.max_pixels) + " (refused before decoding)");
  }
  const int o = exif_orientation(exif);
  return o == 1 ? image : apply_orientation(image, o);
}

RgbImage read_image(const std::filesystem::path& path, const ImageLimits& limits) {
  const MappedFile file(path);
  return decode_image(file.bytes(), path.string(), limits);
}

}  // namespace qhx
