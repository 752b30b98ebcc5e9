// Speculative decoding: with greedy decoding, drafts (prompt lookup, a draft model) verified
// several tokens per pass give exactly the tokens of decoding one at a time, and leave the
// session's state exactly as that would have (KV caches cut back, Gated DeltaNet states rolled
// back), across turns, stops in the middle of a draft, and a save and load. Sampled, the output
// follows the distribution of sampling without drafts.
#include "runtime/speculative.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "forge/convert.h"
#include "forge/draft_vocab.h"
#include "io/draft_vocab.h"
#include "io/hf_config.h"
#include "models/model.h"
#include "runtime/session.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/json_file.h"

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
  int64_t verify_passes = 0, drafted = 0, accepted = 0, rollbacks = 0;
};

// Three turns, each continuing the conversation with a user part that repeats earlier text (so
// prompt lookup finds drafts), greedy; `stop_after` ends each reply by callback after that many
// tokens (0: never), `stop_id` is a stop id (-1: none). With `save_to`, the session is saved after
// the first turn and the rest runs in a new session loaded from it.
Conversation converse(const Model& model, const SpeculativeOptions& spec, int64_t max_new,
                      int64_t stop_after = 0, int32_t stop_id = -1, const fs::path& save_to = {}) {
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
    options.speculative = spec;
    if (stop_id >= 0) options.stop_ids = {stop_id};
    std::vector<int32_t> reply;
    const TurnStats stats = session->generate(history, options, [&](int32_t id) {
      reply.push_back(id);
      return stop_after == 0 || static_cast<int64_t>(reply.size()) < stop_after;
    });
    c.verify_passes += stats.verify_passes;
    c.drafted += stats.drafted;
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

SpeculativeOptions drafts(DraftKind kind, const Model* draft_model = nullptr) {
  SpeculativeOptions spec;
  spec.kind = kind;
  spec.draft_model = draft_model;
  return spec;
}

const SpeculativeOptions kPlain = drafts(DraftKind::kNone);
const SpeculativeOptions kNgram = drafts(DraftKind::kNgram);

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

// A W8 or W4 bundle of `checkpoint` at `out` (int8 activations; ungated: exactness is checked
// against itself, not against the checkpoint).
fs::path quantized_bundle(const fs::path& checkpoint, DType weights, const fs::path& out) {
  ConvertOptions o;
  o.weights = weights;
  o.int8_activations = true;
  o.gate = false;
  forge_convert(checkpoint, out, o);
  return out;
}

const fs::path kMtpFixture = test::source_dir() / "tests/fixtures/qwen3_5/multimodal_layout";

// `to` (a new directory) holding links to every file of `from`: a checkpoint to add files to.
void link_files(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& entry : fs::directory_iterator(from)) {
    fs::create_symlink(entry.path(), to / entry.path().filename());
  }
}

TEST(Speculative, NgramGivesTheTokensOfPlainGreedyDecodingOnEveryModel) {
  int64_t passes = 0, accepted = 0, rollbacks = 0;
  for (const fs::path& dir : model_dirs()) {
    SCOPED_TRACE(dir.filename().string());
    const auto model = load_model(dir);
    const Conversation plain = converse(*model, kPlain, 20);
    const Conversation spec = converse(*model, kNgram, 20);
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
      const Conversation spec = converse(*model, kNgram, 16, stop_after);
      expect_same(spec, converse(*model, kPlain, 16, stop_after),
                  "stopped after " + std::to_string(stop_after));
      passes += spec.verify_passes;
      rollbacks += spec.rollbacks;
    }
    EXPECT_GT(passes, 0);  // the stops came while drafts were in play
    EXPECT_GT(rollbacks, 0);
    for (const int64_t max_new : {1, 2, 3, 6}) {
      expect_same(converse(*model, kNgram, max_new), converse(*model, kPlain, max_new),
                  "max_new_tokens " + std::to_string(max_new));
    }
    // A stop id the plain replies produce part-way.
    const Conversation plain = converse(*model, kPlain, 16);
    ASSERT_EQ(plain.replies[0].size(), 16u);
    const int32_t stop_id = plain.replies[0][4];
    expect_same(converse(*model, kNgram, 16, 0, stop_id), converse(*model, kPlain, 16, 0, stop_id),
                "stop id");
  }
}

