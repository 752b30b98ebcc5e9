// A pre-norm decoder-only transformer as both Qwen families build it (spec §2.4, §3.4):
//   h = embed[ids]
//   per layer: h += mixer(norm(h)); h += mlp(norm(h))      mixer: attention or Gated DeltaNet
//   logits = lm_head(norm(h))
// The family loaders (qwen3.cc, qwen3_5.cc) bind their checkpoint's tensors to this plan.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "core/matrix_rows.h"
#include "graph/backend.h"
#include "io/checkpoint.h"
#include "models/blocks.h"
#include "models/model.h"

namespace qhx {

struct DecoderLayer {
  LayerKind kind = LayerKind::kFullAttention;
  WeightVector input_norm, post_attention_norm;  // effective RMSNorm scales
  AttentionWeights attention;                    // kind == kFullAttention
  GatedDeltaNetWeights deltanet;                 // kind == kLinearAttention
  MlpWeights mlp;
};

// Qwen3.5's multi-token-prediction head (as vLLM's Qwen3_5MultiTokenPredictor computes it):
//   x = fc([norm_e(embed[next id]) ; norm_h(hidden)])
//   x = a full-attention decoder layer of x (its own KV cache)
//   out = norm(x); logits = lm_head(out)              (embedding and lm_head are the model's)
// mtp.fc [H, 2H] is held as its two [H, H] halves, widened to f32 (they multiply the two norms).
// With a draft vocabulary (io/draft_vocab.h) the logits are those of its tokens only: lm_head's
// rows of `vocab`, in its order.
struct MtpWeights {
  WeightVector embedding_norm, hidden_norm, final_norm;  // effective scales
  std::vector<float> fc_embedding_rows, fc_hidden_rows;  // storage of the halves
  MatrixRef fc_embedding, fc_hidden;
  DecoderLayer layer;
  std::vector<int32_t> vocab;            // empty: the whole vocabulary
  std::optional<MatrixRows> vocab_head;  // the lm_head's rows of vocab
};

struct DecoderWeights {
  MatrixRef embed_tokens, lm_head;
  WeightVector final_norm;
  std::vector<DecoderLayer> layers;
  std::optional<MtpWeights> mtp;
  std::string mtp_unavailable;  // why the checkpoint's mtp.* tensors are not a head ("" if none)
};

class WeightReader;

// What both families bind the same way: the SwiGLU MLP of layer prefix `layer`, and the
// attention parameters (output gate: Qwen3.5).
MlpWeights read_mlp(const WeightReader& model, const std::string& layer, const ModelConfig& c);
AttentionParams attention_params(const ModelConfig& c, bool output_gate, KvType kv);

std::unique_ptr<Model> make_decoder(const ModelConfig& config, Checkpoint checkpoint,
                                    DecoderWeights weights, AttentionParams attention,
                                    GatedDeltaNetParams deltanet,
                                    std::shared_ptr<CpuContext> context,
                                    std::vector<std::shared_ptr<Backend>> backends);

}  // namespace qhx
