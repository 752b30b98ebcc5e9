#include "backend/qnn/npu_pack.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <span>

#include "util/error.h"
#include "util/json_file.h"
#include "util/sha256.h"

namespace qhx {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "qhx-npu-pack";

std::vector<size_t> indices(const Json& array, const std::string& where) {
  if (!array.is_array()) fail(where, "expected an array of value numbers");
  std::vector<size_t> out;
  for (const Json& i : array) {
    if (!i.is_number_unsigned()) fail(where, "expected an array of value numbers");
    out.push_back(i.get<size_t>());
  }
  return out;
}

// A path inside the pack: relative, no "..".
std::string inside(const std::string& path, const std::string& where) {
  const fs::path p(path);
  if (path.empty() || p.is_absolute()) fail(where, "'" + path + "' is not a file of the pack");
  for (const auto& part : p) {
    if (part == "..") fail(where, "'" + path + "' is not a file of the pack");
  }
  return path;
}

void check_file(const fs::path& pack, const NpuPackFile& f) {
  const fs::path file = pack / f.path;
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) fail(file.string(), "missing (listed in MANIFEST.json)");
  if (static_cast<int64_t>(size) != f.bytes) fail(file.string(), "size differs from MANIFEST.json");
  if (sha256_file(file) != f.sha256) {
    fail(file.string(), "sha256 differs from MANIFEST.json: the file is corrupt or was changed");
  }
}

// Compares as JSON: a "format" of another type is no pack, not a type error.
bool is_pack_format(const Json& m) {
  return m.is_object() && m.contains("format") && m.at("format") == kFormat;
}

NpuAcceptance parse_acceptance(const Json& a, const std::string& where) {
  NpuAcceptance out;
  const Json& replies = require_field(a, "replies_on_npu", where);
  if (!replies.is_boolean()) fail(field(where, "replies_on_npu"), "expected true or false");
  out.replies = replies.get<bool>();
  const Json& passed = require_field(a, "passed", where);
  if (!passed.is_boolean()) fail(field(where, "passed"), "expected true or false");
  out.passed = passed.get<bool>();
  out.suite = require_string(a, "suite", where);
  out.prompts = require_int(a, "prompts", where);
  out.greedy_tokens = require_int(a, "greedy_tokens", where);
  out.greedy_identical = require_int(a, "greedy_identical", where);
  if (out.prompts < 0 || out.greedy_tokens < 0 || out.greedy_identical < 0 ||
      out.greedy_identical > out.prompts) {
    fail(where,
         "prompts, greedy_tokens and greedy_identical must be counts (identical <= prompts)");
  }
  for (const auto& [name, value] :
       {std::pair{"top1", &out.top1}, std::pair{"top5", &out.top5},
        std::pair{"pearson_min", &out.pearson_min}, std::pair{"kl_mean", &out.kl_mean}}) {
    // null: not finite when measured (JSON has no NaN or infinity; the NPU's logits may have).
    if (a.contains(name) && a.at(name).is_null()) {
      *value = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    *value = require_number(a, name, where);
    if (!std::isfinite(*value)) fail(field(where, name), "not a finite number");
  }
  const Json& divergence = require_field(a, "first_divergence", where);
  const std::string dw = field(where, "first_divergence");
  if (!divergence.is_array() || static_cast<int64_t>(divergence.size()) != out.prompts) {
    fail(dw, "expected one token index per prompt");
  }
  for (const Json& d : divergence) {
    if (!d.is_number_integer() || d.get<int64_t>() < -1 || d.get<int64_t>() >= out.greedy_tokens) {
      fail(dw, "expected token indices (-1: identical)");
    }
    out.first_divergence.push_back(d.get<int64_t>());
  }
  return out;
}

Json acceptance_json(const NpuAcceptance& a) {
  return {{"replies_on_npu", a.replies},
          {"suite", a.suite},
          {"prompts", a.prompts},
          {"greedy_tokens", a.greedy_tokens},
          {"greedy_identical", a.greedy_identical},
          {"top1", a.top1},
          {"top5", a.top5},
          {"pearson_min", a.pearson_min},
          {"kl_mean", a.kl_mean},
          {"first_divergence", a.first_divergence},
          {"passed", a.passed}};
}

}  // namespace

