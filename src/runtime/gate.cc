#include "runtime/gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <span>
#include <sstream>

#include "runtime/sampler.h"
#include "runtime/session.h"
#include "util/error.h"
#include "util/image_pads.h"
#include "util/mapped_file.h"

namespace qhx {
namespace {

const char* const kTextPrompts[] = {
    "The quick brown fox jumps over the lazy dog.",
    "In the beginning God created the heaven and the earth.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "请用一句话介绍你自己。",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea, there lived",
    "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC;",
    "The mitochondria is the powerhouse of the cell because",
    "Liebe Grüße aus Berlin! Wie geht es dir heute?",
    "1, 1, 2, 3, 5, 8, 13, 21,",
    "To be, or not to be, that is the question:",
    "// Copyright 2026 The qhx Authors.\n#include <vector>\n",
};

// The prompt as `model` reads it: each image's ids (the model's own) in place of its token.
std::vector<int32_t> with_images(const Model& model, const GatePrompt& prompt) {
  if (prompt.images.empty()) return prompt.ids;
  std::vector<std::vector<int32_t>> images;
  for (const PixelValues& pixels : prompt.images) images.push_back(model.image_ids(pixels));
  return expand_image_pads(prompt.ids, model.config().image_token_id, images, prompt.name);
}

// The last positions a model with devices reads one token at a time: a device that decodes is
// compared on its decode steps too.
constexpr int64_t kDecodeSteps = 8;

// Every position's logits, the sequence read as a session reads a prompt: in whole multiples of
// what the model's devices take (Model::prompt_rows_multiple), then the rest; with devices, the
// last kDecodeSteps positions as decode steps. (On the CPU alone every way gives the same bits.)
std::vector<float> every_token_logits(const Model& model, std::span<const int32_t> sequence) {
  auto state = model.new_state();
  const int64_t n = static_cast<int64_t>(sequence.size()), whole = model.prompt_rows_multiple();
  const int64_t steps = model.has_devices() && n > 1 ? std::min(kDecodeSteps, n - 1) : 0;
  const int64_t read = n - steps;
  const int64_t first = whole > 1 && read > whole ? read / whole * whole : read;
  std::vector<float> logits, part;
  const auto forward = [&](std::span<const int32_t> ids) {
    model.forward(ids, *state, LogitsFor::kEveryToken, part);
    logits.insert(logits.end(), part.begin(), part.end());
  };
  forward(sequence.first(first));
  if (first < read) forward(sequence.subspan(first, read - first));
  for (int64_t i = read; i < n; ++i) forward(sequence.subspan(i, 1));
  return logits;
}

std::vector<int32_t> top_k_ids(const float* logits, int64_t n, int64_t k) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  ids.resize(k);
  return ids;
}

double pearson(const float* a, const float* b, int64_t n) {
  double ma = 0, mb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ma += a[i];
    mb += b[i];
  }
  ma /= n;
  mb /= n;
  double sab = 0, saa = 0, sbb = 0;
  for (int64_t i = 0; i < n; ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : (saa == sbb ? 1.0 : 0.0);
}

// KL(p ‖ q) of the softmax distributions of two logit rows, in nats.
double kl_divergence(const float* p_logits, const float* q_logits, int64_t n) {
  const auto log_softmax = [n](const float* x, std::vector<double>& out) {
    const double max = *std::max_element(x, x + n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - max);
    const double log_z = max + std::log(sum);
    out.resize(n);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] - log_z;
  };
  std::vector<double> lp, lq;
  log_softmax(p_logits, lp);
  log_softmax(q_logits, lq);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);
}

}  // namespace

GateThresholds default_gate_thresholds(DType weights) {
  switch (weights) {
    case DType::kF32:
      return {1.0, 1.0, 0.999999, 1e-6, 1.0};
    case DType::kBF16:
    case DType::kF16:
      return {0.97, 0.95, 0.999, 2e-3, 0.0};
    case DType::kW8:
      return {0.95, 0.9, 0.995, 1e-2, 0.0};
    case DType::kW4:
      return {0.75, 0.7, 0.95, 0.1, 0.0};
    default:
      return {};
  }
}

std::vector<GatePrompt> gate_prompt_suite(const Tokenizer* tokenizer, int64_t vocab_size,
                                          int64_t n_prompts) {
  std::vector<GatePrompt> suite;
  if (tokenizer != nullptr) {
    for (int64_t i = 0; i < n_prompts; ++i) {
      const char* text = kTextPrompts[i % std::size(kTextPrompts)];
      suite.push_back({"text" + std::to_string(i), tokenizer->encode(text), {}});
    }
    return suite;
  }
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab_size - 1));
  for (int64_t i = 0; i < n_prompts; ++i) {
    GatePrompt p{"random" + std::to_string(i), {}, {}};
    const int64_t length = 4 + 7 * i % 29;
    for (int64_t t = 0; t < length; ++t) p.ids.push_back(id(rng));
    suite.push_back(std::move(p));
  }
  return suite;
}

