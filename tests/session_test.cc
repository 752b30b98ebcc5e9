// Sessions: multi-turn state reuse, checkpoints, save/restore, the prefix cache, and memory
// admission. The reference for every reuse is the same conversation run from an empty state.
#include "runtime/session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <thread>

#include "models/model.h"
#include "runtime/memory.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace qhx {
namespace {

using test::expect_error;

struct Turn {
  std::vector<int32_t> generated;
  TurnStats stats;
};

Turn run_turn(Session& session, std::span<const int32_t> tokens, int64_t max_new = 12) {
  TurnOptions options;
  options.max_new_tokens = max_new;
  Turn turn;
  turn.stats = session.generate(tokens, options, [&](int32_t id) {
    turn.generated.push_back(id);
    return true;
  });
  return turn;
}

// The conversation as the chat layer builds it: ChatML turns, each reply appended as generated.
class SessionTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = test::source_dir() / "models" / GetParam();
    model_ = load_model(dir_);
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(dir_));
  }
  std::vector<int32_t> user_turn(const std::string& text, bool first) const {
    std::string turn = first ? "" : "\n";
    turn += "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n";
    return tokenizer_->encode(turn);
  }

  std::filesystem::path dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

const char* const kUserTurns[] = {"And it came to pass", "Who begat whom?", "Tell of the flood.",
                                  "And the LORD said", "Amen."};

TEST_P(SessionTest, FiveTurnsMatchRunningEachHistoryFromScratch) {
  Session session(*model_);
  std::vector<int32_t> history;
  for (int t = 0; t < 5; ++t) {
    const std::vector<int32_t> added = user_turn(kUserTurns[t], t == 0);
    history.insert(history.end(), added.begin(), added.end());
    const Turn reused = run_turn(session, history);

    Session fresh(*model_);
    const Turn scratch = run_turn(fresh, history);
    EXPECT_EQ(reused.generated, scratch.generated) << "turn " << t;
    // Only the new tokens ran: the user turn, plus the previous reply's last token, which was
    // chosen but never fed back.
    const int64_t expected = static_cast<int64_t>(added.size()) + (t == 0 ? 0 : 1);
    EXPECT_EQ(reused.stats.n_processed, expected) << "turn " << t;
    EXPECT_EQ(reused.stats.n_reused, static_cast<int64_t>(history.size()) - expected);
    EXPECT_EQ(scratch.stats.n_processed, static_cast<int64_t>(history.size()));
    history.insert(history.end(), reused.generated.begin(), reused.generated.end());
  }
}

TEST_P(SessionTest, RegenerateAndEditGoBackWithoutRecomputingThePrefix) {
  Session session(*model_);
  std::vector<int32_t> history = user_turn(kUserTurns[0], true);
  const Turn first = run_turn(session, history);
  history.insert(history.end(), first.generated.begin(), first.generated.end());
  const size_t before_second = history.size();
  const std::vector<int32_t> second_prompt = user_turn(kUserTurns[1], false);
  history.insert(history.end(), second_prompt.begin(), second_prompt.end());
  const Turn second = run_turn(session, history);

  // Regenerate: the same prompt again needs no forward pass before the first token.
  const Turn again = run_turn(session, history);
  EXPECT_EQ(again.stats.n_processed, 0);
  EXPECT_EQ(again.generated, second.generated);

  // Edit the last user message: only the edited turn runs (from the end of the first reply).
  history.resize(before_second);
  const std::vector<int32_t> edited = user_turn(kUserTurns[2], false);
  history.insert(history.end(), edited.begin(), edited.end());
  const Turn after_edit = run_turn(session, history);
  Session fresh(*model_);
  EXPECT_EQ(after_edit.generated, run_turn(fresh, history).generated);
  // A recurrent model goes back to the checkpoint at the end of the first reply; an
  // attention-only one cuts its KV cache where the edit begins, a few tokens later.
  const int64_t from_checkpoint = static_cast<int64_t>(edited.size()) + 1;
  if (model_->new_state()->can_truncate()) {
    EXPECT_LT(after_edit.stats.n_processed, from_checkpoint);
  } else {
    EXPECT_EQ(after_edit.stats.n_processed, from_checkpoint);
  }
}

