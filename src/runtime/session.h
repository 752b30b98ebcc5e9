// A conversation with a model that keeps its state between turns. Each call to generate() is
// given the whole token sequence so far (history + new turn); the session reuses the longest
// prefix it still holds and processes only the rest. KV caches can be cut back to any prefix,
// but the recurrent state of Gated DeltaNet layers cannot, so the session keeps checkpoints at
// turn boundaries (end of each prompt, end of each reply) and goes back to the nearest one when
// a turn is regenerated or an earlier message edited.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/embedding.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"
#include "runtime/token_constraint.h"

namespace qhx {

class PrefixCache;

struct SessionOptions {
  int64_t context_length = 0;  // tokens the session may hold; 0: the model's maximum
  // Tokens per forward call in prefill: bounds the scratch memory a long prompt needs.
  int64_t prefill_chunk = 512;
  // Turn-boundary checkpoints kept; past it, older ones are thinned out evenly.
  int64_t max_checkpoints = 8;
};

struct TurnOptions {
  int64_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;
  // Set from any thread to stop at the next chunk or token boundary.
  const std::atomic<bool>* cancel = nullptr;
  // Positions in the prompt where a checkpoint is worth taking, besides its end: where the next
  // turn's rendering may differ from this one's (a chat template that re-renders earlier replies
  // differently, e.g. without their thinking, starts differing after the reply's header).
  std::vector<int64_t> checkpoint_at;
  // Drafts verified several tokens per pass (runtime/speculative.h): greedy output exactly that of
  // decoding one token at a time; sampled output from the same distribution (not the same draws).
  SpeculativeOptions speculative;
  // Structured output: the reply follows it, and ends when it is complete. It turns speculation
  // off (drafts are verified against the model, not the grammar). Owned by the caller.
  TokenConstraint* constraint = nullptr;
  // Log-probabilities: with top_logprobs >= 0, each chosen token's (token_logprobs() of the row it
  // was chosen from) with that many alternatives goes to on_logprobs just before on_token. Turns
  // speculation off, as a constraint does: every token then comes from a row of its own.
  int top_logprobs = -1;
  std::function<void(const TokenLogprobs&)> on_logprobs;
};

// Why generation ended. (A context too short for max_new_tokens is refused up front instead.)
// kStopId: a stop id, or the constraint's end (nothing may follow).
enum class StopReason { kLength, kStopId, kCallback, kCancelled };

struct TurnStats {
  int64_t n_prompt = 0;     // tokens given
  int64_t n_reused = 0;     // of those, already in the state (or from the prefix cache)
  int64_t n_processed = 0;  // of those, run through the model now
  int64_t n_generated = 0;
  double prefill_seconds = 0;
  double ttft_seconds = 0;  // call → first token chosen
  double decode_seconds = 0;
  StopReason stop = StopReason::kLength;
  // Speculative decoding: passes that verified a draft, the draft tokens they verified and how
  // many of them the model agreed with, and the passes that rolled a recurrent state back.
  int64_t verify_passes = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t rollbacks = 0;
  int64_t decode_passes = 0;      // forward passes of the decode (plain steps and verify passes)
  double constraint_seconds = 0;  // in the constraint: masks and advancing it
};

class Session {
 public:
  // `cache` (optional, shared by sessions of the same model) outlives the session.
  Session(const Model& model, SessionOptions options = {}, PrefixCache* cache = nullptr);

  // Brings the state to `tokens`, then generates. on_token(id) is called for every generated
  // token (a stop id included, then generation ends); returning false stops generation. Throws
  // Error when the tokens plus max_new_tokens do not fit the context, or an id is invalid.
  TurnStats generate(std::span<const int32_t> tokens, const TurnOptions& options,
                     const std::function<bool(int32_t)>& on_token);

  // The sentence embedding of `ids` (runtime/embedding.h) on this session's state, in its
  // prefill chunks: the conversation it held is dropped. nullopt when params.cancel was set.
  // Throws Error when the ids do not fit the context.
  std::optional<std::vector<float>> embed(std::span<const int32_t> ids, EmbedParams params);

  // How many leading tokens of `tokens` the session could reuse without processing them.
  int64_t reusable(std::span<const int32_t> tokens) const;

  // The tokens the state holds (prompt and generated tokens that went through the model; the
  // last generated token does not until the next turn gives it).
  std::span<const int32_t> tokens() const { return history_; }
  void reset();
  int64_t context_length() const { return context_length_; }
  // Bytes held: the state, checkpoints and their logits, and a draft model's session.
  int64_t bytes() const;

  // Saves the state and its tokens to a qhx tensor file; load() refuses a file written by
  // another model (weights fingerprint) and checks every tensor.
  void save(const std::filesystem::path& path) const;
  void load(const std::filesystem::path& path);

 private:
  struct Checkpoint {
    StateCheckpoint state;
    std::vector<float> logits;  // of the last token, when it was the end of a prompt
  };

