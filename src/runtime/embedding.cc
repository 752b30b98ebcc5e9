#include "runtime/embedding.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"
#include "util/json_file.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kModulePrefix = "sentence_transformers.models.";

bool flag(const Json& object, const std::string& key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return false;
  if (!it->is_boolean()) fail(field(where, key), "expected true or false");
  return it->get<bool>();
}

// 1_Pooling/config.json: exactly one mode, one computed here.
void read_pooling(const fs::path& file, EmbeddingConfig& config) {
  const std::string where = file.string();
  const Json j = read_json_file(file);
  if (!j.is_object()) fail(where, "expected a JSON object");
  std::vector<std::pair<std::string, Pooling>> set;
  for (const auto& [key, pooling] : {std::pair{"pooling_mode_lasttoken", Pooling::kLastToken},
                                     std::pair{"pooling_mode_mean_tokens", Pooling::kMean},
                                     std::pair{"pooling_mode_cls_token", Pooling::kCls}}) {
    if (flag(j, key, where)) set.emplace_back(key, pooling);
  }
  for (const char* key : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                          "pooling_mode_weightedmean_tokens"}) {
    if (flag(j, key, where)) {
      fail(field(where, key), "this pooling is not supported (last token, mean and cls are)");
    }
  }
  if (set.empty()) fail(where, "no pooling mode is true");
  if (set.size() > 1) {
    fail(field(where, set[1].first),
         "true beside " + set[0].first + ": concatenated poolings are not supported");
  }
  config.pooling = set[0].second;
  // Without the prompt, mean and cls pooling would skip its tokens; the last token is never one.
  const bool include_prompt = !j.contains("include_prompt") || j["include_prompt"].is_null() ||
                              flag(j, "include_prompt", where);
  if (!include_prompt && config.pooling != Pooling::kLastToken) {
    fail(field(where, "include_prompt"), "false is supported with last-token pooling only");
  }
}

// The prompts and default_prompt_name of `object` (named `where`).
void parse_prompts(const Json& object, const std::string& where, EmbeddingConfig& config) {
  if (const auto prompts = object.find("prompts"); prompts != object.end() && !prompts->is_null()) {
    if (!prompts->is_object()) fail(field(where, "prompts"), "expected a JSON object");
    for (const auto& [name, text] : prompts->items()) {
      if (!text.is_string()) fail(field(where, "prompts." + name), "expected a string");
      config.prompts.emplace_back(name, text.get<std::string>());
    }
  }
  const auto name = object.find("default_prompt_name");
  if (name != object.end() && !name->is_null()) {
    if (!name->is_string()) fail(field(where, "default_prompt_name"), "expected a string");
    config.default_prompt_name = name->get<std::string>();
    const auto& p = config.prompts;
    if (!config.default_prompt_name.empty() && std::none_of(p.begin(), p.end(), [&](const auto& e) {
          return e.first == config.default_prompt_name;
        })) {
      fail(field(where, "default_prompt_name"),
           "'" + config.default_prompt_name + "' is not one of its prompts");
    }
  }
}

// sentence_bert_config.json: the length sentence-transformers cuts inputs to; lowercasing (which
// qhx does not do) is refused.
void read_transformer_settings(const fs::path& file, EmbeddingConfig& config) {
  if (!fs::exists(file)) return;
  const std::string where = file.string();
  const Json j = read_json_file(file);
  if (!j.is_object()) fail(where, "expected a JSON object");
  if (flag(j, "do_lower_case", where)) {
    fail(field(where, "do_lower_case"), "true is not supported: the inputs would differ");
  }
  if (const auto n = j.find("max_seq_length"); n != j.end() && !n->is_null()) {
    if (!n->is_number_integer() || n->get<int64_t>() < 1) {
      fail(field(where, "max_seq_length"), "expected a positive integer");
    }
    config.max_seq_length = n->get<int64_t>();
  }
}

void read_prompts(const fs::path& file, EmbeddingConfig& config) {
  if (!fs::exists(file)) return;
  const Json j = read_json_file(file);
  if (!j.is_object()) fail(file.string(), "expected a JSON object");
  parse_prompts(j, file.string(), config);
}

}  // namespace

Pooling parse_pooling(std::string_view name, std::string_view where) {
  for (const Pooling p : {Pooling::kLastToken, Pooling::kMean, Pooling::kCls}) {
    if (name == pooling_name(p)) return p;
  }
  std::string what = "'";
  what.append(name).append("' is not last, mean or cls");
  fail(where, what);
}

void check_dimensions(int64_t dimensions, int64_t hidden_size) {
  if (dimensions < 0 || dimensions > hidden_size) {
    fail("dimensions", "must be 0 (all) or 1.." + std::to_string(hidden_size) + ", got " +
                           std::to_string(dimensions));
  }
}

const char* pooling_name(Pooling pooling) {
  switch (pooling) {
    case Pooling::kLastToken:
      return "last";
    case Pooling::kMean:
      return "mean";
    case Pooling::kCls:
      return "cls";
  }
  return "?";
}

const std::string& EmbeddingConfig::prompt(std::string_view name) const {
  std::string names;
  for (const auto& [key, text] : prompts) {
    if (key == name) return text;
    names += (names.empty() ? "" : ", ") + key;
  }
  std::string what = "'";
  what.append(name).append("' is not one of the model's prompts (");
  what.append(names.empty() ? "it has none" : names).append(")");
  fail("prompt_name", what);
}

