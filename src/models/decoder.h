// A pre-norm decoder-only transformer as both Qwen families build it (spec §2.4, §3.4):
//   h = embed[ids]
//   per layer: h += mixer(norm(h)); h += mlp(norm(h))      mixer: attention or Gated DeltaNet
//   logits = lm_head(norm(h))
// The family loaders (qwen3.cc, qwen3_5.cc) bind their checkpoint's tensors to this plan.
#pragma once

#include <memory>
#include <vector>

#include "graph/backend.h"
#include "io/checkpoint.h"
#include "models/blocks.h"
#include "models/model.h"

namespace qhx {

struct DecoderLayer {
  LayerKind kind = LayerKind::kFullAttention;
  std::vector<float> input_norm, post_attention_norm;  // effective RMSNorm scales
  AttentionWeights attention;                          // kind == kFullAttention
  GatedDeltaNetWeights deltanet;                       // kind == kLinearAttention
  MlpWeights mlp;
};

struct DecoderWeights {
  MatrixRef embed_tokens, lm_head;
  std::vector<float> final_norm;
  std::vector<DecoderLayer> layers;
};

class WeightReader;

// What both families bind the same way: the SwiGLU MLP of layer prefix `layer`, and the
// attention parameters (output gate: Qwen3.5).
MlpWeights read_mlp(const WeightReader& model, const std::string& layer, const ModelConfig& c);
AttentionParams attention_params(const ModelConfig& c, bool output_gate);

std::unique_ptr<Model> make_decoder(const ModelConfig& config, Checkpoint checkpoint,
                                    DecoderWeights weights, AttentionParams attention,
                                    GatedDeltaNetParams deltanet,
                                    std::shared_ptr<CpuContext> context,
                                    std::vector<std::shared_ptr<Backend>> devices);

}  // namespace qhx
