// Picks the next token from a row of logits: greedy, or temperature / top-k / top-p sampling.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace qhx {

struct SamplingParams {
  bool greedy = true;
  float temperature = 1.0f;
  int64_t top_k = 0;   // 0: no limit
  float top_p = 1.0f;  // 1: no limit
  uint64_t seed = 0;
};

// Index of the largest logit; the first one on ties (as torch.argmax).
int32_t argmax(std::span<const float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // throws Error on out-of-range parameters
  int32_t sample(std::span<const float> logits);

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;
};

}  // namespace qhx
