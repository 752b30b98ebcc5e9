#include "io/hf_config.h"

#include <set>
#include <string_view>

#include "util/error.h"
#include "util/json_file.h"

namespace qhx {
namespace {

// Keys that carry no information about the forward pass (bookkeeping written by transformers,
// training-only settings, or values checked elsewhere such as token ids).
const std::set<std::string_view> kInformationalKeys = {
    "_name_or_path", "architectures", "attention_dropout", "bos_token_id", "pad_token_id",
    "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label", "label2id",
    "initializer_range", "is_encoder_decoder", "output_attentions", "output_hidden_states",
    "problem_type", "return_dict", "transformers_version", "use_cache", "max_window_layers",
    "model_type", "tie_word_embeddings", "max_position_embeddings", "eos_token_id",
    "tokenizer_class", "use_return_dict", "torchscript", "pruned_heads", "tf_legacy_loss",
    "use_bfloat16", "finetuning_task", "prefix", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "add_cross_attention", "cross_attention_hidden_size", "is_decoder",
    "tie_encoder_decoder", "num_labels"};

// Keys the forward pass reads.
const std::set<std::string_view> kModelKeys = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
    "rope_parameters", "rope_scaling", "hidden_act", "attention_bias", "mlp_bias",
    "use_sliding_window", "sliding_window", "layer_types"};

// Keys a multimodal wrapper carries around its text_config.
const std::set<std::string_view> kWrapperKeys = {"text_config", "vision_config",
                                                 "image_token_id", "video_token_id",
                                                 "vision_start_token_id", "vision_end_token_id"};

std::string field(const std::string& where, std::string_view key) {
  return where + ": " + std::string(key);
}

int64_t positive_int(const Json& cfg, std::string_view key, const std::string& where) {
  const int64_t v = require_int(cfg, key, where);
  if (v <= 0) fail(field(where, key), "must be positive, got " + std::to_string(v));
  return v;
}

std::vector<int32_t> token_ids(const Json& value, const std::string& where) {
  std::vector<int32_t> ids;
  if (value.is_null()) return ids;
  if (value.is_number_integer()) {
    ids.push_back(value.get<int32_t>());
  } else if (value.is_array()) {
    for (const Json& v : value) {
      if (!v.is_number_integer()) fail(where, "expected an integer or a list of integers");
      ids.push_back(v.get<int32_t>());
    }
  } else {
    fail(where, "expected an integer or a list of integers");
  }
  return ids;
}

void require_value(const Json& cfg, std::string_view key, const Json& allowed,
                   const std::string& where, std::string_view why) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null() || *it == allowed) return;
  fail(field(where, key), "value " + it->dump() + " is not supported (" + std::string(why) + ")");
}

double rope_theta_of(const Json& cfg, const std::string& where) {
  // transformers v5 writes rope_parameters {rope_type, rope_theta}; v4 wrote rope_theta and
  // rope_scaling. Only plain RoPE is implemented.
  double theta = 10000.0;
  if (auto it = cfg.find("rope_theta"); it != cfg.end()) {
    theta = require_number(cfg, "rope_theta", where);
  }
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) continue;
    const std::string w = field(where, key);
    if (!it->is_object()) fail(w, "expected an object");
    for (const char* type_key : {"rope_type", "type"}) {
      if (auto t = it->find(type_key); t != it->end() && *t != "default") {
        fail(w + "." + type_key, "RoPE type " + t->dump() + " is not supported");
      }
    }
    for (const auto& [k, v] : it->items()) {
      if (k == "rope_type" || k == "type") {
        continue;
      } else if (k == "rope_theta") {
        theta = require_number(*it, "rope_theta", w);
      } else {
        fail(w + "." + k, "unknown RoPE parameter");
      }
    }
  }
  if (!(theta > 0)) fail(field(where, "rope_theta"), "must be positive");
  return theta;
}

}  // namespace

