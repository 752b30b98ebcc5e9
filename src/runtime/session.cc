#include "runtime/session.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "io/qhxt.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/json_file.h"
#include "util/partial_path.h"

namespace qhx {
namespace {

// Session::generate: after a verify pass the session's logits are stale; the logits after its
// last token are row `row` of the pass's `rows`, copied into `logits` when the turn ends, however
// it ends, or before `rows` is written again (rather than a vocabulary per accepted token).
struct PendingLogits {
  static constexpr size_t kNone = SIZE_MAX;
  std::vector<float>& logits;
  const std::vector<float>& rows;
  const size_t vocab;
  size_t row = kNone;
  void sync() {
    if (row != kNone) logits.assign(rows.begin() + row * vocab, rows.begin() + (row + 1) * vocab);
    row = kNone;
  }
  ~PendingLogits() { sync(); }
};

constexpr const char* kStateKind = "qhx-session-state";
// "2": a state with images (their features, their ids' numbering, the M-RoPE positions); text
// states stay "1", which qhx has always read.
constexpr const char* kStateVersion = "1";
constexpr const char* kImageStateVersion = "2";

int64_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return ia - a.begin();
}

bool cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_relaxed);
}

template <typename T>
TensorToWrite tensor_to_write(std::string name, DType dtype, std::span<const T> values) {
  TensorToWrite t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = {static_cast<int64_t>(values.size())};
  t.data.resize(values.size_bytes());
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), values.size_bytes());
  return t;
}

template <typename T>
std::span<const T> tensor_values(const QhxtFile& file, const std::string& name, DType dtype) {
  const TensorView* view = file.find(name);
  if (view == nullptr) {
    // The same tensor in another form ("state.layer0.keys.q8": a KV cache of another type).
    std::string instead;
    for (const auto& [held, tensor] : file.tensors()) {
      if (held.rfind(name + ".", 0) == 0 || name.rfind(held + ".", 0) == 0) instead = held;
    }
    fail(file.path().string(),
         "missing state tensor '" + name + "'" +
             (instead.empty() ? ""
                              : " (it holds '" + instead +
                                    "': saved with another KV type than this model's, --kv-type)"));
  }
  if (view->dtype != dtype || view->shape.size() != 1) {
    fail(file.path().string() + ": " + name,
         "expected a 1-D " + std::string(dtype_name(dtype)) + " tensor");
  }
  return {reinterpret_cast<const T*>(view->data), view->nbytes / sizeof(T)};
}

}  // namespace

Session::Session(const Model& model, SessionOptions options, PrefixCache* cache)
    : model_(model), options_(options), cache_(cache), state_(model.new_state()) {
  const int64_t model_max = model.config().max_position_embeddings;
  if (options.context_length < 0) fail("context_length", "must be >= 0");
  if (options.prefill_chunk < 1) fail("prefill_chunk", "must be >= 1");
  if (options.max_checkpoints < 0) fail("max_checkpoints", "must be >= 0");
  context_length_ =
      options.context_length == 0 ? model_max : std::min(options.context_length, model_max);
}

void Session::reset() {
  drafter_.reset();
  mtp_stop();
  state_->reset();
  history_.clear();
  logits_.clear();
  checkpoints_.clear();
}

std::optional<std::vector<float>> Session::embed(std::span<const int32_t> ids, EmbedParams params) {
  if (static_cast<int64_t>(ids.size()) > context_length_) {
    fail("context",
         std::to_string(ids.size()) + " tokens exceed the context length (" +
             std::to_string(context_length_) + ")",
         ErrorKind::kContextFull);
  }
  reset();
  params.chunk = options_.prefill_chunk;
  // Nothing of the input stays, whether it ends well or not: the state holds no conversation.
  struct Emptied {
    ModelState& state;
    ~Emptied() { state.reset(); }
  } emptied{*state_};
  return embed_tokens(model_, *state_, ids, params);
}

int64_t Session::bytes() const {
  int64_t total = state_->bytes() + static_cast<int64_t>(logits_.size() * sizeof(float));
  for (const Checkpoint& c : checkpoints_) {
    total += c.state.bytes() + static_cast<int64_t>(c.logits.size() * sizeof(float));
  }
  if (drafter_ != nullptr) total += drafter_->bytes();
  if (mtp_state_ != nullptr) total += mtp_state_->bytes();
  return total;
}

