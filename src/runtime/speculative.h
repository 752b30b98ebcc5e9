// Speculative decoding's drafts: guesses of the next few tokens, which one forward pass then
// verifies (Session::generate, LogitsFor::kEveryStep), keeping the longest prefix the model itself
// would have chosen. With greedy decoding the output is exactly that of decoding one token at a
// time; when sampling, each draft token is kept by speculative sampling's rule
// (Sampler::sample_with_draft), so the output follows the same distribution. A wrong draft costs
// only time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace qhx {

class Model;

enum class DraftKind {
  kNone,
  kNgram,  // prompt lookup: what followed the last earlier occurrence of the context's suffix
  kModel,  // a smaller model with the same vocabulary, decoding greedily ahead of the model
  kMtp,    // the model's own multi-token-prediction head (Qwen3.5 checkpoints with mtp.*)
};

struct SpeculativeOptions {
  DraftKind kind = DraftKind::kNone;
  int64_t draft_max = 4;  // tokens per draft (verified in one pass of draft_max + 1 tokens)
  // Prompt lookup: suffixes of ngram_max tokens down to ngram_min are looked for.
  int64_t ngram_max = 3;
  int64_t ngram_min = 2;
  // kModel: the draft model (outlives the sessions using it). It drafts greedily, on the CPU or
  // wherever it was opened, in a session of its own that follows the conversation.
  const Model* draft_model = nullptr;
};

// "none", "ngram", "draft" (kModel) or "mtp"; Error naming `where` on anything else.
DraftKind parse_draft_kind(const std::string& name, const std::string& where);

// Error naming "speculative" when `model` has no MTP head for kMtp, with the reason its
// checkpoint's mtp.* tensors are not one (Model::mtp_unavailable), if it has any.
void require_mtp_head(const Model& model);

// The continuation (at most max_tokens) after the most recent earlier occurrence of the longest
// suffix of `context` of ngram_max down to ngram_min tokens; empty when none occurs.
std::vector<int32_t> ngram_draft(std::span<const int32_t> context, int64_t ngram_max,
                                 int64_t ngram_min, int64_t max_tokens);

}  // namespace qhx