int64_t NpuPackChip::bytes() const {
  int64_t total = 0;
  for (const NpuPackFile& f : files) total += f.bytes;
  return total;
}

bool is_npu_pack(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "MANIFEST.json", ec)) return false;
  try {
    const Json m = read_json_file(dir / "MANIFEST.json");
    return is_pack_format(m);
  } catch (const Error&) {
    return false;
  }
}

NpuPackManifest read_npu_pack(const fs::path& dir) {
  const fs::path path = dir / "MANIFEST.json";
  return parse_npu_pack_manifest(read_json_file(path), path.string());
}

NpuPackManifest parse_npu_pack_manifest(const Json& m, const std::string& where) {
  if (!is_pack_format(m)) {
    fail(where + ": format", "not an NPU pack (qhx forge npu makes them)");
  }
  const int64_t version = require_int(m, "format_version", where);
  if (version <
      kNpuPackOldestFormatVersion) {  // its graphs are named otherwise: none would be found
    fail(where + ": format_version", "a pack made by an older qhx (version " +
                                         std::to_string(version) +
                                         "): make it again with qhx forge npu");
  }
  if (version > kNpuPackFormatVersion) {
    fail(where + ": format_version",
         "newer than this qhx reads (" + std::to_string(kNpuPackFormatVersion) + ")");
  }
  NpuPackManifest out;
  const Json& base = require_field(m, "base", where);
  out.base_name = require_string(base, "name", field(where, "base"));
  out.base_manifest_sha256 = require_string(base, "manifest_sha256", field(where, "base"));
  out.qnn_build = require_string(m, "qnn_build", where);
  const std::string precision = require_string(m, "precision", where);
  const std::optional<NpuForm> form = parse_npu_form(precision);
  if (!form) fail(field(where, "precision"), "'" + precision + "' is not fp16, w8a16 or w4a16");
  out.form = *form;
  if (out.form != NpuForm::kF16) {
    out.calibration_tokens = require_int(m, "calibration_tokens", where);
    if (out.calibration_tokens < 0) fail(field(where, "calibration_tokens"), "negative");
    const Json& ranges = require_field(m, "activation_ranges", where);
    const std::string rw = field(where, "activation_ranges");
    if (!ranges.is_array() || ranges.empty()) fail(rw, "expected a non-empty array");
    for (size_t i = 0; i < ranges.size(); ++i) {
      const std::string iw = rw + "[" + std::to_string(i) + "]";
      const int64_t weight = require_int(ranges[i], "weight", iw);
      if (weight < 0 || out.ranges.contains(weight)) fail(field(iw, "weight"), "negative or twice");
      MatmulRanges& r = out.ranges[weight];
      for (const auto& [name, range] : {std::pair{"in", &r.in}, std::pair{"out", &r.out}}) {
        const Json& v = require_field(ranges[i], name, iw);
        if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) {
          fail(field(iw, name), "expected [lo, hi]");
        }
        const double lo = v[0].get<double>(), hi = v[1].get<double>();
        constexpr double kLargest = 3.0e38;  // within float's range
        if (!(lo <= 0 && hi >= 0 && lo >= -kLargest && hi <= kLargest)) {
          fail(field(iw, name), "a range must hold 0 and be finite");
        }
        range->lo = static_cast<float>(lo);
        range->hi = static_cast<float>(hi);
      }
    }
  }
  out.chunk_rows = require_int(m, "chunk_rows", where);
  out.context_budget_bytes = require_int(m, "context_budget_bytes", where);
  const Json& chips = require_field(m, "chips", where);
  if (!chips.is_array()) fail(field(where, "chips"), "expected an array");
  for (size_t c = 0; c < chips.size(); ++c) {
    const std::string cw = where + ": chips[" + std::to_string(c) + "]";
    NpuPackChip chip;
    const int64_t arch = require_int(chips[c], "arch", cw);
    if (arch < 0 || arch > 1000) fail(field(cw, "arch"), "not a Hexagon generation");
    chip.arch = static_cast<int>(arch);
    for (const NpuPackChip& before : out.chips) {
      if (before.arch == chip.arch) fail(field(cw, "arch"), "v" + std::to_string(arch) + " twice");
    }
    const int64_t soc = require_int(chips[c], "soc", cw);
    if (soc < 0 || soc > UINT32_MAX) fail(field(cw, "soc"), "not a SoC model");
    chip.soc = static_cast<uint32_t>(soc);
    chip.gate = require_string(chips[c], "gate", cw);
    if (chips[c].contains("acceptance")) {  // (packs made before forge npu measured it lack it)
      const Json& acceptance = chips[c].at("acceptance");
      if (!acceptance.is_array()) fail(field(cw, "acceptance"), "expected an array");
      for (size_t i = 0; i < acceptance.size(); ++i) {
        chip.acceptance.push_back(
            parse_acceptance(acceptance[i], cw + ": acceptance[" + std::to_string(i) + "]"));
      }
    }
    const Json& files = require_field(chips[c], "files", cw);
    if (!files.is_array()) fail(field(cw, "files"), "expected an array");
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string fw = cw + ": files[" + std::to_string(i) + "]";
      NpuPackFile f;
      f.path = inside(require_string(files[i], "path", fw), field(fw, "path"));
      f.sha256 = require_string(files[i], "sha256", fw);
      f.bytes = require_int(files[i], "bytes", fw);
      if (f.bytes < 0) fail(field(fw, "bytes"), "negative");
      if (files[i].contains("decode")) {
        const Json& decode = files[i].at("decode");
        if (!decode.is_boolean()) fail(field(fw, "decode"), "expected true or false");
        f.decode = decode.get<bool>();
      }
      const Json& graphs = require_field(files[i], "graphs", fw);
      if (!graphs.is_array()) fail(field(fw, "graphs"), "expected an array");
      for (size_t g = 0; g < graphs.size(); ++g) {
        const std::string gw = fw + ": graphs[" + std::to_string(g) + "]";
        NpuPackGraph graph;
        graph.name = require_string(graphs[g], "name", gw);
        graph.key = require_string(graphs[g], "key", gw);
        graph.inputs = indices(require_field(graphs[g], "inputs", gw), field(gw, "inputs"));
        graph.outputs = indices(require_field(graphs[g], "outputs", gw), field(gw, "outputs"));
        graph.const_bytes = require_int(graphs[g], "const_bytes", gw);
        graph.io_bytes = require_int(graphs[g], "io_bytes", gw);
        graph.spill_fill_bytes = require_int(graphs[g], "spill_fill_bytes", gw);
        f.graphs.push_back(std::move(graph));
      }
      chip.files.push_back(std::move(f));
    }
    out.chips.push_back(std::move(chip));
  }
  return out;
}

