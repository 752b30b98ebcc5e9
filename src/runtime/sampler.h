// Picks the next token from a row of logits: logit bias and penalties, then greedy, or
// temperature / top-k / top-p / min-p sampling in the order transformers' generate() applies them.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace qhx {

struct SamplingParams {
  bool greedy = true;  // argmax of the processed logits (penalties and bias still apply)
  float temperature = 1.0f;
  int64_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // HF/CTRL style over prompt + generated tokens
  float presence_penalty = 0.0f;    // OpenAI style, over generated tokens
  float frequency_penalty = 0.0f;   // OpenAI style, over generated tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logit of that id
  uint64_t seed = 0;
};

// Index of the largest logit; the first one on ties (as torch.argmax). The logits hold no NaN
// (Sampler::process rejects them first).
int32_t argmax(std::span<const float> logits);

// A chosen token's log-probability under a row of logits (its log-softmax, summed in double:
// the model's own distribution, before temperature, penalties and filters), and the `top` most
// likely ids with theirs, most likely first (ties: the lower id first). -inf for a logit of -inf.
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top);

struct TokenProb {
  int32_t id;
  double prob;
};

// Throws Error naming the first field out of range; vocab_size 0: ids are checked only once there
// are logits.
void check_sampling_params(const SamplingParams& params, int64_t vocab_size);

// Per token, in this order (transformers' LogitsProcessorList as generate() builds it, with the
// OpenAI-style additive terms first, as vLLM applies them):
//   1. logit_bias, then -= frequency_penalty·count + presence_penalty·[count > 0] over `generated`
//   2. repetition penalty over prompt ∪ generated: l < 0 ? l·r : l/r (once per distinct id);
//      then the tokens a constraint does not allow become -inf
//   3. greedy: argmax. Sampling: l / temperature; top_k (ties with the k-th kept); top_p (drop the
//      least likely tokens whose cumulative mass is ≤ 1 - top_p); min_p (drop p < min_p·p_max)
//   4. softmax over the survivors and one draw.
// The draw is specified exactly, so a seed gives the same tokens on every platform: each sampled
// token takes one std::mt19937_64 output, u = its top 53 bits / 2^53, and picks the first
// survivor, in ascending id order, whose cumulative weight exp(l - l_max) exceeds u · Σ weights.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // throws Error naming the bad field
  // `prompt` and `generated` are the sequence so far (for the penalties). `allowed`, when not
  // empty, masks the vocabulary after the penalties (TokenConstraint's bits: token i at bit i % 32
  // of allowed[i / 32]); tokens it leaves out get no probability.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> prompt,
                 std::span<const int32_t> generated, std::span<const uint32_t> allowed = {});
  // Speculative sampling's rule for a draft token proposed with certainty (prompt lookup and greedy
  // drafts: q(draft) = 1): keeps `draft` with probability p(draft), else draws from p without it,
  // renormalised. So the token returned is distributed exactly as sample()'s: p(draft) for the
  // draft, (1 - p(draft))·p(y)/(1 - p(draft)) = p(y) for any other y; only the random stream
  // differs (one draw to accept, one more on rejection). Greedy: the argmax, as sample().
  int32_t sample_with_draft(std::span<const float> logits, std::span<const int32_t> prompt,
                            std::span<const int32_t> generated, int32_t draft);
  // The distribution sample() draws from (ascending ids, probabilities summing to 1; greedy: the
  // argmax alone). Does not advance the random state.
  std::vector<TokenProb> distribution(std::span<const float> logits,
                                      std::span<const int32_t> prompt,
                                      std::span<const int32_t> generated,
                                      std::span<const uint32_t> allowed = {});

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };
  // Steps 1-3 (and the mask) into candidates_ (ascending ids, finite logits); returns the
  // largest logit.
  float process(std::span<const float> logits, std::span<const int32_t> prompt,
                std::span<const int32_t> generated, std::span<const uint32_t> allowed);
  void apply_penalties(std::span<const int32_t> prompt, std::span<const int32_t> generated);
  void keep_top_p(float top);  // top: the largest candidate logit
  // weights_[i] = exp(logit_i - top) over candidates_; returns their sum.
  double weigh(double top);
  // One random number in [0, 1): the top 53 bits of one mt19937_64 output / 2^53.
  double uniform();
  // The first candidate whose cumulative weight exceeds uniform() · total.
  int32_t draw(double total);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> scratch_;         // the logits being processed
  std::vector<int32_t> counts_;        // per id, zero between calls
  std::vector<Candidate> candidates_;  // the survivors
  std::vector<double> weights_;
};

}  // namespace qhx
