#include "forge/convert.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "forge/model_card.h"
#include "forge/weight_calibration.h"
#include "io/bundle.h"
#include "io/checkpoint.h"
#include "io/draft_vocab.h"
#include "io/hf_config.h"
#include "io/qhxt.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "models/families.h"
#include "models/model.h"
#include "models/weights.h"
#include "runtime/embedding.h"
#include "runtime/generation_config.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/partial_path.h"
#include "util/sha256.h"

namespace qhx {
namespace fs = std::filesystem;
namespace {

std::string weight_dtype_name(DType d) {
  switch (d) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kW8:
      return "w8";
    case DType::kW4:
      return "w4";
    default:
      return std::string(dtype_name(d));
  }
}

// A source tensor as f32 rows: [rows, cols] with rows = shape[0].
std::vector<float> read_f32(const TensorView& t, int64_t& rows, int64_t& cols) {
  rows = t.shape.empty() ? 1 : t.shape[0];
  cols = rows == 0 ? 0 : t.numel() / rows;
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    fail(t.file->string() + ": tensor '" + t.name + "'",
         "dtype " + std::string(dtype_name(t.dtype)) + " cannot be converted");
  }
  std::vector<float> out(t.numel());
  const MatrixRef m{t.dtype, t.data, rows, cols};
  for (int64_t r = 0; r < rows; ++r) ref::read_row(m, r, out.data() + r * cols);
  for (float x : out) {
    if (!std::isfinite(x)) fail(t.file->string() + ": tensor '" + t.name + "'", "holds inf or NaN");
  }
  return out;
}

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The widest even group size <= wanted that divides cols (W4 groups must tile each row).
int64_t fitting_group(int64_t wanted, int64_t cols) {
  for (int64_t g = wanted; g >= 2; g -= 2) {
    if (cols % g == 0) return g;
  }
  fail("--group-size", "no even group size divides " + std::to_string(cols) + " columns");
}

// How a quantized matrix is rounded: on its own (no gram), or for the inputs it met.
struct Rounding {
  const InputGram* gram = nullptr;
  CalibrationMethod method = CalibrationMethod::kGptq;
};

TensorToWrite encode_tensor(const TensorView& source, const std::string& name, DType dtype,
                            int64_t group_size, const Rounding& rounding) {
  int64_t rows = 0, cols = 0;
  const std::vector<float> w = read_f32(source, rows, cols);
  TensorToWrite t;
  t.name = name;
  t.dtype = dtype;
  t.shape = source.shape;
  switch (dtype) {
    case DType::kF32:
      t.data = as_bytes(w);
      break;
    case DType::kBF16:
    case DType::kF16: {
      std::vector<uint16_t> h(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        h[i] = dtype == DType::kBF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
      }
      t.data = as_bytes(h);
      break;
    }
    case DType::kW8: {
      std::vector<int8_t> q(w.size());
      std::vector<float> scales(rows);
      if (rounding.gram != nullptr) {
        quantize_w8_calibrated(w.data(), rows, cols, rounding.gram->sum, rounding.method, q.data(),
                               scales.data());
      } else {
        quantize_w8(w.data(), rows, cols, q.data(), scales.data());
      }
      t.data = as_bytes(q);
      t.scales = as_bytes(scales);
      break;
    }
    case DType::kW4: {
      t.group_size = fitting_group(group_size, cols);
      std::vector<uint8_t> packed(w.size() / 2);
      std::vector<uint16_t> scales(rows * (cols / t.group_size));
      if (rounding.gram != nullptr) {
        quantize_w4_calibrated(w.data(), rows, cols, t.group_size, rounding.gram->sum,
                               rounding.method, packed.data(), scales.data());
      } else {
        quantize_w4(w.data(), rows, cols, t.group_size, packed.data(), scales.data());
      }
      t.data = as_bytes(packed);
      t.scales = as_bytes(scales);
      break;
    }
    default:
      fail(name, "unsupported target dtype");
  }
  return t;
}