int64_t Session::reusable(std::span<const int32_t> tokens) const {
  const int64_t shared = common_prefix(history_, tokens);
  int64_t best = 0;
  if (state_->can_truncate() || static_cast<int64_t>(history_.size()) <= shared) best = shared;
  for (const Checkpoint& c : checkpoints_) {
    if (c.state.n_past <= shared) best = std::max(best, c.state.n_past);
  }
  return best;
}

void Session::rewind_for(std::span<const int32_t> tokens) {
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  const int64_t shared = common_prefix(history_, tokens);
  const int64_t held = static_cast<int64_t>(history_.size());
  // Where to continue from: the longest reusable prefix that still leaves a token to process,
  // unless the logits of its last token are known.
  const auto usable = [&](int64_t n, bool has_logits) {
    return n <= shared && (n < n_tokens || has_logits);
  };
  int64_t target = 0;
  const Checkpoint* from = nullptr;
  if (usable(held, !logits_.empty())) target = held;
  for (const Checkpoint& c : checkpoints_) {
    if (c.state.n_past > target && usable(c.state.n_past, !c.logits.empty())) {
      target = c.state.n_past;
      from = &c;
    }
  }
  if (state_->can_truncate() && std::min(shared, n_tokens - 1) > target) {
    target = std::min(shared, n_tokens - 1);
    from = nullptr;
  }

  if (cache_ != nullptr &&
      cache_->restore(tokens, target + 1, *state_, logits_) > 0) {  // replaces the whole state
    mtp_stop();
    history_.assign(tokens.begin(), tokens.begin() + state_->n_past());
    std::erase_if(checkpoints_, [&](const Checkpoint& c) { return c.state.n_past > shared; });
    return;
  }
  if (target == held) return;
  mtp_stop();
  if (target == 0 && from == nullptr) {
    state_->reset();
    logits_.clear();
  } else {
    state_->rewind(target, from != nullptr ? &from->state : nullptr);
    logits_ = from != nullptr ? from->logits : std::vector<float>{};
  }
  history_.resize(target);
  std::erase_if(checkpoints_, [&](const Checkpoint& c) { return c.state.n_past > target; });
}

void Session::remember_checkpoint() {
  if (options_.max_checkpoints == 0 || history_.empty()) return;
  // Attention-only models can cut back anywhere: a checkpoint is worth keeping only for the
  // logits it remembers.
  if (state_->can_truncate() && logits_.empty()) return;
  const int64_t n = static_cast<int64_t>(history_.size());
  if (!checkpoints_.empty() && checkpoints_.back().state.n_past == n) return;
  checkpoints_.push_back({state_->checkpoint(), logits_});
  // Over the limit, drop the checkpoint whose loss leaves the smallest gap between its
  // neighbours, sparing the newest three (this turn's): older turns stay reachable, at spreading
  // intervals, rather than only the last few.
  while (static_cast<int64_t>(checkpoints_.size()) > options_.max_checkpoints) {
    const int64_t candidates = static_cast<int64_t>(checkpoints_.size()) - 3;
    int64_t drop = 0, smallest_gap = INT64_MAX;
    for (int64_t i = 0; i < candidates; ++i) {
      const int64_t before = i == 0 ? 0 : checkpoints_[i - 1].state.n_past;
      const int64_t gap = checkpoints_[i + 1].state.n_past - before;
      if (gap < smallest_gap) {
        smallest_gap = gap;
        drop = i;
      }
    }
    checkpoints_.erase(checkpoints_.begin() + drop);
  }
}