// With few checkpoints, older turns are thinned out rather than dropped: editing the second of
// six turns still resumes from a checkpoint, and matches a fresh run.
TEST_P(SessionTest, EarlierTurnsStayReachableWithFewCheckpoints) {
  Session session(*model_, {.max_checkpoints = 4});
  std::vector<int32_t> history;
  std::vector<size_t> turn_starts;
  for (int t = 0; t < 6; ++t) {
    turn_starts.push_back(history.size());
    const std::vector<int32_t> added = user_turn(kUserTurns[t % 5], t == 0);
    history.insert(history.end(), added.begin(), added.end());
    const Turn reply = run_turn(session, history, 4);
    history.insert(history.end(), reply.generated.begin(), reply.generated.end());
  }
  history.resize(turn_starts[1]);
  const std::vector<int32_t> edited = user_turn("An edited question.", false);
  history.insert(history.end(), edited.begin(), edited.end());
  const Turn after_edit = run_turn(session, history, 4);
  EXPECT_GT(after_edit.stats.n_reused, 0);
  Session fresh(*model_);
  EXPECT_EQ(after_edit.generated, run_turn(fresh, history, 4).generated);
}

TEST_P(SessionTest, RestoredStateContinuesAsIfNeverStopped) {
  test::TempDir tmp;
  const auto path = tmp.path() / "chat.qhxs";
  std::vector<int32_t> history = user_turn(kUserTurns[0], true);

  Session original(*model_);
  const Turn first = run_turn(original, history);
  original.save(path);
  history.insert(history.end(), first.generated.begin(), first.generated.end());
  const std::vector<int32_t> next = user_turn(kUserTurns[1], false);
  history.insert(history.end(), next.begin(), next.end());
  const Turn continued = run_turn(original, history);

  Session restored(*model_);
  restored.load(path);
  EXPECT_EQ(restored.tokens().size(), history.size() - next.size() - 1);
  const Turn after_restore = run_turn(restored, history);
  EXPECT_EQ(after_restore.generated, continued.generated);
  EXPECT_EQ(after_restore.stats.n_processed, continued.stats.n_processed);
}

INSTANTIATE_TEST_SUITE_P(Models, SessionTest, ::testing::Values("qwen3.5-kjv", "qwen3-kjv"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::erase_if(name, [](char c) { return !std::isalnum(c); });
                           return name;
                         });

// A model whose KV caches hold f16, q8 or q4 rows: a token decoded alone gets the bits its row
// gets in a batched pass (a row is quantized by itself, whatever the batch; kEveryStep, so that
// Qwen3.5's delta rule runs stepwise too, as a speculative verification runs it), the logits stay
// within each type's measured distance of the f32 cache's, the state takes the bytes the type
// promises, and a saved state goes back only into a model with the same KV type.
class KvTypeTest : public ::testing::TestWithParam<std::tuple<const char*, KvType>> {
 protected:
  void SetUp() override {
    dir_ = test::source_dir() / "models" / std::get<0>(GetParam());
    kv_ = std::get<1>(GetParam());
    model_ = load_model(dir_, {.kv_type = kv_});
    const Tokenizer tokenizer = Tokenizer::load(dir_);
    ids_ = tokenizer.encode(
        "In the beginning God created the heaven and the earth. And the earth was without form, "
        "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon "
        "the face of the waters. And God said, Let there be light: and there was light.");
  }
  std::filesystem::path dir_;
  KvType kv_ = KvType::kF32;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> ids_;
};