TEST(Speculative, ASavedAndLoadedSessionGoesOnAsPlainDecodingDoes) {
  test::TempDir dir;
  for (const char* name : {"qwen3-kjv", "qwen3.5-kjv"}) {
    SCOPED_TRACE(name);
    const auto model = load_model(test::source_dir() / "models" / name);
    expect_same(converse(*model, kNgram, 12, 0, -1, dir.path() / "spec.qhxt"),
                converse(*model, kPlain, 12, 0, -1, dir.path() / "plain.qhxt"),
                "saved after the first turn");
  }
}

// W8 and W4 bundles (int8 activations) of the trained Qwen3.5 model.
TEST(Speculative, QuantizedBundlesGiveTheTokensOfPlainGreedyDecoding) {
  test::TempDir dir;
  for (const DType weights : {DType::kW8, DType::kW4}) {
    SCOPED_TRACE(dtype_name(weights));
    const auto model = load_model(quantized_bundle(test::source_dir() / "models" / "qwen3.5-kjv",
                                                   weights, dir.path() / dtype_name(weights)));
    expect_same(converse(*model, kNgram, 20), converse(*model, kPlain, 20), "20 tokens a turn");
  }
}

// A draft model with the same vocabulary: the other trained model, a random one, and the model
// itself (every draft kept); across turns, stops inside drafts and a save and load.
TEST(Speculative, DraftModelGivesTheTokensOfPlainGreedyDecoding) {
  const fs::path models = test::source_dir() / "models";
  const auto qwen3 = load_model(models / "qwen3-kjv");
  const auto qwen35 = load_model(models / "qwen3.5-kjv");
  const auto random = load_model(models / "qwen3-tiny-random");
  struct Case {
    const Model* target;
    const Model* draft;
    std::string what;
  };
  int64_t accepted = 0, rollbacks = 0;
  for (const Case& c :
       {Case{qwen35.get(), qwen3.get(), "qwen3.5-kjv drafted by qwen3-kjv"},
        Case{qwen3.get(), qwen35.get(), "qwen3-kjv drafted by qwen3.5-kjv"},
        Case{qwen35.get(), random.get(), "qwen3.5-kjv drafted by a random model"}}) {
    const Conversation spec = converse(*c.target, drafts(DraftKind::kModel, c.draft), 20);
    expect_same(spec, converse(*c.target, kPlain, 20), c.what);
    EXPECT_GT(spec.verify_passes, 10) << c.what;
    accepted += spec.accepted;
    rollbacks += spec.rollbacks;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rollbacks, 0);

  const Conversation self = converse(*qwen35, drafts(DraftKind::kModel, qwen35.get()), 20);
  expect_same(self, converse(*qwen35, kPlain, 20), "drafted by itself");
  EXPECT_EQ(self.accepted, self.drafted);  // greedy drafts of the model itself are its own picks

  const SpeculativeOptions by_qwen3 = drafts(DraftKind::kModel, qwen3.get());
  for (const int64_t stop_after : {1, 3, 6}) {
    expect_same(converse(*qwen35, by_qwen3, 16, stop_after),
                converse(*qwen35, kPlain, 16, stop_after),
                "stopped after " + std::to_string(stop_after));
  }
  test::TempDir dir;
  expect_same(converse(*qwen35, by_qwen3, 12, 0, -1, dir.path() / "spec.qhxt"),
              converse(*qwen35, kPlain, 12, 0, -1, dir.path() / "plain.qhxt"),
              "saved after the first turn");
}