void Session::forward(std::span<const int32_t> tokens, std::span<const int64_t> checkpoint_at,
                      const std::atomic<bool>* cancel) {
  const int64_t end = static_cast<int64_t>(tokens.size());
  while (static_cast<int64_t>(history_.size()) < end) {
    const int64_t begin = static_cast<int64_t>(history_.size());
    if (begin > 0 && cancelled(cancel)) return;
    // A chunk ends early where a checkpoint is wanted (only models that cannot cut their state
    // back anywhere need one).
    int64_t stop = std::min(end, begin + options_.prefill_chunk);
    if (!state_->can_truncate()) {
      for (const int64_t at : checkpoint_at) {
        if (at > begin && at < stop) stop = at;
      }
    }
    // A device that reads prompts in chunks of a fixed size takes whole ones: the rest of the
    // chunk runs after them, on the CPU.
    if (const int64_t whole = model_.prompt_rows_multiple(); whole > 1 && stop - begin > whole) {
      stop = begin + (stop - begin) / whole * whole;
    }
    run(tokens.subspan(begin, stop - begin), LogitsFor::kLastToken, logits_);
    history_.insert(history_.end(), tokens.begin() + begin, tokens.begin() + stop);
    if (std::find(checkpoint_at.begin(), checkpoint_at.end(), stop) != checkpoint_at.end()) {
      remember_checkpoint();
    }
  }
}