void write_npu_pack_manifest(const fs::path& dir, const NpuPackManifest& m) {
  Json chips = Json::array();
  for (const NpuPackChip& chip : m.chips) {
    Json files = Json::array();
    for (const NpuPackFile& f : chip.files) {
      Json graphs = Json::array();
      for (const NpuPackGraph& g : f.graphs) {
        graphs.push_back({{"name", g.name},
                          {"key", g.key},
                          {"inputs", g.inputs},
                          {"outputs", g.outputs},
                          {"const_bytes", g.const_bytes},
                          {"io_bytes", g.io_bytes},
                          {"spill_fill_bytes", g.spill_fill_bytes}});
      }
      files.push_back({{"path", f.path},
                       {"sha256", f.sha256},
                       {"bytes", f.bytes},
                       {"decode", f.decode},
                       {"graphs", graphs}});
    }
    Json acceptance = Json::array();
    for (const NpuAcceptance& a : chip.acceptance) acceptance.push_back(acceptance_json(a));
    chips.push_back({{"arch", chip.arch},
                     {"soc", chip.soc},
                     {"bytes", chip.bytes()},
                     {"gate", chip.gate},
                     {"acceptance", acceptance},
                     {"files", files}});
  }
  Json manifest = {{"format", kFormat},
                   {"format_version", kNpuPackFormatVersion},
                   {"base", {{"name", m.base_name}, {"manifest_sha256", m.base_manifest_sha256}}},
                   {"qnn_build", m.qnn_build},
                   {"precision", npu_form_name(m.form)},
                   {"chunk_rows", m.chunk_rows},
                   {"context_budget_bytes", m.context_budget_bytes},
                   {"chips", chips}};
  if (m.form != NpuForm::kF16) {
    Json ranges = Json::array();
    for (const auto& [weight, r] : m.ranges) {
      ranges.push_back(
          {{"weight", weight}, {"in", {r.in.lo, r.in.hi}}, {"out", {r.out.lo, r.out.hi}}});
    }
    manifest["calibration_tokens"] = m.calibration_tokens;
    manifest["activation_ranges"] = ranges;
  }
  std::ofstream out(dir / "MANIFEST.json");
  out << manifest.dump(2) << "\n";
  if (!out) fail((dir / "MANIFEST.json").string(), "could not be written");
}

