// qhx tensor files (.qhxt), the weight files of a bundle (docs/bundle.md):
//   "QHXT" | u32 LE format version | u64 LE table length N | N bytes of JSON tensor table |
//   zero padding | tensor data, every tensor (and every scale block) at a 64-byte aligned offset.
// The table lists each tensor's name, dtype, shape, byte offset and size (and for W8/W4 its
// scales and group size). Reading maps the file and validates the whole table; nothing is copied.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "io/tensor_file.h"

namespace qhx {

inline constexpr uint32_t kQhxtVersion = 1;
inline constexpr size_t kQhxtAlignment = 64;

class QhxtFile final : public TensorFile {
 public:
  static QhxtFile open(const std::filesystem::path& path);

 private:
  QhxtFile(const std::filesystem::path& path, MappedFile file)
      : TensorFile(path, std::move(file)) {}
};

// One tensor to write: its bytes in the layout of `dtype` (see core/tensor.h MatrixRef).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
  std::vector<std::byte> scales;  // W8: f32 per row; W4: f16 per group
  int64_t group_size = 0;
};

// Writes a complete .qhxt file (the caller makes the bundle as a whole atomic).
// `metadata` goes into the table as an object of strings (QhxtFile::metadata reads it back).
void write_qhxt(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                const std::map<std::string, std::string>& metadata = {});

// Bytes a tensor's data and scales take in `dtype`; throws Error naming `where` on an
// impossible layout.
struct TensorBytes {
  uint64_t data = 0;
  uint64_t scales = 0;
};
TensorBytes tensor_bytes(DType dtype, std::span<const int64_t> shape, int64_t group_size,
                         const std::string& where);

}  // namespace qhx
