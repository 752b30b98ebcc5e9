// Model family loaders: bind a checkpoint's tensors to the decoder plan (models/decoder.h).
#pragma once

#include <memory>

#include "io/checkpoint.h"
#include "kernels/cpu_context.h"
#include "models/model.h"

namespace qhx {

// The model computes on `context`.
std::unique_ptr<Model> load_qwen3(const ModelConfig& config, Checkpoint checkpoint,
                                  std::shared_ptr<CpuContext> context);
std::unique_ptr<Model> load_qwen3_5(const ModelConfig& config, Checkpoint checkpoint,
                                    std::shared_ptr<CpuContext> context);

}  // namespace qhx