// Mean over positions of KL(p_exact ‖ p) between the softmaxes of two [n, vocab] logit rows.
double mean_kl(const std::vector<float>& exact, const std::vector<float>& other, int64_t vocab) {
  const int64_t n = static_cast<int64_t>(exact.size()) / vocab;
  double total = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    const float* a = exact.data() + t * vocab;
    const float* b = other.data() + t * vocab;
    const double ma = *std::max_element(a, a + vocab), mb = *std::max_element(b, b + vocab);
    double za = 0.0, zb = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {
      za += std::exp(a[i] - ma);
      zb += std::exp(b[i] - mb);
    }
    for (int64_t i = 0; i < vocab; ++i) {
      const double la = a[i] - ma - std::log(za), lb = b[i] - mb - std::log(zb);
      total += std::exp(la) * (la - lb);
    }
  }
  return total / static_cast<double>(n);
}

TEST_P(KvTypeTest, StepsEqualThePrefillAndStayCloseToF32) {
  const int64_t vocab = model_->config().vocab_size;
  const auto batched_state = model_->new_state();
  std::vector<float> batched, step;
  model_->forward(ids_, *batched_state, LogitsFor::kEveryStep, batched);
  const auto stepped = model_->new_state();
  for (size_t t = 0; t < ids_.size(); ++t) {
    model_->forward(std::span(ids_).subspan(t, 1), *stepped, LogitsFor::kLastToken, step);
    ASSERT_TRUE(std::equal(step.begin(), step.end(), batched.begin() + t * vocab))
        << "token " << t << " decoded alone differs from its batched row";
  }
  const auto exact_model = load_model(dir_);
  const auto exact_state = exact_model->new_state();
  std::vector<float> exact;
  exact_model->forward(ids_, *exact_state, LogitsFor::kEveryStep, exact);
  // Measured over these 50 tokens (qwen3.5-kjv, qwen3-kjv): f16 4e-9, 3e-8; q8 1.3e-6, 1.8e-5;
  // q4 6e-4, 4.7e-3.
  const double kl = mean_kl(exact, batched, vocab);
  EXPECT_LT(kl, kv_ == KvType::kF16 ? 1e-6 : kv_ == KvType::kQ8 ? 2e-4 : 3e-2);
  // The attention layers' caches shrink as the type says (the recurrent states do not).
  const ModelConfig& c = model_->config();
  int64_t attention_layers = 0;
  for (const LayerKind kind : c.layer_types) attention_layers += kind == LayerKind::kFullAttention;
  if (c.layer_types.empty()) attention_layers = c.num_layers;
  const auto kv_bytes = [&](KvType type) -> int64_t {
    return attention_layers * 2 * static_cast<int64_t>(ids_.size()) * c.num_kv_heads *
           kv_head_floats(type, c.head_dim) * static_cast<int64_t>(sizeof(float));
  };
  EXPECT_EQ(exact_state->bytes() - batched_state->bytes(), kv_bytes(KvType::kF32) - kv_bytes(kv_));
}

TEST_P(KvTypeTest, SavedStatesGoBackIntoModelsWithTheSameKvType) {
  test::TempDir tmp;
  const auto path = tmp.path() / "state.qhxs";
  Session original(*model_);
  const std::vector<int32_t> prompt(ids_.begin(), ids_.begin() + 20);
  run_turn(original, prompt, 4);
  original.save(path);
  std::vector<int32_t> history(original.tokens().begin(), original.tokens().end());
  history.insert(history.end(), ids_.begin() + 30, ids_.end());
  const Turn continued = run_turn(original, history);

  Session restored(*model_);
  restored.load(path);
  EXPECT_EQ(run_turn(restored, history).generated, continued.generated);

  const auto exact_model = load_model(dir_);
  Session other(*exact_model);
  expect_error([&] { other.load(path); }, {path.string(), std::string("keys.") + kv_type_name(kv_),
                                           "another KV type", "--kv-type"});
}

INSTANTIATE_TEST_SUITE_P(Models, KvTypeTest,
                         ::testing::Combine(::testing::Values("qwen3.5-kjv", "qwen3-kjv"),
                                            ::testing::Values(KvType::kF16, KvType::kQ8,
                                                              KvType::kQ4)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param);
                           std::erase_if(name, [](char c) { return !std::isalnum(c); });
                           return name + "_" + kv_type_name(std::get<1>(info.param));
                         });

class SessionStateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = load_model(test::source_dir() / "models" / "qwen3.5-kjv");
    Session session(*model_);
    run_turn(session, prompt_, 2);
    session.save(path_);
  }
  test::TempDir tmp_;
  std::filesystem::path path_ = tmp_.path() / "state.qhxs";
  std::vector<int32_t> prompt_ = {9707, 1879, 11, 323};
  std::unique_ptr<Model> model_;
};

TEST_F(SessionStateFileTest, RefusesAnotherModelsState) {
  const auto other = load_model(test::source_dir() / "models" / "qwen3-kjv");
  Session session(*other);
  expect_error([&] { session.load(path_); }, {path_.string(), "different model"});
}

TEST_F(SessionStateFileTest, RefusesTruncatedOrCorruptFiles) {
  const auto size = std::filesystem::file_size(path_);
  std::filesystem::resize_file(path_, size - 100);
  Session session(*model_);
  expect_error([&] { session.load(path_); }, {path_.string()});
  {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << "not a state";
  }
  expect_error([&] { session.load(path_); }, {path_.string()});
  EXPECT_TRUE(session.tokens().empty());  // a failed load leaves the session as it was
}

TEST(PrefixCacheTest, ASecondSessionStartsFromACachedPrompt) {
  const auto model = load_model(test::source_dir() / "models" / "qwen3.5-kjv");
  PrefixCache cache(64 << 20);
  const std::vector<int32_t> system = {9707, 1879, 11, 323, 279, 4244, 13, 576};
  Session a(*model, {}, &cache);
  const Turn from_a = run_turn(a, system);
  EXPECT_EQ(cache.entries(), 1);

  std::vector<int32_t> longer = system;
  longer.insert(longer.end(), {1879, 13});
  Session b(*model, {}, &cache);
  const Turn from_b = run_turn(b, longer);
  EXPECT_EQ(from_b.stats.n_reused, static_cast<int64_t>(system.size()));
  EXPECT_EQ(from_b.stats.n_processed, 2);
  Session fresh(*model);
  EXPECT_EQ(from_b.generated, run_turn(fresh, longer).generated);

  // The exact same prompt: no forward pass at all.
  Session c(*model, {}, &cache);
  const Turn from_c = run_turn(c, system);
  EXPECT_EQ(from_c.stats.n_processed, 0);
  EXPECT_EQ(from_c.generated, from_a.generated);
}

TEST(PrefixCacheTest, StaysWithinItsBound) {
  const auto model = load_model(test::source_dir() / "models" / "qwen3.5-kjv");
  Session probe(*model, {.max_checkpoints = 0});
  run_turn(probe, std::vector<int32_t>{1, 2, 3}, 0);
  const int64_t one_entry = probe.bytes();
  PrefixCache cache(one_entry * 5 / 2);
  for (int32_t i = 0; i < 6; ++i) {
    Session s(*model, {}, &cache);
    run_turn(s, std::vector<int32_t>{1, 2, i}, 0);
    EXPECT_LE(cache.bytes(), one_entry * 5 / 2);
  }
  EXPECT_EQ(cache.entries(), 2);
}

TEST(SessionLimitsTest, CancelStopsPrefillAtAChunkBoundary) {
  const auto model = load_model(test::source_dir() / "models" / "qwen3.5-kjv");
  Session session(*model, {.prefill_chunk = 4});
  std::atomic<bool> cancel{true};
  TurnOptions options;
  options.cancel = &cancel;
  const std::vector<int32_t> prompt(10, 9707);
  const TurnStats stats = session.generate(prompt, options, [](int32_t) { return true; });
  EXPECT_EQ(stats.stop, StopReason::kCancelled);
  EXPECT_EQ(stats.n_processed, 4);
  EXPECT_EQ(session.tokens().size(), 4u);
  cancel = false;
  const Turn resumed = run_turn(session, prompt, 3);  // picks up where it stopped
  EXPECT_EQ(resumed.stats.n_processed, 6);
}

