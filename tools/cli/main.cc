// qhx command line: generate, tokenize, render chat templates, score (perplexity),
// forge/verify/pack bundles, serve.
#include <signal.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "chat.h"
#include "chat/chat_template.h"
#include "forge/convert.h"
#include "forge/synth.h"
#include "io/bundle.h"
#include "io/hf_config.h"
#include "io/pack.h"
#include "kernels/attention.h"
#include "kernels/cpu_context.h"
#include "kernels/thread_pool.h"
#include "models/model.h"
#include "qhx/qhx.h"
#include "qhx_version.h"
#include "runtime/bench.h"
#include "runtime/generation_config.h"
#include "runtime/perplexity.h"
#include "runtime/session.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/json_file.h"

namespace {

namespace fs = std::filesystem;

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 0 || value > INT32_MAX) {
      qhx::fail(flag, "'" + item + "' is not a non-negative integer");
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  if (ids.empty()) qhx::fail(flag, "no values given");
  return ids;
}

// --logit-bias ID=BIAS: a token id and the number added to its logit ("-inf" bans it).
std::pair<int32_t, float> parse_logit_bias(const std::string& item) {
  const size_t eq = item.find('=');
  if (eq == std::string::npos) qhx::fail("--logit-bias", "'" + item + "' is not ID=BIAS");
  const int32_t id = parse_id_list(item.substr(0, eq), "--logit-bias").at(0);
  size_t used = 0;
  float bias = 0.0f;
  try {
    bias = std::stof(item.substr(eq + 1), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != item.size() - eq - 1) {
    qhx::fail("--logit-bias", "'" + item.substr(eq + 1) + "' is not a number");
  }
  return {id, bias};
}

// -t / --threads for the commands that run a model: default, every hardware thread.
int default_threads() {
  return qhx::hardware_threads();
}

void add_threads_option(CLI::App* command, int& threads) {
  command->add_option("-t,--threads", threads, "Compute threads (default: all hardware threads)")
      ->check(CLI::Range(1, 256));
}

// The context a command's model computes on: -t threads, the kernels QHX_KERNELS allows.
std::shared_ptr<qhx::CpuContext> cpu_context(int threads) {
  return std::make_shared<qhx::CpuContext>(threads, qhx::CpuKernels::from_environment());
}

struct GenerateArgs {
  int threads = default_threads();
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  std::optional<int64_t> n;  // default: generation_config.json's max_new_tokens, else 64
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
  std::optional<uint64_t> seed;
  bool print_ids = false;
  bool ignore_eos = false;
  bool verify = false;
};

// One line for stderr about a bundle's provenance: its plan and its gate certificate.
std::string describe_bundle(const qhx::BundleManifest& m) {
  std::string line = "bundle: " + m.family + ", weights " +
                     m.precision_policy.value("matrices", std::string("?")) + ", target " +
                     m.target + ", " + std::to_string(m.shards.size()) + " decoder shard(s); ";
  if (m.gate.is_null()) return line + "not gated";
  char buf[200];
  std::snprintf(buf, sizeof buf, "gate %s: top-1 %.4f, Pearson r %.6f, KL %.3g, greedy %lld/%lld",
                m.gate.value("passed", false) ? "passed" : "FAILED", m.gate.value("top1", 0.0),
                m.gate.value("pearson_min", 0.0), m.gate.value("kl_mean", 0.0),
                m.gate.value("greedy_matched", 0LL), m.gate.value("prompts", 0LL));
  return line + buf;
}

// Frees what the C API allocated when it goes out of scope.
struct OpenedModel {
  qhx_model* model = nullptr;
  qhx_session* session = nullptr;
  ~OpenedModel() {
    qhx_session_destroy(session);
    qhx_model_close(model);
  }
};

void check(qhx_status status) {
  if (status != QHX_OK) qhx::fail("generate", qhx_last_error());
}

// Through the C API, as chat and serve: the same sampling, stop ids and stop strings.
int run_generate(const GenerateArgs& args) {
  fs::path dir(args.model);
  if (qhx::is_pack(dir)) {
    dir = qhx::select_pack_bundle(dir);
    std::fprintf(stderr, "pack: using %s\n", dir.c_str());
  }
  if (!fs::exists(dir / "tokenizer.json") && (!args.prompt.empty() || !args.print_ids)) {
    qhx::fail(dir.string(), "no tokenizer.json: use --prompt-ids and --print-ids");
  }
  if (!args.stop.empty() && args.print_ids) {
    qhx::fail("--stop", "needs text output, not --print-ids");
  }
  qhx_model_options model_options;
  qhx_model_options_default(&model_options);
  model_options.n_threads = args.threads;
  model_options.verify_sha256 = args.verify ? 1 : 0;
  OpenedModel m;
  if (qhx_model_open(dir.c_str(), &model_options, &m.model) != QHX_OK) {
    qhx::fail(dir.string(), qhx_last_error());
  }
  qhx_model_info info;
  check(qhx_model_get_info(m.model, &info));
  if (info.admission_note[0] != '\0') std::fprintf(stderr, "%s\n", info.admission_note);
  // The model's own configuration, for generation_config.json's max_new_tokens; a bundle's
  // provenance on stderr (its files were checked as the model opened).
  qhx::ModelConfig config;
  if (qhx::is_bundle(dir)) {
    const qhx::BundleManifest manifest = qhx::open_bundle_manifest(dir, {});
    std::fprintf(stderr, "%s\n", describe_bundle(manifest).c_str());
    config = manifest.config;
  } else {
    config = qhx::load_model_config(dir / "config.json");
  }

  std::vector<int32_t> prompt;
  if (args.prompt_ids.empty()) {
    size_t n = 0;
    qhx_status status =
        qhx_tokenize(m.model, args.prompt.data(), args.prompt.size(), nullptr, 0, &n);
    if (status == QHX_ERROR_BUFFER_TOO_SMALL) {
      prompt.resize(n);
      status = qhx_tokenize(m.model, args.prompt.data(), args.prompt.size(), prompt.data(), n, &n);
    }
    if (status != QHX_OK) qhx::fail("--prompt", qhx_last_error());
  } else {
    prompt = parse_id_list(args.prompt_ids, "--prompt-ids");
  }

  // The checkpoint's defaults, as transformers' generate() would use them; a sampling flag turns
  // sampling on (with the file's other values), --greedy turns it off.
  qhx_generate_options options;
  check(qhx_generate_options_default(m.model, &options));
  options.max_new_tokens =
      args.n.value_or(qhx::load_generation_config(dir, config).max_new_tokens.value_or(64));
  qhx_sampling& s = options.sampling;
  if (args.greedy) {
    s.greedy = 1;
  } else if (args.temperature || args.top_k || args.top_p || args.min_p) {
    s.greedy = 0;
  }
  s.temperature = args.temperature.value_or(s.temperature);
  s.top_k = static_cast<int32_t>(args.top_k.value_or(s.top_k));
  s.top_p = args.top_p.value_or(s.top_p);
  s.min_p = args.min_p.value_or(s.min_p);
  s.repetition_penalty = args.repeat_penalty.value_or(s.repetition_penalty);
  s.presence_penalty = args.presence_penalty.value_or(s.presence_penalty);
  s.frequency_penalty = args.frequency_penalty.value_or(s.frequency_penalty);
  std::vector<int32_t> bias_ids;
  std::vector<float> bias_values;
  for (const std::string& item : args.logit_bias) {
    const auto [id, bias] = parse_logit_bias(item);
    bias_ids.push_back(id);
    bias_values.push_back(bias);
  }
  s.logit_bias_ids = bias_ids.data();
  s.logit_bias_values = bias_values.data();
  s.n_logit_bias = bias_ids.size();
  s.seed = args.seed.value_or(std::random_device{}());
  options.stop_at_eos = args.ignore_eos ? 0 : 1;
  std::vector<const char*> stops;
  for (const std::string& stop : args.stop) stops.push_back(stop.c_str());
  options.stop_strings = stops.data();
  options.n_stop_strings = stops.size();
  check(qhx_generate_options_check(m.model, &options));

  struct Output {
    bool ids;
    std::vector<int32_t> generated;
  } out{args.print_ids, {}};
  const auto on_token = [](void* user, int32_t token, const char* text, size_t len) {
    auto* o = static_cast<Output*>(user);
    if (token >= 0) o->generated.push_back(token);
    if (!o->ids) std::cout.write(text, static_cast<std::streamsize>(len)).flush();
    return 0;
  };
  check(qhx_session_create(m.model, nullptr, &m.session));
  qhx_generate_result result;
  check(qhx_session_generate(m.session, prompt.data(), prompt.size(), &options, on_token, &out,
                             &result));
  qhx_string_free(result.text);
  if (args.print_ids) {
    for (size_t i = 0; i < out.generated.size(); ++i)
      std::cout << (i ? "," : "") << out.generated[i];
  }
  std::cout << "\n";
  std::cout.flush();

  const double prefill_tps = result.n_prompt / std::max(result.prefill_ms * 1e-3, 1e-9);
  const double decode_tps = result.n_generated > 1
                                ? (result.n_generated - 1) / std::max(result.decode_ms * 1e-3, 1e-9)
                                : 0;
  std::fprintf(stderr,
               "prefill: %lld tokens, %.1f tok/s | decode: %lld tokens, %.1f tok/s | "
               "TTFT %.1f ms | peak RSS %.1f MB | %s\n",
               static_cast<long long>(result.n_prompt), prefill_tps,
               static_cast<long long>(result.n_generated), decode_tps, result.ttft_ms,
               peak_rss_mb(),
               s.greedy ? "greedy" : ("sampled, seed " + std::to_string(s.seed)).c_str());
  return 0;
}

struct ForgeArgs {
  std::string source, out, weights = "f32", lm_head, embed, target = "generic", reference,
                           activations = "auto";
  int64_t group_size = 64, shards = 1, max_context = 0;
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

void print_gate(const qhx::GateReport& r) {
  std::fprintf(stderr, "%s\n", r.summary().c_str());
  for (const auto& p : r.prompts) {
    std::fprintf(stderr, "  %-10s %4lld positions  top-1 %.4f  top-5 %.4f  r %.6f  KL %.3g  %s\n",
                 p.name.c_str(), static_cast<long long>(p.positions), p.top1, p.top5, p.pearson_min,
                 p.kl_mean,
                 p.greedy_match
                     ? "greedy identical"
                     : ("greedy differs at " + std::to_string(p.first_divergence)).c_str());
  }
  for (const auto& f : r.failures) std::fprintf(stderr, "  below threshold: %s\n", f.c_str());
}

constexpr int kGateFailed = 3;

// --activations auto|int8|f32 → ConvertOptions::int8_activations.
std::optional<bool> int8_activations_choice(const std::string& value) {
  if (value == "auto") return std::nullopt;
  if (value == "int8" || value == "f32") return value == "int8";
  qhx::fail("--activations", "'" + value + "' is not one of auto, int8, f32");
}

int run_convert(const ForgeArgs& a) {
  qhx::ConvertOptions o;
  o.weights = a.dtype("--weights", a.weights);
  if (!a.lm_head.empty()) o.lm_head = a.dtype("--lm-head", a.lm_head);
  if (!a.embed.empty()) o.embed = a.dtype("--embed", a.embed);
  o.group_size = a.group_size;
  o.shards = a.shards;
  o.max_shard_bytes = a.max_shard_bytes;
  o.target = a.target;
  o.max_context = a.max_context;
  o.gate = !a.no_gate;
  o.thresholds = a.thresholds(o.weights);
  o.gate_suite = a.suite;
  o.overwrite = a.force;
  o.int8_activations = int8_activations_choice(a.activations);
  const qhx::ConvertResult r = qhx::forge_convert(a.source, a.out, o);
  if (r.int8_activation_gate) {
    std::fprintf(stderr, "with int8 activations:\n");
    print_gate(*r.int8_activation_gate);
    std::fprintf(stderr, "int8 activations failed the gate; trying f32 activations:\n");
  }
  if (r.gate) print_gate(*r.gate);
  if (!r.published) {
    std::fprintf(stderr, "qhx: the gate failed; nothing was written to %s\n", a.out.c_str());
    return kGateFailed;
  }
  std::fprintf(stderr, "wrote %s (%s activations)\n", a.out.c_str(),
               r.int8_activations ? "int8" : "f32");
  return 0;
}

struct SynthArgs {
  std::string preset, out, weights, embed, lm_head, activations = "auto";
  uint64_t seed = 1;
};

// A random-weight checkpoint with a real model's shapes; with --weights, a bundle converted from
// it (ungated: there is no reference worth comparing random weights with).
int run_synth(const SynthArgs& a) {
  if (a.weights.empty()) {
    qhx::write_synthetic_checkpoint(qhx::synth_preset(a.preset), a.out, a.seed);
    std::fprintf(stderr, "wrote checkpoint %s\n", a.out.c_str());
    return 0;
  }
  qhx::ConvertOptions o;
  const auto weights = qhx::parse_weight_dtype(a.weights);
  if (!weights) qhx::fail("--weights", "'" + a.weights + "' is not one of f32, bf16, f16, w8, w4");
  o.weights = *weights;
  for (auto [flag, value, table] : {std::tuple{"--embed", &a.embed, &o.embed},
                                    std::tuple{"--lm-head", &a.lm_head, &o.lm_head}}) {
    if (value->empty()) continue;
    const auto d = qhx::parse_weight_dtype(*value);
    if (!d) qhx::fail(flag, "'" + *value + "' is not one of f32, bf16, f16, w8, w4");
    *table = *d;
  }
  o.int8_activations = int8_activations_choice(a.activations);
  o.gate = false;
  o.target = qhx::host_target();
  const qhx::SynthShape& shape = qhx::synth_preset(a.preset);
  const fs::path out(a.out);
  if (fs::exists(out)) qhx::fail(a.out, "already exists");
  const fs::path source = out.parent_path() / ("." + out.filename().string() + ".synth-source");
  fs::remove_all(source);
  qhx::write_synthetic_checkpoint(shape, source, a.seed);
  try {
    qhx::forge_convert(source, out, o);
  } catch (...) {
    fs::remove_all(source);
    throw;
  }
  fs::remove_all(source);
  std::fprintf(stderr, "wrote bundle %s (%s, weights %s)\n", a.out.c_str(), a.preset.c_str(),
               a.weights.c_str());
  return 0;
}

int run_gate(const ForgeArgs& a) {
  const auto manifest = qhx::open_bundle_manifest(a.source, {.check_target = false});
  const auto weights = qhx::parse_weight_dtype(manifest.precision_policy.value("matrices", "f32"));
  const qhx::GateReport r = qhx::forge_gate(
      a.source, a.reference, a.thresholds(weights.value_or(qhx::DType::kF32)), a.suite);
  print_gate(r);
  if (a.json) std::cout << r.to_json().dump() << "\n";
  return r.passed ? 0 : kGateFailed;
}

int run_verify(const std::string& bundle) {
  const auto manifest =
      qhx::open_bundle_manifest(bundle, {.verify_sha256 = true, .check_target = false});
  qhx::open_bundle_tensors(bundle, manifest);  // every tensor table parses and fits its file
  std::printf("%s: %zu files verified (sizes, sha256, tensor tables)\n", bundle.c_str(),
              manifest.files.size());
  if (!qhx::target_runs_here(manifest.target)) {
    std::printf("note: built for target '%s', this machine is '%s'\n", manifest.target.c_str(),
                qhx::host_target().c_str());
  }
  return 0;
}

int run_pack(const std::string& out, const std::vector<std::string>& bundles, bool force) {
  qhx::write_pack(out, std::vector<fs::path>(bundles.begin(), bundles.end()), force);
  std::fprintf(stderr, "wrote %s (%zu bundles)\n", out.c_str(), bundles.size());
  return 0;
}

struct BenchArgs {
  int threads = default_threads();
  std::string model;
  std::string prompts = "512", depths = "0";
  int64_t n_gen = 128;
  int64_t repetitions = 5;
  int64_t turns = 0;  // > 0: the multi-turn chat benchmark instead
  bool json = false;
};

std::vector<int64_t> parse_count_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  for (const int32_t v : parse_id_list(text, flag)) out.push_back(v);
  return out;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("model name")) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

// What the model's weights are: a bundle's matrix dtype (with its activations when int8), or a
// checkpoint's stored dtype.
std::string weights_label(const fs::path& dir, qhx::Json& gate) {
  if (qhx::is_bundle(dir)) {
    const auto manifest = qhx::open_bundle_manifest(dir, {});
    gate = manifest.gate;
    return manifest.precision_policy.value("matrices", std::string("?")) +
           (manifest.config.int8_activations ? "+a8" : "");
  }
  const qhx::Json config = qhx::read_json_file(dir / "config.json");
  const qhx::Json& text = config.contains("text_config") ? config["text_config"] : config;
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (text.contains(key) && text[key].is_string())
      return "checkpoint " + text[key].get<std::string>();
    if (config.contains(key) && config[key].is_string()) {
      return "checkpoint " + config[key].get<std::string>();
    }
  }
  return "checkpoint";
}

