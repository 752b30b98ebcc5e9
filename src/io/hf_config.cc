#include "io/hf_config.h"

#include <cmath>
#include <cstdint>
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
    "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label", "label2id", "initializer_range",
    "is_encoder_decoder", "output_attentions", "output_hidden_states", "problem_type",
    "return_dict", "transformers_version", "use_cache", "max_window_layers", "model_type",
    "tie_word_embeddings", "max_position_embeddings", "eos_token_id", "tokenizer_class",
    "use_return_dict", "torchscript", "pruned_heads", "tf_legacy_loss", "use_bfloat16",
    "finetuning_task", "prefix", "sep_token_id", "decoder_start_token_id", "task_specific_params",
    "add_cross_attention", "cross_attention_hidden_size", "is_decoder", "tie_encoder_decoder",
    "num_labels",
    // Qwen3.5: the multi-token-prediction head is not used for decoding, and the HF torch path
    // keeps the recurrent state in f32 whatever mamba_ssm_dtype says.
    "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "mamba_ssm_dtype"};

// Keys the forward pass reads.
const std::set<std::string_view> kModelKeys = {"vocab_size",
                                               "hidden_size",
                                               "intermediate_size",
                                               "num_hidden_layers",
                                               "num_attention_heads",
                                               "num_key_value_heads",
                                               "head_dim",
                                               "rms_norm_eps",
                                               "rope_theta",
                                               "rope_parameters",
                                               "rope_scaling",
                                               "hidden_act",
                                               "attention_bias",
                                               "mlp_bias",
                                               "use_sliding_window",
                                               "sliding_window",
                                               "layer_types",
                                               "partial_rotary_factor",
                                               "attn_output_gate",
                                               "full_attention_interval",
                                               "linear_num_key_heads",
                                               "linear_num_value_heads",
                                               "linear_key_head_dim",
                                               "linear_value_head_dim",
                                               "linear_conv_kernel_dim"};

// Keys a multimodal wrapper carries around its text_config.
const std::set<std::string_view> kWrapperKeys = {"text_config",           "vision_config",
                                                 "image_token_id",        "video_token_id",
                                                 "vision_start_token_id", "vision_end_token_id"};

// Sizes are bounded so that products of them cannot overflow and a typo cannot ask for
// exabytes: 2^31 (a vocabulary, a hidden size), 2^16 layers.
int64_t positive_int(const Json& cfg, std::string_view key, const std::string& where,
                     int64_t max = int64_t{1} << 31) {
  const Json& j = require_field(cfg, key, where);
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(max)) {
    fail(field(where, key), "must be at most " + std::to_string(max) + ", got " + j.dump());
  }
  const int64_t v = require_int(cfg, key, where);
  if (v <= 0) fail(field(where, key), "must be positive, got " + std::to_string(v));
  if (v > max)
    fail(field(where, key), "must be at most " + std::to_string(max) + ", got " + j.dump());
  return v;
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
      } else if (k == "partial_rotary_factor" || k == "mrope_section" || k == "mrope_interleaved") {
        continue;  // read by rotary_dim_of; M-RoPE is the identity on text (spec §3.5)
      } else {
        fail(w + "." + k, "unknown RoPE parameter");
      }
    }
  }
  if (!(theta > 0)) fail(field(where, "rope_theta"), "must be positive");
  return theta;
}

// int(head_dim · partial_rotary_factor), as transformers computes it. The factor may sit at the
// top level or inside rope_parameters; Qwen3.5's config class defaults it to 0.25.
int64_t rotary_dim_of(const Json& cfg, int64_t head_dim, double default_factor,
                      const std::string& where) {
  double factor = default_factor;
  std::string key = "partial_rotary_factor";
  if (cfg.contains(key) && !cfg[key].is_null()) factor = require_number(cfg, key, where);
  if (auto it = cfg.find("rope_parameters");
      it != cfg.end() && it->is_object() && it->contains(key)) {
    factor = require_number(*it, key, where + ": rope_parameters");
    key = "rope_parameters." + key;
  }
  const auto dim = static_cast<int64_t>(static_cast<double>(head_dim) * factor);
  if (!(factor > 0 && factor <= 1) || dim < 2 || dim % 2 != 0) {
    fail(field(where, key), "gives a rotary dimension of " + std::to_string(dim) +
                                " for head_dim " + std::to_string(head_dim) +
                                " (must be even, > 0, <= head_dim)");
  }
  return dim;
}

