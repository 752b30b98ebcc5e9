// config.json parsing: flat and nested layouts, documented defaults,
// and clear errors for unknown, missing or unsupported keys.
#include <gtest/gtest.h>

#include <fstream>

#include "io/hf_config.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "util/json_file.h"

namespace qhx {
namespace {

using test::expect_error;

Json base_config() {
  return Json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": null, "hidden_act": "silu",
    "attention_bias": false, "attention_dropout": 0.0, "use_sliding_window": false,
    "sliding_window": null, "max_window_layers": 28, "tie_word_embeddings": true,
    "bos_token_id": 151643, "eos_token_id": 151645, "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
    "initializer_range": 0.02})");
}

class ConfigTest : public ::testing::Test {
 protected:
  ModelConfig load(const Json& j) {
    std::ofstream(path()) << j.dump(2);
    return load_model_config(path());
  }
  std::filesystem::path path() const { return dir_.path() / "config.json"; }
  test::TempDir dir_;
};

TEST_F(ConfigTest, Qwen3_0_6BConfigAsPublished) {
  const ModelConfig c = load(base_config());
  EXPECT_EQ(c.family, Family::kQwen3);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.head_dim, 128);  // explicit, not hidden / heads
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151645});
  EXPECT_EQ(c.max_position_embeddings, 40960);
}

TEST_F(ConfigTest, TransformersV5RopeParameters) {
  Json j = base_config();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  EXPECT_DOUBLE_EQ(load(j).rope_theta, 5e5);
}

TEST_F(ConfigTest, NestedTextConfig) {
  Json wrapper = {{"architectures", {"Qwen3ForConditionalGeneration"}},
                  {"model_type", "qwen3_vl"},
                  {"text_config", base_config()},
                  {"vision_config", {{"depth", 2}}}};
  const ModelConfig c = load(wrapper);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.model_type, "qwen3");
}

TEST_F(ConfigTest, DocumentedDefaults) {
  Json j = base_config();
  for (const char* key : {"head_dim", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                          "max_position_embeddings", "tie_word_embeddings"}) {
    j.erase(key);
  }
  const ModelConfig c = load(j);
  EXPECT_EQ(c.head_dim, 1024 / 16);
  EXPECT_EQ(c.num_kv_heads, 16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST_F(ConfigTest, UnknownKeyIsAnError) {
  Json j = base_config();
  j["quantization_config"] = {{"bits", 4}};
  expect_error([&] { load(j); }, {"config.json", "quantization_config", "unknown config key"});
}

TEST_F(ConfigTest, MissingRequiredKeyIsAnError) {
  Json j = base_config();
  j.erase("hidden_size");
  expect_error([&] { load(j); }, {"config.json", "hidden_size", "missing"});
}

TEST_F(ConfigTest, UnsupportedSettingsAreErrors) {
  Json j = base_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error([&] { load(j); }, {"rope_scaling", "yarn"});
  j = base_config();
  j["use_sliding_window"] = true;
  expect_error([&] { load(j); }, {"use_sliding_window", "not supported"});
  j = base_config();
  j["attention_bias"] = true;
  expect_error([&] { load(j); }, {"attention_bias"});
  j = base_config();
  j["model_type"] = "llama";
  expect_error([&] { load(j); }, {"model_type", "llama"});
  j = base_config();
  j["num_key_value_heads"] = 3;
  expect_error([&] { load(j); }, {"num_key_value_heads", "divide"});
  j = base_config();
  j["hidden_size"] = "1024";
  expect_error([&] { load(j); }, {"hidden_size", "integer"});
}

// Sizes past what any model has are refused by name before anything is sized by them (a
// trillion layers asked for a vector of a trillion entries; 2^64 - 1 wrapped negative).
TEST_F(ConfigTest, ImplausibleSizesAreRefusedByName) {
  Json j = base_config();
  j["num_hidden_layers"] = int64_t{1000000000000};
  expect_error([&] { load(j); }, {"config.json: num_hidden_layers", "at most 65536"});
  j = base_config();
  j["hidden_size"] = uint64_t{18446744073709551615u};
  expect_error([&] { load(j); }, {"config.json: hidden_size", "at most", "18446744073709551615"});
  j = base_config();
  j["intermediate_size"] = int64_t{1} << 40;
  expect_error([&] { load(j); }, {"config.json: intermediate_size", "at most"});
}

// Qwen3.5-0.8B's config.json as published (spec §3.1, §3.2), vision part shortened.
Json qwen3_5_config() {
  return Json::parse(R"({
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
    "vision_end_token_id": 248054, "tie_word_embeddings": true,
    "vision_config": {"depth": 12, "hidden_size": 768},
    "text_config": {
      "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 1024,
      "intermediate_size": 3584, "num_hidden_layers": 8, "num_attention_heads": 8,
      "num_key_value_heads": 2, "head_dim": 256, "hidden_act": "silu", "rms_norm_eps": 1e-06,
      "attention_bias": false, "attn_output_gate": true, "full_attention_interval": 4,
      "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                      "full_attention", "linear_attention", "linear_attention",
                      "linear_attention", "full_attention"],
      "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
      "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                          "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                          "mrope_interleaved": true},
      "max_position_embeddings": 262144, "eos_token_id": 248044, "mamba_ssm_dtype": "float32",
      "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": false, "dtype": "bfloat16"}})");
}

