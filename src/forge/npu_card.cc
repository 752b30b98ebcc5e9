#include "forge/npu_card.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace qhx {
namespace {

std::string megabytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return text;
}

// What a chip's graphs hold on the NPU while loaded (with the decode graphs or without): their
// constants, and per context the largest graph's spill-fill and I/O buffers (a context runs one
// graph at a time).
int64_t loaded_bytes(const NpuPackChip& chip, bool decode) {
  int64_t total = 0;
  for (const NpuPackFile& f : chip.files) {
    if (f.decode && !decode) continue;
    int64_t spill = 0, io = 0;
    for (const NpuPackGraph& g : f.graphs) {
      total += g.const_bytes;
      spill = std::max(spill, g.spill_fill_bytes);
      io = std::max(io, g.io_bytes);
    }
    total += spill + io;
  }
  return total;
}

std::string divergences(const NpuAcceptance& a) {
  std::string out;
  for (size_t i = 0; i < a.first_divergence.size(); ++i) {
    if (a.first_divergence[i] < 0) continue;
    out += (out.empty() ? "" : ", ") + std::to_string(i + 1) + "@" +
           std::to_string(a.first_divergence[i]);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::string describe_acceptance(const NpuAcceptance& a) {
  char figures[200];
  std::snprintf(figures, sizeof figures,
                "top-1 %.4f, top-5 %.4f, Pearson r (min) %.6f, KL %.3g; greedy %lld/%lld "
                "identical (%lld tokens)",
                a.top1, a.top5, a.pearson_min, a.kl_mean,
                static_cast<long long>(a.greedy_identical), static_cast<long long>(a.prompts),
                static_cast<long long>(a.greedy_tokens));
  return std::string(a.replies ? "prompts and replies" : "prompts") + " on the NPU, " + a.suite +
         ": " + figures;
}

std::string render_npu_pack_card(const NpuPackManifest& m) {
  std::ostringstream md;
  const bool decode_graphs = std::any_of(m.chips.begin(), m.chips.end(), [](const auto& chip) {
    return std::any_of(chip.files.begin(), chip.files.end(),
                       [](const auto& f) { return f.decode; });
  });
  const std::string form(npu_form_name(m.form));
  md << "# NPU pack for `" << m.base_name << "` (" << form << ")\n\n"
     << "Made by `qhx forge npu` with QNN `" << m.qnn_build << "` for ";
  for (size_t i = 0; i < m.chips.size(); ++i) {
    md << (i == 0 ? "" : ", ") << "hexagon:v" << m.chips[i].arch << " (SoC model " << m.chips[i].soc
       << ")";
  }
  md << ". It pairs with the bundle whose manifest.json has sha256 `" << m.base_manifest_sha256
     << "` and with no other: `qhx generate --model <bundle> --npu-pack <this folder> --device "
        "hexagon:vNN`.\n\n"
     << "## What runs where\n\n"
     << "| work | where |\n|---|---|\n"
     << "| token embedding | host CPU (a lookup) |\n"
     << "| prompt chunks of " << m.chunk_rows
     << " tokens: projections, MLP, norms, residual adds | NPU, the graphs of this pack |\n"
     << "| prompt attention over the KV cache, Gated DeltaNet conv and delta rule, a prompt's "
        "last tokens short of a chunk, the lm-head | host CPU |\n"
     << "| replies (one token per step) | host CPU; with `--decode-device hexagon` every "
        "step's layers and the lm-head on the NPU in one-row graphs "
     << (decode_graphs ? "from this pack's decode files (contexts of their own: they hold the "
                         "layers' weights a second time, and load only when the NPU decodes)"
                       : "compiled at load (beside this pack's prompt graphs they hold the "
                         "layers' weights a second time; beside prompt graphs compiled at load "
                         "they share them)")
     << ", the KV cache and recurrent states in host memory |\n\n"
     << "## Precision\n\n";
  if (m.form == NpuForm::kF16) {
    md << "fp16: the matmuls' weights and activations in half precision.\n\n";
  } else {
    md << form << ": the matmuls' weights as "
       << (m.form == NpuForm::kW8A16 ? "int8 rows" : "4-bit blocks")
       << ", their inputs and outputs in 16 bits over activation ranges measured on "
       << m.calibration_tokens << " tokens of calibration text (" << m.ranges.size()
       << " matrices); the norms and adds in fp16.\n\n";
  }
  md << "## Files\n\n| file | graphs for | bytes | graphs | constants | sha256 |\n"
        "|---|---|---:|---:|---:|---|\n";
  for (const NpuPackChip& chip : m.chips) {
    for (const NpuPackFile& f : chip.files) {
      int64_t constants = 0;
      for (const NpuPackGraph& g : f.graphs) constants += g.const_bytes;
      md << "| " << f.path << " | " << (f.decode ? "decode steps" : "prompt chunks") << " | "
         << f.bytes << " | " << f.graphs.size() << " | " << constants << " | `" << f.sha256
         << "` |\n";
    }
  }
  md << "\n## Memory while loaded\n\n"
     << "| chip | decoding on the NPU | files | contexts | NPU memory (constants, spill-fill, I/O) "
        "|\n|---|---|---:|---:|---:|\n";
  for (const NpuPackChip& chip : m.chips) {
    for (const bool decode : {false, true}) {
      if (decode && !decode_graphs) continue;
      int64_t bytes = 0, contexts = 0;
      for (const NpuPackFile& f : chip.files) {
        if (f.decode && !decode) continue;
        bytes += f.bytes;
        ++contexts;
      }
      md << "| v" << chip.arch << " | " << (decode ? "yes" : "no") << " | " << megabytes(bytes)
         << " | " << contexts << " | " << megabytes(loaded_bytes(chip, decode)) << " |\n";
    }
  }
  md << "\nEach context stays under the budget of " << megabytes(m.context_budget_bytes)
     << " of constants (an NPU process maps about 3.5 GB in all). The base bundle's memory comes "
        "on top: the CPU keeps the model for what it runs.\n\n"
     << "## Acceptance, measured when the pack was made\n\n"
     << "Against the base bundle on the CPU: the gate's measures over teacher-forced positions, "
        "and greedy continuations compared token by token (first divergences as prompt@token). "
        "The simulator computes what the chip computes; it says nothing of a phone's speed.\n\n"
     << "| chip | on the NPU | prompts | top-1 | top-5 | Pearson r (min) | KL | greedy "
        "identical | first divergences | within the check's thresholds |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---|---|\n";
  bool any = false;
  for (const NpuPackChip& chip : m.chips) {
    for (const NpuAcceptance& a : chip.acceptance) {
      any = true;
      char figures[200];
      std::snprintf(figures, sizeof figures, "%.4f | %.4f | %.6f | %.3g | %lld/%lld (%lld tokens)",
                    a.top1, a.top5, a.pearson_min, a.kl_mean,
                    static_cast<long long>(a.greedy_identical), static_cast<long long>(a.prompts),
                    static_cast<long long>(a.greedy_tokens));
      md << "| v" << chip.arch << " | " << (a.replies ? "prompts and replies" : "prompts") << " | "
         << a.suite << " (" << a.prompts << ") | " << figures << " | " << divergences(a) << " | "
         << (a.passed ? "yes" : "no") << " |\n";
    }
  }
  if (!any) md << "| (none recorded) | | | | | | | | | |\n";
  md << "\n";
  for (const NpuPackChip& chip : m.chips) md << "- v" << chip.arch << ": " << chip.gate << "\n";
  md << "\nThe check before use (`--device-check`) runs the probes again on the user's machine and "
        "holds them to the thresholds; a suite's figures are recorded, not judged.\n";
  return md.str();
}

void write_npu_pack_card(const std::filesystem::path& pack) {
  const NpuPackManifest m = read_npu_pack(pack);
  std::ofstream out(pack / "README.md");
  out << render_npu_pack_card(m);
  if (!out) fail((pack / "README.md").string(), "could not be written");
}

}  // namespace qhx