TurnStats Session::generate(std::span<const int32_t> tokens, const TurnOptions& options,
                            const std::function<bool(int32_t)>& on_token) {
  if (tokens.empty()) fail("prompt", "empty: at least one token is needed");
  const int64_t vocab = model_.config().vocab_size;
  bool images = false;
  for (const int32_t id : tokens) {
    if (id >= vocab && model_.is_image_id(id)) {
      images = true;
    } else if (id < 0 || id >= vocab) {
      fail("prompt", "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(vocab) + ")");
    }
  }
  // The sampler's penalties see an image's tokens as transformers' input_ids hold them: the
  // image token.
  std::vector<int32_t> as_input_ids;
  if (images) {
    as_input_ids.assign(tokens.begin(), tokens.end());
    for (int32_t& id : as_input_ids) {
      if (id >= vocab) id = model_.config().image_token_id;
    }
  }
  const std::span<const int32_t> prompt_ids = images ? as_input_ids : tokens;
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  const int64_t needed = n_tokens + std::max<int64_t>(options.max_new_tokens - 1, 0);
  if (needed > context_length_) {
    fail("prompt",
         std::to_string(n_tokens) + " tokens + " + std::to_string(options.max_new_tokens) +
             " new tokens exceed the context limit of " + std::to_string(context_length_),
         ErrorKind::kContextFull);
  }
  // A constraint decides token by token, and log-probabilities want each token's own row: no
  // drafts then.
  SpeculativeOptions no_drafts;
  const bool token_by_token = options.constraint != nullptr || options.top_logprobs >= 0;
  const SpeculativeOptions& spec = token_by_token ? no_drafts : options.speculative;
  if (spec.kind == DraftKind::kMtp) require_mtp_head(model_);
  // The head follows the conversation from this turn's first pass, or goes on following it.
  mtp_on_ = spec.kind == DraftKind::kMtp;
  if (!mtp_on_) mtp_stop();
  if (spec.kind == DraftKind::kModel) {
    if (spec.draft_model == nullptr) fail("speculative", "'draft' needs a draft model");
    if (spec.draft_model->config().vocab_size != vocab) {
      fail("speculative", "the draft model's vocabulary (" +
                              std::to_string(spec.draft_model->config().vocab_size) +
                              " tokens) is not the model's (" + std::to_string(vocab) + ")");
    }
  }
  Sampler sampler(options.sampling);
  TurnStats stats;
  stats.n_prompt = n_tokens;
  const auto start = Clock::now();

  rewind_for(tokens);
  stats.n_reused = static_cast<int64_t>(history_.size());
  // Room for the whole turn up front, even when the prompt is all reused (a prefix-cache hit
  // leaves exactly the prompt's room): growing by doubling mid-reply could take twice the
  // context memory admission counted. A verify pass holds up to draft_max rows more.
  state_->reserve(
      std::min(needed + (spec.kind == DraftKind::kNone ? 0 : spec.draft_max), context_length_));
  if (stats.n_reused < n_tokens) {
    remember_checkpoint();  // the end of the previous turn
    forward(tokens, options.checkpoint_at, options.cancel);
    stats.n_processed = static_cast<int64_t>(history_.size()) - stats.n_reused;
    if (static_cast<int64_t>(history_.size()) < n_tokens) {
      stats.stop = StopReason::kCancelled;
      stats.prefill_seconds = seconds_since(start);
      return stats;
    }
    remember_checkpoint();  // the end of this prompt
    if (cache_ != nullptr) cache_->insert(tokens, *state_, logits_);
  }
  stats.prefill_seconds = seconds_since(start);
  if (options.max_new_tokens <= 0) return stats;

  // Penalties see the whole conversation as the prompt, and this turn's tokens as generated.
  const auto generated = [&] {
    return std::span<const int32_t>(history_).subspan(static_cast<size_t>(n_tokens));
  };
  // The sampler's pick from a row of logits, within what the constraint allows.
  std::vector<uint32_t> allowed;
  if (options.constraint != nullptr) allowed.resize(static_cast<size_t>((vocab + 31) / 32));
  const auto report = [&](std::span<const float> row, int32_t id) {
    if (options.top_logprobs >= 0 && options.on_logprobs) {
      options.on_logprobs(token_logprobs(row, id, options.top_logprobs));
    }
    return id;
  };
  const auto pick = [&](std::span<const float> row) {
    if (options.constraint == nullptr)
      return report(row, sampler.sample(row, prompt_ids, generated()));
    auto t0 = Clock::now();
    const bool masked = options.constraint->allowed_next(allowed);
    stats.constraint_seconds += seconds_since(t0);
    const int32_t id =
        sampler.sample(row, prompt_ids, generated(),
                       masked ? std::span<const uint32_t>(allowed) : std::span<const uint32_t>());
    t0 = Clock::now();
    options.constraint->accept(id);
    stats.constraint_seconds += seconds_since(t0);
    return report(row, id);
  };
  int32_t token = pick(logits_);
  stats.ttft_seconds = seconds_since(start);
  const auto decode_start = Clock::now();
  // Speculation: after a verify pass, `verified` holds the accepted draft tokens, which the state
  // has already processed past history_, then the model's own pick after them; `rows` the pass's
  // logits, row i those after its i-th token.
  const bool speculate = spec.kind != DraftKind::kNone;
  std::vector<int32_t> verified, context, seen;
  std::vector<float> rows;
  size_t next_verified = 0, token_row = 0;
  PendingLogits pending{logits_, rows, static_cast<size_t>(vocab)};
  StateCheckpoint before;
  while (true) {
    ++stats.n_generated;
    const bool go_on = on_token(token);
    bool stopping = true;
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), token) !=
        options.stop_ids.end()) {
      stats.stop = StopReason::kStopId;
    } else if (options.constraint != nullptr && options.constraint->finished()) {
      stats.stop = StopReason::kStopId;
    } else if (!go_on) {
      stats.stop = StopReason::kCallback;
    } else if (stats.n_generated >= options.max_new_tokens) {
      stats.stop = StopReason::kLength;
    } else if (cancelled(options.cancel)) {
      stats.stop = StopReason::kCancelled;
    } else {
      stopping = false;
    }
    if (stopping) {
      // Accepted drafts not emitted leave the state: it holds history_ and no more.
      if (state_->n_past() > static_cast<int64_t>(history_.size())) {
        roll_back(static_cast<int64_t>(history_.size()), {}, before);
        if (mtp_on_) mtp_cut(static_cast<int64_t>(history_.size()));
        ++stats.rollbacks;
      }
      break;
    }
    if (state_->n_past() > static_cast<int64_t>(history_.size())) {
      // `token` is an accepted draft: the verify pass processed it already.
      history_.push_back(token);
      pending.row = token_row++;
      token = verified[next_verified++];
      continue;
    }
    // A draft of up to draft_max tokens, so that every token it could yield may still be emitted.
    const int64_t room = options.max_new_tokens - stats.n_generated - 1;
    std::vector<int32_t> draft;
    if (speculate && room > 0) {
      context.assign(tokens.begin(), tokens.end());
      context.insert(context.end(), history_.begin() + n_tokens, history_.end());
      context.push_back(token);
      draft = this->draft(spec, options.sampling, context, std::min(spec.draft_max, room));
    }
    if (draft.empty()) {
      pending.row = PendingLogits::kNone;  // run() writes them
      run(std::span<const int32_t>(&token, 1), LogitsFor::kLastToken, logits_);
      ++stats.decode_passes;
      history_.push_back(token);
      token = pick(logits_);
      continue;
    }
    // Verify [token, draft...] in one pass; keep the draft's prefix the model would have chosen
    // (greedy) or that speculative sampling keeps.
    std::vector<int32_t> batch = {token};
    batch.insert(batch.end(), draft.begin(), draft.end());
    if (!state_->can_truncate()) before = state_->checkpoint();
    pending.sync();
    model_.forward(batch, *state_, LogitsFor::kEveryStep, rows,
                   mtp_on_ ? &verify_hidden_ : nullptr);
    ++stats.verify_passes;
    ++stats.decode_passes;
    stats.drafted += static_cast<int64_t>(draft.size());
    seen.assign(history_.begin() + n_tokens, history_.end());
    size_t accepted = 0;
    int32_t next = 0;
    for (size_t i = 0; i <= draft.size(); ++i) {
      seen.push_back(batch[i]);
      const std::span<const float> row = std::span<const float>(rows).subspan(i * vocab, vocab);
      if (i == draft.size()) {
        next = sampler.sample(row, prompt_ids, seen);
        break;
      }
      next = sampler.sample_with_draft(row, prompt_ids, seen, draft[i]);
      if (next != draft[i]) break;
      ++accepted;
    }
    stats.accepted += static_cast<int64_t>(accepted);
    const int64_t keep = static_cast<int64_t>(history_.size() + accepted + 1);
    if (mtp_on_) mtp_after_verify(static_cast<int64_t>(history_.size()), batch, accepted);
    if (accepted < draft.size()) {
      roll_back(keep, std::span<const int32_t>(batch).first(accepted + 1), before);
      ++stats.rollbacks;
    }
    history_.push_back(token);
    pending.row = 0;
    // The accepted drafts come next, then the model's own pick after them.
    verified.assign(draft.begin(), draft.begin() + accepted);
    verified.push_back(next);
    token = verified[0];
    next_verified = 1;
    token_row = 1;
  }
  stats.decode_seconds = seconds_since(decode_start);
  return stats;
}

