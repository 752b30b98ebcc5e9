// Safetensors files: an 8-byte little-endian header length, a JSON header describing each
// tensor (dtype, shape, byte range), then the raw data. Mapped, validated, used in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/tensor_file.h"

namespace qhx {

class SafetensorsFile final : public TensorFile {
 public:
  // Maps and validates the whole header: every error names the file and the tensor.
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::map<std::string, std::string> metadata_;
  // Copies of tensors whose bytes in the file are not aligned to their element size.
  std::vector<std::unique_ptr<std::byte[]>> realigned_;

  SafetensorsFile(const std::filesystem::path& path, MappedFile file);
};

}  // namespace qhx