// Encodes one tensor; errors (non-finite weights, impossible groups) name the source tensor.
TensorToWrite encode(const TensorView& source, const std::string& name, DType dtype,
                     int64_t group_size, const Rounding& rounding = {}) {
  try {
    return encode_tensor(source, name, dtype, group_size, rounding);
  } catch (const Error& e) {
    fail(source.file->string() + ": tensor '" + source.name + "'", e.what());
  }
}

// Which stored dtype a tensor gets (docs/bundle.md, precision policy): matrices take the
// requested dtype; vectors (norms, A_log, dt_bias), conv kernels and the Gated DeltaNet gate
// projections (β, decay: tiny, and their error is exponentiated) stay f32.
// The stored dtypes of the embedding table and lm_head. A tied head follows the table unless
// asked otherwise; a head in another dtype than the table is stored as its own tensor.
struct TableDtypes {
  DType embed, head;
  bool separate_head;
};

TableDtypes table_dtypes(const ConvertOptions& o, bool tied) {
  TableDtypes d;
  d.embed = o.embed.value_or(default_table_dtype(o.weights));
  d.head = o.lm_head.value_or(tied ? d.embed : default_table_dtype(o.weights));
  d.separate_head = !tied || d.head != d.embed;
  return d;
}

// The vision tower's: its matrices in W8 when the decoder's are quantized (a W4 tower is not
// offered: its error would reach every image token) or in the requested float dtype; the patch
// embedding (a Conv3d kernel) as the tables; the position table, biases and norms in f32.
DType vision_dtype_for(const std::string& name, const TensorView& t, DType weights) {
  if (name.ends_with("patch_embed.proj.weight")) return default_table_dtype(weights);
  if (t.shape.size() != 2 || name.ends_with("pos_embed.weight")) return DType::kF32;
  return is_quantized(weights) ? DType::kW8 : weights;
}