void Session::roll_back(int64_t n, std::span<const int32_t> tokens, const StateCheckpoint& before) {
  if (state_->can_truncate()) return state_->rewind(n, nullptr);
  // The tokens between the checkpoint and n: those of history_ past it, then `tokens`.
  std::vector<int32_t> again(history_.begin() + before.n_past, history_.end());
  again.insert(again.end(), tokens.begin(), tokens.end());
  again.resize(static_cast<size_t>(n - before.n_past));
  state_->rewind(before.n_past, &before);
  if (!again.empty()) {
    std::vector<float> none;
    model_.forward(again, *state_, LogitsFor::kNoneStepwise, none);
  }
}

std::vector<int32_t> Session::draft(const SpeculativeOptions& spec, const SamplingParams& sampling,
                                    std::span<const int32_t> context, int64_t max_tokens) {
  switch (spec.kind) {
    case DraftKind::kNone:
      return {};
    case DraftKind::kNgram:
      return ngram_draft(context, spec.ngram_max, spec.ngram_min, max_tokens);
    case DraftKind::kMtp:
      return mtp_draft(context.back(), max_tokens);
    case DraftKind::kModel:
      break;
  }
  if (drafter_ == nullptr || &drafter_->model_ != spec.draft_model) {
    drafter_ = std::make_unique<Session>(*spec.draft_model, SessionOptions{});
  }
  const int64_t needed = static_cast<int64_t>(context.size()) + max_tokens - 1;
  if (needed > drafter_->context_length()) return {};  // past the draft model's context
  TurnOptions greedy;
  greedy.max_new_tokens = max_tokens;
  greedy.sampling = sampling;
  greedy.sampling.greedy = true;
  // Presence and frequency penalties count a turn's generated tokens, and the drafter's turns
  // begin where each draft does: left out rather than counted over the wrong tokens.
  greedy.sampling.presence_penalty = greedy.sampling.frequency_penalty = 0.0f;
  std::vector<int32_t> out;
  drafter_->generate(context, greedy, [&](int32_t id) {
    out.push_back(id);
    return true;
  });
  return out;
}

void Session::run(std::span<const int32_t> ids, LogitsFor which, std::vector<float>& logits) {
  if (!mtp_on_) {
    model_.forward(ids, *state_, which, logits);
    return;
  }
  model_.forward(ids, *state_, which, logits, &hidden_);
  mtp_follow(ids, hidden_);
}

