// Test-only access to a safetensors file as (JSON header, data bytes), to build files and to
// corrupt them on purpose.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "util/json_file.h"

namespace qhx::test {

struct RawSafetensors {
  Json header = Json::object();
  std::string data;

  static RawSafetensors read(const std::filesystem::path& path);
  // Appends a tensor at the end of the data, recording its offsets in the header.
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           const void* bytes, size_t nbytes);
  // Removes a tensor and its bytes, moving the tensors after it down so that the file keeps no
  // hole (a bare header.erase would leave one, which SafetensorsFile::open refuses).
  void erase(const std::string& name);
  // Writes the 8-byte length, the header padded with spaces so that 8 + its length is a multiple
  // of `align`, then the data as it is (holes or misalignment in it are kept).
  void write(const std::filesystem::path& path, size_t align = 8) const;
};

void copy_dir(const std::filesystem::path& from, const std::filesystem::path& to);

// Copies the checkpoint directory `from` to `to` without the tensors `drop` is true for (taken
// out of model.safetensors.index.json too, if it has one), and with `add`'s F32 tensors (random
// values) appended to its first weight file.
struct NewTensor {
  std::string name;
  std::vector<int64_t> shape;
};
void copy_checkpoint(const std::filesystem::path& from, const std::filesystem::path& to,
                     const std::function<bool(const std::string&)>& drop,
                     const std::vector<NewTensor>& add = {});

}  // namespace qhx::test
