// Binding checkpoint tensors to a model's weights, with shape checks that name the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "kernels/kernels.h"

namespace qhx {

class WeightReader {
 public:
  // int8_activations: W8/W4 matrices are multiplied with int8 activations (ModelConfig).
  WeightReader(const Checkpoint& checkpoint, std::string prefix, bool int8_activations)
      : checkpoint_(checkpoint), prefix_(std::move(prefix)), int8_activations_(int8_activations) {}

  bool contains(const std::string& name) const { return checkpoint_.contains(prefix_ + name); }
  // A [rows, cols] float matrix used in place.
  MatrixRef matrix(const std::string& name, int64_t rows, int64_t cols) const;
  // A tensor of any float dtype and the given shape, widened to f32.
  std::vector<float> f32(const std::string& name, std::initializer_list<int64_t> shape) const;
  // A zero-centred norm weight w stored as an offset: returns 1 + w, added in f32 (spec §1.1 B).
  std::vector<float> one_plus(const std::string& name, int64_t n) const;

  const Checkpoint& checkpoint() const { return checkpoint_; }

 private:
  const Checkpoint& checkpoint_;
  std::string prefix_;
  bool int8_activations_;
};

// The sizes the configuration gives (vocabulary, hidden, MLP, heads, head and Gated DeltaNet
// dimensions, layer count) against the shapes of the weights that hold them: an Error naming
// `config_where`'s field on the first that disagrees (a null num_key_value_heads takes
// transformers' default, the attention heads, which the weights may contradict).
void check_sizes_against_weights(const ModelConfig& config, const Checkpoint& checkpoint,
                                 const std::string& config_where);

// Where the text decoder's tensors live: "model.language_model." in multimodal wrappers (whose
// vision and multi-token-prediction tensors are never read), "" in a base model saved without
// its head (embedding models), else "model.".
std::string text_decoder_prefix(const Checkpoint& checkpoint);

// lm_head.weight when the checkpoint has it; otherwise the embedding table, if the config says
// the two are tied (spec §1.5: tying is decided by the file contents); none (data null) for a
// base model saved alone with untied weights, which embeds but cannot produce logits.
MatrixRef lm_head_or_tied(const Checkpoint& checkpoint, const ModelConfig& config,
                          const MatrixRef& embed_tokens);

}  // namespace qhx
