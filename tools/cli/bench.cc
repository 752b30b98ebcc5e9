// qhx bench: speed records in llama-bench's shape (src/runtime/bench.h measures), with what a
// record needs to be compared later: the CPU, the kernels, the weights, the commit, the date.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "common.h"
#include "io/bundle.h"
#include "io/hf_config.h"
#include "io/pack.h"
#include "kernels/attention.h"
#include "kernels/cpu_context.h"
#include "models/model.h"
#include "qhx_version.h"
#include "runtime/bench.h"
#include "runtime/context_sweep.h"
#include "runtime/profile_report.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/json_file.h"
#include "vision/image.h"
#include "vision/image_processor.h"

namespace qhx::cli {

namespace fs = std::filesystem;

namespace {

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

// A device's profile of one configuration (qhx bench --profile): its peaks, then where its time
// went in a prompt pass and in a decode step.
void print_profile(const qhx::Json& p, int64_t n_prompt, int64_t depth, int64_t n_gen) {
  const qhx::Json& peaks = p["peaks"];
  std::string rates;
  for (const auto& [arithmetic, rate] : peaks["ops_per_s"].items()) {
    char cell[64];
    std::snprintf(cell, sizeof cell, ", %s %.1f Gop/s", arithmetic.c_str(),
                  rate.get<double>() * 1e-9);
    rates += cell;
  }
  std::printf("%8s %s peaks measured: read %.1f GB/s%s\n", "",
              p["device"].get<std::string>().c_str(), peaks["read_gb_s"].get<double>(),
              rates.c_str());
  char title[160];
  if (p.contains("prefill")) {
    std::snprintf(title, sizeof title, "%8s profile of a prompt pass of %lld tokens", "",
                  static_cast<long long>(n_prompt));
    std::fputs(qhx::profile_table(title, p["prefill"]).c_str(), stdout);
  }
  if (p.contains("decode")) {
    std::snprintf(title, sizeof title, "%8s profile of a decode step (%lld steps after depth %lld)",
                  "", static_cast<long long>(n_gen), static_cast<long long>(depth));
    std::fputs(qhx::profile_table(title, p["decode"]).c_str(), stdout);
  }
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

// --image's WxH: a random image of that size (speed does not depend on the pixels).
std::optional<qhx::RgbImage> random_image(const std::string& spec) {
  int64_t w = 0, h = 0;
  char end = 0;
  if (std::sscanf(spec.c_str(), "%" SCNd64 "x%" SCNd64 "%c", &w, &h, &end) != 2 || w <= 0 ||
      h <= 0 || w > 16384 || h > 16384 || fs::exists(spec)) {
    return std::nullopt;
  }
  qhx::RgbImage image{w, h, std::vector<uint8_t>(static_cast<size_t>(w * h * 3))};
  std::mt19937 rng(1);
  for (uint8_t& v : image.pixels) v = static_cast<uint8_t>(rng() >> 24);
  return image;
}

// qhx bench --image: per image, reading it (decode and preprocessing), the vision tower, and the
// prompt that holds its tokens; TTFT is their sum.
int run_image_bench(const BenchArgs& args, const qhx::Model& model, const std::string& weights) {
  if (!model.has_vision()) {
    qhx::fail("--image", args.model + " reads no images: " + model.vision_unavailable());
  }
  if (!args.json) {
    std::printf("model %s | weights %s | threads %d | CPU %s | commit %s\n", args.model.c_str(),
                weights.c_str(), model.context().threads(), cpu_model_name().c_str(),
                QHX_GIT_COMMIT);
    std::printf("%-24s %10s %8s %7s %14s %18s %18s %10s\n", "image", "size", "patches", "tokens",
                "read ms", "encode ms", "prefill ms", "TTFT ms");
  }
  for (const std::string& spec : args.images) {
    const std::optional<qhx::RgbImage> random = random_image(spec);
    std::vector<double> read_ms;
    qhx::PixelValues pixels;
    qhx::RgbImage image;
    for (int64_t i = 0; i < args.repetitions; ++i) {
      const auto start = qhx::Clock::now();
      image = random ? *random : qhx::read_image(spec);
      pixels = qhx::preprocess_image(image, model.image_processor(), spec);
      read_ms.push_back(qhx::seconds_since(start) * 1e3);
    }
    const qhx::Spread read = qhx::Spread::of(read_ms);
    const qhx::ImageBenchResult r = qhx::run_image_bench(model, pixels, args.repetitions);
    const double ttft = read.mean + r.encode_ms.mean + r.prefill_ms.mean;
    const std::string size = std::to_string(image.width) + "x" + std::to_string(image.height);
    if (args.json) {
      std::cout << qhx::Json{{"model", args.model},
                             {"weights", weights},
                             {"threads", model.context().threads()},
                             {"cpu", cpu_model_name()},
                             {"image", spec},
                             {"size", size},
                             {"grid", {pixels.grid.t, pixels.grid.h, pixels.grid.w}},
                             {"patches", r.patches},
                             {"image_tokens", r.tokens},
                             {"read_ms", read.mean},
                             {"encode_ms", r.encode_ms.mean},
                             {"encode_ms_stddev", r.encode_ms.stddev},
                             {"prefill_ms", r.prefill_ms.mean},
                             {"prefill_ms_stddev", r.prefill_ms.stddev},
                             {"ttft_ms", ttft},
                             {"commit", QHX_GIT_COMMIT},
                             {"date", utc_date()}}
                       .dump()
                << std::endl;
    } else {
      std::printf("%-24s %10s %8lld %7lld %14.1f %11.1f ± %4.1f %11.1f ± %4.1f %10.1f\n",
                  fs::path(spec).filename().c_str(), size.c_str(),
                  static_cast<long long>(r.patches), static_cast<long long>(r.tokens), read.mean,
                  r.encode_ms.mean, r.encode_ms.stddev, r.prefill_ms.mean, r.prefill_ms.stddev,
                  ttft);
    }
  }
  return 0;
}

// --prompt-file's text in the model's tokens (`flag`: the mode that needs it).
std::vector<int32_t> prompt_file_ids(const BenchArgs& args, const fs::path& dir, const char* flag) {
  if (args.prompt_file.empty()) qhx::fail(flag, "needs --prompt-file");
  std::ifstream in(args.prompt_file, std::ios::binary);
  if (!in) qhx::fail(args.prompt_file, "cannot be read");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return qhx::Tokenizer::load(dir).encode(text, args.prompt_file);
}

// The context sweep (runtime/context_sweep.h): a table, or one JSON object.
int run_context_sweep(const BenchArgs& args, const fs::path& dir, const qhx::Model& model,
                      const std::shared_ptr<qhx::CpuContext>& context, const std::string& weights,
                      const qhx::OpenedDevices& devices) {
  const std::vector<int32_t> ids = prompt_file_ids(args, dir, "--context-sweep");
  const std::string reference_dir = args.reference.empty() ? dir.string() : args.reference;
  const auto reference = qhx::load_model(reference_dir, {.context = context});
  if (reference->config().vocab_size != model.config().vocab_size) {
    qhx::fail("--reference", reference_dir + " has another vocabulary than " + dir.string());
  }
  const int64_t positions =
      std::min(model.config().max_position_embeddings, reference->config().max_position_embeddings);
  const std::vector<int64_t> depths =
      args.sweep_depths.empty()
          ? qhx::default_sweep_depths(positions, static_cast<int64_t>(ids.size()),
                                      args.sweep_tokens)
          : parse_count_list("--sweep-depths", args.sweep_depths);
  if (depths.empty()) {
    qhx::fail(args.prompt_file, "too short to sweep (" + std::to_string(ids.size()) + " tokens)");
  }
  const std::vector<qhx::SweepPoint> points =
      qhx::context_sweep(model, *reference, ids, depths, args.sweep_tokens);
  // A device that failed part-way left the rest to the CPU: say so, the figures are not its.
  const std::string failure = model.device_failures() > 0 ? model.device_failure() : std::string();
  int64_t departs = -1, coherent_to = 0;  // the shallowest departure; coherent from the start
  for (const qhx::SweepPoint& p : points) {
    if (departs < 0 && p.first_departure >= 0) departs = p.depth;
  }
  for (const qhx::SweepPoint& p : points) {
    if (!p.coherent) break;
    coherent_to = p.depth;
  }
  qhx::Json rows = qhx::Json::array();
  for (const qhx::SweepPoint& p : points) {
    rows.push_back({{"depth", p.depth},
                    {"first_departure", p.first_departure},
                    {"length", p.length},
                    {"reference_length", p.reference_length},
                    {"nll", p.nll},
                    {"reference_nll", p.reference_nll},
                    {"coherent", p.coherent}});
  }
  if (args.json) {
    std::cout << qhx::Json{{"model", args.model},
                           {"weights", weights},
                           {"prompts_on", devices.prefill.text()},
                           {"replies_on", devices.decode.text()},
                           {"reference", reference_dir},
                           {"text", args.prompt_file},
                           {"reply_tokens", args.sweep_tokens},
                           {"sweep", rows},
                           {"device_failure", failure},
                           {"commit", QHX_GIT_COMMIT}}
                     .dump()
              << "\n";
    return 0;
  }
  std::printf(
      "context sweep of %s (weights %s; prompts on %s, replies on %s) against %s on the CPU: "
      "replies of up to %lld tokens after the first tokens of %s (%zu tokens)\n",
      args.model.c_str(), weights.c_str(), devices.prefill.text().c_str(),
      devices.decode.text().c_str(), reference_dir.c_str(),
      static_cast<long long>(args.sweep_tokens), args.prompt_file.c_str(), ids.size());
  std::printf("%8s %11s %7s %11s %8s %8s %9s\n", "depth", "departs at", "length", "ref length",
              "NLL", "ref NLL", "coherent");
  for (const qhx::SweepPoint& p : points) {
    const std::string at = p.first_departure < 0 ? "-" : std::to_string(p.first_departure);
    std::printf("%8lld %11s %7lld %11lld %8.3f %8.3f %9s\n", static_cast<long long>(p.depth),
                at.c_str(), static_cast<long long>(p.length),
                static_cast<long long>(p.reference_length), p.nll, p.reference_nll,
                p.coherent ? "yes" : "no");
  }
  if (!failure.empty()) {
    std::printf("the device failed part-way (%s): what followed ran on the CPU\n", failure.c_str());
  }
  std::printf(
      "%s; coherent %s\n",
      departs < 0 ? "never departs from the reference"
                  : ("first departs at depth " + std::to_string(departs)).c_str(),
      coherent_to == 0 ? "at no depth" : ("through depth " + std::to_string(coherent_to)).c_str());
  return 0;
}

// Speculative decoding on one task: decode speed with and without drafts, their acceptance, and
// the cost of a verify pass of k drafts in decode steps.
int run_speculative_bench(const BenchArgs& args, const fs::path& dir, const qhx::Model& model,
                          const std::shared_ptr<qhx::CpuContext>& context,
                          const std::string& weights) {
  qhx::SpeculativeBenchConfig config;
  config.prompt = prompt_file_ids(args, dir, "--speculative");
  config.n_gen = args.n_gen;
  config.repetitions = args.repetitions;
  config.speculative.kind = qhx::parse_draft_kind(args.speculative.kind(), "--speculative");
  config.speculative.draft_max = args.speculative.draft_max;
  std::unique_ptr<qhx::Model> draft_model;
  if (args.speculative.draft_model() != nullptr) {
    // On the CPU, in the model's context, as qhx_model_open opens one.
    draft_model = qhx::load_model(args.speculative.draft_model(), {.context = context});
    config.speculative.draft_model = draft_model.get();
  }
  const qhx::SpeculativeBenchResult r = qhx::run_speculative_bench(model, config);
  const double speedup = r.speculative_tok_s.mean / std::max(r.plain_tok_s.mean, 1e-9);
  const double acceptance = r.drafted > 0 ? static_cast<double>(r.accepted) / r.drafted : 0.0;
  const double per_pass =
      static_cast<double>(r.n_generated - 1) / std::max<int64_t>(r.decode_passes, 1);
  qhx::Json verify = qhx::Json::array();
  for (const double ms : r.verify_ms) verify.push_back(ms / r.step_ms);
  // The tokens the MTP head drafts from (0: the whole vocabulary).
  const size_t draft_vocab =
      config.speculative.kind == qhx::DraftKind::kMtp ? model.mtp_vocab().size() : 0;
  if (args.json) {
    std::cout << qhx::Json{{"model", args.model},
                           {"weights", weights},
                           {"threads", model.context().threads()},
                           {"speculative", args.speculative.value},
                           {"draft_max", args.speculative.draft_max},
                           {"draft_vocab", draft_vocab},
                           {"prompt_file", args.prompt_file},
                           {"n_prompt", config.prompt.size()},
                           {"n_gen", args.n_gen},
                           {"repetitions", args.repetitions},
                           {"plain_decode_tok_s", r.plain_tok_s.mean},
                           {"speculative_decode_tok_s", r.speculative_tok_s.mean},
                           {"speedup", speedup},
                           {"same_tokens", r.same_tokens},
                           {"acceptance", acceptance},
                           {"tokens_per_pass", per_pass},
                           {"verify_passes", r.verify_passes},
                           {"rollbacks", r.rollbacks},
                           {"step_ms", r.step_ms},
                           {"verify_pass_in_steps", verify},
                           {"checkpoint_ms", r.checkpoint_ms},
                           {"cpu", cpu_model_name()},
                           {"commit", QHX_GIT_COMMIT},
                           {"date", utc_date()}}
                     .dump()
              << std::endl;
    return 0;
  }
  std::printf(
      "model %s | weights %s | threads %d | %s, drafts of up to %d%s | prompt %zu tokens "
      "(%s) | %lld generated, same tokens: %s\n",
      args.model.c_str(), weights.c_str(), model.context().threads(),
      args.speculative.value.c_str(), args.speculative.draft_max,
      draft_vocab > 0 ? (" from " + std::to_string(draft_vocab) + " tokens").c_str() : "",
      config.prompt.size(), args.prompt_file.c_str(), static_cast<long long>(r.n_generated),
      r.same_tokens ? "yes" : "NO");
  std::printf(
      "decode tok/s: plain %.2f ± %.2f, speculative %.2f ± %.2f: %.2fx | acceptance %.3f "
      "(%lld of %lld) | %.2f tokens per pass | %lld verify passes, %lld rollbacks\n",
      r.plain_tok_s.mean, r.plain_tok_s.stddev, r.speculative_tok_s.mean,
      r.speculative_tok_s.stddev, speedup, acceptance, static_cast<long long>(r.accepted),
      static_cast<long long>(r.drafted), per_pass, static_cast<long long>(r.verify_passes),
      static_cast<long long>(r.rollbacks));
  std::printf("at depth %zu: a decode step %.2f ms; a verify pass of k drafts, in steps:",
              config.prompt.size(), r.step_ms);
  for (size_t k = 0; k < r.verify_ms.size(); ++k) {
    std::printf(" k=%zu %.2f", k + 1, r.verify_ms[k] / r.step_ms);
  }
  std::printf(" | recurrent-state checkpoint %.3f ms\n", r.checkpoint_ms);
  return r.same_tokens ? 0 : 1;
}

}  // namespace

int run_bench(const BenchArgs& args) {
  fs::path dir(args.model);
  if (qhx::is_pack(dir)) dir = qhx::select_pack_bundle(dir);
  const std::vector<int64_t> prompt_lengths = parse_count_list("-p", args.prompts);
  const std::vector<int64_t> depths = parse_count_list("--depth", args.depths);
  qhx::Json gate;
  const std::string weights = weights_label(dir, gate);
  const auto load_start = qhx::Clock::now();
  qhx::OpenedDevices devices = open_devices(args.devices, dir);
  qhx::Json backends = qhx::Json::array({"cpu"});
  for (const auto& b : devices.backends) backends.push_back(b->name());
  const std::shared_ptr<qhx::CpuContext> context = cpu_context(args.threads);
  const qhx::KvType kv_type = qhx::parse_kv_type(args.devices.kv_type, "--kv-type");
  const auto model = qhx::load_model(dir, {.context = context,
                                           .devices = devices.backends,
                                           .mtp_vocab_size = args.speculative.mtp_vocab,
                                           .kv_type = kv_type});
  const bool on_devices = check_devices(*model, devices, args.devices, dir);
  if (!on_devices) {  // the records say where the runs ran: on the CPU alone
    devices.prefill = {};
    devices.decode = {};
  }
  const double load_s = qhx::seconds_since(load_start);
  // Where the device reads its weights: in place from the mapped files, or copies of its own.
  qhx::Json device_weights = nullptr;
  if (!devices.backends.empty()) {
    const qhx::WeightMemory w = qhx::weight_memory(devices);
    device_weights = {{"in_place", static_cast<double>(w.in_place_bytes) / 1e6},
                      {"copied", static_cast<double>(w.copied_bytes) / 1e6}};
  }
  const std::string cpu = cpu_model_name();
  const double weights_mb = weight_file_mb(dir);
  const qhx::CpuKernels& kernels = model->context().kernels();
  const std::string kernel_path =
      kernels.describe() + "; attention " +
      qhx::attention_kernel_path(kernels, model->config().head_dim, kv_type) + ", " +
      qhx::kv_type_name(kv_type) + " KV cache";
  const int threads = model->context().threads();
  // --profile: the devices that time their work, and their peaks, measured before the runs.
  std::vector<qhx::Backend*> profiled;
  std::vector<qhx::DevicePeaks> peaks;
  if (args.devices.profile) {
    if (args.turns > 0 || args.speculative.on() || args.context_sweep) {
      qhx::fail("--profile",
                "profiles the prefill and decode runs only (not --turns, "
                "--speculative or --context-sweep)");
    }
    if (!on_devices) {
      qhx::fail("--profile",
                "the device failed its check before use (above), so the CPU runs everything: "
                "nothing of the device's to profile (--device-check never profiles it unchecked)");
    }
    for (const auto& b : devices.backends) {
      if (b->profiles()) profiled.push_back(b.get());
    }
    if (profiled.empty()) {
      qhx::fail("--profile",
                "no device here times its work: it takes a Vulkan device that "
                "opened (--device vulkan; `qhx devices` lists them)");
    }
    for (qhx::Backend* b : profiled) peaks.push_back(b->measure_peaks());
  }
  if (!args.images.empty()) return run_image_bench(args, *model, weights);
  if (args.turns > 0) return run_chat_bench(args, *model, weights);
  if (args.speculative.on()) return run_speculative_bench(args, dir, *model, context, weights);
  if (args.context_sweep) {
    return run_context_sweep(args, dir, *model, context, weights, devices);
  }
  if (!args.json) {
    std::printf(
        "model %s | weights %s, %.1f MB | threads %d | kernels %s | load %.2f s | CPU %s | "
        "prompts on %s, replies on %s | commit %s\n",
        args.model.c_str(), weights.c_str(), weights_mb, threads, kernel_path.c_str(), load_s,
        cpu.c_str(), devices.prefill.text().c_str(), devices.decode.text().c_str(), QHX_GIT_COMMIT);
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
      config.profiled = profiled;
      const qhx::BenchResult r = qhx::run_bench(*model, config);
      // Per device: where its time went in a prompt pass and in a decode step.
      qhx::Json profiles = nullptr;
      if (!profiled.empty()) {
        profiles = qhx::Json::array();
        for (size_t i = 0; i < profiled.size(); ++i) {
          qhx::Json p = {{"device", profiled[i]->name()}, {"peaks", qhx::peaks_json(peaks[i])}};
          if (r.prefill_passes > 0) {
            p["prefill"] = qhx::profile_json(r.prefill_profiles[i], peaks[i], r.prefill_passes);
          }
          if (r.decode_steps > 0) {
            p["decode"] = qhx::profile_json(r.decode_profiles[i], peaks[i], r.decode_steps);
          }
          profiles.push_back(p);
        }
      }
      // Per prefill pass and per decode step: what ran on the device and crossed between
      // backends, and the first step's time after the prompt.
      const auto per = [](const qhx::DeviceTraffic& t, int64_t n) {
        const double d = static_cast<double>(std::max<int64_t>(n, 1));
        return qhx::Json{{"device_passes", static_cast<double>(t.passes) / d},
                         {"copies", static_cast<double>(t.copies) / d},
                         {"copied_kb", static_cast<double>(t.copy_bytes) / d / 1024.0},
                         {"device_tokens", static_cast<double>(t.tokens) / d}};
      };
      const qhx::Json handoff = {
          {"prefill_pass", per(r.prefill_traffic, r.prefill_passes)},
          {"decode_step", per(r.decode_traffic, r.decode_steps)},
          {"first_decode_step_ms", r.first_step_ms.mean},
          {"decode_step_ms", r.decode_tok_s.mean > 0 ? 1e3 / r.decode_tok_s.mean : 0.0},
          {"states", "shared: every backend's sequence states are in memory the host maps"}};
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
            {"prefill_device", devices.prefill.text()},
            {"decode_device", devices.decode.text()},
            {"backends", backends},
            {"npu_pack", args.devices.npu_pack},
            {"handoff", handoff},
            {"device_weights_mb", device_weights},
            {"commit", QHX_GIT_COMMIT},
            {"date", utc_date()},
            {"gate", gate},
            {"profile", profiles}};
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
        if (model->has_devices()) {
          const qhx::Json& p = handoff["prefill_pass"];
          const qhx::Json& d = handoff["decode_step"];
          std::printf(
              "%8s hand-off: a prompt pass %.0f copies (%.1f KB) on %.0f device passes, a decode "
              "step %.1f copies (%.1f KB); first step after the prompt %.2f ms, steady %.2f ms\n",
              "", p["copies"].get<double>(), p["copied_kb"].get<double>(),
              p["device_passes"].get<double>(), d["copies"].get<double>(),
              d["copied_kb"].get<double>(), r.first_step_ms.mean,
              handoff["decode_step_ms"].get<double>());
        }
        for (const qhx::Json& p : profiles.is_null() ? qhx::Json::array() : profiles) {
          print_profile(p, n_prompt, depth, args.n_gen);
        }
        std::fflush(stdout);
        results.emplace_back(r, qhx::Json());
      }
    }
  }
  // What each decode read against the read bandwidth of the memory the decoding device reads:
  // the CPU's, measured after the runs (its buffer would count in their peak RSS), or a device's
  // own, from --profile's peaks (without them, none: the CPU's memory is not its yardstick).
  const std::string decoder = devices.decode.text();
  double bandwidth = 0;
  std::string read_by;
  if (decoder == "cpu") {
    bandwidth = qhx::read_bandwidth(model->context());
    read_by = std::to_string(threads) + " threads read from memory";
    if (bandwidth <= 0 && !args.json) {
      std::printf("memory read bandwidth not measured: no room to map its buffer\n");
    }
  } else {
    for (size_t i = 0; i < profiled.size(); ++i) {
      if (profiled[i]->name().starts_with(decoder + " ")) {  // "vulkan:0 (...)"
        bandwidth = peaks[i].read_bytes_per_s;
        read_by = decoder + " reads at its measured peak";
      }
    }
  }
  for (auto& [r, record] : results) {
    const double read = static_cast<double>(r.decode_step_bytes) * r.decode_tok_s.mean;
    const qhx::Json fraction =
        bandwidth > 0 && r.config.n_gen > 0 ? qhx::Json(read / bandwidth) : qhx::Json();
    if (args.json) {
      record["memory_read_gb_s"] = bandwidth > 0 ? qhx::Json(bandwidth * 1e-9) : qhx::Json();
      record["memory_read_by"] = decoder;
      record["decode_read_gb_s"] = read * 1e-9;
      record["decode_bandwidth_fraction"] = fraction;
      std::cout << record.dump() << std::endl;
    } else if (r.config.n_gen > 0 && bandwidth > 0) {
      std::printf(
          "decode at depth %lld reads %.1f MB a token: %.1f GB/s, %.0f%% of the %.1f GB/s "
          "that %s\n",
          static_cast<long long>(r.config.depth), r.decode_step_bytes / 1e6, read * 1e-9,
          100 * read / bandwidth, bandwidth * 1e-9, read_by.c_str());
    } else if (r.config.n_gen > 0 && decoder != "cpu") {
      std::printf(
          "decode at depth %lld on %s reads %.1f MB a token: %.1f GB/s (--profile "
          "measures the device's peak)\n",
          static_cast<long long>(r.config.depth), decoder.c_str(), r.decode_step_bytes / 1e6,
          read * 1e-9);
    }
  }
  return 0;
}

}  // namespace qhx::cli