DType dtype_for(const std::string& name, const TensorView& t, DType weights,
                const TableDtypes& tables) {
  if (name == "model.embed_tokens.weight") return tables.embed;
  if (name == "lm_head.weight") return tables.head;
  if (t.shape.size() != 2) return DType::kF32;
  if (name.ends_with("linear_attn.in_proj_a.weight") ||
      name.ends_with("linear_attn.in_proj_b.weight")) {
    return DType::kF32;
  }
  return weights;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// A file of the bundle as its manifest lists it.
Json file_entry(const fs::path& dir, const std::string& name) {
  return {{"path", name}, {"size", fs::file_size(dir / name)}, {"sha256", sha256_file(dir / name)}};
}

// manifest.json, and manifest.sha256 beside it (which qhx verify checks it against).
void write_manifest(const fs::path& dir, const Json& manifest) {
  std::ofstream(dir / "manifest.json") << manifest.dump(2) << "\n";
  std::ofstream(dir / kManifestHashFile)
      << sha256_file(dir / "manifest.json") << "  manifest.json\n";
}

uint64_t bytes_of(std::span<const TensorToWrite> tensors) {
  uint64_t sum = 0;
  for (const TensorToWrite& t : tensors) sum += t.data.size() + t.scales.size();
  return sum;
}

// A layer's tensor as encoded, and where it came from.
struct LayerTensor {
  TensorToWrite* encoded;
  const TensorView* source;
};

// Mixed precision: which W4 matrices become W8 within options.size_budget bytes of weights
// (`fixed_bytes` are the bytes of everything but the layers), by each one's sensitivity — the
// mean KL divergence from the float model when it alone is quantized — per byte W8 adds; those
// are re-encoded in place. The manifest's record of it.
Json keep_sensitive_in_w8(const fs::path& hf_dir, std::span<const int32_t> ids,
                          const std::map<std::string, LayerTensor>& layers, uint64_t fixed_bytes,
                          const ConvertOptions& options, bool int8_activations,
                          const std::function<Rounding(const std::string&)>& rounding_of) {
  uint64_t total = fixed_bytes;
  std::vector<StandIn> stand_ins;
  std::vector<const LayerTensor*> candidates;
  for (const auto& [name, layer] : layers) {
    const TensorToWrite& t = *layer.encoded;
    total += t.data.size() + t.scales.size();
    if (t.dtype != DType::kW4) continue;
    MatrixRef m{DType::kW4, t.data.data(), t.shape[0], t.shape[1]};
    m.scales = t.scales.data();
    m.group_size = t.group_size;
    if (int8_activations) m.activations = Activations::kInt8;
    stand_ins.push_back({layer.source->name, m});
    candidates.push_back(&layer);
  }
  if (total > options.size_budget) {
    fail("--size-budget", std::to_string(options.size_budget) + " bytes is less than the " +
                              std::to_string(total) +
                              " the bundle's weights take with every "
                              "matrix in W4");
  }
  const std::vector<double> kl = measure_sensitivity(hf_dir, ids, stand_ins);
  std::vector<uint64_t> extra(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const TensorToWrite& t = *candidates[i]->encoded;
    extra[i] = matrix_bytes(DType::kW8, t.shape[0], t.shape[1], 0) +
               matrix_scale_bytes(DType::kW8, t.shape[0], t.shape[1], 0) - t.data.size() -
               t.scales.size();
  }
  std::vector<size_t> order(candidates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return kl[a] * static_cast<double>(extra[b]) > kl[b] * static_cast<double>(extra[a]);
  });
  Json w8 = Json::array(), sensitivity = Json::object();
  for (size_t i = 0; i < candidates.size(); ++i) {
    sensitivity[candidates[i]->encoded->name] = kl[i];
  }
  for (const size_t i : order) {
    if (total + extra[i] > options.size_budget) continue;
    TensorToWrite& t = *candidates[i]->encoded;
    const TensorView& source = *candidates[i]->source;
    t = encode(source, t.name, DType::kW8, 0, rounding_of(source.name));
    total += extra[i];
    w8.push_back(t.name);
  }
  return {{"size_budget", options.size_budget},
          {"weight_bytes", total},
          {"sensitivity_tokens", static_cast<int64_t>(ids.size())},
          {"w8_matrices", w8},
          {"kl_alone_w4", sensitivity}};
}

}  // namespace

DType default_table_dtype(DType weights) {
  return is_quantized(weights) ? DType::kBF16 : weights;
}