  // Goes back to the longest prefix of `tokens` that can be continued, with its logits where
  // known (empty otherwise).
  void rewind_for(std::span<const int32_t> tokens);
  // Runs tokens[history_.size()...] through the model (history_ must be a prefix of tokens),
  // in chunks, taking checkpoints at the positions asked; stops early if cancelled.
  void forward(std::span<const int32_t> tokens, std::span<const int64_t> checkpoint_at,
               const std::atomic<bool>* cancel);
  void remember_checkpoint();
  // Brings the state back to history_ (n tokens) after a verify pass ran past it: KV caches cut,
  // or, for recurrent layers, `before` (at before_n ≤ n) restored and the tokens up to n run
  // again step-exactly (LogitsFor::kNoneStepwise: no logits).
  void roll_back(int64_t n, std::span<const int32_t> tokens, const StateCheckpoint& before);
  // The model's forward pass over `ids`; when the MTP head follows the conversation, it then
  // takes the new rows (mtp_follow), else it stops following.
  void run(std::span<const int32_t> ids, LogitsFor which, std::vector<float>& logits);
  // Pairs the model's final-norm rows `hidden` of a pass over `ids` with the tokens after them
  // and runs the head over the pairs it can form (the first with the row held from before).
  void mtp_follow(std::span<const int32_t> ids, std::span<const float> hidden);
  // Up to max_tokens greedy drafts of the MTP head after `token` (the next token, not yet
  // processed): its first row is the true pairing of the last processed position with `token`.
  std::vector<int32_t> mtp_draft(int32_t token, int64_t max_tokens);
  // After a verify pass from n0 tokens that kept `accepted` drafts of `batch`: the head's
  // drafted rows go, the accepted pairs come in from the pass's rows (verify_hidden_).
  void mtp_after_verify(int64_t n0, std::span<const int32_t> batch, size_t accepted);
  // The head back to following history_ of n ≤ what the verify pass from verify_from_ kept.
  void mtp_cut(int64_t n);
  void mtp_stop();  // stops following (after a rewind, a load): starts afresh at the next pass
  // Up to max_tokens tokens guessed to follow `context`; empty when there is no guess. A draft
  // model picks greedily under the turn's logit bias and repetition penalty (`sampling`), as
  // the model's own picks are made.
  std::vector<int32_t> draft(const SpeculativeOptions& spec, const SamplingParams& sampling,
                             std::span<const int32_t> context, int64_t max_tokens);

  const Model& model_;
  SessionOptions options_;
  PrefixCache* cache_;
  int64_t context_length_;
  std::unique_ptr<ModelState> state_;
  std::vector<int32_t> history_;
  std::vector<float> logits_;  // of the last token in history_; empty if unknown
  std::deque<Checkpoint> checkpoints_;
  // The draft model's session (DraftKind::kModel), following this one's conversation: it reuses
  // what it holds, as any session does, so each draft processes only the tokens since the last.
  std::unique_ptr<Session> drafter_;
  // The MTP head (DraftKind::kMtp): its KV cache, following history_ one row behind, and the
  // model's final-norm output at the last position of history_, which its next row pairs with
  // the next token (empty: not following). verify_hidden_: the last verify pass's rows, from
  // position verify_from_.
  bool mtp_on_ = false;
  std::unique_ptr<ModelState> mtp_state_;
  std::vector<float> mtp_pending_, verify_hidden_;
  // Scratch of the passes (kept: a decode step allocates nothing): the model's rows, the head's
  // input and output rows, its logits.
  std::vector<float> hidden_, mtp_rows_, mtp_out_, mtp_logits_;
  int64_t verify_from_ = 0;
  int64_t mtp_offset_ = 0;  // the position of the head's row 0 (it may start mid-conversation)
};

// States at turn boundaries shared across sessions, keyed by their exact token sequence: a new
// session whose prompt starts with a cached sequence starts from there. Least recently used
// entries go first when the bound is reached. Safe to use from several threads.
class PrefixCache {
 public:
  explicit PrefixCache(int64_t max_bytes) : max_bytes_(max_bytes) {}
  // Stores a copy of `state` (which holds exactly `tokens`) and the last token's logits.
  void insert(std::span<const int32_t> tokens, const ModelState& state,
              std::span<const float> logits);
  // The longest cached sequence that is a prefix of `tokens` and is at least `at_least` long
  // restores into `state` and `logits`; returns its length, or 0 if none.
  int64_t restore(std::span<const int32_t> tokens, int64_t at_least, ModelState& state,
                  std::vector<float>& logits);
  int64_t bytes() const;
  int64_t entries() const;

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::unique_ptr<ModelState> state;
    std::vector<float> logits;
    int64_t bytes = 0;
    uint64_t last_used = 0;
  };
  mutable std::mutex mutex_;
  std::mutex copy_mutex_;  // held by insert(), which copies a state
  int64_t max_bytes_;
  int64_t bytes_ = 0;
  uint64_t clock_ = 0;
  std::vector<Entry> entries_;
};

// The model's greedy reply to `prompt` in a fresh session: at most `n` tokens, ending before the
// first of `stop_ids` (which is not part of it).
std::vector<int32_t> greedy_reply(const Model& model, std::span<const int32_t> prompt, int64_t n,
                                  std::span<const int32_t> stop_ids = {});

}  // namespace qhx