// A constraint that allows one token per step, from a script, then ends the reply.
class ScriptedConstraint final : public TokenConstraint {
 public:
  explicit ScriptedConstraint(std::vector<int32_t> script) : script_(std::move(script)) {}
  bool allowed_next(std::span<uint32_t> words) override {
    std::fill(words.begin(), words.end(), 0u);
    const int32_t id = script_.at(at_);
    words[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    return true;
  }
  void accept(int32_t token) override {
    if (token != script_.at(at_)) fail("constraint", "off the script");
    ++at_;
  }
  bool finished() const override { return at_ == script_.size(); }

 private:
  std::vector<int32_t> script_;
  size_t at_ = 0;
};

TEST(SessionLimitsTest, AConstraintDecidesTheTokensAndEndsTheReplyWithoutDrafts) {
  const auto model = load_model(test::source_dir() / "models" / "qwen3.5-kjv");
  Session session(*model);
  const std::vector<int32_t> script = {11, 22, 33, 22, 11};
  ScriptedConstraint constraint(script);
  TurnOptions options;
  options.max_new_tokens = 20;
  options.constraint = &constraint;
  options.speculative.kind = DraftKind::kNgram;  // turned off by the constraint
  std::vector<int32_t> out;
  const TurnStats stats = session.generate(std::vector<int32_t>{9707, 11, 22, 33, 22, 11, 9707},
                                           options, [&](int32_t id) {
                                             out.push_back(id);
                                             return true;
                                           });
  EXPECT_EQ(out, script);
  EXPECT_EQ(stats.stop, StopReason::kStopId);
  EXPECT_EQ(stats.verify_passes, 0);
}

TEST(SessionLimitsTest, LogprobsAreTheModelsLogSoftmaxAtEachChosenTokenWithoutDrafts) {
  const auto model = load_model(test::source_dir() / "models" / "qwen3.5-kjv");
  Session session(*model);
  const std::vector<int32_t> prompt = {9707, 11, 22, 33, 22, 11, 9707};
  TurnOptions options;
  options.max_new_tokens = 8;
  options.sampling.greedy = false;
  options.sampling.temperature = 1.5f;  // the logprobs stay the model's, not the sampler's
  options.sampling.seed = 7;
  options.speculative.kind = DraftKind::kNgram;  // turned off by logprobs
  options.top_logprobs = 3;
  std::vector<TokenLogprobs> reported;
  std::vector<int32_t> out;
  options.on_logprobs = [&](const TokenLogprobs& lp) { reported.push_back(lp); };
  const TurnStats stats = session.generate(prompt, options, [&](int32_t id) {
    EXPECT_EQ(reported.size(), out.size() + 1);  // its log-probabilities come first
    out.push_back(id);
    return true;
  });
  EXPECT_EQ(stats.verify_passes, 0);
  ASSERT_EQ(reported.size(), out.size());
  // The reference: the model's logits for the whole sequence in one pass, row by row.
  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), out.begin(), out.end());
  auto state = model->new_state();
  std::vector<float> logits;
  model->forward(sequence, *state, LogitsFor::kEveryToken, logits);
  const size_t vocab = static_cast<size_t>(model->config().vocab_size);
  for (size_t i = 0; i < out.size(); ++i) {
    const std::span<const float> row(logits.data() + (prompt.size() - 1 + i) * vocab, vocab);
    double total = 0.0;
    const float max = *std::max_element(row.begin(), row.end());
    for (const float l : row) total += std::exp(static_cast<double>(l) - max);
    EXPECT_EQ(reported[i].token, out[i]);
    EXPECT_NEAR(reported[i].logprob, row[static_cast<size_t>(out[i])] - max - std::log(total), 1e-4)
        << i;
    ASSERT_EQ(reported[i].top_ids.size(), 3u);
    EXPECT_EQ(reported[i].top_ids[0], argmax(row)) << i;
    EXPECT_GE(reported[i].top_logprobs[0], reported[i].logprob);
  }
}

