// Images in: decoding (PNG, JPEG, EXIF orientation, limits) and Qwen3.5's preprocessing, against
// transformers' image processor on the fixture images (tools/oracle/make_vision_fixtures.py).
#include <gtest/gtest.h>

#include <fstream>

#include "backend/cpu_backend.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "models/vision_tower.h"
#include "qhx/qhx.h"
#include "support/cli_run.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "util/base64.h"
#include "util/json_file.h"
#include "util/sha256.h"
#include "vision/image.h"
#include "vision/image_processor.h"

namespace qhx {
namespace {

const std::filesystem::path kDir = test::source_dir() / "tests/fixtures/vision";

std::vector<std::byte> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// Token ids as --prompt-ids takes them and --print-ids prints them.
std::string joined_ids(const Json& ids) {
  std::string out;
  for (const auto& id : ids) {
    if (!out.empty()) out += ',';
    out += std::to_string(id.get<int>());
  }
  return out;
}

std::string sha256_of(const void* data, size_t n) {
  Sha256 h;
  h.update(std::span<const std::byte>(static_cast<const std::byte*>(data), n));
  return h.hex();
}

TEST(ImageProcessor, EqualsTransformersOnEveryFixtureImage) {
  const Json golden = read_json_file(kDir / "processor_golden.json");
  const ImageProcessorConfig config = ImageProcessorConfig{};  // Qwen3.5's file's values
  ASSERT_GE(golden["goldens"].size(), 15u);
  for (const auto& [name, want] : golden["goldens"].items()) {
    SCOPED_TRACE(name);
    const RgbImage image = read_image(kDir / "images" / name);
    const PixelValues pv = preprocess_image(image, config, name);
    EXPECT_EQ(pv.grid.t, want["image_grid_thw"][0].get<int64_t>());
    EXPECT_EQ(pv.grid.h, want["image_grid_thw"][1].get<int64_t>());
    EXPECT_EQ(pv.grid.w, want["image_grid_thw"][2].get<int64_t>());
    EXPECT_EQ(pv.grid.tokens(config.merge_size), want["image_tokens"].get<int64_t>());
    EXPECT_EQ(pv.cols, want["pixel_values_shape"][1].get<int64_t>());
    for (const auto& [index, value] : want["samples"].items()) {
      EXPECT_EQ(pv.values.at(std::stoll(index)), value.get<float>()) << "value " << index;
    }
    // Bit for bit: the float32 bytes hash as the processor's do.
    EXPECT_EQ(sha256_of(pv.values.data(), pv.values.size() * sizeof(float)),
              want["pixel_values_sha256"].get<std::string>());
    const auto [h, w] =
        smart_resize(image.height, image.width, 32, config.min_pixels, config.max_pixels, name);
    const RgbImage resized = resize_bicubic_antialiased(image, h, w);
    EXPECT_EQ(sha256_of(resized.pixels.data(), resized.pixels.size()),
              want["resized_rgb_sha256"].get<std::string>());
  }
}

TEST(ImageProcessor, ReadsTheCheckpointsPreprocessorConfig) {
  const ImageProcessorConfig c = read_image_processor_config(kDir / "tied_bf16");
  EXPECT_EQ(c.min_pixels, 32 * 32);
  EXPECT_EQ(c.max_pixels, 128 * 128);
  EXPECT_EQ(c.patch_size, 16);
  EXPECT_EQ(c.merge_size, 2);
  EXPECT_EQ(c.temporal_patch_size, 2);
}

TEST(ImageProcessor, SmartResizeAsTransformers) {
  // Python's round halves to even: 48/32 = 1.5 → 2, 80/32 = 2.5 → 2.
  EXPECT_EQ(smart_resize(48, 80, 32, 1, 1 << 30, "x"), (std::pair<int64_t, int64_t>{64, 64}));
  EXPECT_EQ(smart_resize(256, 320, 32, 65536, 16777216, "x"),
            (std::pair<int64_t, int64_t>{256, 320}));
  test::expect_error([] { smart_resize(10, 2010, 32, 1, 1 << 30, "wide.png"); },
                     {"wide.png", "aspect ratio"});
}

// The standard CRC-32 of PNG chunks.
uint32_t crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

void put_u32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (24 - 8 * i));
}