std::vector<GatePrompt> gate_image_prompts(const Model& model, const Tokenizer* tokenizer) {
  const ModelConfig& c = model.config();
  std::mt19937 rng(20261207);
  std::uniform_int_distribution<int> byte(0, 255);
  // Text ids: the tokenizer's, or random ones that are none of the vision tokens.
  const auto text = [&](const char* words, int64_t n) {
    if (tokenizer != nullptr) return tokenizer->encode(words);
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.vocab_size - 1));
    std::vector<int32_t> ids;
    while (static_cast<int64_t>(ids.size()) < n) {
      const int32_t t = id(rng);
      if (t != c.image_token_id && t != c.vision_start_token_id && t != c.vision_end_token_id &&
          t != c.video_token_id) {
        ids.push_back(t);
      }
    }
    return ids;
  };
  std::vector<GatePrompt> suite;
  for (int k = 0; k < 2; ++k) {
    RgbImage image{k == 0 ? 96 : 72, k == 0 ? 64 : 88, {}};
    for (int64_t y = 0; y < image.height; ++y) {
      for (int64_t x = 0; x < image.width; ++x) {
        for (int ch = 0; ch < 3; ++ch) {
          const double smooth = 127.5 + 127.5 * std::sin(0.11 * x * (ch + 1) + 0.07 * y);
          image.pixels.push_back(static_cast<uint8_t>(k == 0 ? smooth : byte(rng)));
        }
      }
    }
    GatePrompt p{"image" + std::to_string(k), text("Look at this picture:", 5), {}};
    p.ids.insert(p.ids.end(), {c.vision_start_token_id, c.image_token_id, c.vision_end_token_id});
    const std::vector<int32_t> after = text(" What does it show, and in which colours?", 7);
    p.ids.insert(p.ids.end(), after.begin(), after.end());
    p.images.push_back(preprocess_image(image, model.image_processor(), p.name));
    suite.push_back(std::move(p));
  }
  return suite;
}

std::vector<GatePrompt> gate_prompt_suite_from_file(const Tokenizer& tokenizer,
                                                    const std::filesystem::path& file) {
  std::istringstream in(read_regular_file(file));
  std::vector<GatePrompt> suite;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file.string() + ":" + std::to_string(number);
    std::string text = line;
    // A line that is one JSON string holds a prompt with newlines; any other line is the text.
    if (const Json quoted = Json::parse(line, nullptr, /*allow_exceptions=*/false);
        line.front() == '"' && quoted.is_string()) {
      text = quoted.get<std::string>();
      if (text.empty()) fail(where, "an empty prompt");
    }
    suite.push_back({"line" + std::to_string(number), tokenizer.encode(text, where), {}});
  }
  if (suite.empty()) fail(file.string(), "no prompts (one per non-empty line)");
  return suite;
}

