// A Hugging Face checkpoint's weights: one model.safetensors, or several files listed by
// model.safetensors.index.json. Lookup by tensor name with shape checks that name the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace qhx {

class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);

  const TensorView* find(const std::string& name) const;
  // The tensor, or an Error naming the checkpoint and the tensor if it is missing or its shape
  // is not `shape`.
  const TensorView& require(const std::string& name, std::initializer_list<int64_t> shape) const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }

  const std::filesystem::path& dir() const { return dir_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  std::filesystem::path dir_;
  std::vector<SafetensorsFile> files_;
};

}  // namespace qhx
