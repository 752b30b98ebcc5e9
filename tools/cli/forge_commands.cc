// The bundle commands: qhx forge convert, gate and synth, qhx verify, qhx pack. Thin over
// src/forge and src/io; what they add is the gate's report on stderr and its exit status.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/qnn/npu_pack.h"
#include "commands.h"
#include "forge/convert.h"
#include "forge/draft_vocab.h"
#include "forge/npu_card.h"
#include "forge/npu_pack.h"
#include "forge/synth.h"
#include "io/bundle.h"
#include "io/draft_vocab.h"
#include "io/hf_config.h"
#include "io/pack.h"
#include "runtime/gate.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace qhx::cli {

namespace fs = std::filesystem;

namespace {

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

// "123", "40M", "1.5G": bytes, K/M/G meaning 2^10, 2^20, 2^30.
uint64_t parse_byte_size(const char* flag, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty()  ? 1
                       : unit == "K" ? 0x1p10
                       : unit == "M" ? 0x1p20
                       : unit == "G" ? 0x1p30
                                     : 0;
  if (used == 0 || scale == 0 || !(value > 0)) {
    qhx::fail(flag, "'" + text + "' is not a size (bytes, or a number with K, M or G)");
  }
  return static_cast<uint64_t>(value * scale);
}

}  // namespace