// The MTP heads of a Qwen3.5 checkpoint (random mtp.* weights; multimodal layout) and of the
// trained KJV model (its draft vocabulary too), and of their W8 and W4 bundles: the same tokens and
// saved sessions as plain decoding, across turns, stops inside drafts, and a save and load.
TEST(Speculative, MtpHeadGivesTheTokensOfPlainGreedyDecoding) {
  test::TempDir dir;
  std::vector<fs::path> models;
  for (const fs::path& checkpoint : {kMtpFixture, test::source_dir() / "models/qwen3.5-kjv"}) {
    models.push_back(checkpoint);
    for (const DType weights : {DType::kW8, DType::kW4}) {
      models.push_back(quantized_bundle(
          checkpoint, weights,
          dir.path() / (checkpoint.filename().string() + "-" + std::string(dtype_name(weights)))));
    }
  }
  const SpeculativeOptions mtp = drafts(DraftKind::kMtp);
  int64_t passes = 0, rollbacks = 0, kjv_accepted = 0;
  for (const fs::path& path : models) {
    SCOPED_TRACE(path.filename().string());
    const auto model = load_model(path);
    ASSERT_TRUE(model->has_mtp());
    const bool kjv = path.filename().string().starts_with("qwen3.5-kjv");
    EXPECT_EQ(model->mtp_vocab().empty(), !kjv);  // the bundles carry its draft vocabulary
    const Conversation spec = converse(*model, mtp, 20);
    expect_same(spec, converse(*model, kPlain, 20), "20 tokens a turn");
    passes += spec.verify_passes;
    rollbacks += spec.rollbacks;
    if (kjv) kjv_accepted += spec.accepted;
    for (const int64_t stop_after : {1, 3, 6}) {
      expect_same(converse(*model, mtp, 16, stop_after), converse(*model, kPlain, 16, stop_after),
                  "stopped after " + std::to_string(stop_after));
    }
    expect_same(converse(*model, mtp, 12, 0, -1, dir.path() / "spec.qhxt"),
                converse(*model, kPlain, 12, 0, -1, dir.path() / "plain.qhxt"),
                "saved after the first turn");
  }
  EXPECT_GT(kjv_accepted, 0);  // the trained head's drafts are kept sometimes
  EXPECT_GT(passes, 30);
  EXPECT_GT(rollbacks, 0);  // random weights: the head's guesses are seldom right
  // A model without a head refuses 'mtp'.
  const auto plain = load_model(test::source_dir() / "tests/fixtures/qwen3_5/gva2_tied");
  Session session(*plain);
  TurnOptions options;
  options.speculative = mtp;
  test::expect_error(
      [&] {
        session.generate(std::vector<int32_t>{1, 2}, options, [](int32_t) { return true; });
      },
      {"speculative", "MTP head"});
}

// The MTP head's context after a speculative conversation (one row behind the model, drafted
// rows cut after each verify pass, the accepted ones added, stops inside drafts cut back) is the
// one it gets from reading the whole conversation at once: a turn that goes on from there drafts
// and keeps the same tokens. (The identity tests above cannot see a wrong context: it costs only
// acceptance.)
TEST(Speculative, TheMtpHeadsContextIsThatOfReadingTheConversationAtOnce) {
  const auto model = load_model(test::source_dir() / "models/qwen3.5-kjv");
  const Tokenizer tokenizer = Tokenizer::load(test::source_dir() / "models/qwen3.5-kjv");
  const std::vector<std::string> parts = {"And God said, Let there be light",
                                          "\nAnd the LORD spake unto Moses, saying,",
                                          "\nThen answered Jesus and said unto them,"};
  TurnOptions options;
  options.speculative = drafts(DraftKind::kMtp);
  options.max_new_tokens = 64;
  // A turn the callback ends after n tokens: inside an accepted draft, often.
  const auto turn = [&](Session& session, const std::vector<int32_t>& history, int64_t n) {
    std::vector<int32_t> reply;
    const TurnStats stats = session.generate(history, options, [&](int32_t id) {
      reply.push_back(id);
      return static_cast<int64_t>(reply.size()) < n;
    });
    return std::pair{reply, stats};
  };
  Session step_by_step(*model);
  std::vector<int32_t> history;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::vector<int32_t> part = tokenizer.encode(parts[i]);
    history.insert(history.end(), part.begin(), part.end());
    const auto [reply, stats] = turn(step_by_step, history, 13 + 7 * static_cast<int64_t>(i));
    EXPECT_GT(stats.verify_passes, 0);
    history.insert(history.end(), reply.begin(), reply.end());
  }
  // The last turn goes on from the last reply with nothing new: its first draft starts from the
  // head's row for the reply's last token, whatever cut the turn before left.
  const auto [reply, stats] = turn(step_by_step, history, 40);
  Session at_once(*model);
  const auto [fresh_reply, fresh_stats] = turn(at_once, history, 40);
  EXPECT_EQ(reply, fresh_reply);
  EXPECT_EQ(stats.drafted, fresh_stats.drafted);
  EXPECT_EQ(stats.accepted, fresh_stats.accepted);
  EXPECT_EQ(stats.verify_passes, fresh_stats.verify_passes);
  EXPECT_GT(stats.accepted, stats.drafted / 2);  // the trained head is mostly right
}