// Bytes of weights the model maps: a bundle's tensor files, or a checkpoint's safetensors.
double weight_file_mb(const fs::path& dir) {
  uint64_t bytes = 0;
  if (qhx::is_bundle(dir)) {
    for (const auto& f : qhx::open_bundle_manifest(dir, {}).files) {
      if (f.path.ends_with(".qhxt")) bytes += f.size;
    }
  } else {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() == ".safetensors") bytes += entry.file_size();
    }
  }
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// llama-bench-like: one record per (prompt length, depth) configuration.
// qhx bench --turns: per turn, the session that kept its state against a fresh one.
int run_chat_bench(const BenchArgs& args, const qhx::Model& model, const std::string& weights) {
  qhx::ChatBenchConfig config;
  config.turns = args.turns;
  config.user_tokens = parse_count_list("-p", args.prompts).front();
  config.reply_tokens = args.n_gen;
  const std::vector<qhx::ChatBenchTurn> turns = qhx::run_chat_bench(model, config);
  if (!args.json) {
    std::printf("model %s | weights %s | threads %d | %lld user + %lld reply tokens a turn\n",
                args.model.c_str(), weights.c_str(), model.context().threads(),
                static_cast<long long>(config.user_tokens),
                static_cast<long long>(config.reply_tokens));
    std::printf("%5s %9s %10s %14s %14s %9s %13s\n", "turn", "n_prompt", "processed",
                "TTFT kept ms", "TTFT fresh ms", "speedup", "decode tok/s");
  }
  for (size_t i = 0; i < turns.size(); ++i) {
    const qhx::ChatBenchTurn& t = turns[i];
    if (args.json) {
      std::cout << qhx::Json{{"model", args.model},
                             {"weights", weights},
                             {"threads", model.context().threads()},
                             {"turn", i + 1},
                             {"n_prompt", t.n_prompt},
                             {"n_processed", t.n_processed},
                             {"ttft_ms", t.ttft_ms},
                             {"ttft_fresh_ms", t.ttft_fresh_ms},
                             {"decode_tok_s", t.decode_tok_s},
                             {"commit", QHX_GIT_COMMIT},
                             {"date", utc_date()}}
                       .dump()
                << std::endl;
    } else {
      std::printf("%5zu %9lld %10lld %14.1f %14.1f %8.1fx %13.1f\n", i + 1,
                  static_cast<long long>(t.n_prompt), static_cast<long long>(t.n_processed),
                  t.ttft_ms, t.ttft_fresh_ms, t.ttft_fresh_ms / t.ttft_ms, t.decode_tok_s);
    }
  }
  return 0;
}

