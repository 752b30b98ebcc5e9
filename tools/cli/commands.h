// The qhx commands main() dispatches to (all but chat, in chat.h): each takes what its options
// filled in and returns the process's exit status; errors are thrown for main() to report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "forge/convert.h"
#include "runtime/gate.h"
#include "server/server.h"
#include "util/error.h"

namespace qhx::cli {

struct GenerateArgs {
  int threads = default_threads();
  DeviceArgs devices;
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  std::vector<std::string> images;  // --image, in the order of the prompt's <|image_pad|>
  std::optional<int64_t> n;         // default: generation_config.json's max_new_tokens, else 64
  bool greedy = false;
  std::optional<float> temperature;
  std::optional<int64_t> top_k;
  std::optional<float> top_p;
  std::optional<float> min_p;
  std::optional<float> repeat_penalty;
  std::optional<float> presence_penalty;
  std::optional<float> frequency_penalty;
  std::vector<std::string> logit_bias;  // ID=BIAS
  std::vector<std::string> stop;
  std::string json_schema, grammar, response_format;  // structured output, at most one
  std::optional<uint64_t> seed;
  bool print_ids = false;
  bool ignore_eos = false;
  bool verify = false;
  SpeculativeArgs speculative;
};

struct EmbedArgs {
  int threads = default_threads();
  DeviceArgs devices;
  std::string model;
  std::vector<std::string> prompts;  // the inputs, then those of `file`
  std::string file;
  std::string prompt_name, instruct, prefix;  // what goes before each input, at most one
  std::string pooling;                        // "": the model's
  bool no_normalize = false;
  int64_t dimensions = 0;
  std::string format = "json";
};

// qhx embed: one vector per input on stdout (docs/embeddings.md).
int run_embed(const EmbedArgs& args);

// qhx devices: the CPU and every accelerator this build can use, one per line.
int run_devices();

// qhx generate: one prompt's continuation on stdout, speed figures on stderr.
int run_generate(const GenerateArgs& args);

// qhx forge convert and qhx forge gate.
struct ForgeArgs {
  std::string source, out, weights = "f32", lm_head, embed, target = "generic", reference,
                           activations = "auto";
  int64_t group_size = 64, shards = 1, max_context = 0;
  std::vector<std::string> calibrate;  // texts for calibrated W8/W4
  std::string calibration_method = "gptq";
  int64_t calibrate_tokens = 4096, sensitivity_tokens = 512;
  std::string size_budget;  // bytes, or with K, M, G
  qhx::GateSuiteOptions suite;
  uint64_t max_shard_bytes = 0;
  std::optional<double> min_top1, min_top5, min_pearson, max_kl, min_greedy;
  bool no_gate = false, force = false, json = false;

  qhx::DType dtype(const std::string& flag, const std::string& value) const {
    const auto d = qhx::parse_weight_dtype(value);
    if (!d) qhx::fail(flag, "'" + value + "' is not one of f32, bf16, f16, w8, w4");
    return *d;
  }
  std::optional<qhx::GateThresholds> thresholds(qhx::DType weights) const {
    if (!min_top1 && !min_top5 && !min_pearson && !max_kl && !min_greedy) return std::nullopt;
    qhx::GateThresholds t = qhx::default_gate_thresholds(weights);
    if (min_top1) t.min_top1 = *min_top1;
    if (min_top5) t.min_top5 = *min_top5;
    if (min_pearson) t.min_pearson = *min_pearson;
    if (max_kl) t.max_kl = *max_kl;
    if (min_greedy) t.min_greedy = *min_greedy;
    return t;
  }
};

// qhx forge npu: a bundle's prompt graphs compiled for Hexagon chips into an NPU pack.
struct NpuPackArgs {
  std::string bundle, out, chips = "v75,v81", qnn_lib, form, suite;
  std::vector<std::string> calibrate;
  int64_t calibrate_tokens = 4096, suite_tokens = 32;
  uint64_t context_budget = 0;
  uint64_t decode_context = 0;  // 0: the model's
  bool force = false, decode = false, no_check = false;
};
int run_forge_npu(const NpuPackArgs& a);

// qhx forge convert: a checkpoint into a bundle, published only if it passes the gate (else 3).
int run_convert(const ForgeArgs& a);
// qhx forge gate: a bundle compared with its reference; exit status 3 if it fails.
int run_gate(const ForgeArgs& a);

struct SynthArgs {
  std::string preset, out, weights, embed, lm_head, activations = "auto";
  uint64_t seed = 1;
  bool vision = false;  // with a vision tower (Qwen3.5 presets)
};

// qhx forge synth: a random-weight checkpoint, or bundle, with a preset's shapes.
int run_synth(const SynthArgs& a);

struct DraftVocabArgs {
  std::string model, out;
  std::vector<std::string> texts;
  double coverage = 0.999;
  int64_t max_tokens = 0;
};

// qhx forge draft-vocab: a checkpoint's draft_vocab.json from sample text.
int run_draft_vocab(const DraftVocabArgs& a);

// qhx verify: a bundle's files against its manifest (sizes, sha256, tensor tables).
int run_verify(const std::string& bundle);

// qhx pack: bundles for several targets gathered into one pack at `out`.
int run_pack(const std::string& out, const std::vector<std::string>& bundles, bool force);

struct BenchArgs {
  int threads = default_threads();
  DeviceArgs devices;
  std::string model;
  std::string prompts = "512", depths = "0";
  int64_t n_gen = 128;
  int64_t repetitions = 5;
  int64_t turns = 0;  // > 0: the multi-turn chat benchmark instead
  bool json = false;
  // Not "none": the speculative-decoding benchmark instead, on the text of prompt_file.
  SpeculativeArgs speculative;
  std::string prompt_file;
  // The context sweep instead (runtime/context_sweep.h): replies of sweep_tokens tokens after
  // growing depths of prompt_file's text, against the reference (default: the CPU alone).
  bool context_sweep = false;
  std::string sweep_depths, reference;
  int64_t sweep_tokens = 32;
  // The image benchmark instead: each a PNG/JPEG file or WxH (a random image of that size).
  std::vector<std::string> images;
};

// qhx bench: prefill and decode speed, TTFT and memory; with --turns, the multi-turn chat bench.
int run_bench(const BenchArgs& args);

struct PerplexityArgs {
  int threads = default_threads();
  DeviceArgs devices;
  std::string model, file;
  int64_t window = 512;
  bool second_half = false;  // llama-perplexity's chunks (runtime/perplexity.h)
  int64_t max_tokens = 0;
  std::string kl_base;  // --kl-divergence: the model the divergence is measured from
  bool json = false;
};

// qhx perplexity: a text file's perplexity under the model.
int run_perplexity(const PerplexityArgs& args);

struct ServeArgs {
  int threads = default_threads();
  DeviceArgs devices;
  std::string model;
  int64_t ctx_size = 0;
  int64_t cache_mb = 256;
  bool verify = false;
  SpeculativeArgs speculative;  // sets server.speculative and draft_max
  qhx::server::ServerOptions server;
};

// qhx serve: the OpenAI-compatible server until SIGINT or SIGTERM.
int run_serve(const ServeArgs& args);

// qhx tokenize: stdin's UTF-8 text as a JSON array of token ids.
int run_tokenize(const std::string& model_dir);

struct TemplateArgs {
  std::string model;
  bool no_generation_prompt = false;
  std::optional<bool> enable_thinking;
};

// qhx template: the chat template rendered for the JSON request on stdin.
int run_template(const TemplateArgs& args);

}  // namespace qhx::cli
