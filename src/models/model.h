// What the runtime needs from a model family: a forward pass over new tokens that extends a
// per-sequence state, and logits out.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/hf_config.h"

namespace qhx {

// A named piece of a sequence's state, e.g. "layer3.recurrent".
struct StateTensor {
  std::string name;
  std::span<const float> data;
};

// Everything a sequence carries between forward calls: KV caches, conv and recurrent states.
class ModelState {
 public:
  virtual ~ModelState() = default;
  virtual int64_t n_past() const = 0;  // tokens already processed
  virtual void reset() = 0;            // back to the empty sequence
  // A snapshot: an independent copy that can be continued or restored from.
  virtual std::unique_ptr<ModelState> clone() const = 0;
  // Becomes a copy of `snapshot` (a state of the same model).
  virtual void restore(const ModelState& snapshot) = 0;
  virtual std::vector<StateTensor> tensors() const = 0;
  // Makes room for a sequence of n_tokens in all: the KV caches then grow without reallocating,
  // so they hold exactly what the sequence needs (growing by doubling could take twice that).
  virtual void reserve(int64_t n_tokens) = 0;
  // Bytes the state holds now (KV caches, conv and recurrent states), reserved room included.
  virtual int64_t bytes() const = 0;
};

enum class LogitsFor { kLastToken, kEveryToken };

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual std::unique_ptr<ModelState> new_state() const = 0;
  // Processes `ids` at positions n_past(), n_past()+1, ... and appends them to `state`.
  // `logits` receives [1 or ids.size(), vocab_size] floats. Throws Error on an id outside the
  // vocabulary or a context longer than max_position_embeddings.
  virtual void forward(std::span<const int32_t> ids, ModelState& state, LogitsFor which,
                       std::vector<float>& logits) const = 0;
};

struct LoadOptions {
  bool verify_sha256 = false;  // bundles: check every file's sha256 (sizes are always checked)
  bool check_target = true;    // bundles: refuse one built for another CPU
};

// Opens a Hugging Face checkpoint directory (config.json + safetensors) or a qhx bundle
// (manifest.json + tensor files) of any supported family. Weights are mapped, not copied.
std::unique_ptr<Model> load_model(const std::filesystem::path& dir,
                                  const LoadOptions& options = {});

}  // namespace qhx