TEST(Image, ADecompressionBombIsRefusedByItsDeclaredSize) {
  // A real PNG whose IHDR now declares 100000 x 100000 (its CRC fixed).
  std::vector<std::byte> png = file_bytes(kDir / "images/rgb_37x53.png");
  put_u32(&png[16], 100000);
  put_u32(&png[20], 100000);
  put_u32(&png[29], crc32(reinterpret_cast<const uint8_t*>(&png[12]), 17));
  test::expect_error([&] { decode_image(png, "bomb.png"); },
                     {"bomb.png", "100000x100000", "refused before decoding"});
  // A real JPEG whose frame header declares 65000 x 65000.
  std::vector<std::byte> jpeg = file_bytes(kDir / "images/rgb_480x640.jpg");
  size_t sof = 2;
  while (!(jpeg[sof] == std::byte{0xff} && jpeg[sof + 1] == std::byte{0xc0})) {
    sof += 2 +
           ((std::to_integer<size_t>(jpeg[sof + 2]) << 8) | std::to_integer<size_t>(jpeg[sof + 3]));
  }
  for (size_t at : {sof + 5, sof + 7}) {
    jpeg[at] = std::byte{0xfd};
    jpeg[at + 1] = std::byte{0xe8};
  }
  test::expect_error([&] { decode_image(jpeg, "bomb.jpg"); },
                     {"bomb.jpg", "65000x65000", "refused before decoding"});
  ImageLimits small;
  small.max_pixels = 1000;
  test::expect_error([&] { read_image(kDir / "images/rgb_37x53.png", small); },
                     {"rgb_37x53.png", "53x37", "1000"});
}

TEST(Image, BadFilesAreOneLineErrorsNamingThem) {
  const std::vector<std::byte> png = file_bytes(kDir / "images/rgb_256x320.png");
  const std::vector<std::byte> jpeg = file_bytes(kDir / "images/rgb_480x640.jpg");
  for (size_t keep : {size_t{8}, size_t{40}, png.size() / 2}) {
    test::expect_error([&] { decode_image(std::span(png).first(keep), "cut.png"); },
                       {"cut.png", "not a valid PNG"});
  }
  for (size_t keep : {size_t{3}, size_t{100}}) {
    test::expect_error([&] { decode_image(std::span(jpeg).first(keep), "cut.jpg"); },
                       {"cut.jpg", "not a valid JPEG"});
  }
  const std::string gif = "GIF89a....";
  test::expect_error([&] { decode_image(std::as_bytes(std::span(gif)), "a.gif"); },
                     {"a.gif", "not a PNG or JPEG"});
  test::expect_error([] { read_image(kDir / "images/missing.png"); }, {"missing.png"});
}

