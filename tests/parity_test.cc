// Parity with Hugging Face transformers (float32, eager) on the golden fixtures written by
// tools/oracle/ (tests/fixtures/<family>/<fixture>/golden.*), and internal consistency of the
// engine: batched prefill, token-by-token decode and prefill in segments agree on logits and on
// every state tensor (KV caches, conv and recurrent states); snapshots continue identically.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/families.h"
#include "models/model.h"
#include "runtime/perplexity.h"
#include "runtime/session.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "support/hexagon_device.h"
#include "support/raw_safetensors.h"
#include "support/vulkan_device.h"
#include "tokenizer/tokenizer.h"
#include "util/json_file.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

const char* const kFamilies[] = {"qwen3", "qwen3_5"};

// "family/fixture" for every fixture directory with a golden.json.
std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const char* family : kFamilies) {
    const fs::path root = test::source_dir() / "tests/fixtures" / family;
    if (!fs::exists(root)) continue;
    for (const auto& entry : fs::directory_iterator(root)) {
      if (fs::exists(entry.path() / "golden.json")) {
        names.push_back(std::string(family) + "/" + entry.path().filename().string());
      }
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

size_t count_fixtures(const std::string& family) {
  const auto names = fixture_names();
  return std::count_if(names.begin(), names.end(),
                       [&](const std::string& n) { return n.starts_with(family + "/"); });
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
  fs::path dir;
  fs::path checkpoint;
  std::vector<int64_t> rows;  // vocabulary rows the golden logits cover
  std::vector<GoldenPrompt> prompts;
};

Golden load_golden(const std::string& fixture) {
  const fs::path dir = test::source_dir() / "tests/fixtures" / fixture;
  const Json meta = read_json_file(dir / "golden.json");
  const SafetensorsFile tensors = SafetensorsFile::open(dir / "golden.safetensors");
  Golden g;
  g.dir = dir;
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

float max_abs(std::span<const float> v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// max |a - b| / max |a|: the relative measure of the "within 1e-5 relative".
float relative_diff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return INFINITY;
  float worst = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  const float scale = max_abs(a);
  return scale > 0 ? worst / scale : worst;
}

// Every state tensor of `b` within `tolerance` (relative) of the same tensor of `a`.
void expect_same_state(const ModelState& a, const ModelState& b, float tolerance,
                       const std::string& what) {
  const auto ta = a.tensors(), tb = b.tensors();
  ASSERT_EQ(ta.size(), tb.size());
  EXPECT_EQ(a.n_past(), b.n_past()) << what;
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_LE(relative_diff(ta[i].data, tb[i].data), tolerance) << what << ": " << ta[i].name;
  }
}

class Parity : public ::testing::TestWithParam<std::string> {
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
  // One line per prompt for the logs: the relative differences the tests bound.
  void report(const char* what, const GoldenPrompt& p, std::span<const float> a,
              std::span<const float> b, const ModelState& sa, const ModelState& sb) const {
    float worst_state = 0.0f;
    const auto ta = sa.tensors(), tb = sb.tensors();
    for (size_t i = 0; i < ta.size() && i < tb.size(); ++i) {
      worst_state = std::max(worst_state, relative_diff(ta[i].data, tb[i].data));
    }
    std::printf("%s/%s (%zu tokens) %s: logits %.2g, states %.2g relative\n", GetParam().c_str(),
                p.name.c_str(), p.ids.size(), what, relative_diff(a, b), worst_state);
  }
  Golden golden_;
  std::unique_ptr<Model> model_;
};

TEST(Fixtures, AllPresent) {
  // See tools/oracle/README.md: five random Qwen3 shapes (one with the full vocabulary) and three
  // random Qwen3.5 shapes, plus the trained model of each family.
  EXPECT_GE(count_fixtures("qwen3"), 6u);
  EXPECT_GE(count_fixtures("qwen3_5"), 4u);
}

TEST_P(Parity, LogitsAtEveryPositionMatchReference) {
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

// The model's greedy continuation of the prompt, as long as the golden one.
std::vector<int32_t> greedy_continuation(const Model& model, const GoldenPrompt& p) {
  Session session(model);
  TurnOptions options;
  options.max_new_tokens = static_cast<int64_t>(p.greedy.size());
  std::vector<int32_t> generated;
  session.generate(p.ids, options, [&](int32_t id) {
    generated.push_back(id);
    return true;
  });
  return generated;
}

TEST_P(Parity, GreedyContinuationMatchesReference) {
  for (const GoldenPrompt& p : golden_.prompts) {
    EXPECT_EQ(greedy_continuation(*model_, p), p.greedy) << "prompt " << p.name;
  }
}

TEST_P(Parity, DecodeOverPromptMatchesPrefill) {
  const int64_t vocab = model_->config().vocab_size;
  for (const GoldenPrompt& p : golden_.prompts) {
    auto batched_state = model_->new_state();
    std::vector<float> batched;
    model_->forward(p.ids, *batched_state, LogitsFor::kEveryToken, batched);
    auto state = model_->new_state();
    std::vector<float> step, stepped(batched.size());
    for (size_t t = 0; t < p.ids.size(); ++t) {
      model_->forward(std::span(&p.ids[t], 1), *state, LogitsFor::kLastToken, step);
      std::copy(step.begin(), step.end(), stepped.begin() + t * vocab);
    }
    EXPECT_LE(relative_diff(batched, stepped), 1e-5f) << "prompt " << p.name;
    expect_same_state(*batched_state, *state, 1e-5f, "prompt " + p.name);
    report("decode-over-prompt", p, batched, stepped, *batched_state, *state);
  }
}

// kEveryStep (what a speculative draft's verification runs): every row's logits, and the state
// after them, are those of decoding the tokens one at a time, to the bit, continuing a prompt.
TEST_P(Parity, EveryStepLogitsAreThoseOfDecodingToTheBit) {
  const int64_t vocab = model_->config().vocab_size;
  for (const GoldenPrompt& p : golden_.prompts) {
    if (p.ids.size() < 2) continue;
    const size_t cut = p.ids.size() / 2;
    const std::span<const int32_t> head(p.ids.data(), cut),
        rest(p.ids.data() + cut, p.ids.size() - cut);
    auto batched = model_->new_state();
    std::vector<float> logits;
    if (cut > 0) model_->forward(head, *batched, LogitsFor::kLastToken, logits);
    auto stepped = batched->clone(), replayed = batched->clone();
    std::vector<float> every, step, steps, none;
    model_->forward(rest, *batched, LogitsFor::kEveryStep, every);
    model_->forward(rest, *replayed, LogitsFor::kNoneStepwise, none);
    EXPECT_TRUE(none.empty());
    for (const int32_t id : rest) {
      model_->forward(std::span(&id, 1), *stepped, LogitsFor::kLastToken, step);
      steps.insert(steps.end(), step.begin(), step.end());
    }
    ASSERT_EQ(every.size(), rest.size() * vocab);
    EXPECT_TRUE(every == steps) << "prompt " << p.name;
    // Every step's state, and the one a pass without logits leaves (a replay after a rejected
    // draft), to the bit.
    const auto a = batched->tensors(), b = stepped->tensors(), c = replayed->tensors();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(
          std::equal(a[i].data.begin(), a[i].data.end(), b[i].data.begin(), b[i].data.end()))
          << "prompt " << p.name << ": " << a[i].name;
      EXPECT_TRUE(
          std::equal(a[i].data.begin(), a[i].data.end(), c[i].data.begin(), c[i].data.end()))
          << "prompt " << p.name << ": " << a[i].name << " without logits";
    }
  }
}

TEST_P(Parity, PrefillInSegmentsMatchesOneShot) {
  for (const GoldenPrompt& p : golden_.prompts) {
    if (p.ids.size() < 3) continue;
    auto one_shot_state = model_->new_state();
    std::vector<float> one_shot;
    model_->forward(p.ids, *one_shot_state, LogitsFor::kEveryToken, one_shot);
    auto state = model_->new_state();
    std::vector<float> segment, segmented;
    const size_t cuts[] = {0, p.ids.size() / 3, 2 * p.ids.size() / 3, p.ids.size()};
    for (int s = 0; s < 3; ++s) {
      const std::span<const int32_t> part(p.ids.data() + cuts[s], cuts[s + 1] - cuts[s]);
      model_->forward(part, *state, LogitsFor::kEveryToken, segment);
      segmented.insert(segmented.end(), segment.begin(), segment.end());
    }
    EXPECT_LE(relative_diff(one_shot, segmented), 1e-5f) << "prompt " << p.name;
    expect_same_state(*one_shot_state, *state, 1e-5f, "prompt " + p.name);
    report("3-segment prefill", p, one_shot, segmented, *one_shot_state, *state);
  }
}

TEST_P(Parity, SnapshotsContinueIdentically) {
  const GoldenPrompt& p = golden_.prompts.back();
  const size_t half = p.ids.size() / 2;
  if (half == 0) GTEST_SKIP() << "prompt too short";
  const std::span<const int32_t> first(p.ids.data(), half),
      rest(p.ids.data() + half, p.ids.size() - half);
  auto state = model_->new_state();
  std::vector<float> logits, again;
  model_->forward(first, *state, LogitsFor::kLastToken, logits);
  const auto snapshot = state->clone();
  model_->forward(rest, *state, LogitsFor::kEveryToken, logits);
  const auto finished = state->clone();

  state->restore(*snapshot);  // back to the turn boundary, then the same continuation
  model_->forward(rest, *state, LogitsFor::kEveryToken, again);
  EXPECT_EQ(logits, again);
  expect_same_state(*finished, *state, 0.0f, "restored");

  state->reset();  // a reset state behaves as a new one
  auto fresh = model_->new_state();
  model_->forward(p.ids, *state, LogitsFor::kLastToken, logits);
  model_->forward(p.ids, *fresh, LogitsFor::kLastToken, again);
  EXPECT_EQ(logits, again);
}

// Hugging Face's Gated DeltaNet states after a one-shot prefill (golden P.state.layer{i}
// [Hv, dk, dv] and P.conv.layer{i} [C, K], HF keeping K conv columns where we keep K-1).
TEST_P(Parity, DeltaNetStatesMatchReference) {
  const SafetensorsFile tensors = SafetensorsFile::open(golden_.dir / "golden.safetensors");
  int checked = 0;
  for (const GoldenPrompt& p : golden_.prompts) {
    auto state = model_->new_state();
    std::vector<float> logits;
    model_->forward(p.ids, *state, LogitsFor::kLastToken, logits);
    for (const StateTensor& t : state->tensors()) {
      const auto dot = t.name.find('.');
      const std::string layer = t.name.substr(0, dot), kind = t.name.substr(dot + 1);
      if (kind == "recurrent") {
        const std::string name = p.name + ".state." + layer;
        if (tensors.find(name) == nullptr) continue;
        const auto theirs = read_tensor<float>(tensors, name, DType::kF32);
        EXPECT_LE(relative_diff(theirs, t.data), 1e-4f) << name;
        ++checked;
      } else if (kind == "conv") {
        const std::string name = p.name + ".conv." + layer;
        const TensorView* view = tensors.find(name);
        if (view == nullptr) continue;
        const auto theirs = read_tensor<float>(tensors, name, DType::kF32);
        const int64_t channels = view->shape[0], columns = view->shape[1];
        const int64_t history = static_cast<int64_t>(t.data.size()) / channels;
        ASSERT_EQ(history, columns - 1) << name;
        std::vector<float> transposed(t.data.size());
        for (int64_t h = 0; h < history; ++h) {
          for (int64_t c = 0; c < channels; ++c) {
            transposed[h * channels + c] = theirs[c * columns + 1 + h];
          }
        }
        EXPECT_LE(relative_diff(transposed, t.data), 1e-4f) << name;
        ++checked;
      }
    }
  }
  const bool has_deltanet =
      std::count(model_->config().layer_types.begin(), model_->config().layer_types.end(),
                 LayerKind::kLinearAttention) > 0;
  if (!has_deltanet) GTEST_SKIP() << "no Gated DeltaNet layers";
  EXPECT_GT(checked, 0) << "golden has no DeltaNet states";
}

// Perplexity scores every token of a window from the model's own logits: with the full golden
// logits the expected negative log-likelihoods follow from Hugging Face's numbers directly.
TEST_P(Parity, PerplexityMatchesReferenceLogits) {
  const int64_t vocab = model_->config().vocab_size;
  if (static_cast<int64_t>(golden_.rows.size()) != vocab) GTEST_SKIP() << "golden logits sampled";
  for (const GoldenPrompt& p : golden_.prompts) {
    const int64_t n = static_cast<int64_t>(p.ids.size());
    if (n < 2) continue;
    double expected = 0;
    for (int64_t t = 0; t + 1 < n; ++t) {
      expected += negative_log_likelihood(
          std::span<const float>(p.logits).subspan(t * vocab, vocab), p.ids[t + 1]);
    }
    const PerplexityResult one = perplexity(*model_, p.ids, {n - 1});
    EXPECT_EQ(one.scored, n - 1);
    EXPECT_EQ(one.windows, 1);
    EXPECT_NEAR(one.nll_sum, expected, 1e-4 * std::max(1.0, std::fabs(expected))) << p.name;

    // Windows restart from an empty state: the first window is a prefix of the prompt (causal,
    // so its golden logits apply); the windows together score every token once.
    const int64_t window = std::max<int64_t>(1, (n - 1) / 3);
    double first = 0;
    for (int64_t t = 0; t < window; ++t) {
      first += negative_log_likelihood(std::span<const float>(p.logits).subspan(t * vocab, vocab),
                                       p.ids[t + 1]);
    }
    const PerplexityResult split =
        perplexity(*model_, std::span(p.ids).first(window + 1), {window});
    EXPECT_NEAR(split.nll_sum, first, 1e-4 * std::max(1.0, std::fabs(first))) << p.name;
    const PerplexityResult all = perplexity(*model_, p.ids, {window});
    EXPECT_EQ(all.scored, n - 1);
    EXPECT_EQ(all.windows, (n - 1 + window - 1) / window);

    // llama-perplexity's chunks: the prompt as one chunk, only its second half scored.
    if (n < 3) continue;
    double second = 0;
    for (int64_t t = n / 2; t + 1 < n; ++t) {
      second += negative_log_likelihood(std::span<const float>(p.logits).subspan(t * vocab, vocab),
                                        p.ids[t + 1]);
    }
    const PerplexityResult half = perplexity(*model_, p.ids, {.window = n, .second_half = true});
    EXPECT_EQ(half.scored, n - 1 - n / 2);
    EXPECT_EQ(half.windows, 1);
    EXPECT_NEAR(half.nll_sum, second, 1e-4 * std::max(1.0, std::fabs(second))) << p.name;
  }
}

TEST_P(Parity, TextPromptsTokenizeLikeReference) {
  const bool has_tokenizer = fs::exists(golden_.checkpoint / "tokenizer.json");
  for (const GoldenPrompt& p : golden_.prompts) {
    if (!p.text) continue;
    ASSERT_TRUE(has_tokenizer) << "text prompt without tokenizer files";
    const Tokenizer tokenizer = Tokenizer::load(golden_.checkpoint);
    EXPECT_EQ(tokenizer.encode(*p.text), p.ids) << "prompt " << p.name;
  }
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(fixture_names()), test_name);

#if QHX_HAVE_VULKAN
// The same fixtures on the Vulkan backend (the tests' device, support/vulkan_device.h).
class VulkanParity : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Model> on_device(std::shared_ptr<VulkanDevice> device, bool decode) {
    VulkanBackendOptions options;
    options.decode = decode;
    return load_model(golden_.checkpoint,
                      {.devices = {std::make_shared<VulkanBackend>(std::move(device), options)}});
  }
  void SetUp() override { golden_ = load_golden(GetParam()); }
  Golden golden_;
};

// Everything on the device: the logits at every position within 1e-4 · max|logit| of Hugging
// Face's, and the same greedy continuation.
TEST_P(VulkanParity, EverythingOnTheDeviceMatchesReference) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const auto model = on_device(device, /*decode=*/true);
  const int64_t vocab = model->config().vocab_size;
  for (const GoldenPrompt& p : golden_.prompts) {
    auto state = model->new_state();
    std::vector<float> logits;
    model->forward(p.ids, *state, LogitsFor::kEveryToken, logits);
    float worst = 0.0f;
    for (size_t t = 0; t < p.ids.size(); ++t) {
      for (size_t r = 0; r < golden_.rows.size(); ++r) {
        worst = std::max(worst, std::fabs(logits[t * vocab + golden_.rows[r]] -
                                          p.logits[t * golden_.rows.size() + r]));
      }
    }
    EXPECT_LE(worst, 1e-4f * max_abs(p.logits)) << "prompt " << p.name;
    std::printf("%s/%s on %s: max |logit diff| %.3g x max|logit|\n", GetParam().c_str(),
                p.name.c_str(), device->info().name.c_str(), worst / max_abs(p.logits));
    // A CPU-type device (lavapipe) decodes a 152k-row lm_head at ~2 tokens/s: there the first
    // 16 tokens of each continuation, elsewhere all of them.
    GoldenPrompt shorter = p;
    if (device->info().type == "CPU" && shorter.greedy.size() > 16) shorter.greedy.resize(16);
    EXPECT_EQ(greedy_continuation(*model, shorter), shorter.greedy) << "prompt " << p.name;
  }
}