TEST(SessionLimitsTest, PromptsLongerThanTheContextAreRefused) {
  const auto model = load_model(test::source_dir() / "models" / "qwen3.5-kjv");
  Session session(*model, {.context_length = 16});
  const std::vector<int32_t> prompt(10, 9707);
  expect_error([&] { run_turn(session, prompt, 8); }, {"prompt", "context limit of 16"});
  expect_error([&] { run_turn(session, std::vector<int32_t>{-1}); }, {"prompt", "-1"});
  EXPECT_TRUE(session.tokens().empty());
}

TEST(SessionLimitsTest, ConcurrentSessionsMatchSequentialOnes) {
  const auto model = load_model(test::source_dir() / "models" / "qwen3.5-kjv");
  std::vector<std::vector<int32_t>> prompts = {{9707, 1879}, {323, 279, 4244}, {13, 576}};
  std::vector<std::vector<int32_t>> expected, got(prompts.size());
  for (const auto& p : prompts) {
    Session s(*model);
    expected.push_back(run_turn(s, p, 8).generated);
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      Session s(*model);
      got[i] = run_turn(s, prompts[i], 8).generated;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got, expected);
}

ModelConfig qwen3_0_6b() {
  ModelConfig c;
  c.vocab_size = 151936;
  c.hidden_size = 1024;
  c.intermediate_size = 3072;
  c.num_layers = 28;
  c.num_heads = 16;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.layer_types.assign(28, LayerKind::kFullAttention);
  c.max_position_embeddings = 40960;
  return c;
}

TEST(MemoryAdmissionTest, KvCacheGrowsWithContextAndSessions) {
  const ModelConfig c = qwen3_0_6b();
  MemoryRequest r{.weights_bytes = 600'000'000, .context_length = 1024};
  const MemoryPlan one = plan_memory(c, r);
  EXPECT_EQ(one.kv_cache, 28 * 2 * 8 * 128 * 4 * 1024);  // 224 MiB
  EXPECT_EQ(one.recurrent, 0);
  r.sessions = 4;
  EXPECT_EQ(plan_memory(c, r).kv_cache, 4 * one.kv_cache);
  r.sessions = 1;
  r.kv_type = KvType::kQ8;  // 128 int8 and one f32 scale per head: 33 floats for 128
  EXPECT_EQ(plan_memory(c, r).kv_cache, 28 * 2 * 8 * 33 * 4 * 1024);
}

TEST(MemoryAdmissionTest, LowersAnUnspecifiedContextAndRefusesAnExplicitOne) {
  const ModelConfig c = qwen3_0_6b();
  const MemoryRequest r{.weights_bytes = 600'000'000};
  const int64_t available = 2'000'000'000;
  std::string note;
  const int64_t context = admit_context(c, r, 0, available, &note);
  EXPECT_LT(context, c.max_position_embeddings);
  EXPECT_GT(context, 4096);
  EXPECT_NE(note.find("lowered to " + std::to_string(context)), std::string::npos) << note;
  MemoryRequest at = r;
  at.context_length = context;
  EXPECT_LE(plan_memory(c, at).total(), available);
  at.context_length = context + 1;
  EXPECT_GT(plan_memory(c, at).total(), available);

  EXPECT_EQ(admit_context(c, r, 2048, available, nullptr), 2048);
  expect_error([&] { admit_context(c, r, 40000, available, nullptr); },
               {"memory", "40000 tokens", "KV cache", std::to_string(context) + " tokens fits"});
  expect_error([&] { admit_context(c, r, 0, 500'000'000, nullptr); }, {"does not fit"});
  expect_error([&] { admit_context(c, r, 50000, available, nullptr); },
               {"context", "max_position_embeddings"});
}

}  // namespace
}  // namespace qhx
