// The weights of a model, looked up by tensor name across one or more tensor files: a Hugging
// Face checkpoint (model.safetensors, or the shards model.safetensors.index.json lists) or the
// tensor files of a qhx bundle. Shape checks name the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace qhx {

class Checkpoint {
 public:
  Checkpoint() = default;
  static Checkpoint open(const std::filesystem::path& dir);
  // Tensors spread over `files` (names must be unique across them).
  static Checkpoint from_files(const std::filesystem::path& dir,
                               std::vector<std::unique_ptr<TensorFile>> files);

  const TensorView* find(const std::string& name) const;
  // The tensor, or an Error naming the tensor and the file it should be in (the one the index
  // lists it in, or the only one, or the one holding a name a flipped bit or two away) if it is
  // missing, or the file that has it if its shape is not `shape`.
  const TensorView& require(const std::string& name, std::initializer_list<int64_t> shape) const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }

  // sha256 over every file's tensor table (names, dtypes, shapes), size, and 64 evenly spaced
  // samples of its bytes: tells two sets of weights apart without reading them all.
  std::string fingerprint() const;

  const std::filesystem::path& dir() const { return dir_; }
  // Tensors model.safetensors.index.json lists that no file holds (a pruning tool's leftovers).
  std::vector<std::string> listed_but_absent() const;
  const std::vector<std::unique_ptr<TensorFile>>& files() const { return files_; }

 private:
  [[noreturn]] void fail_missing(const std::string& name) const;
  bool in_other_layers(const std::string& name) const;

  std::filesystem::path dir_;
  std::vector<std::unique_ptr<TensorFile>> files_;
  std::map<std::string, std::filesystem::path> indexed_in_;  // model.safetensors.index.json
};

}  // namespace qhx
