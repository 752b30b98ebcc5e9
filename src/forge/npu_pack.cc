#include "forge/npu_pack.h"

#include <fstream>
#include <map>
#include <optional>

#include "backend/qnn/hexagon_backend.h"
#include "forge/npu_card.h"
#include "io/bundle.h"
#include "models/model.h"
#include "runtime/device_check.h"
#include "runtime/gate.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/partial_path.h"
#include "util/sha256.h"

namespace qhx {
namespace fs = std::filesystem;
namespace {

// The prompt plans a session runs, one chunk each, so that every graph they use is compiled.
void run_prompt_plans(const Model& model, int64_t rows) {
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    ids[i] = static_cast<int32_t>((i * 7919 + 13) % model.config().vocab_size);
  }
  std::vector<float> logits, hidden;
  for (const LogitsFor which : {LogitsFor::kLastToken, LogitsFor::kEveryToken}) {
    auto state = model.new_state();
    model.forward(ids, *state, which, logits);
  }
  if (model.has_mtp()) {  // speculative decoding's prompt pass keeps the final-norm rows
    for (const LogitsFor which : {LogitsFor::kLastToken, LogitsFor::kEveryToken}) {
      auto state = model.new_state();
      model.forward(ids, *state, which, logits, &hidden);
    }
  }
}

// The plans of a reply decoded on the NPU: a short prompt's last-row lm-head, and a step, so that
// every one-row graph of a step is compiled (attention's first length among them).
void run_decode_plans(const Model& model) {
  std::vector<int32_t> ids(4);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 7919 + 13) % model.config().vocab_size);
  }
  std::vector<float> logits;
  auto state = model.new_state();
  model.forward(ids, *state, LogitsFor::kLastToken, logits);
  model.forward(std::span(ids).first(1), *state, LogitsFor::kLastToken, logits);
}

// Whether any context holds more constants than the budget (as its binary reports them), each
// graph's size noted in `known` for a second grouping.
bool over_budget(const std::vector<NpuPackContext>& contexts, int64_t budget,
                 std::map<std::string, int64_t>& known) {
  bool over = false;
  for (const NpuPackContext& c : contexts) {
    int64_t bytes = 0;
    for (const NpuPackGraph& g : c.graphs) {
      bytes += g.const_bytes;
      known[g.key] = g.const_bytes;
    }
    over = over || bytes > budget;
  }
  return over;
}

// Compiles a chip's graphs (`compile`: a backend made with `options`, the plans run on it) and
// exports its contexts; when one passes the budget, compiles them again grouped by the sizes the
// binaries reported. Without `export_binaries` (w4a16: compiled where it runs), compiles once.
template <class Compile>
std::vector<NpuPackContext> compile_within_budget(HexagonBackendOptions& options,
                                                  bool export_binaries, const Compile& compile) {
  std::vector<NpuPackContext> contexts;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::shared_ptr<HexagonBackend> backend = compile(options);
    if (!export_binaries) break;
    contexts = backend->export_contexts();
    if (!over_budget(contexts, options.context_budget_bytes, options.known_constant_bytes)) break;
  }
  return contexts;
}

// Writes a chip's contexts as `<folder>/<stem>_<i>.bin` into the pack being made, each checked
// against the budget, and lists them in `chip`; returns their constants' bytes.
int64_t write_contexts(const fs::path& pack, const std::string& folder, const std::string& stem,
                       const std::vector<NpuPackContext>& contexts, bool decode, int64_t budget,
                       NpuPackChip& chip) {
  int64_t total = 0;
  for (size_t i = 0; i < contexts.size(); ++i) {
    const NpuPackContext& c = contexts[i];
    if (c.shares_weights) fail("forge npu", "a context that shares weights cannot be packed");
    int64_t const_bytes = 0;
    for (const NpuPackGraph& g : c.graphs) const_bytes += g.const_bytes;
    const std::string name = stem + "_" + std::to_string(i) + ".bin";
    if (const_bytes > budget) {
      fail(folder + "/" + name,
           std::to_string(const_bytes) + " bytes of constants, over the budget of " +
               std::to_string(budget) +
               (c.graphs.size() == 1 ? " (one graph: raise --context-budget)" : ""));
    }
    NpuPackFile& f = chip.files.emplace_back();
    f.path = folder + "/" + name;
    f.decode = decode;
    std::ofstream file(pack / f.path, std::ios::binary);
    file.write(reinterpret_cast<const char*>(c.binary.data()),
               static_cast<std::streamsize>(c.binary.size()));
    file.close();
    if (!file) fail((pack / f.path).string(), "could not be written");
    f.bytes = static_cast<int64_t>(c.binary.size());
    f.sha256 = sha256_file(pack / f.path);
    f.graphs = c.graphs;
    total += const_bytes;
  }
  return total;
}