std::optional<DType> parse_weight_dtype(std::string_view name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kW8, DType::kW4}) {
    if (weight_dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

ConvertResult forge_convert(const fs::path& hf_dir, const fs::path& out,
                            const ConvertOptions& options) {
  if (!is_known_target(options.target)) fail("--target", "unknown target '" + options.target + "'");
  if (fs::exists(out) && !options.overwrite) {
    fail(out.string(), "already exists (pass --force to replace it)");
  }
  const Json config_json = read_json_file(hf_dir / "config.json");
  const ModelConfig config = parse_model_config(config_json, (hf_dir / "config.json").string());
  const Checkpoint checkpoint = Checkpoint::open(hf_dir);
  const std::string family = config.family == Family::kQwen3 ? "qwen3" : "qwen3_5";
  const std::string prefix = text_decoder_prefix(checkpoint);
  const int64_t max_context = options.max_context > 0
                                  ? std::min(options.max_context, config.max_position_embeddings)
                                  : config.max_position_embeddings;

  // Encode every tensor of the text decoder under its canonical name, the multi-token-
  // prediction head's (mtp.*, a drafter) under its own, and the vision tower's (model.visual.*)
  // when config.json has one qhx reads.
  std::vector<TensorToWrite> embed, output, vision;
  std::map<int64_t, std::vector<TensorToWrite>> by_layer;
  std::map<std::string, const TensorView*> layer_sources;  // by canonical name
  int64_t skipped = 0;
  const bool tied = !checkpoint.contains("lm_head.weight");
  const TableDtypes tables = table_dtypes(options, tied);
  // Checked before any tensor is written.
  const bool any_quantized =
      is_quantized(options.weights) || is_quantized(tables.embed) || is_quantized(tables.head);
  if (options.int8_activations.value_or(false) && !any_quantized) {
    fail("--activations int8", "needs W8 or W4 weights; float weights use f32 activations");
  }
  ConvertResult result;
  result.int8_activations = any_quantized && options.int8_activations.value_or(true);
  // Calibration runs the checkpoint first; its statistics name the matrices by source name.
  InputStatistics calibration;
  std::vector<std::vector<int32_t>> calibration_ids;
  Json calibration_json = nullptr;
  if (!options.calibration_texts.empty()) {
    if (!is_quantized(options.weights)) {
      fail("--calibrate", "needs --weights w8 or w4: float matrices are not rounded");
    }
    calibration_ids = calibration_sequences(hf_dir, options.calibration_texts, 2048);
    calibration = collect_input_statistics(hf_dir, calibration_ids,
                                           {.max_tokens = options.calibration_tokens});
    Json texts = Json::array();
    for (const fs::path& text : options.calibration_texts) {
      texts.push_back({{"file", text.filename().string()}, {"sha256", sha256_file(text)}});
    }
    calibration_json = {{"method", calibration_method_name(options.calibration_method)},
                        {"tokens", calibration.tokens},
                        {"texts", texts}};
  }
  const auto rounding_of = [&](const std::string& source_name) {
    const auto gram = calibration.grams.find(source_name);
    return Rounding{gram == calibration.grams.end() ? nullptr : gram->second.get(),
                    options.calibration_method};
  };
  // A tensor of the text model the index lists and no file holds is refused here (--no-gate
  // never loads the model, and the bundle would lack it); the optional parts are not carried.
  for (const std::string& name : checkpoint.listed_but_absent()) {
    if (name.starts_with(prefix) || name == "lm_head.weight") checkpoint.require(name, {});
  }
  // An MTP head that is incomplete (or of a type qhx does not compute with) is left out, as
  // loading leaves it unused: the bundle is a text model.
  const std::string mtp_unusable = mtp_head_unusable(checkpoint, config);
  if (!mtp_unusable.empty()) {
    result.notes.push_back(hf_dir.string() + ": " + mtp_unusable + "; the bundle leaves it out");
  }
  for (const auto& file : checkpoint.files()) {
    for (const auto& [source_name, view] : file->tensors()) {
      std::string name;
      const bool mtp = source_name.starts_with("mtp.");
      if (source_name.starts_with("model.visual.") && config.vision) {
        vision.push_back(encode(view, source_name,
                                vision_dtype_for(source_name, view, options.weights),
                                options.group_size));
        continue;
      }
      if (source_name.starts_with(prefix)) {
        name = "model." + source_name.substr(prefix.size());
      } else if (source_name == "lm_head.weight" || (mtp && mtp_unusable.empty())) {
        name = source_name;
      } else {
        ++skipped;
        continue;
      }
      TensorToWrite t = encode(view, name, dtype_for(name, view, options.weights, tables),
                               options.group_size, rounding_of(source_name));
      if (name == "model.embed_tokens.weight") {
        if (tied && tables.separate_head) {
          output.push_back(encode(view, "lm_head.weight", tables.head, options.group_size));
        }
        embed.push_back(std::move(t));
      } else if (name.starts_with("mtp.")) {
        output.push_back(std::move(t));  // with the lm_head it drafts through
      } else if (const int64_t layer = layer_of_tensor(name); layer >= 0) {
        layer_sources[name] = &view;
        by_layer[layer].push_back(std::move(t));
      } else {
        output.push_back(std::move(t));
      }
    }
  }
  if (embed.empty()) fail(hf_dir.string(), "no " + prefix + "embed_tokens.weight");
  if (static_cast<int64_t>(by_layer.size()) != config.num_layers) {
    fail(hf_dir.string(), "tensors for " + std::to_string(by_layer.size()) +
                              " layers, config.json says " + std::to_string(config.num_layers));
  }

  Json mixed = nullptr;
  if (options.size_budget > 0) {
    if (options.weights != DType::kW4 || options.calibration_texts.empty()) {
      fail("--size-budget",
           "needs --weights w4 and --calibrate (sensitivity is measured on the "
           "calibration text)");
    }
    std::map<std::string, LayerTensor> layers;
    for (auto& [layer, tensors] : by_layer) {
      for (TensorToWrite& t : tensors) layers[t.name] = {&t, layer_sources.at(t.name)};
    }
    const std::vector<int32_t>& first = calibration_ids.front();
    const auto ids = std::span(first).first(
        std::min<size_t>(first.size(), static_cast<size_t>(options.sensitivity_tokens)));
    mixed = keep_sensitive_in_w8(hf_dir, ids, layers,
                                 bytes_of(embed) + bytes_of(output) + bytes_of(vision), options,
                                 result.int8_activations, rounding_of);
  }
  std::map<int64_t, uint64_t> layer_bytes;
  for (const auto& [layer, tensors] : by_layer) layer_bytes[layer] = bytes_of(tensors);

  // Decoder shards: consecutive layer ranges, balanced by bytes (or bounded by max bytes).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  uint64_t total = 0;
  for (const auto& [layer, bytes] : layer_bytes) total += bytes;
  const int64_t wanted = std::max<int64_t>(1, std::min(options.shards, config.num_layers));
  int64_t first = 0;
  uint64_t in_shard = 0, done = 0;
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const uint64_t bytes = layer_bytes[layer];
    const bool over_max =
        options.max_shard_bytes > 0 && in_shard > 0 && in_shard + bytes > options.max_shard_bytes;
    const bool over_share = options.max_shard_bytes == 0 &&
                            static_cast<int64_t>(ranges.size()) + 1 < wanted && in_shard > 0 &&
                            done >= total * (ranges.size() + 1) / wanted;
    if (over_max || over_share) {
      ranges.emplace_back(first, layer);
      first = layer;
      in_shard = 0;
    }
    in_shard += bytes;
    done += bytes;
  }
  ranges.emplace_back(first, config.num_layers);

  // Write everything under a temporary name beside `out`.
  const fs::path parent = fs::absolute(out).parent_path();
  fs::create_directories(parent);
  remove_stale_partials(out);
  const fs::path temp = partial_sibling(out);
  fs::remove_all(temp);
  fs::create_directory(temp);
  PartialGuard guard(temp);

  write_qhxt(temp / "embed.qhxt", embed);
  Json shards_json = Json::array();
  for (size_t s = 0; s < ranges.size(); ++s) {
    std::vector<TensorToWrite> tensors;
    for (int64_t layer = ranges[s].first; layer < ranges[s].second; ++layer) {
      for (auto& t : by_layer[layer]) tensors.push_back(std::move(t));
    }
    const std::string file = "decoder-" + std::to_string(s) + ".qhxt";
    write_qhxt(temp / file, tensors);
    shards_json.push_back({{"file", file}, {"layers", {ranges[s].first, ranges[s].second}}});
  }
  write_qhxt(temp / "output.qhxt", output);
  if (!vision.empty()) write_qhxt(temp / "vision.qhxt", vision);

  std::vector<std::string> tokenizer_files;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    if (fs::exists(hf_dir / f)) {
      fs::copy_file(hf_dir / f, temp / f);
      tokenizer_files.push_back(f);
    }
  }
  // The bundle keeps the checkpoint's generation_config.json (load_generation_config reads it
  // from either); the manifest records what it resolves to.
  const GenerationDefaults generation = load_generation_config(hf_dir, config);
  std::vector<std::string> extra_files;
  if (fs::exists(hf_dir / "generation_config.json")) {
    fs::copy_file(hf_dir / "generation_config.json", temp / "generation_config.json");
    extra_files.push_back("generation_config.json");
  }
  // The image processor's settings go with the tower (the model reads them to make pixels).
  if (!vision.empty() && fs::exists(hf_dir / "preprocessor_config.json")) {
    fs::copy_file(hf_dir / "preprocessor_config.json", temp / "preprocessor_config.json");
    extra_files.push_back("preprocessor_config.json");
  }
  // The MTP head's draft vocabulary goes with it (checked first: a bad list fails here).
  if (fs::exists(hf_dir / kDraftVocabFile)) {
    read_draft_vocab(hf_dir / kDraftVocabFile, config.vocab_size);
    fs::copy_file(hf_dir / kDraftVocabFile, temp / kDraftVocabFile);
    extra_files.push_back(kDraftVocabFile);
  }
  std::set<int32_t> stops(generation.eos_ids.begin(), generation.eos_ids.end());
  stops.insert(config.eos_token_ids.begin(), config.eos_token_ids.end());
  const SamplingParams& sp = generation.sampling;
  const Json sampling = {{"do_sample", !sp.greedy}, {"temperature", sp.temperature},
                         {"top_k", sp.top_k},       {"top_p", sp.top_p},
                         {"min_p", sp.min_p},       {"repetition_penalty", sp.repetition_penalty}};

  Json files = Json::array();
  std::vector<std::string> listed = {"embed.qhxt", "output.qhxt"};
  if (!vision.empty()) listed.push_back("vision.qhxt");
  for (const auto& s : shards_json) listed.push_back(s["file"]);
  listed.insert(listed.end(), tokenizer_files.begin(), tokenizer_files.end());
  listed.insert(listed.end(), extra_files.begin(), extra_files.end());
  for (const auto& f : listed) {
    files.push_back(file_entry(temp, f));
  }
  Json manifest = {
      {"format", "qhx-bundle"},
      {"format_version", kBundleFormatVersion},
      {"created_by", "qhx forge convert"},
      {"created_at", utc_now()},
      {"source",
       {{"path", fs::absolute(hf_dir).lexically_normal().string()},
        {"config_sha256", sha256_file(hf_dir / "config.json")},
        {"skipped_tensors", skipped},
        {"notes", result.notes}}},
      {"family", family},
      {"model_config", config_json},
      {"target", options.target},
      {"tokenizer", {{"files", tokenizer_files}}},
      {"plan",
       {{"embed", {{"file", "embed.qhxt"}, {"dtype", weight_dtype_name(tables.embed)}}},
        {"decoder_shards", shards_json},
        {"output",
         {{"file", "output.qhxt"},
          {"lm_head", tables.separate_head ? "lm_head.weight" : "tied"},
          {"dtype", weight_dtype_name(tables.head)}}},
        {"vision", vision.empty() ? Json(nullptr) : Json{{"file", "vision.qhxt"}}},
        {"generate",
         {{"op", family + "_generate"},
          {"max_context", max_context},
          {"prefill_chunk", 64},
          {"sliding_window", nullptr},
          {"stop_ids", std::vector<int32_t>(stops.begin(), stops.end())},
          {"chat_template", tokenizer_files.empty() ? Json(nullptr) : Json("tokenizer")},
          {"sampling", sampling}}}}},
      {"precision_policy",
       {{"matrices", weight_dtype_name(options.weights)},
        {"w4_group_size", options.weights == DType::kW4 ? Json(options.group_size) : Json(nullptr)},
        {"embed", weight_dtype_name(tables.embed)},
        {"lm_head", weight_dtype_name(tables.head)},
        {"vision_matrices",
         vision.empty() ? Json(nullptr)
                        : Json(weight_dtype_name(is_quantized(options.weights) ? DType::kW8
                                                                               : options.weights))},
        {"norms", "f32"},
        {"gdn_A_log_dt_bias_conv", "f32"},
        {"gdn_gate_projections", "f32"},
        {"gdn_recurrent_state", "f32"},
        {"activations", result.int8_activations ? "int8" : "f32"},
        {"calibration", calibration_json},
        {"mixed", mixed},
        {"kv_cache", "f32"}}},
      {"files", files},
      {"gate", nullptr}};
  // An embedding checkpoint's sentence-transformers files, as the runtime reads them (checked
  // here: files that would change the vectors fail the conversion).
  if (const EmbeddingConfig embedding = read_embedding_config(hf_dir); embedding.pooling) {
    manifest["embedding"] = embedding_json(embedding);
  }
  write_manifest(temp, manifest);

  if (options.gate) {
    const GateThresholds thresholds =
        options.thresholds.value_or(default_gate_thresholds(options.weights));
    GateReport report = forge_gate(temp, hf_dir, thresholds, options.gate_suite);
    if (!report.passed && result.int8_activations && !options.int8_activations) {
      // Int8 activations cost the gate: keep the quantized weights with f32 activations.
      result.int8_activation_gate = std::move(report);
      result.int8_activations = false;
      manifest["precision_policy"]["activations"] = "f32";
      write_manifest(temp, manifest);
      report = forge_gate(temp, hf_dir, thresholds, options.gate_suite);
    }
    Json certificate = report.to_json();
    certificate["reference"] = fs::absolute(hf_dir).lexically_normal().string();
    certificate["date"] = utc_now();
    manifest["gate"] = certificate;
    write_manifest(temp, manifest);
    result.gate = report;
    if (!report.passed) return result;  // the guard removes the temporary bundle
  }
  // The model card is derived from the manifest, and listed in it; manifest.sha256 protects
  // the manifest itself (qhx verify, --verify).
  write_model_card(temp, manifest);
  for (const char* f : {"card.json", "README.md"}) {
    manifest["files"].push_back(file_entry(temp, f));
  }
  write_manifest(temp, manifest);
  for (const auto& entry : fs::directory_iterator(temp)) fsync_path(entry.path());
  if (fs::exists(out)) {
    const fs::path old = hidden_sibling(out, ".old-");
    fs::rename(out, old);
    fs::rename(temp, out);
    fs::remove_all(old);
  } else {
    fs::rename(temp, out);
  }
  fsync_path(parent);
  guard.release();
  result.published = true;
  return result;
}

