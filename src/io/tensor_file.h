// A file of named tensors, mapped and validated once, then used in place: Hugging Face
// safetensors files and qhx bundle tensor files (.qhxt) both present themselves this way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "util/mapped_file.h"

namespace qhx {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // aligned to the element size
  // The mapped file's buffer when `data` lies in it; null for a copy made to align it.
  const Buffer* buffer = nullptr;
  size_t nbytes = 0;
  const std::filesystem::path* file = nullptr;  // the file it came from, for messages
  // Quantized weights (W8, W4): per-row or per-group scales, and the group width.
  const std::byte* scales = nullptr;
  size_t scale_bytes = 0;
  int64_t group_size = 0;

  int64_t numel() const;
  std::string shape_string() const;  // "[64, 32]"
};

class TensorFile {
 public:
  virtual ~TensorFile() = default;
  TensorFile(TensorFile&&) = default;
  TensorFile& operator=(TensorFile&&) = default;

  const TensorView* find(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::filesystem::path& path() const { return *path_; }
  // Free-form string pairs stored beside the tensor table (qhxt "metadata"; safetensors
  // "__metadata__").
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::span<const std::byte> bytes() const { return file_.bytes(); }  // the whole mapped file

 protected:
  TensorFile(const std::filesystem::path& path, MappedFile file);

  std::unique_ptr<std::filesystem::path> path_;  // stable address for TensorView::file
  MappedFile file_;
  std::unique_ptr<BorrowedBuffer> mapped_;  // file_'s bytes as a buffer (kMappedFile)
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace qhx
