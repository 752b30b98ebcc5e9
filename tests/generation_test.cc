// Generation around the model: the sampler's distributions against transformers' logits
// processors (tests/fixtures/sampling, tools/oracle/make_sampling_fixtures.py), stop strings
// over streamed text, and generation_config.json defaults.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "runtime/generation_config.h"
#include "runtime/sampler.h"
#include "runtime/stop_strings.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "util/json_file.h"

namespace qhx {
namespace {

SamplingParams params_of(const Json& j) {
  SamplingParams p;
  p.greedy = j.value("greedy", false);
  p.temperature = j.value("temperature", 1.0f);
  p.top_k = j.value("top_k", int64_t{0});
  p.top_p = j.value("top_p", 1.0f);
  p.min_p = j.value("min_p", 0.0f);
  p.repetition_penalty = j.value("repetition_penalty", 1.0f);
  p.presence_penalty = j.value("presence_penalty", 0.0f);
  p.frequency_penalty = j.value("frequency_penalty", 0.0f);
  for (const Json& bias : j.value("logit_bias", Json::array())) {
    p.logit_bias.emplace_back(bias[0].get<int32_t>(), bias[1].get<float>());
  }
  return p;
}

TEST(SamplingGolden, DistributionsMatchTransformers) {
  const Json fixture = read_json_file("tests/fixtures/sampling/distributions.json");
  ASSERT_GE(fixture["cases"].size(), 8u);
  for (const Json& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto logits = c["logits"].get<std::vector<float>>();
    const auto prompt = c["prompt"].get<std::vector<int32_t>>();
    const auto generated = c["generated"].get<std::vector<int32_t>>();
    Sampler sampler(params_of(c["params"]));
    const std::vector<TokenProb> dist = sampler.distribution(logits, prompt, generated);
    const Json& expected = c["expected"];
    ASSERT_EQ(dist.size(), expected.size());
    for (size_t i = 0; i < dist.size(); ++i) {
      EXPECT_EQ(dist[i].id, expected[i][0].get<int32_t>());
      EXPECT_NEAR(dist[i].prob, expected[i][1].get<double>(), 1e-6) << "id " << dist[i].id;
    }
    // A draw lands on a survivor.
    const int32_t token = sampler.sample(logits, prompt, generated);
    bool survivor = false;
    for (const TokenProb& t : dist) survivor = survivor || t.id == token;
    EXPECT_TRUE(survivor) << token;
  }
}

// Feeds the pieces one at a time; returns the emitted text (flushed unless stopped) and whether a
// stop string completed.
std::pair<std::string, bool> stream(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& piece : pieces) {
    const StopStringMatcher::Piece p = m.push(piece);
    out += p.text;
    if (p.stopped) return {out, true};
  }
  return {out + m.flush(), false};
}

TEST(StopStrings, NoStopStringsPassTextThrough) {
  StopStringMatcher m({});
  EXPECT_EQ(m.push("Hello").text, "Hello");
  EXPECT_EQ(m.push(" world").text, " world");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, HoldsBackAPossibleStartAndReleasesIt) {
  StopStringMatcher m({"</end>"});
  EXPECT_EQ(m.push("abc</").text, "abc");  // "</" may begin the stop string
  EXPECT_EQ(m.push("en").text, "");
  EXPECT_EQ(m.push("x").text, "</enx");  // it did not
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("tail <").text, "tail ");
  EXPECT_EQ(m.flush(), "<");  // the end of generation releases what is held
}

TEST(StopStrings, StopSpanningSeveralPiecesCutsEverythingFromIt) {
  StopStringMatcher m({"\n\nUser:"});
  EXPECT_EQ(stream(m, {"Sure.", "\n", "\nUs", "er", ":", " more"}),
            (std::pair<std::string, bool>{"Sure.", true}));
  EXPECT_TRUE(m.stopped());
  EXPECT_TRUE(m.push("later").stopped);
  EXPECT_EQ(m.push("later").text, "");
  EXPECT_EQ(m.flush(), "");

  StopStringMatcher inside({"STOP"});
  EXPECT_EQ(stream(inside, {"abSTOPcd"}), (std::pair<std::string, bool>{"ab", true}));
}

TEST(StopStrings, EarliestOfSeveralWins) {
  StopStringMatcher m({"cd", "bcde"});
  // Both complete in the same piece: the one that starts first wins.
  EXPECT_EQ(stream(m, {"ab", "cdef"}), (std::pair<std::string, bool>{"a", true}));
  StopStringMatcher overlap({"aab"});
  EXPECT_EQ(stream(overlap, {"a", "a", "a", "b"}), (std::pair<std::string, bool>{"a", true}));
}

TEST(StopStrings, MultiByteUtf8) {
  // "→" is E2 86 92; "é" is C3 A9. Pieces may split a character's bytes.
  StopStringMatcher m({"é→"});
  EXPECT_EQ(stream(m, {"caf\xC3", "\xA9", "\xE2\x86", "\x92 x"}),
            (std::pair<std::string, bool>{"caf", true}));
  StopStringMatcher near({"é→"});
  EXPECT_EQ(stream(near, {"café", "→"}), (std::pair<std::string, bool>{"caf", true}));
  StopStringMatcher miss({"é→"});
  EXPECT_EQ(stream(miss, {"café", "!", "→"}), (std::pair<std::string, bool>{"café!→", false}));
  // A held suffix starts on a character boundary: "é" is not split from its lead byte.
  StopStringMatcher held({"éa"});
  EXPECT_EQ(held.push("xé").text, "x");
}