GateReport run_gate(const Model& candidate, const Model& reference,
                    const std::vector<GatePrompt>& suite, int64_t n_greedy,
                    const GateThresholds& thresholds) {
  GateReport report;
  report.thresholds = thresholds;
  const int64_t vocab = reference.config().vocab_size;
  int64_t total_positions = 0;
  double top1_sum = 0, top5_sum = 0, kl_sum = 0;
  for (const GatePrompt& prompt : suite) {
    GatePromptResult r;
    r.name = prompt.name;
    // Teacher-forced: both models read the prompt and the reference's own continuation, each
    // with its own ids for the prompt's images.
    const std::vector<int32_t> ref_prompt = with_images(reference, prompt);
    const std::vector<int32_t> cand_prompt = with_images(candidate, prompt);
    const std::vector<int32_t> ref_greedy = greedy_reply(reference, ref_prompt, n_greedy);
    const std::vector<int32_t> cand_greedy = greedy_reply(candidate, cand_prompt, n_greedy);
    r.greedy_match = ref_greedy == cand_greedy;
    for (size_t i = 0; i < ref_greedy.size() && i < cand_greedy.size(); ++i) {
      if (ref_greedy[i] != cand_greedy[i]) {
        r.first_divergence = static_cast<int64_t>(i);
        break;
      }
    }
    const auto continued = [&](std::vector<int32_t> sequence) {
      sequence.insert(sequence.end(), ref_greedy.begin(), ref_greedy.end());
      if (sequence.size() > 1) sequence.pop_back();  // its logits would not be compared
      return sequence;
    };
    const std::vector<int32_t> ref_sequence = continued(ref_prompt);
    const std::vector<float> ref_logits = every_token_logits(reference, ref_sequence);
    const std::vector<float> cand_logits = every_token_logits(candidate, continued(cand_prompt));
    r.positions = static_cast<int64_t>(ref_sequence.size());
    r.pearson_min = 1.0;
    double top1 = 0, top5 = 0, kl = 0;
    for (int64_t t = 0; t < r.positions; ++t) {
      const float* a = ref_logits.data() + t * vocab;
      const float* b = cand_logits.data() + t * vocab;
      const auto ta = top_k_ids(a, vocab, std::min<int64_t>(5, vocab));
      const auto tb = top_k_ids(b, vocab, std::min<int64_t>(5, vocab));
      top1 += ta[0] == tb[0];
      int64_t overlap = 0;
      for (int32_t id : ta) overlap += std::count(tb.begin(), tb.end(), id);
      top5 += static_cast<double>(overlap) / static_cast<double>(ta.size());
      r.pearson_min = std::min(r.pearson_min, pearson(a, b, vocab));
      kl += kl_divergence(a, b, vocab);
    }
    r.top1 = top1 / r.positions;
    r.top5 = top5 / r.positions;
    r.kl_mean = kl / r.positions;
    total_positions += r.positions;
    top1_sum += top1;
    top5_sum += top5;
    kl_sum += kl;
    report.pearson_min = std::min(report.pearson_min, r.pearson_min);
    report.greedy_matched += r.greedy_match;
    report.prompts.push_back(r);
  }
  report.top1 = top1_sum / std::max<int64_t>(total_positions, 1);
  report.top5 = top5_sum / std::max<int64_t>(total_positions, 1);
  report.kl_mean = kl_sum / std::max<int64_t>(total_positions, 1);
  const double greedy_fraction =
      static_cast<double>(report.greedy_matched) / std::max<size_t>(suite.size(), 1);
  const auto check = [&](bool ok, const std::string& what) {
    if (!ok) report.failures.push_back(what);
  };
  char buf[160];
  std::snprintf(buf, sizeof buf, "top-1 %.4f < %.4f", report.top1, thresholds.min_top1);
  check(report.top1 >= thresholds.min_top1, buf);
  std::snprintf(buf, sizeof buf, "top-5 %.4f < %.4f", report.top5, thresholds.min_top5);
  check(report.top5 >= thresholds.min_top5, buf);
  std::snprintf(buf, sizeof buf, "Pearson r %.6f < %.6f", report.pearson_min,
                thresholds.min_pearson);
  check(report.pearson_min >= thresholds.min_pearson, buf);
  std::snprintf(buf, sizeof buf, "KL %.3g > %.3g", report.kl_mean, thresholds.max_kl);
  check(report.kl_mean <= thresholds.max_kl, buf);
  std::snprintf(buf, sizeof buf, "greedy %.3f < %.3f", greedy_fraction, thresholds.min_greedy);
  check(greedy_fraction >= thresholds.min_greedy, buf);
  report.passed = report.failures.empty();
  return report;
}

Json GateReport::to_json() const {
  Json prompts_json = Json::array();
  for (const auto& p : prompts) {
    prompts_json.push_back({{"name", p.name},
                            {"positions", p.positions},
                            {"top1", p.top1},
                            {"top5", p.top5},
                            {"pearson_min", p.pearson_min},
                            {"kl_mean", p.kl_mean},
                            {"greedy_match", p.greedy_match},
                            {"first_divergence", p.first_divergence}});
  }
  return {{"passed", passed},
          {"top1", top1},
          {"top5", top5},
          {"pearson_min", pearson_min},
          {"kl_mean", kl_mean},
          {"greedy_matched", greedy_matched},
          {"prompts", prompts.size()},
          {"thresholds",
           {{"min_top1", thresholds.min_top1},
            {"min_top5", thresholds.min_top5},
            {"min_pearson", thresholds.min_pearson},
            {"max_kl", thresholds.max_kl},
            {"min_greedy", thresholds.min_greedy}}},
          {"failures", failures},
          {"per_prompt", prompts_json}};
}

std::string GateReport::summary() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "gate %s: top-1 %.4f, top-5 %.4f, Pearson r (min) %.6f, KL %.3g, greedy %lld/%zu",
                passed ? "passed" : "FAILED", top1, top5, pearson_min, kl_mean,
                static_cast<long long>(greedy_matched), prompts.size());
  return buf;
}

}  // namespace qhx