std::vector<LayerKind> layer_types_of(const Json& cfg, const ModelConfig& c,
                                      const std::string& where) {
  std::vector<LayerKind> kinds;
  auto it = cfg.find("layer_types");
  if (it == cfg.end() || it->is_null()) {
    if (c.family == Family::kQwen3)
      return std::vector<LayerKind>(c.num_layers, LayerKind::kFullAttention);
    // Qwen3.5 without an explicit list: every full_attention_interval-th layer is full.
    int64_t interval = 4;
    if (cfg.contains("full_attention_interval")) {
      interval = positive_int(cfg, "full_attention_interval", where);
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      kinds.push_back((i + 1) % interval == 0 ? LayerKind::kFullAttention
                                              : LayerKind::kLinearAttention);
    }
    return kinds;
  }
  const std::string w = field(where, "layer_types");
  if (!it->is_array() || static_cast<int64_t>(it->size()) != c.num_layers) {
    fail(w, "expected a list of num_hidden_layers (" + std::to_string(c.num_layers) +
                ") entries, got " + (it->is_array() ? std::to_string(it->size()) : it->dump()));
  }
  for (const Json& t : *it) {
    if (t == "full_attention") {
      kinds.push_back(LayerKind::kFullAttention);
    } else if (t == "linear_attention" && c.family == Family::kQwen3_5) {
      kinds.push_back(LayerKind::kLinearAttention);
    } else {
      fail(w, "layer type " + t.dump() + " is not supported for model_type '" + c.model_type + "'");
    }
  }
  return kinds;
}

int64_t int_or_default(const Json& cfg, std::string_view key, int64_t fallback,
                       const std::string& where) {
  auto it = cfg.find(key);
  return it == cfg.end() || it->is_null() ? fallback : positive_int(cfg, key, where);
}

}  // namespace

ModelConfig load_model_config(const std::filesystem::path& config_json) {
  return parse_model_config(read_json_file(config_json), config_json.string());
}

namespace {

// Sections past the rotary frequencies select none of them, as in transformers.
std::vector<int64_t> mrope_section_of(const Json& cfg, const std::string& where) {
  std::vector<int64_t> section = {11, 11, 10};  // transformers' default
  auto it = cfg.find("rope_parameters");
  if (it != cfg.end() && it->is_object() && it->contains("mrope_section")) {
    const Json& v = (*it)["mrope_section"];
    const std::string w = where + ": rope_parameters.mrope_section";
    if (!v.is_array() || v.size() != 3) fail(w, "expected three integers");
    section.clear();
    for (const Json& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) fail(w, "expected three integers");
      section.push_back(x.get<int64_t>());
    }
  }
  return section;
}