void Session::mtp_follow(std::span<const int32_t> ids, std::span<const float> hidden) {
  const int64_t H = model_.config().hidden_size, n = static_cast<int64_t>(ids.size());
  // Rows: the held row with ids[0], then row i with ids[i + 1]; without a held row the head
  // starts afresh (attention is the same under a shift of every position).
  std::vector<float>& rows = mtp_rows_;
  std::span<const int32_t> next = ids;
  if (mtp_pending_.empty()) {
    if (mtp_state_ == nullptr) mtp_state_ = model_.new_mtp_state();
    mtp_state_->reset();
    mtp_offset_ = state_->n_past() - n;  // the position of the head's row 0
    next = ids.subspan(1);
    rows.assign(hidden.begin(), hidden.end() - H);
  } else {
    rows = mtp_pending_;
    rows.insert(rows.end(), hidden.begin(), hidden.end() - H);
  }
  if (!next.empty()) model_.mtp_forward(rows, next, *mtp_state_, mtp_out_, nullptr);
  mtp_pending_.assign(hidden.begin() + (n - 1) * H, hidden.end());
}

std::vector<int32_t> Session::mtp_draft(int32_t token, int64_t max_tokens) {
  if (mtp_pending_.empty() || max_tokens <= 0) return {};
  const int64_t H = model_.config().hidden_size;
  std::vector<int32_t> draft;
  const std::span<const int32_t> vocab = model_.mtp_vocab();  // the logits' tokens (or all)
  mtp_rows_ = mtp_pending_;
  int32_t id = token;
  while (true) {
    model_.mtp_forward(mtp_rows_, std::span<const int32_t>(&id, 1), *mtp_state_, mtp_out_,
                       &mtp_logits_);
    id = argmax(mtp_logits_);
    if (!vocab.empty()) id = vocab[id];
    draft.push_back(id);
    if (static_cast<int64_t>(draft.size()) == max_tokens) break;
    mtp_rows_.assign(mtp_out_.end() - H, mtp_out_.end());
  }
  return draft;
}

void Session::mtp_after_verify(int64_t n0, std::span<const int32_t> batch, size_t accepted) {
  const int64_t H = model_.config().hidden_size;
  // Row n0 - 1 (the last position before the pass with its first token) is the model's own
  // pairing; the rows drafted after it paired the head's outputs with its guesses.
  mtp_state_->rewind(n0 - mtp_offset_, nullptr);
  if (accepted > 0) {
    model_.mtp_forward(std::span<const float>(verify_hidden_).first(accepted * H),
                       batch.subspan(1, accepted), *mtp_state_, mtp_out_, nullptr);
  }
  mtp_pending_.assign(verify_hidden_.begin() + accepted * H,
                      verify_hidden_.begin() + (accepted + 1) * H);
  verify_from_ = n0;
}

void Session::mtp_cut(int64_t n) {
  const int64_t H = model_.config().hidden_size;
  if (mtp_pending_.empty() || n - 1 < verify_from_) return mtp_stop();
  mtp_state_->rewind(n - 1 - mtp_offset_, nullptr);
  const int64_t row = n - 1 - verify_from_;
  mtp_pending_.assign(verify_hidden_.begin() + row * H, verify_hidden_.begin() + (row + 1) * H);
}

void Session::mtp_stop() {
  mtp_pending_.clear();
  if (mtp_state_ != nullptr) mtp_state_->reset();
}

