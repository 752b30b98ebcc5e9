// Parity with Hugging Face transformers (float32, eager) on the golden fixtures written by
// tools/oracle/make_qwen3_fixtures.py, and internal consistency of prefill and decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/model.h"
#include "runtime/generate.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/json_file.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  const fs::path root = test::source_dir() / "tests/fixtures/qwen3";
  if (!fs::exists(root)) return names;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (fs::exists(entry.path() / "golden.json")) names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

template <typename T>
std::vector<T> read_tensor(const SafetensorsFile& file, const std::string& name, DType dtype) {
  const TensorView* t = file.find(name);
  if (t == nullptr) throw std::runtime_error("golden tensor missing: " + name);
  if (t->dtype != dtype) throw std::runtime_error("golden tensor dtype: " + name);
  std::vector<T> out(t->numel());
  std::memcpy(out.data(), t->data, t->nbytes);
  return out;
}

struct GoldenPrompt {
  std::string name;
  std::optional<std::string> text;
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [T, rows.size()]
  std::vector<int32_t> greedy;
};

struct Golden {
  fs::path checkpoint;
  std::vector<int64_t> rows;  // vocabulary rows the golden logits cover
  std::vector<GoldenPrompt> prompts;
};

Golden load_golden(const std::string& fixture) {
  const fs::path dir = test::source_dir() / "tests/fixtures/qwen3" / fixture;
  const Json meta = read_json_file(dir / "golden.json");
  const SafetensorsFile tensors = SafetensorsFile::open(dir / "golden.safetensors");
  Golden g;
  g.checkpoint = test::source_dir() / meta.at("checkpoint").get<std::string>();
  const int64_t vocab = load_model_config(g.checkpoint / "config.json").vocab_size;
  if (meta.at("logit_rows") == "all") {
    for (int64_t r = 0; r < vocab; ++r) g.rows.push_back(r);
  } else {
    g.rows = read_tensor<int64_t>(tensors, "logit_rows", DType::kI64);
  }
  for (const Json& p : meta.at("prompts")) {
    GoldenPrompt prompt;
    prompt.name = p.at("name").get<std::string>();
    if (p.at("text").is_string()) prompt.text = p.at("text").get<std::string>();
    for (int64_t id : read_tensor<int64_t>(tensors, prompt.name + ".ids", DType::kI64)) {
      prompt.ids.push_back(static_cast<int32_t>(id));
    }
    for (int64_t id : read_tensor<int64_t>(tensors, prompt.name + ".greedy", DType::kI64)) {
      prompt.greedy.push_back(static_cast<int32_t>(id));
    }
    prompt.logits = read_tensor<float>(tensors, prompt.name + ".logits", DType::kF32);
    if (prompt.logits.size() != prompt.ids.size() * g.rows.size()) {
      throw std::runtime_error("golden logits shape: " + prompt.name);
    }
    g.prompts.push_back(std::move(prompt));
  }
  return g;
}

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

class Qwen3Parity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    golden_ = load_golden(GetParam());
    model_ = load_model(golden_.checkpoint);
  }
  std::vector<float> prefill_all(const std::vector<int32_t>& ids) {
    auto state = model_->new_state();
    std::vector<float> logits;
    model_->forward(ids, *state, LogitsFor::kEveryToken, logits);
    return logits;
  }
  Golden golden_;
  std::unique_ptr<Model> model_;
};

TEST(Qwen3Fixtures, AllPresent) {
  // Four small-vocab shapes and the full-vocab model (see tools/oracle/README.md).
  EXPECT_GE(fixture_names().size(), 5u);
}

TEST_P(Qwen3Parity, LogitsAtEveryPositionMatchReference) {
  const int64_t vocab = model_->config().vocab_size;
  for (const GoldenPrompt& p : golden_.prompts) {
    const std::vector<float> logits = prefill_all(p.ids);
    const float tolerance = 1e-4f * max_abs(p.logits);
    float worst = 0.0f;
    for (size_t t = 0; t < p.ids.size(); ++t) {
      for (size_t r = 0; r < golden_.rows.size(); ++r) {
        const float ours = logits[t * vocab + golden_.rows[r]];
        const float theirs = p.logits[t * golden_.rows.size() + r];
        worst = std::max(worst, std::fabs(ours - theirs));
      }
    }
    EXPECT_LE(worst, tolerance) << "prompt " << p.name << ": max |logit diff| " << worst;
    std::printf("%s/%s: max |logit diff| %.3g = %.3g x max|logit|\n", GetParam().c_str(),
                p.name.c_str(), worst, worst / max_abs(p.logits));
  }
}

TEST_P(Qwen3Parity, GreedyContinuationMatchesReference) {
  for (const GoldenPrompt& p : golden_.prompts) {
    auto state = model_->new_state();
    GenerateOptions options;
    options.max_new_tokens = static_cast<int64_t>(p.greedy.size());
    std::vector<int32_t> generated;
    generate(*model_, *state, p.ids, options, [&](int32_t id) { generated.push_back(id); });
    EXPECT_EQ(generated, p.greedy) << "prompt " << p.name;
  }
}

TEST_P(Qwen3Parity, DecodeOverPromptMatchesPrefill) {
  const int64_t vocab = model_->config().vocab_size;
  for (const GoldenPrompt& p : golden_.prompts) {
    const std::vector<float> batched = prefill_all(p.ids);
    auto state = model_->new_state();
    std::vector<float> step;
    float worst = 0.0f;
    for (size_t t = 0; t < p.ids.size(); ++t) {
      model_->forward(std::span(&p.ids[t], 1), *state, LogitsFor::kLastToken, step);
      for (int64_t r = 0; r < vocab; ++r) {
        worst = std::max(worst, std::fabs(step[r] - batched[t * vocab + r]));
      }
    }
    EXPECT_LE(worst, 1e-5f * max_abs(batched)) << "prompt " << p.name;
  }
}

TEST_P(Qwen3Parity, PrefillInSegmentsMatchesOneShot) {
  const int64_t vocab = model_->config().vocab_size;
  for (const GoldenPrompt& p : golden_.prompts) {
    if (p.ids.size() < 3) continue;
    const std::vector<float> batched = prefill_all(p.ids);
    auto state = model_->new_state();
    std::vector<float> segment;
    const size_t cuts[] = {0, p.ids.size() / 3, 2 * p.ids.size() / 3, p.ids.size()};
    float worst = 0.0f;
    for (int s = 0; s < 3; ++s) {
      const std::span<const int32_t> part(p.ids.data() + cuts[s], cuts[s + 1] - cuts[s]);
      model_->forward(part, *state, LogitsFor::kEveryToken, segment);
      for (size_t i = 0; i < segment.size(); ++i) {
        worst = std::max(worst, std::fabs(segment[i] - batched[cuts[s] * vocab + i]));
      }
    }
    EXPECT_LE(worst, 1e-5f * max_abs(batched)) << "prompt " << p.name;
  }
}

TEST_P(Qwen3Parity, TextPromptsTokenizeLikeReference) {
  const bool has_tokenizer = fs::exists(golden_.checkpoint / "tokenizer.json");
  for (const GoldenPrompt& p : golden_.prompts) {
    if (!p.text) continue;
    ASSERT_TRUE(has_tokenizer) << "text prompt without tokenizer files";
    const Tokenizer tokenizer = Tokenizer::load(golden_.checkpoint);
    EXPECT_EQ(tokenizer.encode(*p.text), p.ids) << "prompt " << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Qwen3Parity, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace qhx