TEST(Image, ExifOrientationTurnsTheImageUpright) {
  // The file is stored 90 wide, 120 high, orientation 6: shown turned 90° clockwise.
  const RgbImage upright = read_image(kDir / "images/exif6_120x90.jpg");
  EXPECT_EQ(upright.width, 120);
  EXPECT_EQ(upright.height, 90);
  // Every orientation undone by its inverse gives the image back.
  RgbImage image{3, 2, {}};
  for (int i = 0; i < 18; ++i) image.pixels.push_back(static_cast<uint8_t>(i * 7));
  const int inverse[9] = {0, 1, 2, 3, 4, 5, 8, 7, 6};
  for (int o = 1; o <= 8; ++o) {
    const RgbImage turned = apply_orientation(image, o);
    const RgbImage back = apply_orientation(turned, inverse[o]);
    EXPECT_EQ(back.pixels, image.pixels) << o;
    EXPECT_EQ(turned.width, o >= 5 ? 2 : 3) << o;
  }
  // Orientation 6 puts the top-left pixel at the top right.
  const RgbImage six = apply_orientation(image, 6);
  EXPECT_EQ(six.at(0, six.width - 1, 0), image.at(0, 0, 0));
  // TIFF headers of both byte orders; unreadable blocks mean "as stored".
  const std::vector<uint8_t> le = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12,
                                   1,   3,   0,  1, 0, 0, 0, 3, 0, 0, 0};
  const std::vector<uint8_t> be = {'M',  'M', 0, 42, 0, 0, 0, 8, 0, 1, 1,
                                   0x12, 0,   3, 0,  0, 0, 1, 0, 8, 0, 0};
  EXPECT_EQ(exif_orientation(le), 3);
  EXPECT_EQ(exif_orientation(be), 8);
  EXPECT_EQ(exif_orientation(std::span(le).first(12)), 1);
  EXPECT_EQ(exif_orientation({}), 1);
}

std::vector<float> golden_tensor(const std::filesystem::path& dir, const std::string& name) {
  const SafetensorsFile file = SafetensorsFile::open(dir / "golden.safetensors");
  const TensorView* t = file.find(name);
  if (t == nullptr || t->dtype != DType::kF32) throw std::runtime_error("golden: " + name);
  std::vector<float> out(t->numel());
  std::memcpy(out.data(), t->data, t->nbytes);
  return out;
}

// The tower's output for each image of the goldens, as transformers' get_image_features gives
// it, from the pixels qhx's processor makes of the files: a bf16 and an f32 checkpoint, two
// threads (the kernels' own paths) and the reference kernels.
TEST(VisionTower, FeaturesEqualTransformersOnTheFixtureImages) {
  for (const char* fixture : {"tied_bf16", "untied_f32"}) {
    const std::filesystem::path dir = kDir / fixture;
    const ModelConfig config = load_model_config(dir / "config.json");
    ASSERT_TRUE(config.vision.has_value()) << config.vision_unavailable;
    const Checkpoint checkpoint = Checkpoint::open(dir);
    const ImageProcessorConfig processor = read_image_processor_config(dir);
    const Json golden = read_json_file(dir / "golden.json");
    for (const bool reference : {false, true}) {
      auto context = std::make_shared<CpuContext>(reference ? 1 : 2,
                                                  reference ? CpuKernels{} : CpuKernels::detect());
      const VisionTower tower(*config.vision, checkpoint, *context,
                              std::make_shared<CpuBackend>(*context));
      for (const auto& [prompt, meta] : golden["prompts"].items()) {
        const auto images = meta["images"].get<std::vector<std::string>>();
        for (size_t i = 0; i < images.size(); ++i) {
          const std::string what = std::string(fixture) + " " + prompt + " " + images[i];
          const PixelValues pixels =
              preprocess_image(read_image(kDir / "images" / images[i]), processor, images[i]);
          EXPECT_EQ(pixels.grid.h, meta["image_grid_thw"][i][1].get<int64_t>()) << what;
          EXPECT_EQ(pixels.grid.w, meta["image_grid_thw"][i][2].get<int64_t>()) << what;
          const CpuContext::Turn turn(*context);
          const std::vector<float> got = tower.encode(pixels);
          const std::vector<float> want =
              golden_tensor(dir, prompt + ".image" + std::to_string(i) + ".features");
          ASSERT_EQ(got.size(), want.size()) << what;
          float scale = 0.0f, worst = 0.0f;
          for (size_t j = 0; j < want.size(); ++j) {
            scale = std::max(scale, std::fabs(want[j]));
            worst = std::max(worst, std::fabs(got[j] - want[j]));
          }
          EXPECT_LE(worst, 1e-4f * scale)
              << what << ": largest difference " << worst << " of values up to " << scale;
        }
      }
    }
  }
}

