// Speculative decoding: with greedy decoding, drafts verified several tokens per pass give exactly
// the tokens of decoding one at a time, and leave the session's state exactly as that would have
// (KV caches cut back, Gated DeltaNet states rolled back), across turns, stops in the middle of a
// draft, and a save and load.
#include "runtime/speculative.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "forge/convert.h"
#include "models/model.h"
#include "runtime/session.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

TEST(NgramDraft, ContinuesTheMostRecentLongestMatch) {
  const std::vector<int32_t> context = {1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 1, 2, 3};
  // "2 3" occurs twice before the end; "1 2 3" once, at 0: the longest wins.
  EXPECT_EQ(ngram_draft(context, 3, 2, 4), (std::vector<int32_t>{4, 9, 2, 3}));
  EXPECT_EQ(ngram_draft(context, 3, 2, 2), (std::vector<int32_t>{4, 9}));
  // Only bigrams: the most recent "2 3" is followed by 5.
  EXPECT_EQ(ngram_draft(context, 2, 2, 3), (std::vector<int32_t>{5, 6, 7}));
  // A continuation stops at the end of the context.
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{7, 8, 7, 8}, 2, 2, 5), (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 3, 4}, 3, 2, 4).empty());
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1}, 3, 1, 4).empty());
  EXPECT_TRUE(ngram_draft(context, 3, 2, 0).empty());
}

struct Conversation {
  std::vector<std::vector<int32_t>> replies;
  std::vector<int32_t> tokens;  // what the session holds at the end
  std::string saved;            // the session saved at the end: tokens, logits and state
  int64_t verify_passes = 0, accepted = 0, rollbacks = 0;
};

// Three turns, each continuing the conversation with a user part that repeats earlier text (so
// prompt lookup finds drafts), greedy; `stop_after` ends each reply by callback after that many
// tokens (0: never), `stop_id` is a stop id (-1: none). With `save_to`, the session is saved after
// the first turn and the rest runs in a new session loaded from it.
Conversation converse(const Model& model, DraftKind kind, int64_t max_new, int64_t stop_after = 0,
                      int32_t stop_id = -1, const fs::path& save_to = {}) {
  const int64_t vocab = model.config().vocab_size;
  auto session = std::make_unique<Session>(model);
  Conversation c;
  std::vector<int32_t> history;
  for (int turn = 0; turn < 3; ++turn) {
    for (int32_t i = 0; i < 12; ++i) history.push_back((i % 6) * 31 % vocab + 3);
    history.insert(history.end(), history.begin(),
                   history.begin() + std::min<size_t>(history.size(), 8));
    TurnOptions options;
    options.max_new_tokens = max_new;
    options.speculative.kind = kind;
    if (stop_id >= 0) options.stop_ids = {stop_id};
    std::vector<int32_t> reply;
    const TurnStats stats = session->generate(history, options, [&](int32_t id) {
      reply.push_back(id);
      return stop_after == 0 || static_cast<int64_t>(reply.size()) < stop_after;
    });
    c.verify_passes += stats.verify_passes;
    c.accepted += stats.accepted;
    c.rollbacks += stats.rollbacks;
    history.insert(history.end(), reply.begin(), reply.end());
    c.replies.push_back(reply);
    if (turn == 0 && !save_to.empty()) {
      session->save(save_to);
      session = std::make_unique<Session>(model);
      session->load(save_to);
    }
  }
  c.tokens.assign(session->tokens().begin(), session->tokens().end());
  test::TempDir dir;
  session->save(dir.path() / "end.qhxt");
  c.saved = test::read_file(dir.path() / "end.qhxt");
  return c;
}

// The models: every fixture checkpoint and the trained models.
std::vector<fs::path> model_dirs() {
  std::vector<fs::path> dirs = test::fixture_checkpoints();
  dirs.push_back(test::source_dir() / "models" / "qwen3-kjv");
  dirs.push_back(test::source_dir() / "models" / "qwen3.5-kjv");
  return dirs;
}

void expect_same(const Conversation& got, const Conversation& want, const std::string& what) {
  EXPECT_EQ(got.replies, want.replies) << what;
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_FALSE(want.saved.empty());
  EXPECT_TRUE(got.saved == want.saved) << what << ": the states differ";
}