NpuAcceptance acceptance_of(const GateReport& r, bool replies, std::string suite,
                            int64_t greedy_tokens) {
  NpuAcceptance a;
  a.replies = replies;
  a.suite = std::move(suite);
  a.prompts = static_cast<int64_t>(r.prompts.size());
  a.greedy_tokens = greedy_tokens;
  a.greedy_identical = r.greedy_matched;
  a.top1 = r.top1;
  a.top5 = r.top5;
  a.pearson_min = r.pearson_min;
  a.kl_mean = r.kl_mean;
  for (const GatePromptResult& p : r.prompts) a.first_divergence.push_back(p.first_divergence);
  a.passed = r.passed;
  return a;
}

// The acceptance of `model` (a chip's backend: prompts on the NPU, with `replies` the replies
// too): the check before use's probes, then the suite against the CPU alone. A suite that could
// not be measured on the NPU (the device failed part-way and the CPU finished: its figures would
// be the CPU's) is not recorded; `note` says why.
std::vector<NpuAcceptance> measure_acceptance(Model& model, const std::string& device,
                                              const Model* reference, bool replies,
                                              const Tokenizer* tokenizer,
                                              const DeviceCheckOptions& check,
                                              const NpuPackOptions& options,
                                              DeviceCheckResult& probes, std::string& note) {
  probes = check_devices(model, device, tokenizer, check);
  if (!probes.checked || probes.report.prompts.empty()) return {};  // no figures to record
  std::vector<NpuAcceptance> out = {
      acceptance_of(probes.report, replies, "probes", check.greedy_tokens)};
  if (reference != nullptr && probes.passed) {
    try {
      const GateReport r = run_gate(model, *reference, options.suite, options.suite_tokens,
                                    device_check_thresholds(check.weights));
      if (model.device_failures() > 0) {
        note = "the suite was not measured (" + model.device_failure() + ")";
      } else {
        out.push_back(acceptance_of(r, replies, options.suite_name, options.suite_tokens));
      }
    } catch (const Error& e) {
      note = std::string("the suite was not measured (") + e.what() + ")";
    }
  }
  return out;
}

}  // namespace