void Session::save(const std::filesystem::path& path) const {
  std::vector<TensorToWrite> tensors;
  tensors.push_back(tensor_to_write<int32_t>("tokens", DType::kI32, history_));
  tensors.push_back(tensor_to_write<float>("logits", DType::kF32, logits_));
  for (const StateTensor& t : state_->tensors()) {
    tensors.push_back(tensor_to_write<float>("state." + t.name, DType::kF32, t.data));
  }
  std::map<std::string, std::string> metadata = {
      {"kind", kStateKind}, {"version", kStateVersion}, {"model", model_.fingerprint()}};
  // The conversation's images go with it: their features, and their ids' numbering here.
  const int32_t vocab = static_cast<int32_t>(model_.config().vocab_size);
  Json images = Json::array();
  int32_t held_from = 0, held_to = 0;  // the last image's ids
  for (const int32_t id : history_) {
    if (id < vocab || (id >= held_from && id < held_to)) continue;
    HeldImage image = model_.held_image(id);
    held_from = image.first_id;
    held_to = image.first_id + static_cast<int32_t>(image.tokens);
    bool known = false;
    for (const Json& i : images) known = known || i["first_id"] == image.first_id;
    if (known) continue;
    tensors.push_back(tensor_to_write<float>("image" + std::to_string(images.size()) + ".features",
                                             DType::kF32, image.features));
    images.push_back({{"key", image.key},
                      {"first_id", image.first_id},
                      {"grid_w", image.grid_w},
                      {"tokens", image.tokens}});
  }
  const std::vector<int32_t> positions = state_->positions();
  if (!images.empty() || !positions.empty()) {
    tensors.push_back(tensor_to_write<int32_t>("positions", DType::kI32, positions));
    metadata["version"] = kImageStateVersion;
    metadata["images"] = images.dump();
  }
  // Written beside the target and renamed over it: a crash or a failed write leaves nothing.
  remove_stale_partials(path);  // those of killed saves
  const std::filesystem::path partial = partial_sibling(path);
  PartialGuard guard(partial);
  write_qhxt(partial, tensors, metadata);
  std::error_code error;
  std::filesystem::rename(partial, path, error);
  if (error) fail(path.string(), "cannot write: " + error.message());
  guard.release();
}

void Session::load(const std::filesystem::path& path) {
  const QhxtFile file = QhxtFile::open(path);
  const std::string where = path.string();
  const auto field = [&](const std::string& key) {
    const auto it = file.metadata().find(key);
    return it == file.metadata().end() ? std::string() : it->second;
  };
  if (field("kind") != kStateKind) fail(where, "not a qhx session state file");
  const bool with_images = field("version") == kImageStateVersion;
  if (field("version") != kStateVersion && !with_images) {
    fail(where + ": version", "'" + field("version") + "', this qhx reads " + kStateVersion +
                                  " and " + kImageStateVersion);
  }
  if (field("model") != model_.fingerprint()) {
    fail(where, "saved from a different model (weights fingerprint " + field("model") +
                    ", this model " + model_.fingerprint() + ")");
  }
  const auto saved_tokens = tensor_values<int32_t>(file, "tokens", DType::kI32);
  const auto logits = tensor_values<float>(file, "logits", DType::kF32);
  const int64_t n_past = static_cast<int64_t>(saved_tokens.size());
  // Each image is taken into this model, its ids renumbered to this model's.
  std::vector<int32_t> tokens(saved_tokens.begin(), saved_tokens.end());
  if (with_images) {
    const Json images = Json::parse(field("images"), nullptr, /*allow_exceptions=*/false);
    if (!images.is_array()) fail(where + ": images", "expected a JSON array");
    std::vector<bool> mapped(tokens.size(), false);
    for (size_t k = 0; k < images.size(); ++k) {
      const std::string at = where + ": images[" + std::to_string(k) + "]";
      const Json& i = images[k];
      if (!i.is_object() || !i.contains("key") || !i["key"].is_string() ||
          !i.value("first_id", Json()).is_number_integer() ||
          !i.value("grid_w", Json()).is_number_integer() ||
          !i.value("tokens", Json()).is_number_integer()) {
        fail(at, "expected {key, first_id, grid_w, tokens}");
      }
      HeldImage image{i["key"].get<std::string>(),
                      i["first_id"].get<int32_t>(),
                      i["grid_w"].get<int64_t>(),
                      i["tokens"].get<int64_t>(),
                      {}};
      const auto features =
          tensor_values<float>(file, "image" + std::to_string(k) + ".features", DType::kF32);
      image.features.assign(features.begin(), features.end());
      int32_t first = 0;
      try {
        first = model_.adopt_image(image);
      } catch (const Error& e) {
        fail(at, e.what());
      }
      for (size_t t = 0; t < tokens.size(); ++t) {
        const int64_t r = static_cast<int64_t>(saved_tokens[t]) - image.first_id;
        if (!mapped[t] && r >= 0 && r < image.tokens) {
          tokens[t] = first + static_cast<int32_t>(r);
          mapped[t] = true;
        }
      }
    }
    for (size_t t = 0; t < tokens.size(); ++t) {
      if (!mapped[t] && tokens[t] >= model_.config().vocab_size) {
        fail(where + ": tokens", "id " + std::to_string(tokens[t]) + " is no saved image's");
      }
    }
  }
  if (n_past > context_length_) {
    fail(where, std::to_string(n_past) + " tokens exceed this session's context limit of " +
                    std::to_string(context_length_));
  }
  for (const int32_t id : tokens) {
    if (id < 0 || (id >= model_.config().vocab_size && !with_images)) {  // else mapped above
      fail(where + ": tokens", "id " + std::to_string(id) + " is outside the vocabulary");
    }
  }
  if (!logits.empty() && static_cast<int64_t>(logits.size()) != model_.config().vocab_size) {
    fail(where + ": logits", "expected " + std::to_string(model_.config().vocab_size) + " values");
  }
  std::vector<StateTensor> state;
  for (const StateTensor& expected : state_->tensors()) {
    state.push_back(
        {expected.name, tensor_values<float>(file, "state." + expected.name, DType::kF32)});
  }
  const std::unique_ptr<ModelState> loaded = model_.new_state();
  loaded->assign(state, n_past, where);
  if (with_images) {
    loaded->assign_positions(tensor_values<int32_t>(file, "positions", DType::kI32), where);
  }
  state_->restore(*loaded);
  history_.assign(tokens.begin(), tokens.end());
  logits_.assign(logits.begin(), logits.end());
  checkpoints_.clear();
  mtp_stop();
}