ModelConfig load_model_config(const std::filesystem::path& config_json) {
  const Json root = read_json_file(config_json);
  const std::string root_where = config_json.string();
  if (!root.is_object()) fail(root_where, "expected a JSON object");
  const bool nested = root.contains("text_config");
  const Json& cfg = nested ? require_field(root, "text_config", root_where) : root;
  const std::string where = nested ? root_where + ": text_config" : root_where;
  if (!cfg.is_object()) fail(where, "expected a JSON object");

  for (const auto& [key, value] : cfg.items()) {
    if (kInformationalKeys.contains(key) || kModelKeys.contains(key)) continue;
    if (!nested && kWrapperKeys.contains(key)) continue;
    fail(field(where, key), "unknown config key (qhx cannot tell whether it changes the model)");
  }
  if (nested) {
    for (const auto& [key, value] : root.items()) {
      if (!kInformationalKeys.contains(key) && !kWrapperKeys.contains(key)) {
        fail(field(root_where, key), "unknown config key");
      }
    }
  }

  ModelConfig c;
  c.model_type = require_string(cfg, "model_type", where);
  if (c.model_type == "qwen3") {
    c.family = Family::kQwen3;
  } else {
    fail(field(where, "model_type"), "'" + c.model_type + "' is not a model family qhx runs");
  }
  c.vocab_size = positive_int(cfg, "vocab_size", where);
  c.hidden_size = positive_int(cfg, "hidden_size", where);
  c.intermediate_size = positive_int(cfg, "intermediate_size", where);
  c.num_layers = positive_int(cfg, "num_hidden_layers", where);
  c.num_heads = positive_int(cfg, "num_attention_heads", where);
  c.num_kv_heads = cfg.contains("num_key_value_heads") && !cfg["num_key_value_heads"].is_null()
                       ? positive_int(cfg, "num_key_value_heads", where)
                       : c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0) {
    fail(field(where, "num_key_value_heads"), "must divide num_attention_heads");
  }
  if (cfg.contains("head_dim") && !cfg["head_dim"].is_null()) {
    c.head_dim = positive_int(cfg, "head_dim", where);
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      fail(field(where, "head_dim"), "missing, and hidden_size is not divisible by the heads");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) fail(field(where, "head_dim"), "must be even for RoPE");
  if (cfg.contains("rms_norm_eps")) c.rms_norm_eps = require_number(cfg, "rms_norm_eps", where);
  if (!(c.rms_norm_eps > 0)) fail(field(where, "rms_norm_eps"), "must be positive");
  c.rope_theta = rope_theta_of(cfg, where);
  if (cfg.contains("tie_word_embeddings")) {
    const Json& t = cfg["tie_word_embeddings"];
    if (!t.is_boolean()) fail(field(where, "tie_word_embeddings"), "expected true or false");
    c.tie_word_embeddings = t.get<bool>();
  }
  if (cfg.contains("max_position_embeddings") && !cfg["max_position_embeddings"].is_null()) {
    c.max_position_embeddings = positive_int(cfg, "max_position_embeddings", where);
  }
  if (cfg.contains("bos_token_id") && cfg["bos_token_id"].is_number_integer()) {
    c.bos_token_id = cfg["bos_token_id"].get<int32_t>();
  }
  if (cfg.contains("eos_token_id")) {
    c.eos_token_ids = token_ids(cfg["eos_token_id"], field(where, "eos_token_id"));
  }

  require_value(cfg, "hidden_act", "silu", where, "only silu is implemented");
  require_value(cfg, "attention_bias", false, where, "Qwen3 projections have no bias");
  require_value(cfg, "mlp_bias", false, where, "Qwen3 MLP has no bias");
  require_value(cfg, "use_sliding_window", false, where, "sliding-window attention");
  if (auto it = cfg.find("layer_types"); it != cfg.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != c.num_layers) {
      fail(field(where, "layer_types"), "expected one entry per layer");
    }
    for (const Json& t : *it) {
      if (t != "full_attention") {
        fail(field(where, "layer_types"), "layer type " + t.dump() + " is not supported");
      }
    }
  }
  return c;
}

GenerationDefaults load_generation_defaults(const std::filesystem::path& path) {
  GenerationDefaults d;
  if (!std::filesystem::exists(path)) return d;
  const Json cfg = read_json_file(path);
  const std::string where = path.string();
  if (!cfg.is_object()) fail(where, "expected a JSON object");
  if (auto it = cfg.find("do_sample"); it != cfg.end() && it->is_boolean()) {
    d.do_sample = it->get<bool>();
  }
  if (auto it = cfg.find("temperature"); it != cfg.end() && !it->is_null()) {
    d.temperature = require_number(cfg, "temperature", where);
  }
  if (auto it = cfg.find("top_k"); it != cfg.end() && !it->is_null()) {
    d.top_k = require_int(cfg, "top_k", where);
  }
  if (auto it = cfg.find("top_p"); it != cfg.end() && !it->is_null()) {
    d.top_p = require_number(cfg, "top_p", where);
  }
  if (auto it = cfg.find("eos_token_id"); it != cfg.end()) {
    d.eos_token_ids = token_ids(*it, field(where, "eos_token_id"));
  }
  return d;
}

}  // namespace qhx
