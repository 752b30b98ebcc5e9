// Model family loaders: bind a checkpoint's tensors to the decoder plan (models/decoder.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/backend.h"
#include "io/checkpoint.h"
#include "kernels/cpu_context.h"
#include "models/model.h"

namespace qhx {

// The model computes on `backends` (graph/runner.h): [0] the CPU's, on `context`, then the
// devices, where the scheduler places nodes there. A
// Qwen3.5 MTP head drafts over the token ids mtp_vocab() gives, called only when the checkpoint
// has a head (none: the whole vocabulary). Its KV caches hold rows of type `kv`.
std::unique_ptr<Model> load_qwen3(const ModelConfig& config, Checkpoint checkpoint,
                                  std::shared_ptr<CpuContext> context,
                                  std::vector<std::shared_ptr<Backend>> backends, KvType kv);
std::unique_ptr<Model> load_qwen3_5(const ModelConfig& config, Checkpoint checkpoint,
                                    std::shared_ptr<CpuContext> context,
                                    std::vector<std::shared_ptr<Backend>> backends, KvType kv,
                                    const std::function<std::vector<int32_t>()>& mtp_vocab);

// Qwen3.5's multi-token-prediction head: the tensors qhx reads of it (mtp_num_hidden_layers is
// 1 in every checkpoint; further layers are not read), whether a checkpoint has any mtp.* tensor,
// and, when it has some, a phrase saying why they are not a head qhx can use (some missing, of a
// type it does not compute with, or of another shape than `config`'s sizes give), "" when they
// are.
const std::vector<std::string>& mtp_head_tensors();
bool has_mtp_tensors(const Checkpoint& checkpoint);
std::string mtp_head_unusable(const Checkpoint& checkpoint, const ModelConfig& config);

}  // namespace qhx
