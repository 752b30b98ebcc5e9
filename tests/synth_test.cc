// Synthetic checkpoints (qhx forge synth): the presets carry the published shapes (spec §2.2,
// §3.2) in a config.json our strict parser accepts, and a written checkpoint loads and runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "forge/synth.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "models/model.h"
#include "runtime/bench.h"
#include "support/fixtures.h"
#include "util/error.h"
#include "vision/image.h"

namespace qhx {
namespace {

ModelConfig preset_config(const std::string& name) {
  return parse_model_config(synthetic_config_json(synth_preset(name)), name);
}

int64_t count_full_attention(const ModelConfig& c) {
  return std::count(c.layer_types.begin(), c.layer_types.end(), LayerKind::kFullAttention);
}

TEST(Synth, Qwen3PresetsHaveThePublishedShapes) {
  const ModelConfig small = preset_config("qwen3-0.6b");
  EXPECT_EQ(small.family, Family::kQwen3);
  EXPECT_EQ(small.vocab_size, 151936);
  EXPECT_EQ(small.hidden_size, 1024);
  EXPECT_EQ(small.intermediate_size, 3072);
  EXPECT_EQ(small.num_layers, 28);
  EXPECT_EQ(small.num_heads * small.head_dim, 2048);  // q width ≠ hidden
  EXPECT_EQ(small.num_kv_heads * small.head_dim, 1024);
  EXPECT_EQ(small.rope_theta, 1e6);
  EXPECT_EQ(count_full_attention(small), 28);
  const ModelConfig large = preset_config("qwen3-1.7b");
  EXPECT_EQ(large.hidden_size, 2048);
  EXPECT_EQ(large.intermediate_size, 6144);
}

TEST(Synth, Qwen3_5PresetsHaveThePublishedShapes) {
  for (const char* name : {"qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b"}) {
    const ModelConfig c = preset_config(name);
    EXPECT_EQ(c.family, Family::kQwen3_5) << name;
    EXPECT_EQ(c.vocab_size, 248320) << name;
    EXPECT_EQ(c.head_dim, 256) << name;
    EXPECT_EQ(c.rotary_dim, 64) << name;
    EXPECT_EQ(c.linear_num_key_heads * c.linear_key_head_dim, 2048) << name;  // Kd
    EXPECT_EQ(c.linear_conv_kernel_dim, 4) << name;
    EXPECT_EQ(count_full_attention(c), c.num_layers / 4) << name;
    EXPECT_EQ(c.layer_types[3], LayerKind::kFullAttention) << name;
  }
  const ModelConfig two = preset_config("qwen3.5-2b");
  EXPECT_EQ(two.hidden_size, 2048);
  EXPECT_EQ(two.intermediate_size, 6144);
  EXPECT_EQ(two.num_layers, 24);
  EXPECT_EQ(two.linear_num_value_heads * two.linear_value_head_dim, 2048);  // Vd
  const ModelConfig four = preset_config("qwen3.5-4b");
  EXPECT_EQ(four.hidden_size, 2560);
  EXPECT_EQ(four.num_layers, 32);
  EXPECT_EQ(four.linear_num_value_heads, 32);  // GVA ratio 2
  EXPECT_EQ(four.num_heads, 16);
  EXPECT_EQ(four.num_kv_heads, 4);
}

TEST(Synth, UnknownPresetNamesTheKnownOnes) {
  try {
    synth_preset("qwen3-70b");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3.5-2b"), std::string::npos) << e.what();
  }
}

// A scaled-down shape of each family goes through the same writer and the normal loader.
TEST(Synth, WrittenCheckpointsLoadAndRun) {
  for (const bool hybrid : {false, true}) {
    SynthShape shape{"tiny", hybrid, 512, 64, 128, 4, 4, 2, 32, 2, 4, 16, 256};
    test::TempDir dir;
    write_synthetic_checkpoint(shape, dir.path() / "ckpt", 7);
    const auto model = load_model(dir.path() / "ckpt");
    EXPECT_EQ(model->config().family, hybrid ? Family::kQwen3_5 : Family::kQwen3);
    BenchConfig config;
    config.n_prompt = 70;  // more than one Gated DeltaNet chunk
    config.n_gen = 4;
    config.depth = 8;
    config.repetitions = 2;
    const BenchResult r = run_bench(*model, config);
    EXPECT_GT(r.prefill_tok_s.min, 0) << hybrid;
    EXPECT_GT(r.decode_tok_s.min, 0) << hybrid;
    EXPECT_GE(r.ttft_ms.min, 0) << hybrid;
    EXPECT_LE(r.decode_tok_s.min, r.decode_tok_s.mean);
    EXPECT_GE(r.decode_tok_s.max, r.decode_tok_s.mean);

    auto state = model->new_state();
    std::vector<float> logits;
    const std::vector<int32_t> ids = {1, 2, 3};
    model->forward(ids, *state, LogitsFor::kLastToken, logits);
    EXPECT_TRUE(
        std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
    EXPECT_THROW(write_synthetic_checkpoint(shape, dir.path() / "ckpt", 7), Error);  // exists
  }
}

// With a tower (the multimodal layout, the released preprocessor_config.json), the checkpoint
// reads images, and the image benchmark times them; a text model takes no tower.
TEST(Synth, ACheckpointWithAVisionTowerReadsImages) {
  const SynthShape shape{"tiny", true, 512, 64, 128, 4, 4, 2, 32, 2, 4, 16, 256};
  const SynthVision tower{2, 32, 2, 64, 64};
  test::TempDir dir;
  write_synthetic_checkpoint(shape, dir.path() / "ckpt", 7, &tower);
  const auto model = load_model(dir.path() / "ckpt");
  ASSERT_TRUE(model->has_vision()) << model->vision_unavailable();
  RgbImage image{300, 200, std::vector<uint8_t>(300 * 200 * 3, 99)};
  const PixelValues pixels = preprocess_image(image, model->image_processor(), "image");
  const ImageBenchResult r = run_image_bench(*model, pixels, 2);
  EXPECT_EQ(r.patches, pixels.grid.patches());
  EXPECT_EQ(r.tokens, r.patches / 4);
  EXPECT_GT(r.encode_ms.mean, 0);
  EXPECT_GT(r.prefill_ms.mean, 0);
  const SynthShape dense{"tiny", false, 512, 64, 128, 4, 4, 2, 32, 0, 0, 0, 256};
  EXPECT_THROW(write_synthetic_checkpoint(dense, dir.path() / "dense", 7, &tower), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "dense"));
}

// The chat benchmark keeps the state: after the first turn only the user's tokens and the last
// reply token run, whatever the history's length.
TEST(Bench, ChatTurnsRunOnlyTheirNewTokens) {
  SynthShape shape{"tiny", true, 512, 64, 128, 4, 4, 2, 32, 2, 4, 16, 256};
  test::TempDir dir;
  write_synthetic_checkpoint(shape, dir.path() / "ckpt", 3);
  const auto model = load_model(dir.path() / "ckpt");
  const std::vector<ChatBenchTurn> turns =
      run_chat_bench(*model, {.turns = 3, .user_tokens = 10, .reply_tokens = 5});
  ASSERT_EQ(turns.size(), 3u);
  for (size_t t = 0; t < turns.size(); ++t) {
    EXPECT_EQ(turns[t].n_prompt, static_cast<int64_t>(t * 15 + 10));
    EXPECT_EQ(turns[t].n_processed, t == 0 ? 10 : 11);
    EXPECT_GT(turns[t].ttft_fresh_ms, 0);
  }
  EXPECT_THROW(run_chat_bench(*model, {.turns = 100, .user_tokens = 10, .reply_tokens = 5}), Error);
}

// Every 2-D tensor of a checkpoint is a matrix a decoded token reads in full (synthetic ones tie
// the embedding table to the lm-head, so the table counts once, as the lm-head).
int64_t checkpoint_matrix_bytes(const std::filesystem::path& dir) {
  int64_t bytes = 0;
  const Checkpoint checkpoint = Checkpoint::open(dir);
  for (const auto& file : checkpoint.files()) {
    for (const auto& [name, tensor] : file->tensors()) {
      if (tensor.shape.size() == 2) bytes += static_cast<int64_t>(tensor.nbytes);
    }
  }
  return bytes;
}

// What a decoded token reads: the matrices (counted from the checkpoint's own tensor table), the
// KV caches of the context (a K and a V row of n_kv_heads · head_dim floats per attention layer
// and token), and the conv and recurrent states, which a fresh state already holds in full.
TEST(Bench, DecodeStepBytesAreTheMatricesAndTheState) {
  test::TempDir dir;
  const int64_t kv_row_bytes = 2 * 32 * static_cast<int64_t>(sizeof(float));  // 2 heads × 32
  for (const bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "Qwen3.5" : "Qwen3");
    SynthShape shape{"tiny", hybrid, 512, 64, 128, 4, 4, 2, 32, 2, 4, 16, 256};
    const auto path = dir.path() / (hybrid ? "hybrid" : "dense");
    write_synthetic_checkpoint(shape, path, 5);
    const auto model = load_model(path);
    const int64_t attention_layers = hybrid ? 1 : 4;  // Qwen3.5: every fourth layer
    const int64_t fixed = checkpoint_matrix_bytes(path) + model->new_state()->bytes();
    EXPECT_EQ(model->new_state()->bytes() > 0, hybrid);
    for (const int64_t context : {0, 10}) {
      EXPECT_EQ(model->decode_step_bytes(context),
                fixed + context * attention_layers * 2 * kv_row_bytes);
    }
    BenchConfig config;
    config.n_prompt = 4;
    config.n_gen = 6;
    config.depth = 20;
    config.repetitions = 1;
    EXPECT_EQ(run_bench(*model, config).decode_step_bytes, model->decode_step_bytes(23));
  }
  // Bytes per second: far above a slow disk's, far below any cache's.
  CpuContext cx(1, CpuKernels::from_environment());
  const double bandwidth = read_bandwidth(cx, int64_t{8} << 20, 2);
  EXPECT_GT(bandwidth, 1e8);
  EXPECT_LT(bandwidth, 1e13);
}

// Configurations past the context fail with an error; one that fills it exactly runs.
TEST(Bench, RefusesConfigurationsBeyondTheContext) {
  SynthShape shape{"tiny", false, 64, 32, 64, 1, 2, 1, 16, 0, 0, 0, 16};
  test::TempDir dir;
  write_synthetic_checkpoint(shape, dir.path() / "ckpt", 1);
  const auto model = load_model(dir.path() / "ckpt");
  BenchConfig config;
  config.n_prompt = 8;
  config.depth = 10;
  config.n_gen = 8;
  EXPECT_THROW(run_bench(*model, config), Error);
  // A prompt of the whole context is within it: the warm-up must not add tokens after it.
  config.n_prompt = 16;
  config.depth = 8;
  config.repetitions = 1;
  EXPECT_GT(run_bench(*model, config).prefill_tok_s.min, 0);
}

}  // namespace
}  // namespace qhx