// A draft vocabulary (draft_vocab.json) narrows the head's logits to the lm_head's rows of its
// tokens, in its order: in every weight format (the bundles carry the list) they are exactly those
// columns of the whole vocabulary's logits; mtp_vocab_size keeps the list's first tokens.
TEST(Mtp, ADraftVocabularyKeepsThoseColumnsOfTheLogits) {
  test::TempDir dir;
  const fs::path checkpoint = dir.path() / "checkpoint";
  link_files(kMtpFixture, checkpoint);
  const int64_t vocab_size = load_model(kMtpFixture)->config().vocab_size;
  std::vector<int32_t> vocab;  // every third token, last first
  for (int64_t t = vocab_size - 1; t >= 0; t -= 3) vocab.push_back(static_cast<int32_t>(t));
  std::ofstream(checkpoint / kDraftVocabFile) << Json{
      {"format", "qhx-draft-vocab"}, {"version", 1}, {"vocab_size", vocab_size}, {"ids", vocab}};
  std::vector<fs::path> models = {checkpoint};
  for (const DType weights : {DType::kW8, DType::kW4}) {
    models.push_back(quantized_bundle(checkpoint, weights, dir.path() / dtype_name(weights)));
  }
  const std::vector<int32_t> prompt = {5, 77, 300 % static_cast<int32_t>(vocab_size), 12, 9, 41};
  for (const fs::path& path : models) {
    SCOPED_TRACE(path.filename().string());
    const auto full = load_model(path, {.mtp_vocab_size = LoadOptions::kFullVocabulary});
    const auto narrow = load_model(path);
    EXPECT_TRUE(full->mtp_vocab().empty());
    ASSERT_EQ(std::vector<int32_t>(narrow->mtp_vocab().begin(), narrow->mtp_vocab().end()), vocab);
    std::vector<float> logits, hidden;
    full->forward(prompt, *full->new_state(), LogitsFor::kLastToken, logits, &hidden);
    const auto full_state = full->new_mtp_state(), narrow_state = narrow->new_mtp_state();
    std::vector<float> out, full_logits, narrow_logits;
    const int64_t H = full->config().hidden_size;
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      const std::span<const float> row = std::span(hidden).subspan(i * H, H);
      const std::span<const int32_t> next = std::span(prompt).subspan(i + 1, 1);
      full->mtp_forward(row, next, *full_state, out, &full_logits);
      narrow->mtp_forward(row, next, *narrow_state, out, &narrow_logits);
      ASSERT_EQ(narrow_logits.size(), vocab.size());
      for (size_t j = 0; j < vocab.size(); ++j) {
        EXPECT_EQ(narrow_logits[j], full_logits[vocab[j]]) << "row " << i << ", token " << vocab[j];
      }
    }
  }
  const auto first = load_model(checkpoint, {.mtp_vocab_size = 10});
  EXPECT_EQ(std::vector<int32_t>(first->mtp_vocab().begin(), first->mtp_vocab().end()),
            std::vector<int32_t>(vocab.begin(), vocab.begin() + 10));
}