TEST_F(ConfigTest, Qwen3_5NestedConfig) {
  const ModelConfig c = load(qwen3_5_config());
  EXPECT_EQ(c.family, Family::kQwen3_5);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_TRUE(c.tie_word_embeddings);  // from the wrapper level
  ASSERT_EQ(c.layer_types.size(), 8u);
  EXPECT_EQ(c.layer_types[2], LayerKind::kLinearAttention);
  EXPECT_EQ(c.layer_types[3], LayerKind::kFullAttention);
  EXPECT_EQ(c.linear_num_value_heads, 16);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{248044});
}

TEST_F(ConfigTest, Qwen3_5LayerTypesFromTheInterval) {
  Json j = qwen3_5_config();
  j["text_config"].erase("layer_types");
  j["text_config"]["full_attention_interval"] = 2;
  const ModelConfig c = load(j);
  EXPECT_EQ(c.layer_types[0], LayerKind::kLinearAttention);
  EXPECT_EQ(c.layer_types[1], LayerKind::kFullAttention);
  EXPECT_EQ(c.layer_types[7], LayerKind::kFullAttention);
}

TEST_F(ConfigTest, Qwen3_5MalformedConfigs) {
  Json j = qwen3_5_config();
  j["text_config"]["layer_types"].erase(0);
  expect_error([&] { load(j); }, {"text_config: layer_types", "8", "got 7"});
  j = qwen3_5_config();
  j["text_config"]["layer_types"][0] = "sliding_attention";
  expect_error([&] { load(j); }, {"layer_types", "sliding_attention"});
  j = qwen3_5_config();
  j["text_config"]["linear_num_value_heads"] = 24;
  j["text_config"]["linear_num_key_heads"] = 16;
  expect_error([&] { load(j); }, {"linear_num_value_heads", "multiple"});
  j = qwen3_5_config();
  j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.001;
  expect_error([&] { load(j); }, {"partial_rotary_factor", "rotary dimension"});
  j = qwen3_5_config();
  j["text_config"]["attn_output_gate"] = false;
  expect_error([&] { load(j); }, {"attn_output_gate"});
  j = qwen3_5_config();
  j["text_config"]["linear_attention_bias"] = true;
  expect_error([&] { load(j); }, {"linear_attention_bias", "unknown config key"});
}

TEST_F(ConfigTest, BadJsonNamesTheFile) {
  std::ofstream(path()) << "{\"vocab_size\": 12,";
  expect_error([&] { load_model_config(path()); }, {path().string(), "invalid JSON"});
  expect_error([&] { load_model_config(dir_.path() / "nope.json"); }, {"nope.json", "cannot open"});
}

}  // namespace
}  // namespace qhx