// vision_config as a VisionConfig, or why it is not one qhx reads.
std::optional<VisionConfig> vision_of(const Json& v, int64_t text_hidden, std::string& why) {
  static const std::set<std::string_view> known = {"model_type",
                                                   "depth",
                                                   "hidden_size",
                                                   "hidden_act",
                                                   "intermediate_size",
                                                   "num_heads",
                                                   "in_channels",
                                                   "patch_size",
                                                   "spatial_merge_size",
                                                   "temporal_patch_size",
                                                   "out_hidden_size",
                                                   "num_position_embeddings",
                                                   "initializer_range",
                                                   "rope_parameters",
                                                   "deepstack_visual_indexes",
                                                   "dtype",
                                                   "torch_dtype",
                                                   "transformers_version",
                                                   "_name_or_path",
                                                   "fullatt_block_indexes",
                                                   "tokens_per_second",
                                                   "window_size"};
  const std::string where = "vision_config";
  try {
    if (!v.is_object()) fail(where, "expected a JSON object");
    for (const auto& [key, value] : v.items()) {
      if (!known.contains(key)) fail(field(where, key), "unknown vision config key");
    }
    VisionConfig c;
    c.depth = positive_int(v, "depth", where, 1024);
    c.hidden_size = positive_int(v, "hidden_size", where, 1 << 16);
    c.intermediate_size = positive_int(v, "intermediate_size", where, 1 << 18);
    c.num_heads = positive_int(v, "num_heads", where, 1024);
    c.out_hidden_size = positive_int(v, "out_hidden_size", where, 1 << 18);
    c.num_position_embeddings = positive_int(v, "num_position_embeddings", where, 1 << 20);
    c.in_channels = int_or_default(v, "in_channels", 3, where);
    c.patch_size = int_or_default(v, "patch_size", 16, where);
    c.temporal_patch_size = int_or_default(v, "temporal_patch_size", 2, where);
    c.spatial_merge_size = int_or_default(v, "spatial_merge_size", 2, where);
    if (c.in_channels != 3) fail(field(where, "in_channels"), "images are RGB: expected 3");
    if (c.hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0) {
      fail(field(where, "num_heads"), "the head size must be a multiple of 4 (2-D RoPE)");
    }
    if (c.out_hidden_size != text_hidden) {
      fail(field(where, "out_hidden_size"), "differs from the text model's hidden_size");
    }
    const auto side =
        static_cast<int64_t>(std::sqrt(static_cast<double>(c.num_position_embeddings)));
    if (side * side != c.num_position_embeddings) {
      fail(field(where, "num_position_embeddings"), "expected a square (a grid of positions)");
    }
    if (v.contains("hidden_act")) {
      if (v["hidden_act"] == "gelu") {
        c.gelu_tanh = false;
      } else if (v["hidden_act"] != "gelu_pytorch_tanh") {
        fail(field(where, "hidden_act"),
             v["hidden_act"].dump() + ": qhx's tower computes gelu_pytorch_tanh or gelu");
      }
    }
    if (auto d = v.find("deepstack_visual_indexes");
        d != v.end() && !d->is_null() && !(d->is_array() && d->empty())) {
      fail(field(where, "deepstack_visual_indexes"),
           "must be empty: qhx's tower feeds no DeepStack features to the decoder (Qwen3-VL's)");
    }
    if (auto r = v.find("rope_parameters"); r != v.end() && r->is_object()) {
      if (r->contains("rope_type") && (*r)["rope_type"] != "axial") {
        fail(field(where, "rope_parameters.rope_type"), "expected \"axial\"");
      }
      if (r->contains("rope_theta")) c.rope_theta = require_number(*r, "rope_theta", where);
    }
    return c;
  } catch (const Error& e) {
    why = e.what();
    return std::nullopt;
  }
}

}  // namespace