int run_bench(const BenchArgs& args) {
  fs::path dir(args.model);
  if (qhx::is_pack(dir)) dir = qhx::select_pack_bundle(dir);
  const std::vector<int64_t> prompt_lengths = parse_count_list("-p", args.prompts);
  const std::vector<int64_t> depths = parse_count_list("--depth", args.depths);
  qhx::Json gate;
  const std::string weights = weights_label(dir, gate);
  const auto load_start = qhx::Clock::now();
  const auto model = qhx::load_model(dir, {.context = cpu_context(args.threads)});
  const double load_s = qhx::seconds_since(load_start);
  const std::string cpu = cpu_model_name();
  const double weights_mb = weight_file_mb(dir);
  const qhx::CpuKernels& kernels = model->context().kernels();
  const std::string kernel_path = kernels.describe() + "; attention " +
                                  qhx::attention_kernel_path(kernels, model->config().head_dim);
  const int threads = model->context().threads();
  if (args.turns > 0) return run_chat_bench(args, *model, weights);
  if (!args.json) {
    std::printf(
        "model %s | weights %s, %.1f MB | threads %d | kernels %s | load %.2f s | CPU %s | commit "
        "%s\n",
        args.model.c_str(), weights.c_str(), weights_mb, threads, kernel_path.c_str(), load_s,
        cpu.c_str(), QHX_GIT_COMMIT);
    std::printf("%8s %8s %6s %22s %22s %18s %10s %10s\n", "n_prompt", "depth", "n_gen",
                "prefill tok/s", "decode tok/s", "TTFT ms", "state MB", "RSS MB");
  }
  std::vector<std::pair<qhx::BenchResult, qhx::Json>> results;  // JSON records wait for the probe
  for (const int64_t n_prompt : prompt_lengths) {
    for (const int64_t depth : depths) {
      qhx::BenchConfig config;
      config.n_prompt = n_prompt;
      config.n_gen = args.n_gen;
      config.depth = depth;
      config.repetitions = args.repetitions;
      const qhx::BenchResult r = qhx::run_bench(*model, config);
      if (args.json) {
        const auto spread = [](const qhx::Spread& s) {
          return qhx::Json{{"mean", s.mean}, {"stddev", s.stddev}, {"min", s.min}, {"max", s.max}};
        };
        const qhx::Json record = {
            {"model", args.model},
            {"weights", weights},
            {"threads", threads},
            {"n_prompt", n_prompt},
            {"n_gen", args.n_gen},
            {"depth", depth},
            {"repetitions", args.repetitions},
            {"prefill_tok_s", r.prefill_tok_s.mean},
            {"decode_tok_s", r.decode_tok_s.mean},
            {"ttft_ms", r.ttft_ms.mean},
            {"peak_rss_mb", peak_rss_mb()},
            {"weights_mb", weights_mb},
            {"state_mb", static_cast<double>(r.state_bytes) / (1024.0 * 1024.0)},
            {"load_s", load_s},
            {"spread",
             {{"prefill_tok_s", spread(r.prefill_tok_s)},
              {"decode_tok_s", spread(r.decode_tok_s)},
              {"ttft_ms", spread(r.ttft_ms)}}},
            {"family", model->config().family == qhx::Family::kQwen3_5 ? "qwen3_5" : "qwen3"},
            {"cpu", cpu},
            {"kernel_path", kernel_path},
            {"commit", QHX_GIT_COMMIT},
            {"date", utc_date()},
            {"gate", gate}};
        results.emplace_back(r, record);
      } else {
        const auto cell = [](const qhx::Spread& s) {
          char buf[48];
          std::snprintf(buf, sizeof buf, "%.2f ± %.2f", s.mean, s.stddev);
          return std::string(buf);
        };
        std::printf("%8lld %8lld %6lld %22s %22s %18s %10.1f %10.1f\n",
                    static_cast<long long>(n_prompt), static_cast<long long>(depth),
                    static_cast<long long>(args.n_gen), cell(r.prefill_tok_s).c_str(),
                    cell(r.decode_tok_s).c_str(), cell(r.ttft_ms).c_str(),
                    static_cast<double>(r.state_bytes) / (1024.0 * 1024.0), peak_rss_mb());
        std::fflush(stdout);
        results.emplace_back(r, qhx::Json());
      }
    }
  }
  // The memory's read bandwidth, measured after the runs (its buffer would count in their peak
  // RSS), against what each decode read.
  const double bandwidth = qhx::read_bandwidth(model->context());
  if (bandwidth <= 0 && !args.json) {
    std::printf("memory read bandwidth not measured: no room to map its buffer\n");
  }
  for (auto& [r, record] : results) {
    const double read = static_cast<double>(r.decode_step_bytes) * r.decode_tok_s.mean;
    const qhx::Json fraction =
        bandwidth > 0 && r.config.n_gen > 0 ? qhx::Json(read / bandwidth) : qhx::Json();
    if (args.json) {
      record["memory_read_gb_s"] = bandwidth > 0 ? qhx::Json(bandwidth * 1e-9) : qhx::Json();
      record["decode_read_gb_s"] = read * 1e-9;
      record["decode_bandwidth_fraction"] = fraction;
      std::cout << record.dump() << std::endl;
    } else if (r.config.n_gen > 0 && bandwidth > 0) {
      std::printf(
          "decode at depth %lld reads %.1f MB a token: %.1f GB/s, %.0f%% of the %.1f GB/s "
          "that %d threads read from memory\n",
          static_cast<long long>(r.config.depth), r.decode_step_bytes / 1e6, read * 1e-9,
          100 * read / bandwidth, bandwidth * 1e-9, threads);
    }
  }
  return 0;
}