// qhx forge draft-vocab: the text's tokens by frequency (ties: the smaller id), as few as cover
// the share asked for; the file it writes reads back as the list.
TEST(Mtp, ForgeDraftVocabRanksTheTextsTokensByFrequency) {
  const fs::path model = test::source_dir() / "models/qwen3.5-kjv";
  const Tokenizer tokenizer = Tokenizer::load(model);
  const std::vector<std::string> texts = {test::read_file(model / "held_out.txt")};
  std::map<int32_t, int64_t> counts;
  for (const int32_t id : tokenizer.encode(texts[0], "text")) ++counts[id];
  const DraftVocab vocab = rank_draft_vocab(tokenizer, texts, {.coverage = 0.99});
  ASSERT_FALSE(vocab.ids.empty());
  int64_t covered = 0;
  for (size_t i = 0; i < vocab.ids.size(); ++i) {
    if (i > 0) {
      const int64_t before = counts[vocab.ids[i - 1]], here = counts[vocab.ids[i]];
      EXPECT_TRUE(before > here || (before == here && vocab.ids[i - 1] < vocab.ids[i])) << i;
    }
    covered += counts[vocab.ids[i]];
  }
  const double total = static_cast<double>(vocab.text_tokens);
  EXPECT_GE(static_cast<double>(covered) / total, 0.99);
  EXPECT_LT(static_cast<double>(covered - counts[vocab.ids.back()]) / total, 0.99);
  EXPECT_LT(vocab.ids.size(), counts.size());  // the rarest tokens are left out
  for (const auto& [id, n] : counts) {  // and every one left out is no more frequent than kept ones
    if (std::find(vocab.ids.begin(), vocab.ids.end(), id) == vocab.ids.end()) {
      EXPECT_LE(n, counts[vocab.ids.back()]) << id;
    }
  }
  EXPECT_EQ(rank_draft_vocab(tokenizer, texts, {.coverage = 0.99, .max_tokens = 10}).ids,
            std::vector<int32_t>(vocab.ids.begin(), vocab.ids.begin() + 10));
  test::TempDir dir;
  const int64_t vocab_size = load_model_config(model / "config.json").vocab_size;
  write_draft_vocab(dir.path() / kDraftVocabFile, vocab, vocab_size, "held_out.txt");
  EXPECT_EQ(read_draft_vocab(dir.path() / kDraftVocabFile, vocab_size), vocab.ids);
  test::expect_error(
      [&] { write_draft_vocab(dir.path() / "small.json", vocab, 100, "held_out.txt"); },
      {"small.json", "outside the vocabulary"});
  test::expect_error([&] { rank_draft_vocab(tokenizer, texts, {.coverage = 0.0}); },
                     {"--coverage"});
  test::expect_error([&] { rank_draft_vocab(tokenizer, std::vector<std::string>{""}, {}); },
                     {"no token"});
}

TEST(Mtp, ABadDraftVocabularyIsRefusedByName) {
  test::TempDir dir;
  link_files(kMtpFixture, dir.path());
  const int64_t vocab_size = load_model(kMtpFixture)->config().vocab_size;
  const fs::path file = dir.path() / kDraftVocabFile;
  const auto refused = [&](const Json& doc, const std::vector<std::string>& words) {
    std::ofstream(file, std::ios::trunc) << doc;
    std::vector<std::string> expected = {file.string()};
    expected.insert(expected.end(), words.begin(), words.end());
    test::expect_error([&] { load_model(dir.path()); }, expected);
    ConvertOptions o;
    o.gate = false;
    test::expect_error([&] { forge_convert(dir.path(), dir.path() / "bundle", o); }, expected);
  };
  const Json good = {
      {"format", "qhx-draft-vocab"}, {"version", 1}, {"vocab_size", vocab_size}, {"ids", {3, 1}}};
  Json doc = good;
  doc["ids"] = {3, vocab_size};
  refused(doc, {"ids[1]", "outside the vocabulary"});
  doc["ids"] = {3, 7, 3};
  refused(doc, {"ids[2]", "listed twice"});
  doc["ids"] = Json::array();
  refused(doc, {"ids", "non-empty"});
  doc = good;
  doc["vocab_size"] = vocab_size + 1;
  refused(doc, {"vocab_size", std::to_string(vocab_size + 1), std::to_string(vocab_size)});
  doc = good;
  doc["version"] = 2;
  refused(doc, {"version"});
  // A model without a head never reads the list; a size below -1 is refused.
  test::TempDir headless;
  link_files(test::source_dir() / "tests/fixtures/qwen3_5/gva2_tied", headless.path());
  std::ofstream(headless.path() / kDraftVocabFile) << doc;
  EXPECT_FALSE(load_model(headless.path())->has_mtp());
  test::expect_error([&] { load_model(dir.path(), {.mtp_vocab_size = -2}); }, {"mtp_vocab_size"});
  // The whole vocabulary asked for: the list is not read.
  EXPECT_TRUE(load_model(dir.path(), {.mtp_vocab_size = LoadOptions::kFullVocabulary})
                  ->mtp_vocab()
                  .empty());
}

TEST(Speculative, ADraftModelOfAnotherVocabularyIsRefused) {
  const auto target =
      load_model(test::source_dir() / "tests" / "fixtures" / "qwen3_5" / "gva2_tied");
  const auto other = load_model(test::source_dir() / "models" / "qwen3-kjv");
  Session session(*target);
  TurnOptions options;
  options.speculative = drafts(DraftKind::kModel, other.get());
  test::expect_error(
      [&] {
        session.generate(std::vector<int32_t>{1, 2, 3}, options, [](int32_t) { return true; });
      },
      {"speculative", "vocabulary (151936 tokens)", "(384)"});
  options.speculative.draft_model = nullptr;
  test::expect_error(
      [&] {
        session.generate(std::vector<int32_t>{1, 2, 3}, options, [](int32_t) { return true; });
      },
      {"speculative", "needs a draft model"});
}