ModelConfig parse_model_config(const Json& root, const std::string& root_where) {
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
  } else if (c.model_type == "qwen3_5_text" || c.model_type == "qwen3_5") {
    c.family = Family::kQwen3_5;
  } else {
    fail(field(where, "model_type"), "'" + c.model_type + "' is not a model family qhx runs");
  }
  c.vocab_size = positive_int(cfg, "vocab_size", where);
  c.hidden_size = positive_int(cfg, "hidden_size", where);
  c.intermediate_size = positive_int(cfg, "intermediate_size", where);
  c.num_layers = positive_int(cfg, "num_hidden_layers", where, int64_t{1} << 16);
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
  const bool qwen3_5 = c.family == Family::kQwen3_5;
  c.rotary_dim = rotary_dim_of(cfg, c.head_dim, qwen3_5 ? 0.25 : 1.0, where);
  // A wrapper may carry the flag at either level; tying is decided by the weights present.
  for (const Json* level : {&root, &cfg}) {
    if (auto t = level->find("tie_word_embeddings"); t != level->end()) {
      if (!t->is_boolean()) fail(field(where, "tie_word_embeddings"), "expected true or false");
      c.tie_word_embeddings = c.tie_word_embeddings || t->get<bool>();
    }
  }
  c.layer_types = layer_types_of(cfg, c, where);
  if (qwen3_5) {
    // Defaults are those of transformers' Qwen3_5TextConfig (spec §3.1).
    c.linear_num_key_heads = int_or_default(cfg, "linear_num_key_heads", 16, where);
    c.linear_num_value_heads = int_or_default(cfg, "linear_num_value_heads", 32, where);
    c.linear_key_head_dim = int_or_default(cfg, "linear_key_head_dim", 128, where);
    c.linear_value_head_dim = int_or_default(cfg, "linear_value_head_dim", 128, where);
    c.linear_conv_kernel_dim = int_or_default(cfg, "linear_conv_kernel_dim", 4, where);
    if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
      fail(field(where, "linear_num_value_heads"), "must be a multiple of linear_num_key_heads (" +
                                                       std::to_string(c.linear_num_key_heads) +
                                                       ")");
    }
    require_value(cfg, "attn_output_gate", true, where,
                  "Qwen3.5 attention always applies its output gate");
  }
  if (cfg.contains("max_position_embeddings") && !cfg["max_position_embeddings"].is_null()) {
    c.max_position_embeddings = positive_int(cfg, "max_position_embeddings", where);
  }
  if (cfg.contains("bos_token_id") && cfg["bos_token_id"].is_number_integer()) {
    c.bos_token_id = cfg["bos_token_id"].get<int32_t>();
  }
  if (cfg.contains("eos_token_id")) {
    c.eos_token_ids = parse_token_ids(cfg["eos_token_id"], field(where, "eos_token_id"));
  }

  if (qwen3_5) c.mrope_section = mrope_section_of(cfg, where);
  if (nested && root.contains("vision_config")) {
    c.vision = vision_of(root["vision_config"], c.hidden_size, c.vision_unavailable);
    for (auto [key, id] : {std::pair{"image_token_id", &c.image_token_id},
                           std::pair{"video_token_id", &c.video_token_id},
                           std::pair{"vision_start_token_id", &c.vision_start_token_id},
                           std::pair{"vision_end_token_id", &c.vision_end_token_id}}) {
      if (!root.contains(key)) continue;
      // Read only for images: a text model loads whatever they say (as transformers does).
      const std::vector<int32_t> ids = parse_token_ids(root[key], field(root_where, key));
      if (ids.size() == 1 && ids[0] < c.vocab_size) *id = ids[0];
    }
    if (c.vision &&
        (c.image_token_id < 0 || c.vision_start_token_id < 0 || c.vision_end_token_id < 0)) {
      c.vision.reset();
      c.vision_unavailable =
          "config.json's image_token_id, vision_start_token_id or vision_end_token_id is missing "
          "or outside the vocabulary";
    }
  }

  require_value(cfg, "hidden_act", "silu", where, "only silu is implemented");
  require_value(cfg, "attention_bias", false, where, "Qwen3 projections have no bias");
  require_value(cfg, "mlp_bias", false, where, "Qwen3 MLP has no bias");
  require_value(cfg, "use_sliding_window", false, where, "sliding-window attention");
  return c;
}

std::vector<int32_t> parse_token_ids(const Json& value, const std::string& where) {
  std::vector<int32_t> ids;
  if (value.is_null()) return ids;
  const auto add = [&](const Json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      fail(where, "expected a token id or a list of token ids");
    }
    ids.push_back(v.get<int32_t>());
  };
  if (value.is_array()) {
    for (const Json& v : value) add(v);
  } else {
    add(value);
  }
  return ids;
}

}  // namespace qhx