std::vector<NpuPackChipReport> forge_npu_pack(const fs::path& bundle, const fs::path& out,
                                              const NpuPackOptions& options) {
  const std::string base_id = npu_pack_base_id(bundle);
  if (options.chips.empty()) fail("--chips", "no chip given");
  if (fs::exists(out) && !options.overwrite) {
    fail(out.string(), "already exists (pass --force to replace it)");
  }
  const auto library = QnnLibrary::load(options.qnn_lib);
  HexagonBackendOptions backend_options;
  int64_t manifest_calibration_tokens = 0;
  if (options.context_budget_bytes > 0) {
    backend_options.context_budget_bytes = options.context_budget_bytes;
  }
  std::optional<Tokenizer> tokenizer;
  if (fs::exists(bundle / "tokenizer.json")) tokenizer = Tokenizer::load(bundle);
  // The suite's reference: the base bundle on the CPU alone.
  const std::unique_ptr<Model> reference = options.suite.empty() ? nullptr : load_model(bundle);

  // The form, and the ranges its 16-bit activations are encoded over.
  const bool calibrated = !options.calibration_texts.empty() || !options.calibration_ids.empty();
  NpuForm form = NpuForm::kF16;
  if (options.form) {
    form = *options.form;
  } else if (calibrated) {
    const DType weights = check_weights_of(bundle);
    form = weights == DType::kW8   ? NpuForm::kW8A16
           : weights == DType::kW4 ? NpuForm::kW4A16
                                   : NpuForm::kF16;
  }
  if (form != NpuForm::kF16) {
    if (!calibrated) {
      fail("--form " + std::string(npu_form_name(form)),
           "16-bit activations need ranges measured on text like the model's (--calibrate FILE)");
    }
    std::vector<std::vector<int32_t>> sequences = options.calibration_ids;
    for (auto& s : calibration_sequences(bundle, options.calibration_texts,
                                         options.calibration.sequence_tokens)) {
      sequences.push_back(std::move(s));
    }
    Calibration c = calibrate_npu_ranges(bundle, sequences, options.calibration);
    backend_options.ranges = std::move(c.ranges);
    manifest_calibration_tokens = c.tokens;
  }
  backend_options.form = form;
  backend_options.compile_only = !options.check;

  NpuPackManifest manifest;
  manifest.base_name = fs::absolute(bundle).lexically_normal().filename().string();
  if (manifest.base_name.empty())
    manifest.base_name = fs::absolute(bundle).parent_path().filename();
  manifest.base_manifest_sha256 = base_id;
  manifest.qnn_build = library->build_id();
  manifest.chunk_rows = HexagonBackend::kChunkRows;
  manifest.context_budget_bytes = backend_options.context_budget_bytes;
  manifest.form = form;
  manifest.ranges = backend_options.ranges;
  manifest.calibration_tokens = manifest_calibration_tokens;
  std::vector<NpuPackChipReport> reports;

  remove_stale_partials(out);
  const fs::path temp = partial_sibling(out);
  fs::remove_all(temp);
  fs::create_directories(temp);
  PartialGuard partial(temp);  // removed unless the pack is published whole
  for (const std::string& name : options.chips) {
    const HexagonChip* chip = hexagon_chip(name);
    if (chip == nullptr) fail("--chips", "'" + name + "' is not a chip qhx compiles for");
    for (const NpuPackChip& done : manifest.chips) {
      if (done.arch == chip->arch) fail("--chips", "v" + std::to_string(chip->arch) + " twice");
    }
    // Graphs go into contexts by an estimate of their constants; when a context passes the
    // budget, they are compiled again grouped by the sizes the binaries reported.
    const auto device = HexagonDevice::open(library, *chip);
    std::shared_ptr<HexagonBackend> backend;
    std::unique_ptr<Model> model;
    HexagonBackendOptions chip_options = backend_options;
    // w4a16 graphs are compiled where they run, from the pack's ranges: QNN 2.51's HTP crashes
    // executing some of them loaded from a context binary (docs/hexagon.md).
    const std::vector<NpuPackContext> contexts = compile_within_budget(
        chip_options, form != NpuForm::kW4A16, [&](const HexagonBackendOptions& o) {
          model.reset();
          backend = std::make_shared<HexagonBackend>(device, o);
          model = load_model(bundle, {.devices = {backend}});
          run_prompt_plans(*model, HexagonBackend::kChunkRows);
          if (!backend->compile_failures().empty()) {  // a pack whose runs fall back is no pack
            fail("v" + std::to_string(chip->arch),
                 "a graph did not compile: " + backend->compile_failures().front());
          }
          if (backend->graphs_compiled() == 0) {
            fail(bundle.string(), "no prompt work of this model runs on the NPU");
          }
          return backend;
        });
    NpuPackChipReport report;
    report.arch = chip->arch;
    report.form = form;
    report.graphs = backend->graphs_compiled();
    NpuPackChip& packed = manifest.chips.emplace_back();
    packed.arch = chip->arch;
    packed.soc = chip->soc;
    std::string folder = "v";  // (not "v" + string: g++ 12's -Wrestrict)
    folder += std::to_string(chip->arch);
    fs::create_directories(temp / folder);
    report.const_bytes = write_contexts(temp, folder, "context", contexts, false,
                                        backend_options.context_budget_bytes, packed);
    report.contexts = static_cast<int64_t>(contexts.size());
    report.bytes = packed.bytes();
    // The NPU against the CPU, as a user's first run checks it, and on the suite.
    DeviceCheckOptions check;
    check.mode = DeviceCheckMode::kAlways;
    check.weights = check_weights_for(bundle, {{backend}});
    const Tokenizer* words = tokenizer ? &*tokenizer : nullptr;
    DeviceCheckResult r;
    if (!options.check) {
      r.passed = true;
      r.summary =
          backend->name() +
          " not compared with the CPU: its graphs were compiled, never run (forge npu --no-check)";
    } else {
      std::string note;
      packed.acceptance = measure_acceptance(*model, backend->name(), reference.get(), false, words,
                                             check, options, r, note);
      if (!note.empty()) r.summary += "; " + note;
    }
    report.gate = r.summary;
    report.gate_passed = r.passed;
    if (!r.passed) fail(folder, r.summary);
    packed.gate = r.summary;
    if (options.decode) {
      // The decode steps' graphs, as a user's --decode-device hexagon run compiles them beside
      // the pack's prompt graphs: a step's runs and lm-head, the state ops' graphs, attention's
      // for every cache length up to the context; in contexts of their own, which hold the
      // layers' weights again (the simulator cannot load a context whose graphs share them:
      // docs/hexagon.md). w4a16 compiles them where it runs, as it does its prompt graphs.
      HexagonBackendOptions decoding = chip_options;
      decoding.decode = true;
      std::vector<NpuPackContext> loaded = contexts;  // what a decoding run loads
      if (form != NpuForm::kW4A16) {
        const int64_t context = options.decode_context > 0
                                    ? options.decode_context
                                    : model->config().max_position_embeddings;
        std::vector<NpuPackContext> decode_contexts =
            compile_within_budget(decoding, true, [&](const HexagonBackendOptions& o) {
              model.reset();
              const auto decoder = std::make_shared<HexagonBackend>(device, o, contexts);
              model = load_model(bundle, {.devices = {decoder}});
              run_decode_plans(*model);
              try {
                decoder->compile_attention_lengths(context);
              } catch (const Error& e) {
                fail(folder, std::string("an attention graph did not compile: ") + e.what());
              }
              if (!decoder->compile_failures().empty()) {
                fail(folder,
                     "a decode graph did not compile: " + decoder->compile_failures().front());
              }
              report.decode_graphs = decoder->graphs_compiled();
              return decoder;
            });
        report.decode_const_bytes = write_contexts(temp, folder, "decode", decode_contexts, true,
                                                   backend_options.context_budget_bytes, packed);
        report.decode_contexts = static_cast<int64_t>(decode_contexts.size());
        report.decode_bytes = packed.bytes() - report.bytes;
        for (NpuPackContext& c : decode_contexts) {
          c.decode = true;
          loaded.push_back(std::move(c));
        }
      }
      if (options.check) {
        // As a user decoding on the NPU runs it: the pack's prompt and decode graphs, loaded
        // from their binaries. Recorded whatever it measures (the prompt graphs passed).
        model.reset();
        const auto decoder = std::make_shared<HexagonBackend>(device, decoding, std::move(loaded));
        model = load_model(bundle, {.devices = {decoder}});
        DeviceCheckResult decoded;
        std::string note;
        for (NpuAcceptance& a : measure_acceptance(*model, decoder->name(), reference.get(), true,
                                                   words, check, options, decoded, note)) {
          packed.acceptance.push_back(std::move(a));
        }
        if (!decoded.passed || !note.empty()) {
          packed.gate += "; decoding: " + (decoded.passed ? note : decoded.summary);
          report.gate = packed.gate;
        }
        report.decode_graphs_compiled_at_use = decoder->graphs_compiled();
      }
    }
    report.acceptance = packed.acceptance;
    reports.push_back(report);
  }
  write_npu_pack_manifest(temp, manifest);
  write_npu_pack_card(temp);
  if (fs::exists(out)) fs::remove_all(out);
  fs::rename(temp, out);
  partial.release();
  return reports;
}

}  // namespace qhx