// Speculative sampling: the first four tokens sampled after a prompt, with drafts (prompt lookup,
// a draft model) and without, follow the same distribution — a two-sample chi-square test over
// the 4-token sequences (rare ones pooled), at a threshold a correct rule exceeds once in ~10^6.
// The prompt repeats a pattern whose tokens a logit bias makes likely, so drafts of it are kept
// and rejected at comparable rates; top-k keeps the sequences few.
TEST(Speculative, SampledOutputFollowsTheDistributionOfSamplingWithoutDrafts) {
  const fs::path fixtures = test::source_dir() / "tests" / "fixtures";
  const auto model = load_model(fixtures / "qwen3_5" / "gva2_tied");
  const auto draft_model = load_model(fixtures / "qwen3" / "gqa2_f16");
  ASSERT_EQ(draft_model->config().vocab_size, model->config().vocab_size);
  const std::vector<int32_t> pattern = {17, 101, 233};
  std::vector<int32_t> prompt;
  for (int i = 0; i < 5; ++i) prompt.insert(prompt.end(), pattern.begin(), pattern.end());
  prompt.resize(prompt.size() - 1);  // ends mid-pattern: a draft follows at once

  constexpr int kRuns = 3000;
  using Counts = std::map<std::vector<int32_t>, int>;
  const auto sample_runs = [&](const SpeculativeOptions& spec, uint64_t first_seed,
                               int64_t* drafted, int64_t* accepted) {
    Session session(*model);
    Counts counts;
    for (int run = 0; run < kRuns; ++run) {
      TurnOptions options;
      options.max_new_tokens = 4;
      options.sampling.greedy = false;
      options.sampling.top_k = 3;
      options.sampling.seed = first_seed + run;
      for (const int32_t id : pattern) options.sampling.logit_bias.push_back({id, 6.0f});
      options.speculative = spec;
      std::vector<int32_t> reply;
      const TurnStats stats = session.generate(prompt, options, [&](int32_t id) {
        reply.push_back(id);
        return true;
      });
      if (drafted != nullptr) *drafted += stats.drafted;
      if (accepted != nullptr) *accepted += stats.accepted;
      ++counts[reply];
    }
    return counts;
  };
  const Counts plain = sample_runs(kPlain, 1, nullptr, nullptr);
  for (const SpeculativeOptions& spec : {kNgram, drafts(DraftKind::kModel, draft_model.get())}) {
    SCOPED_TRACE(spec.kind == DraftKind::kNgram ? "ngram" : "draft model");
    int64_t drafted = 0, accepted = 0;
    const Counts with = sample_runs(spec, 1000003, &drafted, &accepted);
    // Both kept and rejected often: the rule's two branches are exercised.
    EXPECT_GT(accepted, drafted / 10);
    EXPECT_LT(accepted, drafted * 9 / 10);
    // Pearson's two-sample statistic over sequences seen at least 10 times in all, the rest pooled.
    std::map<std::vector<int32_t>, std::pair<int, int>> cells;
    for (const auto& [seq, n] : plain) cells[seq].first += n;
    for (const auto& [seq, n] : with) cells[seq].second += n;
    std::pair<int, int> rare = {0, 0};
    double chi2 = 0;
    int dof = -1;
    const auto add = [&](std::pair<int, int> c) {
      const double total = c.first + c.second;  // equal arms: expected total / 2 each
      chi2 += (c.first - total / 2) * (c.first - total / 2) / (total / 2) +
              (c.second - total / 2) * (c.second - total / 2) / (total / 2);
      ++dof;
    };
    for (const auto& [seq, c] : cells) {
      if (c.first + c.second >= 10) {
        add(c);
      } else {
        rare.first += c.first;
        rare.second += c.second;
      }
    }
    if (rare.first + rare.second > 0) add(rare);
    ASSERT_GE(dof, 5);
    // The chi-square quantile at 1 - 10^-6 is below dof + 7·sqrt(2·dof) + 25 for these dofs.
    const double threshold = dof + 7 * std::sqrt(2.0 * dof) + 25;
    EXPECT_LT(chi2, threshold) << dof << " degrees of freedom";
  }
}

}  // namespace
}  // namespace qhx
