#include "io/checkpoint.h"

#include <cctype>
#include <map>
#include <set>

#include "util/error.h"
#include "util/json_file.h"
#include "util/sha256.h"

namespace qhx {

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const auto index_path = dir / "model.safetensors.index.json";
  const auto single_path = dir / "model.safetensors";
  if (std::filesystem::exists(index_path)) {
    const Json index = read_json_file(index_path);
    const Json& weight_map = require_field(index, "weight_map", index_path.string());
    if (!weight_map.is_object()) fail(index_path.string() + ": weight_map", "expected an object");
    std::set<std::string> shard_names;
    for (const auto& [tensor, file] : weight_map.items()) {
      if (!file.is_string())
        fail(index_path.string() + ": weight_map." + tensor, "expected a file");
      const std::string name = file.get<std::string>();
      if (name.find('/') != std::string::npos || name.starts_with(".")) {
        fail(index_path.string() + ": weight_map." + tensor, "file '" + name + "' is not local");
      }
      shard_names.insert(name);
    }
    for (const auto& name : shard_names) {
      ckpt.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(dir / name)));
    }
    // Where the index says each tensor is: a tensor the model reads and its file lacks is
    // named with that file (require). transformers picks files by the index and ignores what
    // it does not read, so a pruned optional tensor (mtp.*) still listed is no refusal.
    for (const auto& [tensor, file] : weight_map.items()) {
      ckpt.indexed_in_[tensor] = dir / file.get<std::string>();
    }
  } else if (std::filesystem::exists(single_path)) {
    ckpt.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(single_path)));
  } else {
    fail(dir.string(), "no model.safetensors or model.safetensors.index.json");
  }
  return ckpt;
}

Checkpoint Checkpoint::from_files(const std::filesystem::path& dir,
                                  std::vector<std::unique_ptr<TensorFile>> files) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  std::map<std::string, const TensorFile*> owner;
  for (const auto& f : files) {
    for (const auto& [name, view] : f->tensors()) {
      if (auto [it, fresh] = owner.emplace(name, f.get()); !fresh) {
        fail(f->path().string(), "tensor '" + name + "' is also in " + it->second->path().string());
      }
    }
  }
  ckpt.files_ = std::move(files);
  return ckpt;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  for (const auto& f : files_) {
    if (const TensorView* t = f->find(name)) return t;
  }
  return nullptr;
}

const TensorView& Checkpoint::require(const std::string& name,
                                      std::initializer_list<int64_t> shape) const {
  const TensorView* t = find(name);
  if (t == nullptr) fail_missing(name);
  if (!std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end())) {
    TensorView expected;
    expected.shape.assign(shape.begin(), shape.end());
    fail(t->file->string() + ": tensor '" + name + "'",
         "shape " + t->shape_string() + ", expected " + expected.shape_string() +
             " from config.json's sizes (one of the two is wrong)");
  }
  return *t;
}

namespace {

// Names of the same length that differ in one or two bytes, neither a digit in both (that is
// another layer's tensor): a damaged name in a file's header.
bool near_name(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || a == b) return false;
  int differences = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    if ((std::isdigit(static_cast<unsigned char>(a[i])) &&
         std::isdigit(static_cast<unsigned char>(b[i]))) ||
        ++differences > 2) {
      return false;
    }
  }
  return true;
}

// "model.layers.12.mlp.up_proj.weight" -> ("model.layers.#.mlp.up_proj.weight", "12"); names of
// no layer -> ("", "").
std::pair<std::string, std::string> layer_pattern(const std::string& name) {
  const size_t at = name.find("layers.");
  if (at == std::string::npos) return {};
  const size_t digits = at + 7, dot = name.find('.', digits);
  if (dot == std::string::npos || dot == digits) return {};
  return {name.substr(0, digits) + "#" + name.substr(dot), name.substr(digits, dot - digits)};
}

}  // namespace

// Whether `name` is one of a layer's tensors that another layer has too: a regular tensor, not a
// damaged name (Qwen3.5's attention layers are every fourth: any other layer counts).
bool Checkpoint::in_other_layers(const std::string& name) const {
  const auto [pattern, layer] = layer_pattern(name);
  if (pattern.empty()) return false;
  for (const auto& f : files_) {
    for (const auto& [other, view] : f->tensors()) {
      const auto [other_pattern, other_layer] = layer_pattern(other);
      if (other_pattern == pattern && other_layer != layer) return true;
    }
  }
  return false;
}

void Checkpoint::fail_missing(const std::string& name) const {
  const std::string what = "missing tensor '" + name + "'";
  if (const auto it = indexed_in_.find(name); it != indexed_in_.end()) {
    fail(it->second.string(), what + ", which model.safetensors.index.json lists in it");
  }
  for (const auto& f : files_) {
    for (const auto& [other, view] : f->tensors()) {
      if (near_name(name, other) && find(other) == &view && !in_other_layers(other)) {
        fail(f->path().string(), what + " (it has '" + other + "' instead: a damaged name?)");
      }
    }
  }
  if (files_.size() == 1) fail(files_[0]->path().string(), what);
  fail(dir_.string(), what + " (in none of its " + std::to_string(files_.size()) + " files)");
}

std::vector<std::string> Checkpoint::listed_but_absent() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : indexed_in_) {
    if (!contains(name)) names.push_back(name);
  }
  return names;
}

std::string Checkpoint::fingerprint() const {
  Sha256 hash;
  for (const auto& file : files_) {
    for (const auto& [name, view] : file->tensors()) {
      hash.update(name + ":" + std::string(dtype_name(view.dtype)) + view.shape_string() + ";");
    }
    const std::span<const std::byte> bytes = file->bytes();
    hash.update(std::to_string(bytes.size()) + ";");
    constexpr size_t kSamples = 64, kSampleBytes = 64;
    if (bytes.size() <= kSamples * kSampleBytes) {
      hash.update(bytes);
      continue;
    }
    const size_t stride = (bytes.size() - kSampleBytes) / (kSamples - 1);
    for (size_t i = 0; i < kSamples; ++i) hash.update(bytes.subspan(i * stride, kSampleBytes));
  }
  return hash.hex();
}

}  // namespace qhx
