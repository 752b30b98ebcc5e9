// Qwen3 dense decoder (spec §2): pre-norm blocks of GQA attention with q/k RMSNorm and
// rotate-half RoPE, and a SwiGLU MLP; final RMSNorm and a tied or separate lm_head.
#pragma once

#include <memory>

#include "io/checkpoint.h"
#include "models/model.h"

namespace qhx {

std::unique_ptr<Model> load_qwen3(const ModelConfig& config, Checkpoint checkpoint);

}  // namespace qhx