// Prompts on the device, replies on the CPU: the CPU's greedy ids exactly.
TEST_P(VulkanParity, DevicePrefillWithCpuDecodeGivesTheCpusTokens) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const auto model = on_device(device, /*decode=*/false);
  const auto cpu = load_model(golden_.checkpoint);
  for (const GoldenPrompt& p : golden_.prompts) {
    EXPECT_EQ(greedy_continuation(*model, p), greedy_continuation(*cpu, p)) << "prompt " << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VulkanParity, ::testing::ValuesIn(fixture_names()), test_name);
#endif

#if QHX_HAVE_HEXAGON
// The NPU in fp16 decoding every reply token (the simulator; the golden prompts are shorter than
// a 128-row chunk, so the CPU reads them): Hugging Face's greedy continuations, token for token —
// except where the reference's own two best tokens lie closer than fp16 can tell apart (these
// random fixtures' margins go down to 0.014 of logits up to 7.6): there the NPU may take the
// other, and the test says where. The two fixtures the Hexagon tests use.
class HexagonParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HexagonParity, RepliesDecodedInFp16OnTheNpuAreTheReferences) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const Golden golden = load_golden(GetParam());
  HexagonBackendOptions options;
  options.decode = true;
  const auto backend =
      std::make_shared<HexagonBackend>(HexagonDevice::open(library, *hexagon_chip("v81")), options);
  const auto model = load_model(golden.checkpoint, {.devices = {backend}});
  const auto cpu = load_model(golden.checkpoint);
  int64_t identical = 0;
  for (const GoldenPrompt& p : golden.prompts) {
    const std::vector<int32_t> got = greedy_continuation(*model, p);
    ASSERT_EQ(got.size(), p.greedy.size());
    const auto departs = std::ranges::mismatch(got, p.greedy).in1 - got.begin();
    if (departs == static_cast<int64_t>(got.size())) {
      ++identical;
      continue;
    }
    // The reference's logits where the NPU departed: its choice and the NPU's within 1% of the
    // largest logit (fp16's error through the layers), or the NPU is wrong.
    std::vector<int32_t> read = p.ids;
    read.insert(read.end(), p.greedy.begin(), p.greedy.begin() + departs);
    auto state = cpu->new_state();
    std::vector<float> logits;
    cpu->forward(read, *state, LogitsFor::kLastToken, logits);
    const float margin =
        logits[static_cast<size_t>(p.greedy[departs])] - logits[static_cast<size_t>(got[departs])];
    std::printf(
        "%s prompt %s: the NPU departs at token %lld, where the reference's margin is "
        "%.4f of max |logit| %.2f\n",
        GetParam().c_str(), p.name.c_str(), static_cast<long long>(departs), margin,
        max_abs(logits));
    EXPECT_LT(margin, 1e-2f * max_abs(logits)) << "prompt " << p.name << " token " << departs;
  }
  EXPECT_GE(identical * 2, static_cast<int64_t>(golden.prompts.size()));
  // Every reply token but each last (its step is not taken); a one-token prompt is a step too.
  EXPECT_GE(backend->decode_steps(),
            static_cast<int64_t>(golden.prompts.size() * (golden.prompts[0].greedy.size() - 1)));
  EXPECT_EQ(model->device_failures(), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HexagonParity,
                         ::testing::Values("qwen3/gqa2_f16", "qwen3_5/gva2_tied"), test_name);