int run_convert(const ForgeArgs& a) {
  qhx::ConvertOptions o;
  o.weights = a.dtype("--weights", a.weights);
  if (!a.lm_head.empty()) o.lm_head = a.dtype("--lm-head", a.lm_head);
  if (!a.embed.empty()) o.embed = a.dtype("--embed", a.embed);
  o.group_size = a.group_size;
  o.calibration_texts.assign(a.calibrate.begin(), a.calibrate.end());
  const auto method = qhx::parse_calibration_method(a.calibration_method);
  if (!method)
    qhx::fail("--calibration-method", "'" + a.calibration_method + "' is not gptq or weighted");
  o.calibration_method = *method;
  o.calibration_tokens = a.calibrate_tokens;
  o.sensitivity_tokens = a.sensitivity_tokens;
  if (!a.size_budget.empty()) o.size_budget = parse_byte_size("--size-budget", a.size_budget);
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
  for (const std::string& note : r.notes) std::fprintf(stderr, "qhx: note: %s\n", note.c_str());
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

// A random-weight checkpoint with a real model's shapes; with --weights, a bundle converted from
// it (ungated: there is no reference worth comparing random weights with).
int run_synth(const SynthArgs& a) {
  const qhx::SynthVision tower;
  const qhx::SynthVision* vision = a.vision ? &tower : nullptr;
  if (a.weights.empty()) {
    qhx::write_synthetic_checkpoint(qhx::synth_preset(a.preset), a.out, a.seed, vision);
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
  // native(), not string(): on a temporary, g++ 12 -O3 warns of an overlap (-Wrestrict) that is
  // not there.
  const fs::path source = out.parent_path() / ("." + out.filename().native() + ".synth-source");
  fs::remove_all(source);
  qhx::write_synthetic_checkpoint(shape, source, a.seed, vision);
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

int run_draft_vocab(const DraftVocabArgs& a) {
  const fs::path dir(a.model);
  const bool bundle = qhx::is_bundle(dir);
  if (bundle && a.out.empty()) {
    qhx::fail("--output",
              "a bundle lists its files: write the list beside its checkpoint (then "
              "convert again), or name a file");
  }
  const int64_t vocab_size = bundle ? qhx::open_bundle_manifest(dir, {}).config.vocab_size
                                    : qhx::load_model_config(dir / "config.json").vocab_size;
  const qhx::Tokenizer tokenizer = qhx::Tokenizer::load(dir);
  std::vector<std::string> texts;
  for (const std::string& file : a.texts) {
    std::ifstream in(file, std::ios::binary);
    if (!in) qhx::fail(file, "cannot be read");
    texts.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const qhx::DraftVocab vocab =
      qhx::rank_draft_vocab(tokenizer, texts, {.coverage = a.coverage, .max_tokens = a.max_tokens});
  const fs::path out = a.out.empty() ? dir / qhx::kDraftVocabFile : fs::path(a.out);
  std::string source = "qhx forge draft-vocab:";
  for (const std::string& file : a.texts) {
    source += ' ';
    source += fs::path(file).filename().native();  // not " " + string(): g++ 12's -Wrestrict
  }
  qhx::write_draft_vocab(out, vocab, vocab_size, source);
  std::fprintf(stderr, "wrote %s: %zu tokens, %.4f%% of the text's %lld\n", out.c_str(),
               vocab.ids.size(), 100.0 * vocab.coverage, static_cast<long long>(vocab.text_tokens));
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

int run_forge_npu(const NpuPackArgs& a) {
  qhx::NpuPackOptions options;
  options.chips.clear();
  for (size_t begin = 0; begin <= a.chips.size();) {
    const size_t comma = std::min(a.chips.find(',', begin), a.chips.size());
    if (comma > begin) options.chips.push_back(a.chips.substr(begin, comma - begin));
    begin = comma + 1;
  }
  options.context_budget_bytes = static_cast<int64_t>(a.context_budget);
  options.qnn_lib = a.qnn_lib;
  options.overwrite = a.force;
  if (!a.form.empty()) options.form = qhx::parse_npu_form(a.form);  // checked by the parser
  for (const std::string& f : a.calibrate) options.calibration_texts.emplace_back(f);
  options.calibration.max_tokens = a.calibrate_tokens;
  if (!a.suite.empty()) {
    if (!std::filesystem::exists(std::filesystem::path(a.bundle) / "tokenizer.json")) {
      qhx::fail("--suite", a.bundle + " has no tokenizer to read the prompts with");
    }
    options.suite = qhx::gate_prompt_suite_from_file(qhx::Tokenizer::load(a.bundle), a.suite);
    options.suite_name = std::filesystem::path(a.suite).filename().string();
  }
  options.suite_tokens = a.suite_tokens;
  options.decode = a.decode;
  options.decode_context = static_cast<int64_t>(a.decode_context);
  if (a.decode_context > 0 && !a.decode) qhx::fail("--decode-context", "needs --decode");
  options.check = !a.no_check;
  if (a.no_check && !a.suite.empty()) {
    qhx::fail("--no-check", "measures nothing: --suite needs the comparison");
  }
  for (const qhx::NpuPackChipReport& r : qhx::forge_npu_pack(a.bundle, a.out, options)) {
    const std::string form(qhx::npu_form_name(r.form));
    if (r.contexts == 0) {
      std::fprintf(stderr, "v%d %s: %lld graphs, compiled where they run (no binary); %s\n", r.arch,
                   form.c_str(), static_cast<long long>(r.graphs), r.gate.c_str());
    } else {
      std::fprintf(stderr,
                   "v%d %s: %lld graphs in %lld context(s), %.1f MB (%.1f MB of constants); %s\n",
                   r.arch, form.c_str(), static_cast<long long>(r.graphs),
                   static_cast<long long>(r.contexts), static_cast<double>(r.bytes) / 1e6,
                   static_cast<double>(r.const_bytes) / 1e6, r.gate.c_str());
    }
    if (r.decode_contexts > 0) {
      const std::string more = r.decode_graphs_compiled_at_use == 0
                                   ? ""
                                   : ", " + std::to_string(r.decode_graphs_compiled_at_use) +
                                         " more compiled as the acceptance decoded";
      std::fprintf(stderr,
                   "  decode steps: %lld graphs in %lld context(s) of their own, %.1f MB (%.1f MB "
                   "of constants)%s\n",
                   static_cast<long long>(r.decode_graphs),
                   static_cast<long long>(r.decode_contexts),
                   static_cast<double>(r.decode_bytes) / 1e6,
                   static_cast<double>(r.decode_const_bytes) / 1e6, more.c_str());
    }
    for (const qhx::NpuAcceptance& accepted : r.acceptance) {
      std::fprintf(stderr, "  %s\n", qhx::describe_acceptance(accepted).c_str());
    }
  }
  std::fprintf(stderr, "wrote %s (README.md: the pack's card)\n", a.out.c_str());
  return 0;
}

int run_verify(const std::string& bundle) {
  if (qhx::is_npu_pack(bundle)) {
    const qhx::NpuPackManifest m = qhx::read_npu_pack(bundle);
    const int64_t files = qhx::verify_npu_pack(bundle);
    std::printf("%s: NPU pack for '%s', %lld files verified (sizes, sha256) for", bundle.c_str(),
                m.base_name.c_str(), static_cast<long long>(files));
    for (const qhx::NpuPackChip& chip : m.chips) std::printf(" v%d", chip.arch);
    std::printf("; compiled by QNN %s\n", m.qnn_build.c_str());
    return 0;
  }
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
  for (const std::string& b : bundles) {
    if (qhx::is_npu_pack(b)) {
      qhx::fail(b,
                "an NPU pack (qhx forge npu), not a bundle: it ships beside the one bundle it "
                "pairs with (--npu-pack), not inside a pack of bundles");
    }
  }
  qhx::write_pack(out, std::vector<fs::path>(bundles.begin(), bundles.end()), force);
  std::fprintf(stderr, "wrote %s (%zu bundles)\n", out.c_str(), bundles.size());
  return 0;
}

}  // namespace qhx::cli