TEST(StopStrings, RejectsEmptyAndInvalidStopStrings) {
  test::expect_error([] { StopStringMatcher m({"ok", ""}); }, {"stop string", "empty"});
  test::expect_error([] { StopStringMatcher m({"\xC3"}); }, {"stop string", "UTF-8"});
}

class GenerationConfigTest : public ::testing::Test {
 protected:
  void write(const std::string& text) {
    std::ofstream(dir_.path() / "generation_config.json") << text;
  }
  GenerationDefaults load() { return load_generation_config(dir_.path(), config_); }
  test::TempDir dir_;
  ModelConfig config_ = [] {
    ModelConfig c;
    c.vocab_size = 151936;
    c.eos_token_ids = {151645};
    return c;
  }();
};

TEST_F(GenerationConfigTest, AbsentFileIsGreedyWithTheConfigsEos) {
  const GenerationDefaults d = load();
  EXPECT_TRUE(d.sampling.greedy);
  EXPECT_EQ(d.sampling.top_k, 50);  // transformers' default once sampling is asked for
  EXPECT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_EQ(d.eos_ids, (std::vector<int32_t>{151645}));
  EXPECT_FALSE(d.max_new_tokens.has_value());
}

TEST_F(GenerationConfigTest, ReadsQwenStyleFile) {
  write(R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
      "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.05,
      "repetition_penalty": 1.1, "max_new_tokens": 300, "transformers_version": "4.51.0"})");
  const GenerationDefaults d = load();
  EXPECT_FALSE(d.sampling.greedy);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.6f);
  EXPECT_EQ(d.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 0.95f);
  EXPECT_FLOAT_EQ(d.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(d.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(d.eos_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_EQ(d.max_new_tokens, 300);
}

TEST_F(GenerationConfigTest, UnsetFieldsTakeTransformersDefaults) {
  write(R"({"do_sample": true, "eos_token_id": 7, "top_p": null, "num_beams": 1,
      "bad_words_ids": null, "suppress_tokens": [], "max_length": 100, "use_cache": true})");
  const GenerationDefaults d = load();
  EXPECT_FALSE(d.sampling.greedy);
  EXPECT_EQ(d.sampling.top_k, 50);
  EXPECT_EQ(d.sampling.top_p, 1.0f);
  EXPECT_EQ(d.sampling.min_p, 0.0f);
  EXPECT_EQ(d.eos_ids, (std::vector<int32_t>{7}));
  write(R"({"temperature": 0.7})");  // no do_sample: greedy, and eos from config.json
  EXPECT_TRUE(load().sampling.greedy);
  EXPECT_EQ(load().eos_ids, (std::vector<int32_t>{151645}));
}

TEST_F(GenerationConfigTest, ErrorsNameTheFileAndTheField) {
  const std::string file = (dir_.path() / "generation_config.json").string();
  const auto expect_rejected = [&](const std::string& text, const std::string& field,
                                   const std::string& why = "") {
    write(text);
    test::expect_error([&] { load(); }, {file, field, why});
  };
  expect_rejected(R"({"do_sample": "yes"})", "do_sample");
  expect_rejected(R"({"temperature": "hot"})", "temperature");
  expect_rejected(R"({"top_k": 2.5})", "top_k");
  expect_rejected(R"({"eos_token_id": "x"})", "eos_token_id");
  expect_rejected(R"({"eos_token_id": [1, -2]})", "eos_token_id");
  // A top_k past the vocabulary keeps every token, as transformers' min(top_k, vocabulary) does
  // (it wrapped negative on its way through the C API's int32).
  write(R"({"do_sample": true, "top_k": 2147483648})");
  EXPECT_EQ(load().sampling.top_k, config_.vocab_size);
  expect_rejected(R"({"max_new_tokens": -1})", "max_new_tokens");
  expect_rejected(R"({"do_sample": true, "temperature": 0})", "temperature");
  expect_rejected(R"({"top_p": 1.5})", "top_p");
  expect_rejected(R"({"num_beams": 4})", "num_beams", "not supported");
  expect_rejected(R"({"typical_p": 0.9})", "typical_p", "not supported");
  expect_rejected(R"({"bad_words_ids": [[5]]})", "bad_words_ids", "not supported");
  expect_rejected(R"({"temprature": 0.5})", "temprature", "unknown key");
  expect_rejected(R"([1, 2])", "expected a JSON object");
}

TEST_F(GenerationConfigTest, ShippedModelsLoad) {
  ModelConfig config;
  for (const char* dir : {"models/qwen3-kjv", "models/qwen3.5-kjv", "models/qwen3-tiny-random"}) {
    SCOPED_TRACE(dir);
    const GenerationDefaults d = load_generation_config(dir, config);
    EXPECT_FALSE(d.sampling.greedy);
    EXPECT_EQ(d.eos_ids, (std::vector<int32_t>{151645, 151643}));
  }
}

}  // namespace
}  // namespace qhx
