// The oracle gate: compares a candidate model (a converted bundle) with a reference (the
// Hugging Face checkpoint, or an f32 bundle) on a prompt suite, and decides whether the
// candidate may be published. Thresholds and their reasoning: docs/gate.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"
#include "util/json_file.h"
#include "vision/image_processor.h"

namespace qhx {

struct GateThresholds {
  double min_top1 = 1.0;     // fraction of positions whose argmax agrees
  double min_top5 = 1.0;     // mean overlap of the top-5 sets
  double min_pearson = 1.0;  // lowest per-position Pearson r of the logits
  double max_kl = 0.0;       // mean KL(reference ‖ candidate), nats
  double min_greedy = 0.0;   // fraction of prompts whose greedy continuation is identical
};

// Defaults by the weight dtype of the candidate (docs/gate.md).
GateThresholds default_gate_thresholds(DType weights);

struct GatePrompt {
  std::string name;
  std::vector<int32_t> ids;  // each image one image_token_id: each model reads its own ids there
  std::vector<PixelValues> images;
};

// Which prompts the gate runs and how far it follows each.
struct GateSuiteOptions {
  int64_t prompts = 8;                // built-in suite size (ignored with a prompt file)
  int64_t greedy_tokens = 32;         // greedy continuation compared per prompt
  std::filesystem::path prompt_file;  // optional: gate_prompt_suite_from_file's
};

// The built-in suite: text prompts through the tokenizer when there is one, else deterministic
// random ids (the small test checkpoints have no tokenizer).
std::vector<GatePrompt> gate_prompt_suite(const Tokenizer* tokenizer, int64_t vocab_size,
                                          int64_t n_prompts);

// Prompts with an image each (a smooth picture and a noisy one, of different sizes) for a model
// that reads images, so that the gate measures the vision tower too: text around
// <|vision_start|><|image_pad|><|vision_end|>, through the tokenizer when there is one.
std::vector<GatePrompt> gate_image_prompts(const Model& model, const Tokenizer* tokenizer);

// A suite read from a file: one prompt per non-empty line (a domain-specific suite, e.g. text in
// the style the model was trained on); a line that is one JSON string is that string, for
// prompts that hold newlines. Errors name the file and line.
std::vector<GatePrompt> gate_prompt_suite_from_file(const Tokenizer& tokenizer,
                                                    const std::filesystem::path& file);

struct GatePromptResult {
  std::string name;
  int64_t positions = 0;
  double top1 = 0, top5 = 0, pearson_min = 0, kl_mean = 0;
  bool greedy_match = false;
  int64_t first_divergence = -1;  // index of the first differing greedy token, -1 if none
};

struct GateReport {
  std::vector<GatePromptResult> prompts;
  double top1 = 0, top5 = 0, pearson_min = 1, kl_mean = 0;
  int64_t greedy_matched = 0;
  GateThresholds thresholds;
  bool passed = false;
  std::vector<std::string> failures;  // which thresholds were missed

  Json to_json() const;
  std::string summary() const;  // one line
};

GateReport run_gate(const Model& candidate, const Model& reference,
                    const std::vector<GatePrompt>& suite, int64_t n_greedy,
                    const GateThresholds& thresholds);

}  // namespace qhx