void PrefixCache::insert(std::span<const int32_t> tokens, const ModelState& state,
                         std::span<const float> logits) {
  // One insert at a time: the memory estimate counts one copy over the cache's bound.
  std::lock_guard copying(copy_mutex_);
  {
    std::lock_guard lock(mutex_);
    for (Entry& e : entries_) {  // a prompt already held is only marked used, not copied again
      if (std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end())) {
        e.last_used = ++clock_;
        return;
      }
    }
  }
  std::unique_ptr<ModelState> copy = state.clone();
  const int64_t bytes =
      copy->bytes() + static_cast<int64_t>(logits.size_bytes() + tokens.size_bytes());
  std::lock_guard lock(mutex_);
  if (bytes > max_bytes_) return;
  while (bytes_ + bytes > max_bytes_) {
    const auto oldest =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
    bytes_ -= oldest->bytes;
    entries_.erase(oldest);
  }
  entries_.push_back({std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(copy),
                      std::vector<float>(logits.begin(), logits.end()), bytes, ++clock_});
  bytes_ += bytes;
}

int64_t PrefixCache::restore(std::span<const int32_t> tokens, int64_t at_least, ModelState& state,
                             std::vector<float>& logits) {
  std::lock_guard lock(mutex_);
  Entry* best = nullptr;
  for (Entry& e : entries_) {
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    if (n < at_least || n > static_cast<int64_t>(tokens.size())) continue;
    if (best != nullptr && n <= static_cast<int64_t>(best->tokens.size())) continue;
    if (std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin())) best = &e;
  }
  if (best == nullptr) return 0;
  best->last_used = ++clock_;
  state.restore(*best->state);
  logits = best->logits;
  return static_cast<int64_t>(best->tokens.size());
}

int64_t PrefixCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

int64_t PrefixCache::entries() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(entries_.size());
}

std::vector<int32_t> greedy_reply(const Model& model, std::span<const int32_t> prompt, int64_t n,
                                  std::span<const int32_t> stop_ids) {
  Session session(model);
  TurnOptions options;
  options.max_new_tokens = n;
  options.stop_ids.assign(stop_ids.begin(), stop_ids.end());
  std::vector<int32_t> out;
  session.generate({prompt.begin(), prompt.end()}, options, [&](int32_t id) {
    out.push_back(id);
    return true;
  });
  if (!out.empty() && std::find(stop_ids.begin(), stop_ids.end(), out.back()) != stop_ids.end()) {
    out.pop_back();  // the stop token ended the reply
  }
  return out;
}

}  // namespace qhx