#endif

}  // namespace
}  // namespace qhx

namespace qhx {
namespace {

// The MTP head against tools/oracle/mtp_reference.py (mtp_golden.*): each row's logits (the
// model's final-norm hidden at position i with the token at i + 1), row by row on the head's KV
// cache and in one batch, then a greedy chain of drafts fed back through the head.
TEST(Mtp, HeadMatchesTheReference) {
  int checked = 0;
  for (const fs::path& dir : {test::source_dir() / "tests/fixtures/qwen3_5/multimodal_layout",
                              test::source_dir() / "models/qwen3.5-kjv"}) {
    if (!fs::exists(dir / "mtp_golden.json")) continue;
    SCOPED_TRACE(dir.filename().string());
    // Over the whole vocabulary, as the reference (a draft vocabulary's columns are the same:
    // Mtp.ADraftVocabularyKeepsThoseColumnsOfTheLogits).
    const auto model = load_model(dir, {.mtp_vocab_size = LoadOptions::kFullVocabulary});
    ASSERT_TRUE(model->has_mtp());
    const int64_t H = model->config().hidden_size, vocab = model->config().vocab_size;
    const Json meta = read_json_file(dir / "mtp_golden.json");
    const SafetensorsFile golden = SafetensorsFile::open(dir / "mtp_golden.safetensors");
    for (const Json& p : meta.at("prompts")) {
      const std::string name = p.at("name");
      SCOPED_TRACE(name);
      const std::vector<int32_t> ids = read_tensor<int32_t>(golden, name + ".ids", DType::kI32);
      const auto rows = read_tensor<float>(golden, name + ".row_logits", DType::kF32);
      const auto chain = read_tensor<int32_t>(golden, name + ".chain_ids", DType::kI32);
      const auto chain_logits = read_tensor<float>(golden, name + ".chain_logits", DType::kF32);
      const float tolerance = 1e-4f * p.at("max_abs_logit").get<float>();
      const auto state = model->new_state();
      std::vector<float> logits, hidden;
      model->forward(ids, *state, LogitsFor::kLastToken, logits, &hidden);
      ASSERT_EQ(hidden.size(), ids.size() * H);
      std::vector<float> plain_logits;
      model->forward(ids, *model->new_state(), LogitsFor::kLastToken, plain_logits);
      EXPECT_TRUE(plain_logits == logits) << "asking for the hidden rows changed the logits";
      const int32_t next_id = argmax(logits);
      ASSERT_EQ(next_id, p.at("next_id").get<int32_t>());
      std::vector<int32_t> pairs(ids.begin() + 1, ids.end());
      pairs.push_back(next_id);
      const auto row_of = [](std::span<const float> v, size_t i, int64_t width) {
        return v.subspan(i * width, width);
      };
      const auto max_diff = [](std::span<const float> a, std::span<const float> b) {
        float worst = a.size() == b.size() ? 0.0f : INFINITY;
        for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
          worst = std::max(worst, std::fabs(a[i] - b[i]));
        }
        return worst;
      };
      // Row by row, each on the KV cache of the rows before it.
      const auto head = model->new_mtp_state();
      std::vector<float> out, row_logits;
      for (size_t i = 0; i < pairs.size(); ++i) {
        model->mtp_forward(row_of(hidden, i, H), std::span(pairs).subspan(i, 1), *head, out,
                           &row_logits);
        EXPECT_LE(max_diff(row_of(rows, i, vocab), row_logits), tolerance) << "row " << i;
      }
      // The same rows in one batch: the last row's logits and every row's output agree.
      const auto batched = model->new_mtp_state();
      std::vector<float> batch_out, batch_logits;
      model->mtp_forward(hidden, pairs, *batched, batch_out, &batch_logits);
      EXPECT_LE(max_diff(row_logits, batch_logits), tolerance);
      EXPECT_LE(max_diff(std::span(out).last(H), std::span(batch_out).last(H)), 1e-4f);
      EXPECT_EQ(batched->n_past(), static_cast<int64_t>(pairs.size()));
      // The chain: each draft the argmax of the row before, fed back with that row's output.
      std::vector<float> previous(out.end() - H, out.end());
      for (size_t j = 0; j < chain.size(); ++j) {
        EXPECT_EQ(argmax(row_logits), chain[j]) << "draft " << j;
        model->mtp_forward(previous, std::span(chain).subspan(j, 1), *head, out, &row_logits);
        EXPECT_LE(max_diff(row_of(chain_logits, j, vocab), row_logits), tolerance)
            << "chained row " << j;
        previous = out;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 6);  // the fixture's and the trained head's
}

// transformers ignores every mtp.* tensor, so a Qwen3.5 checkpoint whose MTP module is stripped
// or cut short (exported or pruned by other tools) is the same text model: the same logits to
// the bit as the whole checkpoint and the reference's greedy ids, with no head. "Truncated" is
// the audit's checkpoint: mtp.fc and mtp.norm and nothing else of the head (added with random
// values where the fixture has no head).
class MtpStrippedOrTruncated : public Parity {};

std::vector<std::string> qwen3_5_fixture_names() {
  std::vector<std::string> names = fixture_names();
  std::erase_if(names, [](const std::string& n) { return !n.starts_with("qwen3_5/"); });
  return names;
}

TEST_P(MtpStrippedOrTruncated, IsTheSameTextModel) {
  const int64_t H = model_->config().hidden_size;
  const test::TempDir tmp;
  const fs::path stripped = tmp.path() / "stripped", truncated = tmp.path() / "truncated";
  const auto is_mtp = [](const std::string& name) { return name.starts_with("mtp."); };
  test::copy_checkpoint(golden_.checkpoint, stripped, is_mtp);
  test::copy_checkpoint(golden_.checkpoint, truncated, is_mtp,
                        {{"mtp.fc.weight", {H, 2 * H}}, {"mtp.norm.weight", {H}}});
  for (const fs::path& dir : {stripped, truncated}) {
    SCOPED_TRACE(dir.filename().string());
    const auto variant = load_model(dir);
    EXPECT_FALSE(variant->has_mtp());
    const std::string why = variant->mtp_unavailable();
    if (dir == stripped) {
      EXPECT_EQ(why, "");
    } else {
      EXPECT_NE(why.find("missing 13 of 15 tensors: mtp.pre_fc_norm_embedding.weight"),
                std::string::npos)
          << why;
    }
    for (const GoldenPrompt& p : golden_.prompts) {
      std::vector<float> logits;
      variant->forward(p.ids, *variant->new_state(), LogitsFor::kEveryToken, logits);
      EXPECT_TRUE(logits == prefill_all(p.ids)) << "prompt " << p.name;
      EXPECT_EQ(greedy_continuation(*variant, p), p.greedy) << "prompt " << p.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpStrippedOrTruncated,
                         ::testing::ValuesIn(qwen3_5_fixture_names()), test_name);

// A head missing any one of its tensors is no head: the model loads as a text model and says
// which tensor is missing; --speculative mtp says it too. With all of them it is the head.
TEST(Mtp, AHeadMissingAnyTensorIsLeftOutAndNamed) {
  const fs::path source = test::source_dir() / "tests/fixtures/qwen3_5/multimodal_layout";
  ASSERT_TRUE(load_model(source)->has_mtp());
  ASSERT_EQ(mtp_head_tensors().size(), 15u);
  for (const std::string& missing : mtp_head_tensors()) {
    SCOPED_TRACE(missing);
    const test::TempDir tmp;
    test::copy_checkpoint(source, tmp.path(),
                          [&](const std::string& name) { return name == missing; });
    const auto model = load_model(tmp.path());
    EXPECT_FALSE(model->has_mtp());
    EXPECT_NE(model->mtp_unavailable().find("missing 1 of 15 tensors: " + missing),
              std::string::npos)
        << model->mtp_unavailable();
    Session session(*model);
    TurnOptions options;
    options.max_new_tokens = 2;
    options.speculative.kind = DraftKind::kMtp;
    const std::vector<int32_t> prompt = {1, 2, 3};
    test::expect_error([&] { session.generate(prompt, options, [](int32_t) { return true; }); },
                       {"speculative", "MTP head", missing});
  }
}

// A pruning tool that takes tensors out of a shard may leave them in the index: transformers
// picks files by the index and ignores what it does not read, and so does qhx. A tensor the
// model reads that is listed but absent is named with the file the index puts it in.
TEST(Mtp, AnIndexListingPrunedTensorsIsNoRefusal) {
  const fs::path source = test::source_dir() / "tests/fixtures/qwen3_5/multimodal_layout";
  const test::TempDir tmp;
  test::copy_checkpoint(source, tmp.path(),
                        [](const std::string& n) { return n == "mtp.fc.weight"; });
  Json index = read_json_file(source / "model.safetensors.index.json");
  std::ofstream(tmp.path() / "model.safetensors.index.json") << index.dump();
  const auto model = load_model(tmp.path());
  EXPECT_FALSE(model->has_mtp());
  EXPECT_NE(model->mtp_unavailable().find("missing 1 of 15 tensors: mtp.fc.weight"),
            std::string::npos);
  const std::string norm = "model.language_model.norm.weight";
  test::copy_checkpoint(source, tmp.path(), [&](const std::string& n) { return n == norm; });
  std::ofstream(tmp.path() / "model.safetensors.index.json") << index.dump();
  const std::string file = index["weight_map"][norm];
  test::expect_error([&] { load_model(tmp.path()); },
                     {file + ": missing tensor '" + norm + "'", "index.json lists in it"});
}

// Tensors of types qhx does not compute with (an FP8 vision tower, an FP8 MTP head) are read past
// as transformers reads past what it does not load: the file parses, the head is left out and
// says why, and the text model is the same to the bit.
TEST(Mtp, Fp8OptionalPartsAreReadPast) {
  const fs::path source = test::source_dir() / "tests/fixtures/qwen3_5/multimodal_layout";
  const test::TempDir tmp;
  test::copy_checkpoint(source, tmp.path(), [](const std::string&) { return false; });
  const std::string shard =
      read_json_file(source / "model.safetensors.index.json")["weight_map"]["mtp.fc.weight"];
  test::RawSafetensors raw = test::RawSafetensors::read(tmp.path() / shard);
  const Json fc = raw.header["mtp.fc.weight"];
  raw.erase("mtp.fc.weight");
  const std::vector<int64_t> fc_shape = fc["shape"].get<std::vector<int64_t>>();
  const std::vector<uint8_t> fp8(fc_shape[0] * fc_shape[1], 0x38);  // 1.0 in E4M3
  raw.add("mtp.fc.weight", "F8_E4M3", fc_shape, fp8.data(), fp8.size());
  const std::vector<uint8_t> patch(4 * 8, 0x38);
  raw.add("model.visual.patch_embed.proj.weight", "F8_E4M3", {4, 8}, patch.data(), patch.size());
  raw.write(tmp.path() / shard);
  const auto model = load_model(tmp.path());
  EXPECT_FALSE(model->has_mtp());
  EXPECT_NE(model->mtp_unavailable().find("tensor 'mtp.fc.weight': dtype F8_E4M3"),
            std::string::npos)
      << model->mtp_unavailable();
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  std::vector<float> logits, expected;
  model->forward(ids, *model->new_state(), LogitsFor::kEveryToken, logits);
  const auto whole = load_model(source);
  whole->forward(ids, *whole->new_state(), LogitsFor::kEveryToken, expected);
  EXPECT_TRUE(logits == expected);
}

// A whole module of the wrong shape is not a refusal either (transformers never reads it).
TEST(Mtp, AHeadOfTheWrongShapeIsLeftOutAndSaysWhy) {
  const fs::path source = test::source_dir() / "tests/fixtures/qwen3_5/multimodal_layout";
  const test::TempDir tmp;
  test::copy_checkpoint(source, tmp.path(),
                        [](const std::string& name) { return name == "mtp.norm.weight"; },
                        {{"mtp.norm.weight", {3}}});
  const auto model = load_model(tmp.path());
  EXPECT_FALSE(model->has_mtp());
  EXPECT_NE(model->mtp_unavailable().find("mtp.norm.weight"), std::string::npos)
      << model->mtp_unavailable();
}

TEST(Mtp, ModelsWithoutAHeadSaySo) {
  const auto model = load_model(test::source_dir() / "tests/fixtures/qwen3_5/gva2_tied");
  EXPECT_FALSE(model->has_mtp());
  EXPECT_EQ(model->new_mtp_state(), nullptr);
  std::vector<float> out;
  const std::vector<float> hidden(model->config().hidden_size);
  const std::vector<int32_t> id = {1};
  auto state = model->new_state();
  test::expect_error([&] { model->mtp_forward(hidden, id, *state, out, nullptr); },
                     {"no MTP head"});
}

}  // namespace
}  // namespace qhx