nlohmann::json embedding_json(const EmbeddingConfig& config) {
  Json prompts = Json::object();
  for (const auto& [name, text] : config.prompts) prompts[name] = text;
  return {{"pooling", config.pooling ? Json(pooling_name(*config.pooling)) : Json(nullptr)},
          {"normalize", config.normalize},
          {"prompts", prompts},
          {"default_prompt_name", config.default_prompt_name},
          {"max_seq_length", config.max_seq_length}};
}

namespace {

EmbeddingConfig from_manifest(const fs::path& file) {
  const std::string where = file.string();
  const Json manifest = read_json_file(file);
  EmbeddingConfig config;
  const auto it = manifest.find("embedding");
  if (it == manifest.end() || it->is_null()) return config;
  const std::string at = field(where, "embedding");
  const Json& e = *it;
  if (!e.is_object()) fail(at, "expected a JSON object");
  const std::string pooling = require_string(e, "pooling", at);
  config.pooling = parse_pooling(pooling, field(at, "pooling"));
  config.normalize = flag(e, "normalize", at);
  parse_prompts(e, at, config);
  if (const auto n = e.find("max_seq_length"); n != e.end() && !n->is_null()) {
    if (!n->is_number_integer() || n->get<int64_t>() < 0) {
      fail(field(at, "max_seq_length"), "expected a whole number");
    }
    config.max_seq_length = n->get<int64_t>();
  }
  return config;
}

}  // namespace

EmbeddingConfig read_embedding_config(const fs::path& dir) {
  EmbeddingConfig config;
  if (fs::exists(dir / "manifest.json")) return from_manifest(dir / "manifest.json");
  const fs::path modules_file = dir / "modules.json";
  if (!fs::exists(modules_file)) {
    // Some exports keep the pooling config alone (text-embeddings-inference reads it so).
    if (fs::exists(dir / "1_Pooling" / "config.json")) {
      read_pooling(dir / "1_Pooling" / "config.json", config);
      read_prompts(dir / "config_sentence_transformers.json", config);
      read_transformer_settings(dir / "sentence_bert_config.json", config);
    }
    return config;
  }
  const std::string where = modules_file.string();
  const Json modules = read_json_file(modules_file);
  if (!modules.is_array()) fail(where, "expected an array of modules");
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string entry = where + ": [" + std::to_string(i) + "]";
    const std::string type = require_string(modules[i], "type", entry);
    const std::string kind =
        type.starts_with(kModulePrefix) ? type.substr(kModulePrefix.size()) : type;
    if (kind == "Transformer" && i == 0) continue;
    if (kind == "Pooling" && !config.pooling) {
      read_pooling(dir / require_string(modules[i], "path", entry) / "config.json", config);
    } else if (kind == "Normalize" && config.pooling && !config.normalize) {
      config.normalize = true;
    } else {
      fail(field(entry, "type"), "'" + type +
                                     "' here is not supported (Transformer, then Pooling, then "
                                     "Normalize are): its vectors would differ");
    }
  }
  if (!config.pooling) fail(where, "has no Pooling module");
  read_prompts(dir / "config_sentence_transformers.json", config);
  read_transformer_settings(dir / "sentence_bert_config.json", config);
  return config;
}

std::optional<std::vector<float>> embed_tokens(const Model& model, ModelState& state,
                                               std::span<const int32_t> ids,
                                               const EmbedParams& params) {
  const int64_t H = model.config().hidden_size;
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n == 0) fail("tokens", "none to embed (an empty input)");
  check_dimensions(params.dimensions, H);
  if (params.chunk < 1) fail("chunk", "must be >= 1");
  // All of them before the first pass: a bad id late in a long input wastes no work.
  const int64_t vocab = model.config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      fail(
          "tokens[" + std::to_string(i) + "]",
          std::to_string(ids[i]) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  state.reset();
  state.reserve(n);
  std::vector<double> sum(H, 0.0);  // of the rows pooled
  std::vector<float> logits, hidden;
  for (int64_t begin = 0; begin < n; begin += params.chunk) {
    if (params.cancel != nullptr && params.cancel->load()) return std::nullopt;
    const int64_t count = std::min(params.chunk, n - begin);
    model.forward(ids.subspan(begin, count), state, LogitsFor::kNone, logits, &hidden);
    const auto add_row = [&](int64_t r) {
      for (int64_t k = 0; k < H; ++k) sum[k] += hidden[r * H + k];
    };
    if (params.pooling == Pooling::kMean) {
      for (int64_t r = 0; r < count; ++r) add_row(r);
    } else if (params.pooling == Pooling::kCls && begin == 0) {
      add_row(0);
    } else if (params.pooling == Pooling::kLastToken && begin + count == n) {
      add_row(count - 1);
    }
  }
  const int64_t dims = params.dimensions > 0 ? params.dimensions : H;
  const double scale = params.pooling == Pooling::kMean ? 1.0 / static_cast<double>(n) : 1.0;
  std::vector<float> out(dims);
  for (int64_t k = 0; k < dims; ++k) out[k] = static_cast<float>(sum[k] * scale);
  if (params.normalize) {
    double norm = 0;
    for (const float v : out) norm += static_cast<double>(v) * v;
    // torch.nn.functional.normalize: x / max(|x|, 1e-12).
    const double divisor = std::max(std::sqrt(norm), 1e-12);
    for (float& v : out) v = static_cast<float>(v / divisor);
  }
  return out;
}

}  // namespace qhx
