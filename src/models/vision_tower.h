// Qwen3.5's vision tower (model.visual.*), read top to bottom as transformers' Qwen3_5VisionModel:
// the patches' linear embedding (a Conv3d whose stride is its kernel), plus the learned position
// table resampled bilinearly to the image's grid; per block h += attn(LN(h)), h += mlp(LN(h)),
// attention over the image's patches with 2-D RoPE (height frequencies, then width); then the
// merger: LN per patch, each merge × merge block of patches one row, fc1, GELU, fc2 into the
// text model's hidden size. One image per pass, on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "graph/backend.h"
#include "graph/runner.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "kernels/cpu_context.h"
#include "vision/image_processor.h"

namespace qhx {

class VisionTower {
 public:
  // `cpu` is the model's CPU backend, on `context`. int8_activations: W8 matrices multiply
  // int8-quantized activations, as the text model's do under that policy (the gate measures it).
  VisionTower(const VisionConfig& config, const Checkpoint& checkpoint, CpuContext& context,
              std::shared_ptr<Backend> cpu, bool int8_activations = false);
  ~VisionTower();
  VisionTower(const VisionTower&) = delete;
  VisionTower& operator=(const VisionTower&) = delete;

  const VisionConfig& config() const { return config_; }
  // The image's features, [tokens, out_hidden_size] (tokens = patches / merge²), in the order its
  // <|image_pad|> tokens take them. Call on the context's turn.
  std::vector<float> encode(const PixelValues& pixels) const;

 private:
  struct Block {
    WeightVector norm1, norm1_bias, norm2, norm2_bias;
    MatrixRef qkv, proj, fc1, fc2;
    WeightVector qkv_bias, proj_bias, fc1_bias, fc2_bias;
  };
  Plan build(int64_t n_patches) const;
  WeightList weight_list();

  VisionConfig config_;
  MatrixRef patch_embed_;
  WeightVector patch_bias_;
  std::vector<float> position_table_;  // [side², hidden]
  int64_t side_ = 0;
  std::vector<Block> blocks_;
  WeightVector merger_norm_, merger_norm_bias_;
  MatrixRef merger_fc1_, merger_fc2_;
  WeightVector merger_fc1_bias_, merger_fc2_bias_;
  WeightVector rope_freqs_;        // head_dim / 2: the height's frequencies, then the width's
  std::vector<int8_t> rope_axes_;  // head_dim / 2: 1 (height), then 2 (width)
  Runner runner_;
};

}  // namespace qhx