TEST(Speculative, NgramGivesTheTokensOfPlainGreedyDecodingOnEveryModel) {
  int64_t passes = 0, accepted = 0, rollbacks = 0;
  for (const fs::path& dir : model_dirs()) {
    SCOPED_TRACE(dir.filename().string());
    const auto model = load_model(dir);
    const Conversation plain = converse(*model, DraftKind::kNone, 20);
    const Conversation spec = converse(*model, DraftKind::kNgram, 20);
    expect_same(spec, plain, "20 tokens a turn");
    EXPECT_EQ(plain.verify_passes, 0);
    passes += spec.verify_passes;
    accepted += spec.accepted;
    rollbacks += spec.rollbacks;
  }
  // Drafts were verified, some kept and some rolled back.
  EXPECT_GT(passes, 20);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rollbacks, 0);
}

// A reply that ends inside an accepted draft (a callback, a stop id, max_new_tokens) leaves the
// state holding exactly the emitted tokens: the next turns match.
TEST(Speculative, StopsInsideADraftLeaveTheStateAsPlainDecodingDoes) {
  for (const char* name : {"qwen3-kjv", "qwen3.5-kjv"}) {
    SCOPED_TRACE(name);
    const auto model = load_model(test::source_dir() / "models" / name);
    int64_t passes = 0, rollbacks = 0;
    for (const int64_t stop_after : {1, 2, 3, 5, 7}) {
      const Conversation spec = converse(*model, DraftKind::kNgram, 16, stop_after);
      expect_same(spec, converse(*model, DraftKind::kNone, 16, stop_after),
                  "stopped after " + std::to_string(stop_after));
      passes += spec.verify_passes;
      rollbacks += spec.rollbacks;
    }
    EXPECT_GT(passes, 0);  // the stops came while drafts were in play
    EXPECT_GT(rollbacks, 0);
    for (const int64_t max_new : {1, 2, 3, 6}) {
      expect_same(converse(*model, DraftKind::kNgram, max_new),
                  converse(*model, DraftKind::kNone, max_new),
                  "max_new_tokens " + std::to_string(max_new));
    }
    // A stop id the plain replies produce part-way.
    const Conversation plain = converse(*model, DraftKind::kNone, 16);
    ASSERT_EQ(plain.replies[0].size(), 16u);
    const int32_t stop_id = plain.replies[0][4];
    expect_same(converse(*model, DraftKind::kNgram, 16, 0, stop_id),
                converse(*model, DraftKind::kNone, 16, 0, stop_id), "stop id");
  }
}

TEST(Speculative, ASavedAndLoadedSessionGoesOnAsPlainDecodingDoes) {
  test::TempDir dir;
  for (const char* name : {"qwen3-kjv", "qwen3.5-kjv"}) {
    SCOPED_TRACE(name);
    const auto model = load_model(test::source_dir() / "models" / name);
    expect_same(converse(*model, DraftKind::kNgram, 12, 0, -1, dir.path() / "spec.qhxt"),
                converse(*model, DraftKind::kNone, 12, 0, -1, dir.path() / "plain.qhxt"),
                "saved after the first turn");
  }
}

// W8 and W4 bundles (int8 activations) of the trained Qwen3.5 model.
TEST(Speculative, QuantizedBundlesGiveTheTokensOfPlainGreedyDecoding) {
  test::TempDir dir;
  for (const DType weights : {DType::kW8, DType::kW4}) {
    SCOPED_TRACE(dtype_name(weights));
    ConvertOptions o;
    o.weights = weights;
    o.int8_activations = true;
    o.gate = false;  // exactness against itself, not against the checkpoint
    const fs::path bundle = dir.path() / dtype_name(weights);
    forge_convert(test::source_dir() / "models" / "qwen3.5-kjv", bundle, o);
    const auto model = load_model(bundle);
    expect_same(converse(*model, DraftKind::kNgram, 20), converse(*model, DraftKind::kNone, 20),
                "20 tokens a turn");
  }
}

}  // namespace
}  // namespace qhx