// A golden prompt's ids with each <|image_pad|> in place of the image's ids, as qhx_image_tokens
// gives them.
std::vector<int32_t> expanded(const Model& model, const Json& prompt) {
  const auto images = prompt["images"].get<std::vector<std::string>>();
  std::vector<int32_t> out;
  size_t next = 0;
  for (const int32_t id : prompt["ids"].get<std::vector<int32_t>>()) {
    if (id != model.config().image_token_id) {
      out.push_back(id);
      continue;
    }
    const std::string& name = images.at(next++);
    const std::vector<int32_t> ids = model.image_ids(
        preprocess_image(read_image(kDir / "images" / name), model.image_processor(), name));
    out.insert(out.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(next, images.size());
  return out;
}

float max_abs(std::span<const float> v) {
  float m = 0.0f;
  for (const float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The logits at every position of prompts with one image, two images and none, within the text
// tolerance (1e-4 · max|logit|) of transformers'; the same pass cut in two inside an image gives
// them too; the greedy continuation is transformers' generate().
TEST(Vision, LogitsAndGreedyEqualTransformers) {
  for (const char* fixture : {"tied_bf16", "untied_f32"}) {
    const std::filesystem::path dir = kDir / fixture;
    const std::unique_ptr<Model> model = load_model(dir);
    ASSERT_TRUE(model->has_vision()) << model->vision_unavailable();
    const Json golden = read_json_file(dir / "golden.json");
    for (const char* name : {"one_image", "two_images", "text_only"}) {
      const std::string what = std::string(fixture) + " " + name;
      const Json& p = golden["prompts"][name];
      const std::vector<int32_t> ids = expanded(*model, p);
      ASSERT_EQ(ids.size(), p["expanded_ids"].size()) << what;
      const std::vector<float> want = golden_tensor(dir, std::string(name) + ".logits");
      const float tolerance = 1e-4f * max_abs(want);
      for (const int64_t cut : {int64_t{0}, static_cast<int64_t>(ids.size()) / 2}) {
        auto state = model->new_state();
        std::vector<float> logits, rest;
        if (cut > 0) {
          model->forward(std::span(ids).first(cut), *state, LogitsFor::kEveryToken, logits);
          model->forward(std::span(ids).subspan(cut), *state, LogitsFor::kEveryToken, rest);
          logits.insert(logits.end(), rest.begin(), rest.end());
        } else {
          model->forward(ids, *state, LogitsFor::kEveryToken, logits);
        }
        ASSERT_EQ(logits.size(), want.size()) << what;
        float worst = 0.0f;
        for (size_t i = 0; i < want.size(); ++i)
          worst = std::max(worst, std::fabs(logits[i] - want[i]));
        EXPECT_LE(worst, tolerance) << what << " cut at " << cut;
        // Greedy decoding on from the prompt.
        const int64_t V = model->config().vocab_size;
        std::vector<int32_t> greedy;
        std::span<const float> last = std::span(logits).last(V);
        for (size_t step = 0; step < p["greedy"].size(); ++step) {
          const auto id =
              static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
          greedy.push_back(id);
          model->forward(std::span(&id, 1), *state, LogitsFor::kLastToken, rest);
          last = rest;
        }
        EXPECT_EQ(greedy, p["greedy"].get<std::vector<int32_t>>()) << what << " cut at " << cut;
      }
    }
  }
}

// A second turn that adds an image continues the first turn's state (its image encoded once: the
// same ids) and equals transformers' recomputation of the whole conversation.
TEST(Vision, ASecondTurnWithANewImageContinuesTheState) {
  for (const char* fixture : {"tied_bf16", "untied_f32"}) {
    const std::filesystem::path dir = kDir / fixture;
    const std::unique_ptr<Model> model = load_model(dir);
    const Json golden = read_json_file(dir / "golden.json");
    const Json& p = golden["prompts"]["second_turn"];
    const std::vector<int32_t> ids = expanded(*model, p);
    const std::vector<int32_t> first = expanded(*model, golden["prompts"]["one_image"]);
    const int64_t first_turn = static_cast<int64_t>(first.size()) + 12;
    ASSERT_TRUE(std::equal(first.begin(), first.end(), ids.begin()))
        << "the same image, the same ids";
    auto state = model->new_state();
    std::vector<float> logits;
    model->forward(std::span(ids).first(first_turn), *state, LogitsFor::kLastToken, logits);
    model->forward(std::span(ids).subspan(first_turn), *state, LogitsFor::kEveryToken, logits);
    const std::vector<float> want = golden_tensor(dir, "second_turn.logits");
    const std::span<const float> want_rest =
        std::span(want).subspan(first_turn * model->config().vocab_size);
    ASSERT_EQ(logits.size(), want_rest.size());
    float worst = 0.0f;
    for (size_t i = 0; i < logits.size(); ++i)
      worst = std::max(worst, std::fabs(logits[i] - want_rest[i]));
    EXPECT_LE(worst, 1e-4f * max_abs(want)) << fixture;
    const int64_t V = model->config().vocab_size;
    const std::span<const float> last = std::span(logits).last(V);
    EXPECT_EQ(std::max_element(last.begin(), last.end()) - last.begin(),
              p["greedy"][0].get<int64_t>())
        << fixture;
  }
}

// The command line's contract: one line of ids for --image and --prompt-ids with one
// <|image_pad|> per image; a bad image is a one-line error naming it.
TEST(Vision, GenerateWithImagesPrintsTransformersGreedyIds) {
  const std::filesystem::path dir = kDir / "untied_f32";
  const Json golden = read_json_file(dir / "golden.json");
  const Json& p = golden["prompts"]["two_images"];
  std::string command = "generate --model " + dir.string();
  for (const auto& image : p["images"])
    command += " --image " + (kDir / "images" / image.get<std::string>()).string();
  const std::string ids = joined_ids(p["ids"]);
  const test::CliRun run =
      test::run_qhx(command + " --prompt-ids " + ids + " --greedy --print-ids -n 12");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, joined_ids(p["greedy"]) + "\n");
  const std::string not_an_image = " --image " + (kDir / "processor_golden.json").string();
  const test::CliRun bad =
      test::run_qhx("generate --model " + dir.string() + not_an_image + not_an_image +
                    " --prompt-ids " + ids + " --greedy --print-ids -n 2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("processor_golden.json: not a PNG or JPEG"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  const test::CliRun text =
      test::run_qhx("generate --model " + (kDir.parent_path() / "qwen3_5/gva2_tied").string() +
                    not_an_image + " --prompt-ids 1,2 --greedy --print-ids -n 2");
  EXPECT_NE(text.err.find("reads no images"), std::string::npos) << text.err;
}

// A conversation with images as transformers' Qwen3VLProcessor reads it (rendered, tokenized,
// each <|image_pad|> expanded), and its greedy reply (tied_bf16/chat.json).
class VisionChat : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    qhx_model_options options;
    qhx_model_options_default(&options);
    options.context_length = 512;
    ASSERT_EQ(qhx_model_open(kChatDir.c_str(), &options, &model_), QHX_OK) << qhx_last_error();
  }
  static void TearDownTestSuite() {
    qhx_model_close(model_);
    model_ = nullptr;
  }

  // The golden messages with each image part as {"type": "image", "path": ...} (or, with
  // `inline_images`, OpenAI's image_url part with a data: URL).
  static Json request(const Json& messages, bool inline_images) {
    Json out = messages;
    for (Json& m : out) {
      if (!m["content"].is_array()) continue;
      for (Json& part : m["content"]) {
        if (!part.contains("image")) continue;
        const std::filesystem::path file = kDir / "images" / part["image"].get<std::string>();
        if (inline_images) {
          part = {
              {"type", "image_url"},
              {"image_url", {{"url", "data:image/png;base64," + base64_encode(file_bytes(file))}}}};
        } else {
          part = {{"type", "image"}, {"path", file.string()}};
        }
      }
    }
    return Json{{"messages", out}};
  }

  static std::vector<int32_t> chat_tokens(const Json& req) {
    const std::string text = req.dump();
    size_t n = 0;
    EXPECT_EQ(qhx_chat_tokens(model_, text.c_str(), nullptr, nullptr, 0, &n),
              QHX_ERROR_BUFFER_TOO_SMALL)
        << qhx_last_error();
    std::vector<int32_t> ids(n);
    EXPECT_EQ(qhx_chat_tokens(model_, text.c_str(), nullptr, ids.data(), n, &n), QHX_OK)
        << qhx_last_error();
    return ids;
  }

  static inline const std::string kChatDir = (kDir / "tied_bf16").string();
  static inline qhx_model* model_ = nullptr;
};

int collect_token(void* user, int32_t token, const char*, size_t) {
  if (token >= 0) static_cast<std::vector<int32_t>*>(user)->push_back(token);
  return 0;
}

// The ids a slot stands for are the image token's in transformers' input_ids.
std::vector<int32_t> as_processor_ids(std::vector<int32_t> ids, int32_t image_token) {
  for (int32_t& id : ids) {
    if (id >= 384) id = image_token;
  }
  return ids;
}

TEST_F(VisionChat, RequestsWithImagesAreTheProcessorsIdsAndGiveItsGreedyReply) {
  const Json golden = read_json_file(kDir / "tied_bf16/chat.json");
  for (const auto& [name, chat] : golden["chats"].items()) {
    SCOPED_TRACE(name);
    const std::vector<int32_t> want = chat["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> by_path = chat_tokens(request(chat["messages"], false));
    EXPECT_EQ(as_processor_ids(by_path, 380), want);
    EXPECT_EQ(chat_tokens(request(chat["messages"], true)), by_path);  // the same image inline

    qhx_session* session = nullptr;
    ASSERT_EQ(qhx_session_create(model_, nullptr, &session), QHX_OK) << qhx_last_error();
    qhx_generate_options options;
    ASSERT_EQ(qhx_generate_options_default(model_, &options), QHX_OK);
    options.sampling.greedy = 1;
    options.max_new_tokens = golden["max_new_tokens"].get<int64_t>();
    std::vector<int32_t> reply;
    qhx_generate_result result{};
    const std::string req = request(chat["messages"], false).dump();
    ASSERT_EQ(
        qhx_session_chat(session, req.c_str(), nullptr, &options, collect_token, &reply, &result),
        QHX_OK)
        << qhx_last_error();
    EXPECT_EQ(result.n_prompt, static_cast<int64_t>(want.size()));
    std::vector<int32_t> greedy = chat["greedy"].get<std::vector<int32_t>>();
    if (!greedy.empty() && greedy.back() == golden["eos"].get<int32_t>()) greedy.pop_back();
    EXPECT_EQ(reply, greedy);
    qhx_string_free(result.text);
    qhx_session_destroy(session);
  }
}

TEST_F(VisionChat, BadImagePartsAreOneLineErrorsNamingThem) {
  const auto refused = [&](const Json& part, qhx_status status, const std::string& words) {
    const Json req = {
        {"messages", {{{"role", "user"}, {"content", {part, {{"type", "text"}, {"text", "?"}}}}}}}};
    const std::string text = req.dump();
    size_t n = 0;
    EXPECT_EQ(qhx_chat_tokens(model_, text.c_str(), nullptr, nullptr, 0, &n), status) << words;
    const std::string error = qhx_last_error();
    EXPECT_NE(error.find(words), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  };
  refused({{"type", "image"}, {"path", (kDir / "processor_golden.json").string()}},
          QHX_ERROR_INVALID_ARGUMENT, "processor_golden.json: not a PNG or JPEG");
  refused({{"type", "image_url"}, {"image_url", {{"url", "https://example.com/a.png"}}}},
          QHX_ERROR_INVALID_ARGUMENT, "messages[0].content[0].image_url.url: is a URL");
  refused({{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,@@"}}}},
          QHX_ERROR_INVALID_ARGUMENT, "holds no valid base64");
  refused({{"type", "image"}}, QHX_ERROR_INVALID_ARGUMENT, "needs a file path or a data: URL");
  // Messages that are not objects, or have no content, are the template's to judge, as in
  // qhx_apply_chat_template.
  for (const char* messages : {R"(["hi"])", R"([{"role": "user"}])"}) {
    const std::string req = std::string(R"({"messages": )") + messages + "}";
    char* text = nullptr;
    const qhx_status rendered = qhx_apply_chat_template(model_, req.c_str(), nullptr, &text);
    qhx_string_free(text);
    size_t n = 0;
    const qhx_status tokens = qhx_chat_tokens(model_, req.c_str(), nullptr, nullptr, 0, &n);
    EXPECT_EQ(tokens == QHX_ERROR_BUFFER_TOO_SMALL ? QHX_OK : tokens, rendered) << messages;
  }
  refused({{"type", "video"}, {"video", "clip.mp4"}}, QHX_ERROR_INVALID_ARGUMENT,
          "messages[0].content[0]: a video");

  qhx_model* text_model = nullptr;
  ASSERT_EQ(qhx_model_open((test::source_dir() / "models/qwen3.5-tiny-random").c_str(), nullptr,
                           &text_model),
            QHX_OK)
      << qhx_last_error();
  const std::string req =
      Json{{"messages",
            {{{"role", "user"},
              {"content",
               {{{"type", "image"}, {"path", (kDir / "images/tiny_5x7.png").string()}},
                {{"type", "text"}, {"text", "?"}}}}}}}}
          .dump();
  size_t n = 0;
  EXPECT_EQ(qhx_chat_tokens(text_model, req.c_str(), nullptr, nullptr, 0, &n), QHX_ERROR_MODEL);
  EXPECT_NE(std::string(qhx_last_error()).find("messages[0].content[0] is an image"),
            std::string::npos)
      << qhx_last_error();
  qhx_model_close(text_model);
}

// A conversation holding images is saved with them (features, positions) and continues from the
// file in another model exactly as it would have in the first; the second model numbers the
// images itself (it has seen another image first) and finds them in the loaded state.
TEST_F(VisionChat, AStateWithImagesIsSavedAndContinuesInAnotherModel) {
  const Json golden = read_json_file(kDir / "tied_bf16/chat.json");
  const std::string request_text =
      request(golden["chats"]["two_images_and_a_system"]["messages"], false).dump();
  qhx_generate_options options;
  ASSERT_EQ(qhx_generate_options_default(model_, &options), QHX_OK);
  options.sampling.greedy = 1;
  options.max_new_tokens = 6;
  options.stop_at_eos = 0;
  qhx_generate_result result{};
  const auto generate = [&](qhx_session* session, const std::vector<int32_t>& prompt) {
    std::vector<int32_t> reply;
    EXPECT_EQ(qhx_session_generate(session, prompt.data(), prompt.size(), &options, collect_token,
                                   &reply, &result),
              QHX_OK)
        << qhx_last_error();
    qhx_string_free(result.text);
    return reply;
  };
  const auto prompt_of = [&](qhx_model* model) {
    size_t n = 0;
    qhx_chat_tokens(model, request_text.c_str(), nullptr, nullptr, 0, &n);
    std::vector<int32_t> ids(n);
    EXPECT_EQ(qhx_chat_tokens(model, request_text.c_str(), nullptr, ids.data(), n, &n), QHX_OK);
    return ids;
  };
  const std::vector<int32_t> more = {33, 44, 55, 66};
  qhx_session* first = nullptr;
  ASSERT_EQ(qhx_session_create(model_, nullptr, &first), QHX_OK);
  std::vector<int32_t> prompt = prompt_of(model_);
  const std::vector<int32_t> reply = generate(first, prompt);
  test::TempDir dir;
  const std::string file = (dir.path() / "state.qhxt").string();
  ASSERT_EQ(qhx_session_save(first, file.c_str()), QHX_OK) << qhx_last_error();
  prompt.insert(prompt.end(), reply.begin(), reply.end());
  prompt.insert(prompt.end(), more.begin(), more.end());
  const std::vector<int32_t> want = generate(first, prompt);
  const int64_t want_reused = result.n_reused;
  qhx_session_destroy(first);

  qhx_model* other = nullptr;
  ASSERT_EQ(qhx_model_open(kChatDir.c_str(), nullptr, &other), QHX_OK) << qhx_last_error();
  // The other model's first images are others (the first has taken at most three).
  for (const char* image :
       {"tiny_5x7.png", "rgb_37x53.png", "wide_40x700.png", "exif3_50x80.jpg"}) {
    size_t n = 0;
    ASSERT_EQ(qhx_image_tokens_from_file(other, (kDir / "images" / image).c_str(), nullptr, 0, &n),
              QHX_ERROR_BUFFER_TOO_SMALL);
  }
  qhx_session* second = nullptr;
  ASSERT_EQ(qhx_session_create(other, nullptr, &second), QHX_OK);
  ASSERT_EQ(qhx_session_load(second, file.c_str()), QHX_OK) << qhx_last_error();
  std::vector<int32_t> again = prompt_of(other);
  EXPECT_NE(again, std::vector<int32_t>(prompt.begin(), prompt.begin() + again.size()));
  again.insert(again.end(), reply.begin(), reply.end());
  again.insert(again.end(), more.begin(), more.end());
  EXPECT_EQ(generate(second, again), want);
  EXPECT_EQ(result.n_reused, want_reused);  // the images' tokens matched the loaded state
  EXPECT_GT(result.n_reused, 60);
  qhx_session_destroy(second);
  qhx_model_close(other);
}

// qhx generate --prompt with --image goes through the chat template, as the processor does;
// qhx chat's /image sends the image with the next message.
TEST_F(VisionChat, GenerateAndChatPutTheImageWhereTheTemplateDoes) {
  const Json golden = read_json_file(kDir / "tied_bf16/chat.json");
  const Json& chat = golden["chats"]["one_image"];
  const std::string image = (kDir / "images" / "rgb_256x320.png").string();
  const std::string question = chat["messages"][0]["content"][1]["text"];
  const test::CliRun run = test::run_qhx("generate --model " + kChatDir + " --image " + image +
                                         " --prompt '" + question + "' --greedy --print-ids -n " +
                                         std::to_string(golden["max_new_tokens"].get<int>()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, joined_ids(chat["greedy"]) + "\n");

  const test::CliRun talk = test::run_qhx("chat --model " + kChatDir + " --greedy -n " +
                                              std::to_string(golden["max_new_tokens"].get<int>()),
                                          "/image " + image + "\n" + question + "\n");
  ASSERT_EQ(talk.exit_code, 0) << talk.err;
  const Json& grid = chat["image_grid_thw"][0];  // the processor's: t·h·w / merge²
  const int tokens = grid[0].get<int>() * grid[1].get<int>() * grid[2].get<int>() / 4;
  EXPECT_NE(talk.err.find("[image " + image + ": " + std::to_string(tokens) + " tokens"),
            std::string::npos)
      << talk.err;
  EXPECT_EQ(talk.out, chat["reply_text"].get<std::string>() + "\n");
}

}  // namespace
}  // namespace qhx
