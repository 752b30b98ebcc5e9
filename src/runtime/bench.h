// Speed measurement in the shape of llama-bench and the seeds' device tables: prefill and decode
// throughput, time to first token, with the spread over repetitions. Token ids are random (speed
// does not depend on them); an untimed warm-up comes first and every repetition starts from a
// fresh state.
#pragma once

#include <cstdint>
#include <vector>

#include "models/model.h"

namespace qhx {

struct BenchConfig {
  int64_t n_prompt = 512;  // prefill length (0: no prefill measurement)
  int64_t n_gen = 128;     // decoded tokens
  int64_t depth = 0;       // tokens already in the context before the decode is timed
  int64_t repetitions = 5;
  uint64_t seed = 1;
};

// Summary of one quantity over the repetitions.
struct Spread {
  double mean = 0, stddev = 0, min = 0, max = 0;
  static Spread of(const std::vector<double>& samples);
};

struct BenchResult {
  BenchConfig config;
  Spread prefill_tok_s;     // n_prompt tokens from an empty state, in one forward call
  Spread ttft_ms;           // prefill + the first token's logits and greedy pick
  Spread decode_tok_s;      // n_gen greedy single-token steps after `depth` context tokens
  int64_t state_bytes = 0;  // the sequence state (KV caches, recurrent states) the runs used
};

BenchResult run_bench(const Model& model, const BenchConfig& config);

}  // namespace qhx
