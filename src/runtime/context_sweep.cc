#include "runtime/context_sweep.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/perplexity.h"
#include "runtime/session.h"
#include "util/error.h"

namespace qhx {
namespace {

// Mean NLL per token of `reply` read after the state `after_prompt` left (`logits`: what that
// state gave for the reply's first token).
double mean_nll(const Model& model, const ModelState& after_prompt, std::vector<float> logits,
                std::span<const int32_t> reply) {
  if (reply.empty()) return 0;
  auto state = model.new_state();
  state->restore(after_prompt);
  double total = 0;
  for (size_t i = 0; i < reply.size(); ++i) {
    if (i > 0) model.forward(reply.subspan(i - 1, 1), *state, LogitsFor::kLastToken, logits);
    total += negative_log_likelihood(logits, reply[i]);
  }
  return total / static_cast<double>(reply.size());
}

}  // namespace

std::vector<SweepPoint> context_sweep(const Model& model, const Model& reference,
                                      std::span<const int32_t> text,
                                      std::span<const int64_t> depths, int64_t tokens) {
  const int64_t context =
      std::min(model.config().max_position_embeddings, reference.config().max_position_embeddings);
  std::vector<SweepPoint> out;
  for (const int64_t depth : depths) {
    if (depth < 1 || depth > static_cast<int64_t>(text.size())) {
      fail("context sweep", "depth " + std::to_string(depth) + " needs that many tokens of text (" +
                                std::to_string(text.size()) + " given)");
    }
    if (depth + tokens > context) {
      fail("context sweep", "depth " + std::to_string(depth) + " and " + std::to_string(tokens) +
                                " reply tokens pass the models' context of " +
                                std::to_string(context) + " positions");
    }
    const std::span<const int32_t> prompt = text.first(static_cast<size_t>(depth));
    SweepPoint p;
    p.depth = depth;
    const std::vector<int32_t> reply =
        greedy_reply(model, prompt, tokens, model.config().eos_token_ids);
    const std::vector<int32_t> expected =
        greedy_reply(reference, prompt, tokens, reference.config().eos_token_ids);
    p.length = static_cast<int64_t>(reply.size());
    p.reference_length = static_cast<int64_t>(expected.size());
    const auto [a, b] = std::ranges::mismatch(reply, expected);
    if (a != reply.end() || b != expected.end()) p.first_departure = a - reply.begin();
    auto after_prompt = reference.new_state();
    std::vector<float> logits;
    // In chunks, as a session reads a prompt: a deep prompt's activations at once would be large.
    constexpr size_t kChunk = 512;
    for (size_t at = 0; at < prompt.size(); at += kChunk) {
      reference.forward(prompt.subspan(at, std::min(kChunk, prompt.size() - at)), *after_prompt,
                        LogitsFor::kLastToken, logits);
    }
    p.nll = mean_nll(reference, *after_prompt, logits, reply);
    p.reference_nll = mean_nll(reference, *after_prompt, logits, expected);
    p.coherent =
        (!reply.empty() || expected.empty()) && p.nll <= p.reference_nll + kCoherentNllMargin;
    out.push_back(p);
  }
  return out;
}

std::vector<int64_t> default_sweep_depths(int64_t max_context, int64_t text_tokens,
                                          int64_t tokens) {
  std::vector<int64_t> depths;
  const int64_t deepest = std::min(max_context - tokens, text_tokens);
  for (int64_t d = 128; d < deepest; d *= 2) depths.push_back(d);
  if (deepest >= 1) depths.push_back(deepest);
  return depths;
}

}  // namespace qhx
