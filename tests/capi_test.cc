// The C API: statuses and messages, buffers, generation through sessions, cancellation, state
// files. Generation results are checked against the C++ Session they wrap.
#include "qhx/qhx.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/thread_pool.h"
#include "models/model.h"
#include "runtime/session.h"
#include "support/fixtures.h"

namespace {

const std::string kModel = (qhx::test::source_dir() / "models" / "qwen3.5-kjv").string();

struct ModelHandle {
  qhx_model* model = nullptr;
  explicit ModelHandle(const qhx_model_options* options = nullptr,
                       const std::string& dir = kModel) {
    EXPECT_EQ(qhx_model_open(dir.c_str(), options, &model), QHX_OK) << qhx_last_error();
  }
  ~ModelHandle() { qhx_model_close(model); }
};

struct SessionHandle {
  qhx_session* session = nullptr;
  explicit SessionHandle(qhx_model* model) {
    EXPECT_EQ(qhx_session_create(model, nullptr, &session), QHX_OK) << qhx_last_error();
  }
  ~SessionHandle() { qhx_session_destroy(session); }
};

std::vector<int32_t> tokenize(qhx_model* model, const std::string& text) {
  size_t n = 0;
  EXPECT_EQ(qhx_tokenize(model, text.data(), text.size(), nullptr, 0, &n),
            text.empty() ? QHX_OK : QHX_ERROR_BUFFER_TOO_SMALL);
  std::vector<int32_t> ids(n);
  EXPECT_EQ(qhx_tokenize(model, text.data(), text.size(), ids.data(), ids.size(), &n), QHX_OK);
  return ids;
}

struct Collected {
  std::vector<int32_t> ids;
  std::string text;
  int stop_after = -1;  // stop via the callback after this many tokens
};

int collect(void* user, int32_t token, const char* text, size_t len) {
  auto* c = static_cast<Collected*>(user);
  if (token >= 0) c->ids.push_back(token);
  c->text.append(text, len);
  return c->stop_after >= 0 && static_cast<int>(c->ids.size()) >= c->stop_after;
}

qhx_generate_options greedy(qhx_model* model, int64_t n) {
  qhx_generate_options options;
  EXPECT_EQ(qhx_generate_options_default(model, &options), QHX_OK);
  options.sampling.greedy = 1;
  options.max_new_tokens = n;
  return options;
}

TEST(CApiTest, OpeningAMissingModelNamesIt) {
  qhx_model* model = reinterpret_cast<qhx_model*>(1);
  EXPECT_EQ(qhx_model_open("/nonexistent/model", nullptr, &model), QHX_ERROR_MODEL);
  EXPECT_EQ(model, nullptr);
  EXPECT_NE(std::string(qhx_last_error()).find("/nonexistent/model"), std::string::npos)
      << qhx_last_error();
  EXPECT_EQ(qhx_model_open(nullptr, nullptr, &model), QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("path is NULL"), std::string::npos);
}

// n_threads 0 means every hardware thread the process may use, for the kernels too.
TEST(CApiTest, ZeroThreadsMeansEveryHardwareThread) {
  qhx_model_options options;
  qhx_model_options_default(&options);
  EXPECT_EQ(options.n_threads, 0);
  for (const int32_t asked : {1, 0}) {
    options.n_threads = asked;
    ModelHandle m(&options);
    qhx_model_info info;
    ASSERT_EQ(qhx_model_get_info(m.model, &info), QHX_OK);
    const int expected = asked > 0 ? asked : qhx::hardware_threads();
    EXPECT_EQ(info.n_threads, expected);  // the threads of the model's context
  }
  EXPECT_GE(qhx::hardware_threads(), 1);
  EXPECT_LE(qhx::hardware_threads(),
            static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

TEST(CApiTest, ModelInfo) {
  ModelHandle m;
  qhx_model_info info;
  ASSERT_EQ(qhx_model_get_info(m.model, &info), QHX_OK);
  EXPECT_STREQ(info.name, "qwen3.5-kjv");
  EXPECT_STREQ(info.family, "qwen3_5");
  EXPECT_GT(info.vocab_size, 150000);
  EXPECT_GT(info.context_length, 0);
  EXPECT_GT(info.memory_estimate, 0);
  ASSERT_GE(info.n_eos_ids, 1u);
  EXPECT_EQ(info.has_chat_template, 1);
}

TEST(CApiTest, TokenizeAndDetokenizeRoundTripWithBufferSizes) {
  ModelHandle m;
  const std::string text = "In the beginning God created the heaven and the earth. ✝";
  const std::vector<int32_t> ids = tokenize(m.model, text);
  ASSERT_FALSE(ids.empty());
  size_t len = 0;
  EXPECT_EQ(qhx_detokenize(m.model, ids.data(), ids.size(), 0, nullptr, 0, &len),
            QHX_ERROR_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, text.size());
  std::string out(len + 1, '?');
  ASSERT_EQ(qhx_detokenize(m.model, ids.data(), ids.size(), 0, out.data(), out.size(), &len),
            QHX_OK);
  EXPECT_EQ(out.c_str(), text);
  const std::string bad = "bad \xff utf-8";
  size_t n = 0;
  EXPECT_EQ(qhx_tokenize(m.model, bad.data(), bad.size(), nullptr, 0, &n),
            QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("invalid UTF-8"), std::string::npos);
}

// Ids past the model's vocabulary are the caller's mistake; padding rows (ids the model has and
// the tokenizer does not) decode to nothing, as in transformers.
TEST(CApiTest, DetokenizeRefusesIdsOutsideTheVocabulary) {
  ModelHandle m;
  qhx_model_info info;
  ASSERT_EQ(qhx_model_get_info(m.model, &info), QHX_OK);
  char text[64];
  size_t len = 0;
  for (const int32_t id : {-1, static_cast<int32_t>(info.vocab_size)}) {
    const int32_t ids[] = {785, id};
    EXPECT_EQ(qhx_detokenize(m.model, ids, 2, 0, text, sizeof text, &len),
              QHX_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(qhx_last_error()).find("ids[1]"), std::string::npos) << qhx_last_error();
  }
  const int32_t last = static_cast<int32_t>(info.vocab_size - 1);
  EXPECT_EQ(qhx_detokenize(m.model, &last, 1, 0, text, sizeof text, &len), QHX_OK);
}

// A FIFO (or any file that is not a regular one) where a model's file should be is refused at
// once, not waited on.
TEST(CApiTest, ModelFilesMustBeRegularFiles) {
  qhx::test::TempDir tmp;
  for (const char* name : {"config.json", "tokenizer.json", "model.safetensors"}) {
    std::filesystem::remove_all(tmp.path() / "model");
    std::filesystem::copy(kModel, tmp.path() / "model");
    const std::filesystem::path fifo = tmp.path() / "model" / name;
    std::filesystem::remove(fifo);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    qhx_model* model = nullptr;
    EXPECT_NE(qhx_model_open((tmp.path() / "model").c_str(), nullptr, &model), QHX_OK) << name;
    EXPECT_NE(std::string(qhx_last_error()).find(std::string(name) + ": not a regular file"),
              std::string::npos)
        << qhx_last_error();
  }
}

// A save that fails leaves nothing behind, not even its partial file.
TEST(CApiTest, FailedSaveLeavesNothing) {
  ModelHandle m;
  SessionHandle s(m.model);
  qhx::test::TempDir tmp;
  // The target is a directory: the state is written, then cannot be renamed over it.
  const std::filesystem::path target = tmp.path() / "taken";
  std::filesystem::create_directory(target);
  EXPECT_NE(qhx_session_save(s.session, target.c_str()), QHX_OK);
  EXPECT_EQ(qhx_session_save(s.session, "/nonexistent/dir/state"), QHX_ERROR_STATE_FILE);
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.path())) entries += e.exists();
  EXPECT_EQ(entries, 1u);  // "taken" alone
}

TEST(CApiTest, GenerationMatchesTheSessionItWraps) {
  ModelHandle m;
  SessionHandle s(m.model);
  const std::vector<int32_t> prompt = tokenize(m.model, "And it came to pass");
  const qhx_generate_options options = greedy(m.model, 16);
  Collected got;
  qhx_generate_result result;
  ASSERT_EQ(qhx_session_generate(s.session, prompt.data(), prompt.size(), &options, collect, &got,
                                 &result),
            QHX_OK)
      << qhx_last_error();

  const auto model = qhx::load_model(kModel);
  qhx::Session session(*model);
  qhx::TurnOptions turn;
  turn.max_new_tokens = 16;
  std::vector<int32_t> expected;
  session.generate(prompt, turn, [&](int32_t id) {
    expected.push_back(id);
    return true;
  });
  EXPECT_EQ(got.ids, expected);
  EXPECT_EQ(result.n_generated, 16);
  EXPECT_EQ(result.n_prompt, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(result.stop_reason, QHX_STOP_LENGTH);
  EXPECT_EQ(got.text, result.text);
  size_t len = 0;
  std::string decoded(4096, '\0');
  qhx_detokenize(m.model, expected.data(), expected.size(), 0, decoded.data(), decoded.size(),
                 &len);
  EXPECT_EQ(std::string(result.text), decoded.substr(0, len));
  qhx_string_free(result.text);
}

// The log-probabilities of each token are readable during its callback, equal to the session's
// own, and nowhere else; the token's bytes come with them.
struct LogprobsSeen {
  qhx_session* session = nullptr;
  std::vector<qhx::TokenLogprobs> seen;
  int outside = 0;  // callbacks without an entry (the text released at the end)
};

int collect_logprobs(void* user, int32_t token, const char* /*text*/, size_t /*len*/) {
  auto* c = static_cast<LogprobsSeen*>(user);
  qhx_token_logprobs lp;
  if (qhx_session_token_logprobs(c->session, &lp) != QHX_OK) {
    ++c->outside;
    return 0;
  }
  EXPECT_EQ(lp.token, token);
  c->seen.push_back({lp.token,
                     lp.logprob,
                     {lp.top_tokens, lp.top_tokens + lp.n_top},
                     {lp.top_logprobs, lp.top_logprobs + lp.n_top}});
  return 0;
}

TEST(CApiTest, LogprobsComeWithEachTokensCallback) {
  ModelHandle m;
  SessionHandle s(m.model);
  const std::vector<int32_t> prompt = tokenize(m.model, "And it came to pass");
  qhx_generate_options options = greedy(m.model, 12);
  options.logprobs = 1;
  options.top_logprobs = 4;
  LogprobsSeen got{s.session, {}, 0};
  ASSERT_EQ(qhx_session_generate(s.session, prompt.data(), prompt.size(), &options,
                                 collect_logprobs, &got, nullptr),
            QHX_OK)
      << qhx_last_error();
  qhx_token_logprobs after;
  EXPECT_EQ(qhx_session_token_logprobs(s.session, &after), QHX_ERROR_INVALID_ARGUMENT);

  const auto model = qhx::load_model(kModel);
  qhx::Session session(*model);
  qhx::TurnOptions turn;
  turn.max_new_tokens = 12;
  turn.top_logprobs = 4;
  std::vector<qhx::TokenLogprobs> expected;
  turn.on_logprobs = [&](const qhx::TokenLogprobs& lp) { expected.push_back(lp); };
  session.generate(prompt, turn, [](int32_t) { return true; });
  ASSERT_EQ(got.seen.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(got.seen[i].token, expected[i].token);
    EXPECT_EQ(got.seen[i].logprob, expected[i].logprob);
    EXPECT_EQ(got.seen[i].top_ids, expected[i].top_ids);
    EXPECT_EQ(got.seen[i].top_ids.front(), expected[i].token);  // greedy
  }

  options.top_logprobs = 21;
  EXPECT_EQ(qhx_generate_options_check(m.model, &options), QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("top_logprobs"), std::string::npos);
  // A token's bytes: what detokenizing it alone gives, for a whole-character token.
  char bytes[8];
  size_t n = 0;
  const std::vector<int32_t> and_id = tokenize(m.model, "And");
  ASSERT_EQ(and_id.size(), 1u);
  ASSERT_EQ(qhx_token_bytes(m.model, and_id[0], bytes, sizeof bytes, &n), QHX_OK);
  EXPECT_EQ(std::string(bytes, n), "And");
  EXPECT_EQ(qhx_token_bytes(m.model, and_id[0], bytes, 1, &n), QHX_ERROR_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(qhx_token_bytes(m.model, -1, bytes, sizeof bytes, &n), QHX_ERROR_INVALID_ARGUMENT);
}

// Two models, each on a context of its own (1 and 2 threads), driven from four threads at once
// (two sessions per model, each with its own prompt, for two turns): every reply equals what the
// same session gives run alone. Under ThreadSanitizer this is also the race check of the contexts.
TEST(CApiTest, TwoModelsWithTheirOwnThreadsGenerateFromFourThreadsAsTheyDoAlone) {
  qhx_model_options one_thread, two_threads;
  qhx_model_options_default(&one_thread);
  qhx_model_options_default(&two_threads);
  one_thread.n_threads = 1;
  two_threads.n_threads = 2;
  one_thread.context_length = two_threads.context_length = 256;
  ModelHandle qwen35(&one_thread);
  ModelHandle qwen3(&two_threads, (qhx::test::source_dir() / "models" / "qwen3-kjv").string());
  struct Job {
    qhx_model* model;
    std::string prompts[2];
    std::vector<int32_t> alone[2] = {}, together[2] = {};
  };
  Job jobs[] = {{qwen35.model, {"In the beginning", "And the LORD said"}},
                {qwen35.model, {"Blessed are the", "And Jesus answered"}},
                {qwen3.model, {"The LORD is my", "And God said"}},
                {qwen3.model, {"Now the serpent", "Then said he"}}};
  const auto run = [](Job& job, std::vector<int32_t>(&out)[2]) {
    SessionHandle s(job.model);
    for (int turn = 0; turn < 2; ++turn) {
      const std::vector<int32_t> prompt = tokenize(job.model, job.prompts[turn]);
      const qhx_generate_options options = greedy(job.model, 20);
      Collected got;
      qhx_generate_result result;
      ASSERT_EQ(qhx_session_generate(s.session, prompt.data(), prompt.size(), &options, collect,
                                     &got, &result),
                QHX_OK)
          << qhx_last_error();
      qhx_string_free(result.text);
      out[turn] = got.ids;
    }
  };
  for (Job& job : jobs) run(job, job.alone);
  std::vector<std::thread> threads;
  for (Job& job : jobs) threads.emplace_back([&] { run(job, job.together); });
  for (std::thread& t : threads) t.join();
  for (const Job& job : jobs) {
    for (int turn = 0; turn < 2; ++turn) {
      EXPECT_EQ(job.together[turn].size(), 20u) << job.prompts[turn];
      EXPECT_EQ(job.together[turn], job.alone[turn]) << job.prompts[turn];
    }
  }
}

TEST(CApiTest, CallbackAndCancelStopGeneration) {
  ModelHandle m;
  SessionHandle s(m.model);
  const std::vector<int32_t> prompt = tokenize(m.model, "And the LORD spake");
  const qhx_generate_options options = greedy(m.model, 40);
  Collected got;
  got.stop_after = 3;
  qhx_generate_result result;
  ASSERT_EQ(qhx_session_generate(s.session, prompt.data(), prompt.size(), &options, collect, &got,
                                 &result),
            QHX_OK);
  EXPECT_EQ(result.stop_reason, QHX_STOP_CALLBACK);
  EXPECT_EQ(got.ids.size(), 3u);
  qhx_string_free(result.text);

  // A cancel while nothing runs does not reach the next generation.
  qhx_session_cancel(s.session);
  Collected next;
  ASSERT_EQ(qhx_session_generate(s.session, prompt.data(), prompt.size(), &options, collect, &next,
                                 &result),
            QHX_OK);
  EXPECT_EQ(result.stop_reason, QHX_STOP_LENGTH);
  EXPECT_EQ(next.ids.size(), 40u);
  qhx_string_free(result.text);

  // From another thread, mid-generation.
  struct Slow {
    Collected collected;
    std::atomic<int> seen{0};
  } slow;
  std::thread canceller([&] {
    while (slow.seen.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    qhx_session_cancel(s.session);
  });
  const auto count = [](void* user, int32_t, const char*, size_t) {
    auto* w = static_cast<Slow*>(user);
    ++w->seen;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return 0;
  };
  ASSERT_EQ(qhx_session_generate(s.session, prompt.data(), prompt.size(), &options, count, &slow,
                                 &result),
            QHX_OK);
  canceller.join();
  EXPECT_EQ(result.stop_reason, QHX_STOP_CANCELLED);
  EXPECT_LT(result.n_generated, 40);
  qhx_string_free(result.text);
}

TEST(CApiTest, ContextLimitAndBadOptionsAreErrorsNotCrashes) {
  qhx_model_options mo;
  qhx_model_options_default(&mo);
  mo.context_length = 32;
  ModelHandle m(&mo);
  SessionHandle s(m.model);
  const std::vector<int32_t> prompt(30, 9707);
  qhx_generate_options options = greedy(m.model, 8);
  EXPECT_EQ(qhx_session_generate(s.session, prompt.data(), prompt.size(), &options, nullptr,
                                 nullptr, nullptr),
            QHX_ERROR_CONTEXT_FULL);
  EXPECT_NE(std::string(qhx_last_error()).find("context limit of 32"), std::string::npos);
  options.sampling.greedy = 0;
  options.sampling.temperature = -1;
  EXPECT_EQ(qhx_session_generate(s.session, prompt.data(), 4, &options, nullptr, nullptr, nullptr),
            QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("temperature"), std::string::npos);
  EXPECT_EQ(qhx_session_generate(s.session, nullptr, 3, &options, nullptr, nullptr, nullptr),
            QHX_ERROR_INVALID_ARGUMENT);
  const int32_t outside = 1 << 30;
  options.sampling.greedy = 1;
  EXPECT_EQ(qhx_session_generate(s.session, &outside, 1, &options, nullptr, nullptr, nullptr),
            QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("outside the vocabulary"), std::string::npos);

  mo.context_length = 1 << 30;
  qhx_model* too_long = nullptr;
  EXPECT_EQ(qhx_model_open(kModel.c_str(), &mo, &too_long), QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("max_position_embeddings"), std::string::npos);
}

TEST(CApiTest, SavedSessionContinuesLikeTheOriginal) {
  ModelHandle m;
  qhx::test::TempDir tmp;
  const std::string path = (tmp.path() / "session.qhxs").string();
  std::vector<int32_t> history = tokenize(m.model, "And God said, Let there be light");
  const qhx_generate_options options = greedy(m.model, 8);
  SessionHandle original(m.model);
  Collected first;
  ASSERT_EQ(qhx_session_generate(original.session, history.data(), history.size(), &options,
                                 collect, &first, nullptr),
            QHX_OK);
  ASSERT_EQ(qhx_session_save(original.session, path.c_str()), QHX_OK) << qhx_last_error();
  history.insert(history.end(), first.ids.begin(), first.ids.end());
  const std::vector<int32_t> more = tokenize(m.model, " and there was");
  history.insert(history.end(), more.begin(), more.end());
  Collected continued;
  ASSERT_EQ(qhx_session_generate(original.session, history.data(), history.size(), &options,
                                 collect, &continued, nullptr),
            QHX_OK);

  SessionHandle restored(m.model);
  ASSERT_EQ(qhx_session_load(restored.session, path.c_str()), QHX_OK) << qhx_last_error();
  EXPECT_EQ(qhx_session_reusable(restored.session, history.data(), history.size()),
            static_cast<int64_t>(history.size() - more.size() - 1));
  Collected after;
  qhx_generate_result result;
  ASSERT_EQ(qhx_session_generate(restored.session, history.data(), history.size(), &options,
                                 collect, &after, &result),
            QHX_OK);
  EXPECT_EQ(after.ids, continued.ids);
  EXPECT_EQ(result.n_processed, static_cast<int64_t>(more.size()) + 1);
  qhx_string_free(result.text);

  EXPECT_EQ(qhx_session_load(restored.session, "/nonexistent/state"), QHX_ERROR_STATE_FILE);
  EXPECT_NE(std::string(qhx_last_error()).find("/nonexistent/state"), std::string::npos);
}

std::string chat_request(const std::vector<std::pair<std::string, std::string>>& messages) {
  nlohmann::json request = {{"messages", nlohmann::json::array()}};
  for (const auto& [role, content] : messages) {
    request["messages"].push_back({{"role", role}, {"content", content}});
  }
  return request.dump();
}

// The acceptance check: five turns through one session give exactly the replies of five
// fresh sessions each given the whole history, and each turn runs only the tokens the session
// has not seen. With thinking off, Qwen3's template renders a generation prompt with an empty
// think block but earlier replies without it, so each turn also reruns the previous reply, from
// the checkpoint at its header. Qwen3.5's template (qwen3.5-tiny-random: the real vocabulary and
// template) has thinking off unless it is asked for, so its default turns are like that too.
class FiveTurnChat : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(FiveTurnChat, ReusesStateAndMatchesFreshRuns) {
  const auto& [model_name, enable_thinking] = GetParam();
  ModelHandle m(nullptr, (qhx::test::source_dir() / "models" / model_name).string());
  const bool thinking_off = enable_thinking == 0 || model_name == "qwen3.5-tiny-random";
  SessionHandle chat(m.model);
  const qhx_generate_options options = greedy(m.model, 16);
  qhx_template_options template_options;
  qhx_template_options_default(&template_options);
  template_options.enable_thinking = enable_thinking;
  const char* const questions[] = {"And it came to pass", "Who begat whom?", "Tell of the flood.",
                                   "And the LORD said", "Amen."};
  std::vector<std::pair<std::string, std::string>> messages;
  int64_t previous_prompt = 0, previous_generated = 0;
  for (int turn = 0; turn < 5; ++turn) {
    messages.emplace_back("user", questions[turn]);
    const std::string request = chat_request(messages);
    Collected reused;
    qhx_generate_result r;
    ASSERT_EQ(qhx_session_chat(chat.session, request.c_str(), &template_options, &options, collect,
                               &reused, &r),
              QHX_OK)
        << qhx_last_error();
    SessionHandle fresh(m.model);
    Collected scratch;
    qhx_generate_result f;
    ASSERT_EQ(qhx_session_chat(fresh.session, request.c_str(), &template_options, &options, collect,
                               &scratch, &f),
              QHX_OK);
    EXPECT_EQ(reused.ids, scratch.ids) << "turn " << turn;
    EXPECT_EQ(f.n_processed, f.n_prompt);
    if (turn > 0 && !thinking_off) {
      // Up to the end of the previous reply (its last token was chosen but not yet run).
      EXPECT_EQ(r.n_reused, previous_prompt + previous_generated - 1) << "turn " << turn;
    } else if (turn > 0) {
      // Up to the previous generation prompt's "<|im_start|>", 7 tokens before its end
      // ("<|im_start|>assistant\n<think>\n\n</think>\n\n").
      EXPECT_EQ(r.n_reused, previous_prompt - 7) << "turn " << turn;
    }
    std::printf("thinking %d, turn %d: prompt %lld tokens, processed %lld (fresh: %lld)\n",
                enable_thinking, turn + 1, static_cast<long long>(r.n_prompt),
                static_cast<long long>(r.n_processed), static_cast<long long>(f.n_processed));
    previous_prompt = r.n_prompt;
    previous_generated = r.n_generated;
    messages.emplace_back("assistant", r.text);
    qhx_string_free(r.text);
    qhx_string_free(f.text);
  }
}

INSTANTIATE_TEST_SUITE_P(CApiTest, FiveTurnChat,
                         ::testing::Combine(::testing::Values("qwen3.5-kjv", "qwen3.5-tiny-random"),
                                            ::testing::Values(-1, 0)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param);
                           std::erase_if(name, [](char c) { return !std::isalnum(c); });
                           return name +
                                  (std::get<1>(info.param) < 0 ? "TemplateDefault" : "ThinkingOff");
                         });

TEST(CApiTest, ChatTemplateRendersAndReportsErrors) {
  ModelHandle m;  // it ships the genuine Qwen3 template
  char* text = nullptr;
  // Hugging Face's rendering of the same request (shared fixture, made by transformers).
  std::ifstream cases(qhx::test::tokenizer_fixture_dir("qwen3") / "chat.jsonl");
  nlohmann::json expected;
  for (std::string line; std::getline(cases, line);) {
    expected = nlohmann::json::parse(line);
    if (expected["name"] == "user_gen_think_false") break;
  }
  ASSERT_EQ(expected["name"], "user_gen_think_false");
  const std::string request = nlohmann::json{{"messages", expected["messages"]}}.dump();
  qhx_template_options options;
  qhx_template_options_default(&options);
  options.enable_thinking = 0;
  ASSERT_EQ(qhx_apply_chat_template(m.model, request.c_str(), &options, &text), QHX_OK)
      << qhx_last_error();
  EXPECT_EQ(std::string(text), expected["text"].get<std::string>());
  qhx_string_free(text);
  EXPECT_EQ(qhx_apply_chat_template(m.model, "{\"messages\": 5}", nullptr, &text),
            QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("messages"), std::string::npos);
  EXPECT_EQ(qhx_apply_chat_template(m.model, "{\"messages\": [", nullptr, &text),
            QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("invalid JSON"), std::string::npos);
  // The Qwen3 template reads message.content as a string: a number makes it fail, with a line.
  EXPECT_EQ(qhx_apply_chat_template(
                m.model, "{\"messages\": [{\"role\": \"user\", \"content\": 1}]}", nullptr, &text),
            QHX_ERROR_TEMPLATE);
  EXPECT_NE(std::string(qhx_last_error()).find("chat_template:"), std::string::npos)
      << qhx_last_error();
}

TEST(CApiTest, StopStringsEndGenerationAndAreNotReported) {
  ModelHandle m;
  SessionHandle s(m.model);
  const std::vector<int32_t> prompt = tokenize(m.model, "And it came to pass");
  qhx_generate_options options = greedy(m.model, 32);
  Collected full;
  qhx_generate_result r;
  ASSERT_EQ(
      qhx_session_generate(s.session, prompt.data(), prompt.size(), &options, collect, &full, &r),
      QHX_OK);
  const std::string text = r.text;
  qhx_string_free(r.text);
  // Stop at the first ", " the greedy text contains.
  const size_t at = text.find(", ");
  ASSERT_NE(at, std::string::npos) << text;
  const char* stops[] = {"never appears", ", "};
  options.stop_strings = stops;
  options.n_stop_strings = 2;
  Collected cut;
  ASSERT_EQ(
      qhx_session_generate(s.session, prompt.data(), prompt.size(), &options, collect, &cut, &r),
      QHX_OK);
  EXPECT_EQ(r.stop_reason, QHX_STOP_STRING);
  EXPECT_EQ(std::string(r.text), text.substr(0, at));
  EXPECT_EQ(cut.text, text.substr(0, at));
  EXPECT_LT(r.n_generated, 32);
  qhx_string_free(r.text);
}

}  // namespace
