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

#include "io/dtype.h"
#include "util/mapped_file.h"

namespace qhx {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // aligned to the element size
  size_t nbytes = 0;
  const std::filesystem::path* file = nullptr;  // the file it came from, for messages

  int64_t numel() const;
  std::string shape_string() const;  // "[64, 32]"
};

class SafetensorsFile {
 public:
  // Maps and validates the whole header: every error names the file and the tensor.
  static SafetensorsFile open(const std::filesystem::path& path);

  const TensorView* find(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return *path_; }

 private:
  std::unique_ptr<std::filesystem::path> path_;  // stable address for TensorView::file
  MappedFile file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
  // Copies of tensors whose bytes in the file are not aligned to their element size.
  std::vector<std::unique_ptr<std::byte[]>> realigned_;

  SafetensorsFile(const std::filesystem::path& path, MappedFile file);
};

}  // namespace qhx
