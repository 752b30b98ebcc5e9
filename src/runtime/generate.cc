#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "util/error.h"

namespace qhx {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

GenerateStats generate(const Model& model, ModelState& state, std::span<const int32_t> prompt,
                       const GenerateOptions& options,
                       const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) fail("prompt", "empty: at least one token is needed");
  const int64_t max_ctx = model.config().max_position_embeddings;
  const int64_t needed = state.n_past() + static_cast<int64_t>(prompt.size()) +
                         std::max<int64_t>(options.max_new_tokens - 1, 0);
  if (needed > max_ctx) {
    fail("prompt", std::to_string(prompt.size()) + " tokens + " +
                       std::to_string(options.max_new_tokens) +
                       " new tokens exceed the context limit of " + std::to_string(max_ctx));
  }
  GenerateStats stats;
  stats.n_prompt = static_cast<int64_t>(prompt.size());
  Sampler sampler(options.sampling);
  std::vector<float> logits;
  std::vector<int32_t> generated;  // for the sampler's penalties
  generated.reserve(static_cast<size_t>(std::max<int64_t>(options.max_new_tokens, 0)));

  state.reserve(needed);
  const auto start = std::chrono::steady_clock::now();
  model.forward(prompt, state, LogitsFor::kLastToken, logits);
  stats.prefill_seconds = seconds_since(start);
  if (options.max_new_tokens <= 0) return stats;

  int32_t token = sampler.sample(logits, prompt, generated);
  stats.ttft_seconds = seconds_since(start);
  const auto decode_start = std::chrono::steady_clock::now();
  while (true) {
    ++stats.n_generated;
    generated.push_back(token);
    if (!on_token(token)) {
      stats.stopped_by_caller = true;
      break;
    }
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), token) !=
        options.stop_ids.end()) {
      stats.stopped_at_stop_id = true;
      break;
    }
    if (stats.n_generated >= options.max_new_tokens) break;
    model.forward(std::span<const int32_t>(&token, 1), state, LogitsFor::kLastToken, logits);
    token = sampler.sample(logits, prompt, generated);
  }
  stats.decode_seconds = seconds_since(decode_start);
  return stats;
}

}  // namespace qhx