std::string npu_pack_base_id(const fs::path& bundle) {
  const fs::path manifest = bundle / "manifest.json";
  std::error_code ec;
  if (!fs::is_regular_file(manifest, ec)) {
    fail(bundle.string(),
         "not a bundle (no manifest.json): an NPU pack pairs with a bundle "
         "(qhx forge convert makes one)");
  }
  return sha256_file(manifest);
}

std::vector<NpuPackContext> load_npu_pack_chip(const fs::path& pack, const fs::path& base, int arch,
                                               bool decode) {
  const NpuPackManifest m = read_npu_pack(pack);
  if (npu_pack_base_id(base) != m.base_manifest_sha256) {
    fail(pack.string(), "made from another base bundle ('" + m.base_name + "'), not " +
                            base.string() + " (its manifest.json differs)");
  }
  std::string chips;
  for (const NpuPackChip& chip : m.chips) {
    chips += (chips.empty() ? "v" : ", v") + std::to_string(chip.arch);
    if (chip.arch != arch) continue;
    std::vector<NpuPackContext> out;
    for (const NpuPackFile& f : chip.files) {
      if (f.decode && !decode) continue;  // (memory the run would not use)
      // Read once, and checked as read: what loads is what was checked.
      const fs::path file = pack / f.path;
      std::error_code ec;
      const auto size = fs::file_size(file, ec);
      if (ec) fail(file.string(), "missing (listed in MANIFEST.json)");
      if (static_cast<int64_t>(size) != f.bytes)
        fail(file.string(), "size differs from MANIFEST.json");
      std::ifstream in(file, std::ios::binary);
      if (!in) fail(file.string(), "missing (listed in MANIFEST.json)");
      NpuPackContext& c = out.emplace_back();
      c.binary.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (static_cast<int64_t>(c.binary.size()) != f.bytes) {
        fail(file.string(), "size differs from MANIFEST.json");
      }
      Sha256 hash;
      hash.update(std::as_bytes(std::span(c.binary)));
      if (hash.hex() != f.sha256) {
        fail(file.string(),
             "sha256 differs from MANIFEST.json: the file is corrupt or was changed");
      }
      c.graphs = f.graphs;
      c.decode = f.decode;
    }
    return out;
  }
  fail(pack.string(), "has no graphs for hexagon:v" + std::to_string(arch) + " (it has " +
                          (chips.empty() ? std::string("none") : chips) + ")");
}

int64_t verify_npu_pack(const fs::path& pack) {
  const NpuPackManifest m = read_npu_pack(pack);
  int64_t files = 0;
  for (const NpuPackChip& chip : m.chips) {
    for (const NpuPackFile& f : chip.files) {
      check_file(pack, f);
      ++files;
    }
  }
  return files;
}

}  // namespace qhx