struct PerplexityArgs {
  int threads = default_threads();
  std::string model, file;
  int64_t window = 512;
  int64_t max_tokens = 0;
  bool json = false;
};

// Reads a text file, scores it with the model and prints the perplexity (see perplexity.h).
int run_perplexity(const PerplexityArgs& args) {
  fs::path dir(args.model);
  if (qhx::is_pack(dir)) dir = qhx::select_pack_bundle(dir);
  const qhx::Tokenizer tokenizer = qhx::Tokenizer::load(dir);
  std::ifstream in(args.file, std::ios::binary);
  if (!in) qhx::fail(args.file, "cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> ids = tokenizer.encode(text, args.file);
  if (args.max_tokens > 0 && static_cast<int64_t>(ids.size()) > args.max_tokens) {
    ids.resize(args.max_tokens);
  }
  if (qhx::is_bundle(dir)) {
    std::fprintf(stderr, "%s\n", describe_bundle(qhx::open_bundle_manifest(dir, {})).c_str());
  }
  const auto model = qhx::load_model(dir, {.context = cpu_context(args.threads)});
  const auto start = qhx::Clock::now();
  const qhx::PerplexityResult r =
      qhx::perplexity(*model, ids, args.window, [](int64_t done, int64_t total) {
        std::fprintf(stderr, "\rwindow %lld/%lld", static_cast<long long>(done),
                     static_cast<long long>(total));
      });
  const double seconds = qhx::seconds_since(start);
  std::fprintf(stderr, "\n");
  if (args.json) {
    const qhx::Json out = {{"model", args.model},          {"file", args.file},
                           {"perplexity", r.perplexity()}, {"nll_mean", r.nll_sum / r.scored},
                           {"tokens", r.scored},           {"windows", r.windows},
                           {"window", args.window},        {"seconds", seconds}};
    std::cout << out.dump() << "\n";
  } else {
    std::printf("perplexity %.4f over %lld tokens (%lld windows of %lld, %.1f s)\n", r.perplexity(),
                static_cast<long long>(r.scored), static_cast<long long>(r.windows),
                static_cast<long long>(args.window), seconds);
  }
  return 0;
}

int run_tokenize(const std::string& model_dir) {
  const qhx::Tokenizer tokenizer = qhx::Tokenizer::load(model_dir);
  const std::string text((std::istreambuf_iterator<char>(std::cin)),
                         std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = tokenizer.encode(text, "stdin");
  std::cout << "[";
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
  std::cout << "]\n";
  return 0;
}

struct ServeArgs {
  int threads = default_threads();
  std::string model;
  int64_t ctx_size = 0;
  int64_t cache_mb = 256;
  bool verify = false;
  qhx::server::ServerOptions server;
};

// The OpenAI-compatible server (src/server), on the C API like any other embedder of qhx.
int run_serve(const ServeArgs& args) {
  qhx_model_options options;
  qhx_model_options_default(&options);
  options.n_threads = args.threads;
  options.context_length = args.ctx_size;
  options.max_sessions = args.server.parallel;
  options.prefix_cache_bytes = args.cache_mb << 20;
  options.verify_sha256 = args.verify;
  qhx_model* model = nullptr;
  if (qhx_model_open(args.model.c_str(), &options, &model) != QHX_OK) {
    std::fprintf(stderr, "qhx: error: %s\n", qhx_last_error());
    return 1;
  }
  qhx_model_info info{};
  qhx_model_get_info(model, &info);
  std::fprintf(stderr,
               "model %s (%s): context %lld tokens x %d sessions, memory estimate %.1f MB%s%s\n",
               info.name, info.family, static_cast<long long>(info.context_length),
               args.server.parallel, static_cast<double>(info.memory_estimate) / (1 << 20),
               *info.admission_note != '\0' ? " | " : "", info.admission_note);
  // SIGINT and SIGTERM stop the server cleanly: they are blocked here (and so in every thread
  // started from now on) and waited for by one thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  int status = 0;
  try {
    qhx::server::Server server(model, args.server);
    const int port = server.start();
    std::fprintf(stderr, "listening on http://%s:%d (%d slots, queue %d)\n",
                 args.server.host.c_str(), port, args.server.parallel, args.server.queue);
    std::thread stopper([&] {
      int signal_number = 0;
      sigwait(&stop_signals, &signal_number);
      std::fprintf(stderr, "stopping (signal %d)\n", signal_number);
      server.stop();
    });
    server.wait();
    stopper.join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qhx: error: %s\n", e.what());
    status = 1;
  }
  qhx_model_close(model);
  return status;
}

struct TemplateArgs {
  std::string model;
  bool no_generation_prompt = false;
  std::optional<bool> enable_thinking;
};

// stdin holds {"messages": [...], "tools": [...], "chat_template_kwargs": {...}}; prints the
// template's text as it is. The flags win over the kwargs.
int run_template(const TemplateArgs& args) {
  const qhx::Tokenizer tokenizer = qhx::Tokenizer::load(args.model);
  const std::string origin = (fs::path(args.model) / "chat_template").string();
  const qhx::ChatTemplate chat = qhx::ChatTemplate::from_tokenizer(tokenizer, origin);
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  qhx::ChatTemplateInputs inputs = qhx::parse_chat_request(input, "stdin");
  if (args.no_generation_prompt) inputs.add_generation_prompt = false;
  if (args.enable_thinking) inputs.set_enable_thinking(*args.enable_thinking);
  const std::string text = chat.render(inputs);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qhx: on-device runtime for Qwen3 and Qwen3.5 models"};
  app.require_subcommand(1);

  GenerateArgs gen;
  CLI::App* generate = app.add_subcommand("generate", "Generate a continuation of a prompt");
  generate
      ->add_option("--model,-m", gen.model, "Bundle, pack, or Hugging Face checkpoint directory")
      ->required();
  auto* prompt_opt = generate->add_option("--prompt,-p", gen.prompt, "Prompt text (UTF-8)");
  auto* ids_opt =
      generate->add_option("--prompt-ids", gen.prompt_ids, "Prompt as comma-separated token ids");
  prompt_opt->excludes(ids_opt);
  generate
      ->add_option("-n,--n-predict", gen.n,
                   "Tokens to generate (default: generation_config.json's max_new_tokens, or 64)")
      ->check(CLI::NonNegativeNumber);
  generate->add_flag("--greedy", gen.greedy,
                     "Pick the most likely token (default unless generation_config.json samples)");
  generate->add_option("--temperature", gen.temperature, "Sampling temperature");
  generate->add_option("--top-k", gen.top_k, "Sample from the k most likely tokens (0: all)");
  generate->add_option("--top-p", gen.top_p, "Sample from the smallest set with this mass");
  generate->add_option("--min-p", gen.min_p,
                       "Drop tokens less likely than this fraction of the most likely one");
  generate->add_option("--repeat-penalty", gen.repeat_penalty,
                       "Repetition penalty over prompt and output (HF style; 1: off)");
  generate->add_option("--presence-penalty", gen.presence_penalty,
                       "Subtracted from the logit of every token already generated");
  generate->add_option("--frequency-penalty", gen.frequency_penalty,
                       "Subtracted from a token's logit once per time it was generated");
  generate
      ->add_option("--logit-bias", gen.logit_bias,
                   "ID=BIAS added to that token's logit (repeatable)")
      ->allow_extra_args(false);
  generate->add_option("--stop", gen.stop, "Stop before this text (repeatable)")
      ->allow_extra_args(false);
  generate->add_option("--seed", gen.seed, "Random seed (default: random, printed)");
  generate->add_flag("--print-ids", gen.print_ids,
                     "Print the generated ids, comma-separated, on one line instead of text");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "Do not stop at the end-of-sequence ids");
  generate->add_flag("--verify", gen.verify, "Bundles: check every file's sha256 before loading");
  add_threads_option(generate, gen.threads);

  qhx::cli::ChatArgs chat_args;
  CLI::App* chat = app.add_subcommand("chat", "Interactive chat in the terminal (/help inside)");
  chat->add_option("--model,-m", chat_args.model, "Bundle, pack, or checkpoint directory")
      ->required();
  chat->add_option("--system", chat_args.system, "System prompt");
  chat->add_option("-n,--max-new-tokens", chat_args.max_new_tokens, "Longest reply in tokens")
      ->check(CLI::PositiveNumber);
  chat->add_option("-c,--ctx-size", chat_args.context_length,
                   "Context length (default: the model's, lowered to fit in memory)")
      ->check(CLI::NonNegativeNumber);
  auto* think = chat->add_flag_callback(
      "--think", [&] { chat_args.thinking = true; }, "Thinking on (default: the template's)");
  chat->add_flag_callback(
          "--no-think", [&] { chat_args.thinking = false; }, "Thinking off")
      ->excludes(think);
  chat->add_flag("--greedy", chat_args.greedy, "Most likely tokens instead of sampling");
  chat->add_option("--seed", chat_args.seed, "Random seed");
  chat->add_flag("--stats", chat_args.stats, "Print prompt reuse and speed after every reply");
  add_threads_option(chat, chat_args.threads);

  std::string tokenize_model;
  CLI::App* tokenize =
      app.add_subcommand("tokenize", "Read UTF-8 text on stdin, print its token ids as JSON");
  tokenize->add_option("--model,-m", tokenize_model, "Directory with tokenizer.json")->required();

  TemplateArgs template_args;
  CLI::App* template_cmd = app.add_subcommand(
      "template", "Render the chat template for {\"messages\", \"tools\"} JSON on stdin");
  template_cmd->add_option("--model,-m", template_args.model, "Directory with the tokenizer")
      ->required();
  template_cmd->add_flag("--no-generation-prompt", template_args.no_generation_prompt,
                         "Do not open an assistant turn at the end");
  template_cmd
      ->add_option("--enable-thinking", template_args.enable_thinking,
                   "Pass enable_thinking (true or false) to the template")
      ->transform(CLI::IsMember({"true", "false"}));

  ForgeArgs forge_args;
  CLI::App* forge = app.add_subcommand("forge", "Build bundles from Hugging Face checkpoints");
  forge->require_subcommand(1);
  CLI::App* convert = forge->add_subcommand("convert", "Convert a checkpoint into a gated bundle");
  convert->add_option("source", forge_args.source, "Hugging Face checkpoint directory")->required();
  convert->add_option("-o,--output", forge_args.out, "Bundle directory to create")->required();
  convert->add_option("--weights", forge_args.weights, "Decoder matrices: f32, bf16, f16, w8, w4");
  convert->add_option("--lm-head", forge_args.lm_head, "lm_head dtype (default: --weights)");
  convert->add_option("--embed", forge_args.embed, "Embedding table dtype (default: --weights)");
  convert->add_option("--group-size", forge_args.group_size, "W4 group width")
      ->check(CLI::PositiveNumber);
  auto* shards_opt = convert->add_option("--shards", forge_args.shards, "Decoder shards")
                         ->check(CLI::PositiveNumber);
  convert
      ->add_option("--max-shard-bytes", forge_args.max_shard_bytes,
                   "Split decoder layers into shards of at most this size")
      ->excludes(shards_opt);
  convert->add_option("--target", forge_args.target,
                      "generic, x86_64, x86_64-avx2, x86_64-avx512, aarch64, aarch64-dotprod");
  convert->add_option("--max-ctx", forge_args.max_context, "Context limit of the plan");
  convert->add_option("--activations", forge_args.activations,
                      "W8/W4 matrices multiply int8-quantized or f32 activations: auto (int8 if "
                      "the gate accepts it), int8, f32");
  convert->add_flag("--no-gate", forge_args.no_gate, "Publish without running the oracle gate");
  convert->add_flag("--force", forge_args.force, "Replace an existing bundle");
  CLI::App* gate = forge->add_subcommand("gate", "Compare a bundle with its reference");
  gate->add_option("bundle", forge_args.source, "Bundle directory")->required();
  gate->add_option("--reference", forge_args.reference, "Hugging Face checkpoint or f32 bundle")
      ->required();
  gate->add_flag("--json", forge_args.json, "Also print the report as one JSON object on stdout");
  for (CLI::App* sub : {convert, gate}) {
    sub->add_option("--gate-prompts", forge_args.suite.prompts, "Prompts in the built-in suite")
        ->check(CLI::PositiveNumber);
    sub->add_option("--gate-prompt-file", forge_args.suite.prompt_file,
                    "Gate on these prompts instead: one per non-empty line (needs a tokenizer)");
    sub->add_option("--gate-tokens", forge_args.suite.greedy_tokens, "Greedy tokens per prompt")
        ->check(CLI::PositiveNumber);
    sub->add_option("--min-top1", forge_args.min_top1, "Gate threshold: top-1 agreement");
    sub->add_option("--min-top5", forge_args.min_top5, "Gate threshold: top-5 overlap");
    sub->add_option("--min-pearson", forge_args.min_pearson, "Gate threshold: Pearson r");
    sub->add_option("--max-kl", forge_args.max_kl, "Gate threshold: mean KL (nats)");
    sub->add_option("--min-greedy", forge_args.min_greedy,
                    "Gate threshold: fraction of identical greedy continuations");
  }

  BenchArgs bench_args;
  CLI::App* bench = app.add_subcommand("bench", "Prefill and decode speed, TTFT, memory");
  bench->add_option("model", bench_args.model, "Bundle, pack, or checkpoint directory")->required();
  bench->add_option("-p,--n-prompt", bench_args.prompts, "Prompt lengths, comma-separated");
  bench->add_option("-n,--n-gen", bench_args.n_gen, "Decoded tokens")
      ->check(CLI::NonNegativeNumber);
  bench->add_option("-d,--depth", bench_args.depths,
                    "Context tokens before the decode is timed, comma-separated");
  bench->add_option("-r,--repetitions", bench_args.repetitions, "Repetitions")
      ->check(CLI::PositiveNumber);
  bench
      ->add_option("--turns", bench_args.turns,
                   "Multi-turn chat instead: N turns of -p user tokens and -n reply tokens, "
                   "TTFT with the state kept vs. a fresh session")
      ->check(CLI::PositiveNumber);
  bench->add_flag("--json", bench_args.json, "One JSON object per configuration on stdout");
  add_threads_option(bench, bench_args.threads);

  PerplexityArgs ppl;
  CLI::App* perplexity_cmd =
      app.add_subcommand("perplexity", "Score a UTF-8 text file: perplexity over windows");
  perplexity_cmd->add_option("--model,-m", ppl.model, "Bundle, pack, or checkpoint directory")
      ->required();
  perplexity_cmd->add_option("--file,-f", ppl.file, "Text file")->required();
  perplexity_cmd->add_option("--window", ppl.window, "Tokens scored per window (context resets)")
      ->check(CLI::PositiveNumber);
  perplexity_cmd->add_option("--max-tokens", ppl.max_tokens, "Score only the first N tokens")
      ->check(CLI::NonNegativeNumber);
  perplexity_cmd->add_flag("--json", ppl.json, "Print one JSON object");
  add_threads_option(perplexity_cmd, ppl.threads);

  SynthArgs synth_args;
  CLI::App* synth = forge->add_subcommand(
      "synth", "Random-weight checkpoint or bundle with a real model's shapes (benchmarks)");
  std::string presets;
  for (const auto& name : qhx::synth_preset_names())
    presets += (presets.empty() ? "" : ", ") + name;
  synth->add_option("--preset", synth_args.preset, presets)->required();
  synth->add_option("-o,--output", synth_args.out, "Directory to create")->required();
  synth->add_option("--weights", synth_args.weights,
                    "Write a bundle with these weights (f32, bf16, f16, w8, w4) for this machine's "
                    "target; default: a bf16 Hugging Face-layout checkpoint");
  synth->add_option("--embed", synth_args.embed, "With --weights: embedding table dtype");
  synth->add_option("--lm-head", synth_args.lm_head, "With --weights: lm_head dtype");
  synth->add_option("--activations", synth_args.activations,
                    "With --weights w8/w4: auto (= int8, ungated), int8, f32");
  synth->add_option("--seed", synth_args.seed, "Random seed");

  std::string verify_bundle;
  CLI::App* verify = app.add_subcommand("verify", "Check a bundle's files against its manifest");
  verify->add_option("bundle", verify_bundle, "Bundle directory")->required();

  std::string pack_out;
  std::vector<std::string> pack_bundles;
  bool pack_force = false;
  CLI::App* pack = app.add_subcommand("pack", "Gather bundles for several targets into a pack");
  pack->add_option("bundles", pack_bundles, "Bundle directories, one per target")->required();
  pack->add_option("-o,--output", pack_out, "Pack directory to create")->required();
  pack->add_flag("--force", pack_force, "Replace an existing pack");

  ServeArgs serve_args;
  CLI::App* serve = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/server.md)");
  serve->add_option("--model,-m", serve_args.model, "Bundle, pack, or checkpoint directory")
      ->required();
  serve->add_option("--host", serve_args.server.host, "Address to listen on");
  serve->add_option("--port", serve_args.server.port, "Port (0: any free one)")
      ->check(CLI::Range(0, 65535));
  serve->add_option("--parallel", serve_args.server.parallel, "Sessions served at once (slots)")
      ->check(CLI::Range(1, 256));
  serve
      ->add_option("--queue", serve_args.server.queue,
                   "Requests that may wait for a slot; past them, 429")
      ->check(CLI::Range(0, 4096));
  serve
      ->add_option("--ctx-size,-c", serve_args.ctx_size,
                   "Tokens per session (default: as many as the model and memory allow)")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--cache-mb", serve_args.cache_mb, "Prefix cache shared by the slots, MB")
      ->check(CLI::Range(0, 1 << 20));
  serve
      ->add_option("--max-request-bytes", serve_args.server.max_request_bytes,
                   "Larger request bodies get 413")
      ->check(CLI::PositiveNumber);
  serve->add_option("--alias", serve_args.server.alias,
                    "Model id for clients (default: the model directory's name)");
  serve
      ->add_option("--api-key", serve_args.server.api_key,
                   "Clients must send 'Authorization: Bearer KEY' (all but /health)")
      ->envname("QHX_API_KEY");
  serve->add_option("--cors-origin", serve_args.server.cors_origins,
                    "Web page origin allowed to call the server (repeat; '*': any)");
  serve->add_option("--allowed-host", serve_args.server.allowed_hosts,
                    "Host header name answered besides the --host address (repeat; '*': any)");
  serve
      ->add_option("--max-connections", serve_args.server.max_connections,
                   "Open connections at most; past it new ones are closed")
      ->check(CLI::Range(1, 65536));
  serve
      ->add_option("--timeout", serve_args.server.timeout_seconds,
                   "Seconds a client has to send a request (and may stall reading an answer)")
      ->check(CLI::Range(1, 3600));
  serve->add_flag("--verify", serve_args.verify,
                  "Bundles: check every file's sha256 before serving");
  add_threads_option(serve, serve_args.threads);

  CLI11_PARSE(app, argc, argv);
  try {
    if (generate->parsed()) {
      if (gen.prompt.empty() && gen.prompt_ids.empty()) {
        qhx::fail("generate", "give --prompt or --prompt-ids");
      }
      return run_generate(gen);
    }
    if (chat->parsed()) return qhx::cli::run_chat(chat_args);
    if (convert->parsed()) return run_convert(forge_args);
    if (gate->parsed()) return run_gate(forge_args);
    if (synth->parsed()) return run_synth(synth_args);
    if (verify->parsed()) return run_verify(verify_bundle);
    if (perplexity_cmd->parsed()) return run_perplexity(ppl);
    if (bench->parsed()) return run_bench(bench_args);
    if (pack->parsed()) return run_pack(pack_out, pack_bundles, pack_force);
    if (serve->parsed()) return run_serve(serve_args);
    if (template_cmd->parsed()) return run_template(template_args);
    return run_tokenize(tokenize_model);
  } catch (const qhx::Error& e) {
    std::cout.flush();
    std::fprintf(stderr, "qhx: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // file system and allocation failures
    std::cout.flush();
    std::fprintf(stderr, "qhx: error: %s\n", e.what());
    return 1;
  }
}
