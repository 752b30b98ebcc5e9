// Safetensors files: an 8-byte little-endian header length, a JSON header describing each
// tensor (dtype, shape, byte range), then the raw data. Mapped, validated, used in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/tensor_file.h"

namespace qhx {

class SafetensorsFile final : public TensorFile {
 public:
  // Maps and validates the whole header: every error names the file and the tensor. Accepts the
  // layouts the reference accepts: sorted by byte range, the tensors tile the data exactly.
  static SafetensorsFile open(const std::filesystem::path& path);

 private:
  // Copies of tensors whose bytes in the file are not aligned to their element size.
  std::vector<std::unique_ptr<std::byte[]>> realigned_;

  SafetensorsFile(const std::filesystem::path& path, MappedFile file);
};

// A tensor of a safetensors file to be written: its bytes are produced by write_safetensors's
// `fill` callback, one tensor at a time, so files larger than memory can be streamed out.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// Writes `path` as the reference (Python/Rust `safetensors`) writer lays it out: the tensors back
// to back with no holes, by descending dtype alignment and then by name (so each starts aligned to
// its element size), the header listing them in that order, padded with spaces so the data starts
// 8-byte aligned. fill(i, bytes) is called once per tensor, in file order, with i the tensor's
// index in `tensors` and a zeroed buffer of exactly its size. Names must be distinct.
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const std::function<void(size_t, std::span<std::byte>)>& fill);

}  // namespace qhx
