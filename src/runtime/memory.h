// Memory admission: before a model serves, estimate the most memory it can need (mapped weights,
// KV caches at the full context, recurrent states, turn checkpoints, the activations of a prefill
// chunk as its plan reserves them, the prefix cache) and compare it with what the machine has, so
// a run fails or shrinks its context up front instead of being killed halfway through a long
// chat.
#pragma once

#include <cstdint>
#include <string>

#include "core/kv_layout.h"
#include "io/hf_config.h"

namespace qhx {

struct MemoryRequest {
  int64_t weights_bytes = 0;      // the mapped weight files
  int64_t context_length = 0;     // tokens per session
  int64_t sessions = 1;           // sessions that can be live at once (server slots)
  KvType kv_type = KvType::kF32;  // how the KV caches hold their rows (LoadOptions::kv_type)
  // One forward pass's activations for a prefill chunk, as the model's plan reserves them
  // (Model::activation_bytes): one arena per model, which its sessions take turns on.
  int64_t activation_bytes = 0;
  int64_t max_checkpoints = 8;     // per session
  int64_t prefix_cache_bytes = 0;  // the shared prefix cache's bound
  // Already resident when admission runs, so counted in the estimate but not against what is
  // available: the process before the model was opened, and the tokenizer's tables.
  int64_t resident_bytes = 0;
};

struct MemoryPlan {
  int64_t weights = 0;
  int64_t kv_cache = 0;     // all sessions, full context
  int64_t recurrent = 0;    // all sessions: conv + recurrent states
  int64_t checkpoints = 0;  // all sessions: recurrent copies + logits at turn boundaries
  int64_t scratch = 0;      // the activations of a prefill chunk + every session's logits
  int64_t prefix_cache = 0;
  int64_t resident = 0;  // the process before the model, and the tokenizer (already held)
  int64_t total() const;
  std::string describe() const;  // "1.2 GB weights + 0.9 GB KV cache (…) + …"
};

MemoryPlan plan_memory(const ModelConfig& config, const MemoryRequest& request);

// Bytes this process may still use: MemAvailable, or less where a cgroup limit says so.
int64_t available_memory_bytes();

// Bytes this process holds in memory now (its resident set, /proc/self/statm), 0 if unknown.
int64_t resident_memory_bytes();

// The context to run with. `requested` 0 means "as long as the model allows and memory holds":
// it is lowered to fit (`note` says so). An explicit request that does not fit, or a model that
// does not fit even at a short context, throws Error with the estimate and what would fit.
int64_t admit_context(const ModelConfig& config, MemoryRequest request, int64_t requested,
                      int64_t available, std::string* note);

}  // namespace qhx