GateReport forge_gate(const fs::path& bundle, const fs::path& reference,
                      const std::optional<GateThresholds>& thresholds,
                      const GateSuiteOptions& suite_options) {
  const BundleManifest manifest =
      open_bundle_manifest(bundle, {.verify_sha256 = false, .check_target = false});
  const auto candidate = load_model(bundle, {.verify_sha256 = false, .check_target = false});
  const auto ref = load_model(reference);
  if (ref->config().vocab_size != candidate->config().vocab_size) {
    fail(reference.string(), "reference vocabulary differs from the bundle's");
  }
  std::optional<Tokenizer> tokenizer;
  if (fs::exists(reference / "tokenizer.json")) tokenizer = Tokenizer::load(reference);
  std::vector<GatePrompt> suite;
  if (!suite_options.prompt_file.empty()) {
    if (!tokenizer)
      fail(reference.string(), "a gate prompt file needs the reference's tokenizer.json");
    suite = gate_prompt_suite_from_file(*tokenizer, suite_options.prompt_file);
  } else {
    suite = gate_prompt_suite(tokenizer ? &*tokenizer : nullptr, candidate->config().vocab_size,
                              suite_options.prompts);
  }
  // A model that reads images is gated on images too.
  if (ref->has_vision()) {
    if (!candidate->has_vision()) {
      fail(bundle.string(), "reads no images (" + candidate->vision_unavailable() +
                                "), its reference " + reference.string() + " does");
    }
    const std::vector<GatePrompt> images =
        gate_image_prompts(*ref, tokenizer ? &*tokenizer : nullptr);
    suite.insert(suite.end(), images.begin(), images.end());
  }
  const auto matrices = parse_weight_dtype(manifest.precision_policy.value("matrices", "f32"));
  return run_gate(*candidate, *ref, suite, suite_options.greedy_tokens,
                  thresholds.value_or(default_gate_thresholds(matrices.value_or(DType::kF32))));
}

}  // namespace qhx
