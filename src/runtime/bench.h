// Speed measurement in the shape of llama-bench and the seeds' device tables: prefill and decode
// throughput, time to first token, with the spread over repetitions. Token ids are random (speed
// does not depend on them); an untimed warm-up comes first and every repetition starts from a
// fresh state.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/backend.h"
#include "models/model.h"
#include "runtime/speculative.h"

namespace qhx {

struct BenchConfig {
  int64_t n_prompt = 512;  // prefill length (0: no prefill measurement)
  int64_t n_gen = 128;     // decoded tokens
  int64_t depth = 0;       // tokens already in the context before the decode is timed
  int64_t repetitions = 5;
  uint64_t seed = 1;
  // Devices opened to profile (Backend::profiles) whose profiles of the timed runs it collects:
  // the prompt passes' and the decode steps' apart.
  std::vector<Backend*> profiled;
};

// Summary of one quantity over the repetitions.
struct Spread {
  double mean = 0, stddev = 0, min = 0, max = 0;
  static Spread of(const std::vector<double>& samples);
};

struct BenchResult {
  BenchConfig config;
  Spread prefill_tok_s;  // n_prompt tokens from an empty state, in one forward call
  Spread ttft_ms;        // prefill + the first token's logits and greedy pick
  Spread decode_tok_s;   // n_gen greedy single-token steps after `depth` context tokens
  // The decode step right after a timed prefill: with the prompt read on a device and the reply
  // written elsewhere, what the hand-off costs shows as its excess over a steady step.
  Spread first_step_ms;
  // Over the timed runs, of prefill_passes prompts and decode_steps steps: the passes that ran
  // on a device and the activations they copied between backends (Model::device_traffic).
  DeviceTraffic prefill_traffic, decode_traffic;
  int64_t prefill_passes = 0, decode_steps = 0;
  int64_t state_bytes = 0;  // the sequence state (KV caches, recurrent states) the runs used
  // What a decoded token reads at the decode's mean context (Model::decode_step_bytes).
  int64_t decode_step_bytes = 0;
  // [i]: config.profiled[i]'s, over the prefill_passes timed prompts and the decode_steps steps.
  std::vector<DeviceProfile> prefill_profiles, decode_profiles;
};

BenchResult run_bench(const Model& model, const BenchConfig& config);

// qhx bench --image: an image's way into the model, each repetition from scratch (the tower's
// output is not reused).
struct ImageBenchResult {
  int64_t patches = 0, tokens = 0;  // the tower's input rows, and the image's tokens after it
  Spread encode_ms;                 // the vision tower: patch embedding to merger
  // The prompt <|vision_start|>, the image's tokens, <|vision_end|> and 8 text tokens, read from
  // an empty state (its features already computed): the language side of the image.
  Spread prefill_ms;
};

ImageBenchResult run_image_bench(const Model& model, const PixelValues& pixels,
                                 int64_t repetitions);

// The memory's read bandwidth in bytes per second, as the threads of cx stream a buffer of
// `bytes` (far past the last-level cache) once each pass: the best of `passes`. The ceiling
// decode works against; 0 when the buffer cannot be mapped. Measured, never assumed: on a shared
// or virtual machine it changes with where the threads run (this project's 2-core VM reads 50 or
// 78 GB/s on two threads from one hour to the next, 41 on one).
double read_bandwidth(CpuContext& cx, int64_t bytes = int64_t{256} << 20, int passes = 5);

// A multi-turn chat at the token level: each turn adds `user_tokens` random tokens to the
// conversation and generates `reply_tokens` greedily. The same conversation is timed through one
// session (state kept between turns, runtime/session.h) and, per turn, from a fresh session given
// the whole history, as a runtime without state reuse would run it.
struct ChatBenchConfig {
  int64_t turns = 5;
  int64_t user_tokens = 64;
  int64_t reply_tokens = 64;
  uint64_t seed = 1;
};

struct ChatBenchTurn {
  int64_t n_prompt = 0;      // the conversation so far, this turn's user tokens included
  int64_t n_processed = 0;   // of those, run by the session that kept its state
  double ttft_ms = 0;        // that session: turn in → first reply token
  double ttft_fresh_ms = 0;  // a fresh session: the whole history → first reply token
  double decode_tok_s = 0;
};

std::vector<ChatBenchTurn> run_chat_bench(const Model& model, const ChatBenchConfig& config);

// Speculative decoding on one task (a prompt, n_gen greedy tokens): decode speed through a
// session with and without drafts, rounds interleaved, what the drafts achieved, and what its
// parts cost at the prompt's depth: a verify pass of k = 1..draft_max drafts against one decode
// step, and the recurrent-state checkpoint a verify pass takes.
struct SpeculativeBenchConfig {
  std::vector<int32_t> prompt;
  int64_t n_gen = 128;
  SpeculativeOptions speculative;
  int64_t repetitions = 3;
};

struct SpeculativeBenchResult {
  Spread plain_tok_s, speculative_tok_s;  // decode: tokens after the first, per second
  bool same_tokens = true;                // the two replies agree (greedy: they must)
  int64_t n_generated = 0;
  // Of the last speculative round: verify passes, draft tokens verified and accepted, passes of
  // the decode in all (plain steps and verify passes), rollbacks of a recurrent state.
  int64_t verify_passes = 0, drafted = 0, accepted = 0, decode_passes = 0, rollbacks = 0;
  double step_ms = 0;             // one decode step at the prompt's depth (best of the rounds)
  std::vector<double> verify_ms;  // [k − 1]: a pass over k drafts (k + 1 tokens), the same way
  double checkpoint_ms = 0;       // the checkpoint of the recurrent states (0: none needed)
};

SpeculativeBenchResult run_speculative_bench(const Model& model,
                                             const SpeculativeBenchConfig& config);

}  // namespace qhx
