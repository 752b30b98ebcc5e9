// Bundles and the forge: round trips, shards, integrity failures, atomic publishing, the gate.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "forge/convert.h"
#include "io/bundle.h"
#include "io/pack.h"
#include "io/qhxt.h"
#include "models/families.h"
#include "models/model.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "support/raw_safetensors.h"
#include "tokenizer/tokenizer.h"
#include "util/json_file.h"
#include "util/sha256.h"
#include "vision/image.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

const fs::path kQwen3 = test::source_dir() / "tests/fixtures/qwen3/gqa2_tied_bf16";
const fs::path kQwen3Untied = test::source_dir() / "tests/fixtures/qwen3/gqa4_sharded_f32";
const fs::path kQwen3_5 = test::source_dir() / "tests/fixtures/qwen3_5/multimodal_layout";

std::vector<float> logits_of(const fs::path& model_dir, const std::vector<int32_t>& ids) {
  const auto model = load_model(model_dir);
  auto state = model->new_state();
  std::vector<float> logits;
  model->forward(ids, *state, LogitsFor::kEveryToken, logits);
  return logits;
}

const std::vector<int32_t> kPrompt = {3, 141, 59, 26, 53, 58, 97, 93, 23, 84, 62, 64, 33, 83, 27};

ConvertOptions f32_options() {
  ConvertOptions o;
  o.gate_suite.prompts = 3;
  o.gate_suite.greedy_tokens = 8;
  return o;
}

class BundleTest : public ::testing::Test {
 protected:
  fs::path bundle(const std::string& name) const { return dir_.path() / name; }
  fs::path convert(const fs::path& source, const std::string& name, ConvertOptions o) {
    const ConvertResult r = forge_convert(source, bundle(name), o);
    EXPECT_TRUE(r.published) << (r.gate ? r.gate->summary() : "no gate");
    return bundle(name);
  }
  Json manifest(const fs::path& b) const { return read_json_file(b / "manifest.json"); }
  // An edit made as convert would write it: manifest.sha256 follows.
  void write_manifest(const fs::path& b, const Json& m) const {
    std::ofstream(b / "manifest.json") << m.dump(2);
    std::ofstream(b / kManifestHashFile) << sha256_file(b / "manifest.json") << "  manifest.json\n";
  }
  test::TempDir dir_;
};

TEST_F(BundleTest, F32BundleGivesTheCheckpointsLogitsBitwise) {
  for (const fs::path& source : {kQwen3, kQwen3Untied, kQwen3_5}) {
    const fs::path b = convert(source, "f32-" + source.filename().string(), f32_options());
    EXPECT_EQ(logits_of(b, kPrompt), logits_of(source, kPrompt)) << source;
  }
}

// Only a whole MTP head goes into a bundle. A checkpoint without one, or with one missing a
// tensor, converts to a text-model bundle with the checkpoint's logits (a note says what was
// left out); a whole head converts with the model and drafts as it does.
TEST_F(BundleTest, OnlyAWholeMtpHeadIsCarried) {
  const auto source_model = load_model(kQwen3_5);
  ASSERT_TRUE(source_model->has_mtp());
  const ConvertResult whole = forge_convert(kQwen3_5, bundle("whole"), f32_options());
  ASSERT_TRUE(whole.published);
  EXPECT_TRUE(whole.notes.empty());
  EXPECT_TRUE(load_model(bundle("whole"))->has_mtp());
  const int64_t H = source_model->config().hidden_size;
  const struct {
    const char* name;
    std::function<bool(const std::string&)> drop;
    std::vector<test::NewTensor> add;
    const char* note;
  } variants[] = {
      {"stripped", [](const std::string& n) { return n.starts_with("mtp."); }, {}, nullptr},
      {"truncated",
       [](const std::string& n) { return n.starts_with("mtp."); },
       {{"mtp.fc.weight", {H, 2 * H}}, {"mtp.norm.weight", {H}}},
       "missing 13 of 15 tensors"},
      {"no_k_norm",
       [](const std::string& n) { return n == "mtp.layers.0.self_attn.k_norm.weight"; },
       {},
       "missing 1 of 15 tensors: mtp.layers.0.self_attn.k_norm.weight"},
      {"wrong_shape",
       [](const std::string& n) { return n == "mtp.norm.weight"; },
       {{"mtp.norm.weight", {3}}},
       "tensor 'mtp.norm.weight': shape [3]"},
  };
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    const fs::path source = dir_.path() / (std::string("source-") + v.name);
    test::copy_checkpoint(kQwen3_5, source, v.drop, v.add);
    const ConvertResult r = forge_convert(source, bundle(v.name), f32_options());
    ASSERT_TRUE(r.published);
    if (v.note == nullptr) {
      EXPECT_TRUE(r.notes.empty());
    } else {
      ASSERT_EQ(r.notes.size(), 1u);
      EXPECT_NE(r.notes[0].find(v.note), std::string::npos) << r.notes[0];
      EXPECT_EQ(manifest(bundle(v.name))["source"]["notes"], Json(r.notes));
    }
    const auto model = load_model(bundle(v.name));
    EXPECT_FALSE(model->has_mtp());
    EXPECT_EQ(model->mtp_unavailable(), "");  // the bundle holds no mtp.* tensor at all
    EXPECT_EQ(logits_of(bundle(v.name), kPrompt), logits_of(kQwen3_5, kPrompt));
  }
  // Each of the head's tensors missing in turn: a text-model bundle, the note naming it.
  for (const std::string& missing : mtp_head_tensors()) {
    SCOPED_TRACE(missing);
    const fs::path source = dir_.path() / ("without-" + missing);
    test::copy_checkpoint(kQwen3_5, source, [&](const std::string& n) { return n == missing; });
    const fs::path out = dir_.path() / ("bundle-without-" + missing);
    ConvertOptions o = f32_options();
    o.gate = false;
    const ConvertResult r = forge_convert(source, out, o);
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_NE(r.notes[0].find("missing 1 of 15 tensors: " + missing), std::string::npos);
    EXPECT_FALSE(load_model(out)->has_mtp());
  }
}

// A tensor of the text model that the index lists and no shard holds is refused by convert, even
// without the gate (which would have loaded the model); the optional parts' are not.
TEST_F(BundleTest, ConvertRefusesTextTensorsTheIndexListsButNoFileHolds) {
  const fs::path source = dir_.path() / "pruned-source";
  test::copy_checkpoint(kQwen3_5, source, [](const std::string& n) {
    return n == "model.language_model.norm.weight" || n == "mtp.fc.weight";
  });
  std::ofstream(source / "model.safetensors.index.json")
      << test::read_file(kQwen3_5 / "model.safetensors.index.json");
  ConvertOptions o = f32_options();
  o.gate = false;
  expect_error([&] { forge_convert(source, bundle("pruned"), o); },
               {"missing tensor 'model.language_model.norm.weight'", "index.json"});
  test::copy_checkpoint(kQwen3_5, source,
                        [](const std::string& n) { return n == "mtp.fc.weight"; });
  std::ofstream(source / "model.safetensors.index.json")
      << test::read_file(kQwen3_5 / "model.safetensors.index.json");
  EXPECT_TRUE(forge_convert(source, bundle("pruned-mtp"), o).published);
}

// A killed convert leaves its hidden directory; the next convert removes it (its process is gone),
// and leaves a running convert's alone.
TEST_F(BundleTest, StalePartialDirectoriesAreRemoved) {
  const fs::path stale = dir_.path() / ".stale.partial-999999999";
  const fs::path running = dir_.path() / (".stale.partial-" + std::to_string(::getppid()));
  fs::create_directories(stale / "inner");
  fs::create_directories(running);
  convert(kQwen3, "stale", f32_options());
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(running));
  EXPECT_TRUE(fs::exists(bundle("stale") / "manifest.json"));
}

TEST_F(BundleTest, ThePlansPrefillChunkIsUsed) {
  const fs::path b = convert(kQwen3_5, "chunk", f32_options());
  const auto reference = logits_of(b, kPrompt);
  Json m = manifest(b);
  m["plan"]["generate"]["prefill_chunk"] = 4;  // the prompt now spans four chunks
  write_manifest(b, m);
  const auto chunked = logits_of(b, kPrompt);
  EXPECT_NE(chunked, reference) << "a different chunking must round differently";
  float worst = 0.0f;
  for (size_t i = 0; i < chunked.size(); ++i)
    worst = std::max(worst, std::fabs(chunked[i] - reference[i]));
  EXPECT_LT(worst, 1e-4f);
}

TEST_F(BundleTest, ATiedHeadFollowsTheTableUnlessToldOtherwise) {
  ConvertOptions o = f32_options();
  o.gate = false;
  o.embed = DType::kW8;
  const fs::path tied = convert(kQwen3, "tied", o);
  EXPECT_EQ(manifest(tied)["plan"]["output"]["lm_head"], "tied");
  EXPECT_EQ(manifest(tied)["plan"]["output"]["dtype"], "w8");
  EXPECT_EQ(QhxtFile::open(tied / "output.qhxt").find("lm_head.weight"), nullptr);

  o.lm_head = DType::kBF16;
  const fs::path split = convert(kQwen3, "split", o);
  EXPECT_EQ(manifest(split)["plan"]["output"]["lm_head"], "lm_head.weight");
  EXPECT_EQ(manifest(split)["plan"]["output"]["dtype"], "bf16");
  const QhxtFile output = QhxtFile::open(split / "output.qhxt");
  const TensorView* head = output.find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->dtype, DType::kBF16);
}

TEST_F(BundleTest, OneTwoOrThreeShardsGiveIdenticalLogits) {
  for (const fs::path& source : {kQwen3, kQwen3_5}) {
    std::vector<float> first;
    for (int64_t shards : {1, 2, 3}) {
      ConvertOptions o = f32_options();
      o.weights = DType::kW8;
      o.shards = shards;
      o.gate = false;
      const fs::path b = convert(source, source.filename().string() + std::to_string(shards), o);
      EXPECT_EQ(static_cast<int64_t>(manifest(b)["plan"]["decoder_shards"].size()), shards);
      const auto logits = logits_of(b, kPrompt);
      if (first.empty()) first = logits;
      EXPECT_EQ(logits, first) << source << " with " << shards << " shards";
      if (shards == 2) {  // a plan whose layer ranges do not match its files is refused
        Json m = manifest(b);
        m["plan"]["decoder_shards"][0]["layers"][1] = 1;
        m["plan"]["decoder_shards"][1]["layers"][0] = 1;
        write_manifest(b, m);
        expect_error([&] { load_model(b); }, {"decoder-", "outside the shard's layers"});
      }
    }
  }
}

TEST_F(BundleTest, QuantizedBundlesPassTheirGate) {
  for (const fs::path& source : {kQwen3, kQwen3Untied, kQwen3_5}) {
    for (DType d : {DType::kBF16, DType::kF16, DType::kW8}) {
      ConvertOptions o;  // the default suite: 8 prompts, 32 greedy tokens
      o.weights = d;
      const ConvertResult r =
          forge_convert(source, bundle(std::string(dtype_name(d)) + source.filename().string()), o);
      ASSERT_TRUE(r.gate.has_value());
      EXPECT_TRUE(r.published) << source << " " << dtype_name(d) << ": " << r.gate->summary();
      if (d == DType::kW8 && !r.int8_activations) {  // allowed, but only after the gate said no
        ASSERT_TRUE(r.int8_activation_gate.has_value());
        std::printf("%s: int8 activations refused: %s\n", source.filename().c_str(),
                    r.int8_activation_gate->summary().c_str());
      }
    }
  }
}

// A checkpoint with a vision tower: the bundle carries it (vision.qhxt, W8 matrices in a W8
// bundle) with the image processor's settings, reads images as the checkpoint does, and the gate
// measures it on prompts with images. An f32 bundle gives the checkpoint's bits with images.
TEST_F(BundleTest, VisionCheckpointsCarryTheirTowerAndAreGatedOnImages) {
  const fs::path fixtures = test::source_dir() / "tests/fixtures/vision";
  for (const char* name : {"tied_bf16", "untied_f32"}) {
    SCOPED_TRACE(name);
    const fs::path source = fixtures / name;
    ConvertOptions o;
    o.weights = DType::kW8;
    const ConvertResult r = forge_convert(source, bundle(std::string("w8-") + name), o);
    ASSERT_TRUE(r.gate.has_value());
    EXPECT_TRUE(r.published) << r.gate->summary();
    int images = 0;
    for (const GatePromptResult& p : r.gate->prompts) {
      if (!p.name.starts_with("image")) continue;
      ++images;
      EXPECT_GE(p.pearson_min, r.gate->thresholds.min_pearson) << p.name;
      EXPECT_GT(p.positions, 20) << p.name;  // the image's tokens are among them
    }
    EXPECT_EQ(images, 2);
    const Json m = manifest(bundle(std::string("w8-") + name));
    EXPECT_EQ(m["plan"]["vision"]["file"], "vision.qhxt");
    EXPECT_EQ(m["precision_policy"]["vision_matrices"], "w8");
    EXPECT_EQ(m["source"]["skipped_tensors"], 0);

    ConvertOptions half;  // an f16 tower passes the f16 gate, images included
    half.weights = DType::kF16;
    const ConvertResult f16 = forge_convert(source, bundle(std::string("f16-") + name), half);
    EXPECT_TRUE(f16.published) << (f16.gate ? f16.gate->summary() : "no gate");
    EXPECT_EQ(manifest(bundle(std::string("f16-") + name))["precision_policy"]["vision_matrices"],
              "f16");

    const fs::path f32 = convert(source, std::string("f32-") + name, f32_options());
    const auto from_bundle = load_model(f32, {.verify_sha256 = true});
    const auto from_source = load_model(source);
    ASSERT_TRUE(from_bundle->has_vision()) << from_bundle->vision_unavailable();
    const PixelValues pixels = preprocess_image(read_image(fixtures / "images/rgb_256x320.png"),
                                                from_bundle->image_processor(), "rgb_256x320");
    const auto prompt = [&](const Model& model) {
      std::vector<int32_t> ids = {5, 9, 377};
      const std::vector<int32_t> image = model.image_ids(pixels);
      ids.insert(ids.end(), image.begin(), image.end());
      ids.insert(ids.end(), {378, 11, 3});
      return ids;
    };
    std::vector<float> want, got;
    from_source->forward(prompt(*from_source), *from_source->new_state(), LogitsFor::kEveryToken,
                         want);
    from_bundle->forward(prompt(*from_bundle), *from_bundle->new_state(), LogitsFor::kEveryToken,
                         got);
    EXPECT_EQ(got, want);
  }
  // A bundle whose vision file was changed is refused, naming it.
  const fs::path b = bundle("w8-tied_bf16");
  {
    std::fstream f(b / "vision.qhxt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x5a');
  }
  expect_error([&] { load_model(b, {.verify_sha256 = true}); }, {"vision.qhxt", "sha256"});
}

// The real Qwen3.5 vocabulary (248,320 rows, an untied head) and tokenizer: W8 and W4 bundles
// pass the default gate on its text prompts, and the bundle runs.
TEST_F(BundleTest, FullVocabularyQwen35BundlesPassTheirGate) {
  const fs::path source = test::source_dir() / "models/qwen3.5-tiny-random";
  for (DType d : {DType::kW8, DType::kW4}) {
    ConvertOptions o;
    o.weights = d;
    const fs::path out = bundle("tiny-" + std::string(dtype_name(d)));
    const ConvertResult r = forge_convert(source, out, o);
    ASSERT_TRUE(r.gate.has_value());
    EXPECT_TRUE(r.published) << dtype_name(d) << ": " << r.gate->summary();
    const auto model = load_model(out);
    EXPECT_EQ(model->config().vocab_size, 248320);
    EXPECT_EQ(Tokenizer::load(out).size(), 248077);
  }
}

TEST_F(BundleTest, FailedGatePublishesNothing) {
  ConvertOptions o = f32_options();
  o.weights = DType::kW4;
  o.group_size = 16;
  o.thresholds = GateThresholds{1.0, 1.0, 1.0, 0.0, 1.0};  // W4 cannot be exact
  const ConvertResult r = forge_convert(kQwen3, bundle("w4"), o);
  ASSERT_TRUE(r.gate.has_value());
  EXPECT_FALSE(r.gate->passed);
  EXPECT_FALSE(r.published);
  EXPECT_FALSE(fs::exists(bundle("w4")));
  EXPECT_TRUE(fs::is_empty(dir_.path())) << "no temporary directory left behind";
}

// W8 bundles multiply int8 activations when the gate accepts them; when it does not, forge tries
// f32 activations before giving up, and an explicit choice is never second-guessed.
TEST_F(BundleTest, Int8ActivationsWhereTheGateAcceptsThem) {
  ConvertOptions o;  // the default suite, as QuantizedBundlesPassTheirGate
  o.weights = DType::kW8;
  const ConvertResult accepted = forge_convert(kQwen3, bundle("w8"), o);
  ASSERT_TRUE(accepted.published) << accepted.gate->summary();
  EXPECT_TRUE(accepted.int8_activations);
  EXPECT_FALSE(accepted.int8_activation_gate.has_value());
  EXPECT_EQ(manifest(bundle("w8"))["precision_policy"]["activations"], "int8");
  EXPECT_TRUE(load_model(bundle("w8"))->config().int8_activations);

  o.thresholds = GateThresholds{1.0, 1.0, 1.0, 0.0, 1.0};  // nothing quantized is exact
  const ConvertResult refused = forge_convert(kQwen3, bundle("w8-refused"), o);
  ASSERT_TRUE(refused.int8_activation_gate.has_value()) << "int8 activations are tried first";
  EXPECT_FALSE(refused.int8_activation_gate->passed);
  ASSERT_TRUE(refused.gate.has_value()) << "then f32 activations";
  EXPECT_FALSE(refused.int8_activations);
  EXPECT_FALSE(refused.published);

  o.int8_activations = true;
  EXPECT_FALSE(forge_convert(kQwen3, bundle("w8-int8"), o).int8_activation_gate.has_value());
  o.int8_activations = false;
  o.thresholds.reset();
  convert(kQwen3, "w8-f32", o);
  EXPECT_EQ(manifest(bundle("w8-f32"))["precision_policy"]["activations"], "f32");
  EXPECT_FALSE(load_model(bundle("w8-f32"))->config().int8_activations);

  o = f32_options();
  o.int8_activations = true;
  expect_error([&] { forge_convert(kQwen3, bundle("f32-int8"), o); },
               {"--activations int8", "W8 or W4"});

  Json m = manifest(bundle("w8"));
  m["precision_policy"]["activations"] = "int4";
  write_manifest(bundle("w8"), m);
  expect_error([&] { load_model(bundle("w8")); }, {"precision_policy.activations", "\"int8\""});

  m["precision_policy"]["activations"] = "int8";
  m["precision_policy"]["matrices"] = 8;
  write_manifest(bundle("w8"), m);
  expect_error([&] { load_model(bundle("w8")); }, {"precision_policy.matrices", "a string"});
}

TEST_F(BundleTest, IntegrityFailuresAreNamed) {
  const fs::path good = convert(kQwen3, "good", f32_options());
  const auto fresh = [&](const std::string& name) {
    fs::copy(good, bundle(name), fs::copy_options::recursive);
    return bundle(name);
  };
  {  // a corrupted byte: sizes still match, sha256 does not
    const fs::path b = fresh("corrupt");
    std::fstream f(b / "decoder-0.qhxt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x5a');
    f.close();
    EXPECT_NO_THROW(load_model(b));
    expect_error([&] { load_model(b, {.verify_sha256 = true}); },
                 {"decoder-0.qhxt", "sha256", "corrupt"});
  }
  {  // A10: every file is covered, the model card and the manifest itself included
    const fs::path b = fresh("card");
    std::string card = test::read_file(b / "card.json");
    card[card.size() / 2] ^= 1;
    std::ofstream(b / "card.json", std::ios::binary) << card;
    expect_error([&] { load_model(b, {.verify_sha256 = true}); }, {"card.json", "sha256"});
    const fs::path m = fresh("manifest");
    std::string text = test::read_file(m / "manifest.json");
    const size_t at = text.find("\"created_by\"");
    ASSERT_NE(at, std::string::npos);
    text[at + 3] ^= 1;  // still valid JSON, an unknown key
    std::ofstream(m / "manifest.json", std::ios::binary) << text;
    EXPECT_NO_THROW(load_model(m));
    expect_error([&] { load_model(m, {.verify_sha256 = true}); },
                 {"manifest.json", "does not match manifest.sha256"});
    // A damaged value in the manifest is named as damage, not as the bad value it now is.
    const fs::path hex = fresh("manifest-hex");
    std::string manifest_text = test::read_file(hex / "manifest.json");
    const size_t sha = manifest_text.find("\"sha256\": \"");
    ASSERT_NE(sha, std::string::npos);
    manifest_text[sha + 11] = 'X';  // no longer 64 lowercase hex digits
    std::ofstream(hex / "manifest.json", std::ios::binary) << manifest_text;
    expect_error([&] { load_model(hex, {.verify_sha256 = true}); },
                 {"manifest.json", "does not match manifest.sha256"});
    // A file the loader would read, dropped in after convert: refused, since nothing checks it.
    const fs::path dropped = fresh("dropped");
    ASSERT_FALSE(fs::exists(dropped / "chat_template.jinja"));
    std::ofstream(dropped / "chat_template.jinja") << "{{ messages }}";
    expect_error([&] { load_model(dropped, {.verify_sha256 = true}); },
                 {"chat_template.jinja", "not listed in manifest.json"});
    // A bundle of format 1 (before manifest.sha256 and the listed card) still verifies.
    const fs::path v1 = fresh("format-1");
    Json old_manifest = manifest(v1);
    old_manifest["format_version"] = 1;
    Json files = Json::array();
    for (const Json& f : old_manifest["files"]) {
      if (f["path"] != "card.json" && f["path"] != "README.md") files.push_back(f);
    }
    old_manifest["files"] = files;
    std::ofstream(v1 / "manifest.json") << old_manifest.dump(2);
    fs::remove(v1 / kManifestHashFile);
    EXPECT_NO_THROW(load_model(v1, {.verify_sha256 = true}));
    // sha256sum -b's form ("<hash> *manifest.json") is read too.
    const fs::path binary = fresh("binary-mark");
    std::ofstream(binary / kManifestHashFile)
        << sha256_file(binary / "manifest.json") << " *manifest.json\n";
    EXPECT_NO_THROW(load_model(binary, {.verify_sha256 = true}));
    const fs::path unprotected = fresh("unprotected");
    fs::remove(unprotected / kManifestHashFile);
    expect_error([&] { load_model(unprotected, {.verify_sha256 = true}); }, {"manifest.sha256"});
  }
  {  // a truncated file
    const fs::path b = fresh("truncated");
    fs::resize_file(b / "output.qhxt", fs::file_size(b / "output.qhxt") - 10);
    expect_error([&] { load_model(b); }, {"output.qhxt", "size", "truncated"});
  }
  {  // a missing file
    const fs::path b = fresh("missing");
    fs::remove(b / "embed.qhxt");
    expect_error([&] { load_model(b); }, {"embed.qhxt", "missing"});
  }
  {  // a wrong sha256 in the manifest
    const fs::path b = fresh("wrong-sha");
    Json m = manifest(b);
    m["files"][0]["sha256"] = std::string(64, '0');
    write_manifest(b, m);
    expect_error([&] { load_model(b, {.verify_sha256 = true}); }, {"sha256", "does not match"});
  }
  {  // a manifest from a newer qhx
    const fs::path b = fresh("newer");
    Json m = manifest(b);
    m["format_version"] = kBundleFormatVersion + 1;
    write_manifest(b, m);
    expect_error([&] { load_model(b); }, {"manifest.json: format_version", "newer"});
  }
  {  // two stages of the plan on one file
    const fs::path b = fresh("shared-file");
    Json m = manifest(b);
    m["plan"]["output"]["file"] = m["plan"]["decoder_shards"][0]["file"];
    write_manifest(b, m);
    expect_error([&] { load_model(b); }, {"manifest.json: plan", "distinct files"});
  }
  {  // a bundle for another machine
    const fs::path b = fresh("other-target");
    Json m = manifest(b);
    m["target"] = host_target().starts_with("x86_64") ? "aarch64" : "x86_64";
    write_manifest(b, m);
    expect_error([&] { load_model(b); }, {"manifest.json: target", "built for"});
  }
}

// Writes a .qhxt file by hand: header, the given table, and `data_bytes` zero bytes of data.
void write_raw_qhxt(const fs::path& path, const Json& table, size_t data_bytes) {
  const std::string text = table.dump();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write("QHXT", 4);
  const uint32_t version = kQhxtVersion;
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&version), 4);
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << text << std::string(data_bytes, '\0');
}

TEST_F(BundleTest, TensorTablesThatDoNotFitTheFile) {
  const fs::path file = dir_.path() / "t.qhxt";
  Json entry = {
      {"name", "w"}, {"dtype", "F32"}, {"shape", {4, 4}}, {"offset", 1024}, {"nbytes", 64}};
  write_raw_qhxt(file, {{"tensors", {entry}}}, 1200);
  EXPECT_NO_THROW(QhxtFile::open(file));
  entry["offset"] = 1 << 20;
  write_raw_qhxt(file, {{"tensors", {entry}}}, 1200);
  expect_error([&] { QhxtFile::open(file); }, {"t.qhxt", "tensor 'w'", "past the end"});
  entry["offset"] = 1000;
  write_raw_qhxt(file, {{"tensors", {entry}}}, 1200);
  expect_error([&] { QhxtFile::open(file); }, {"aligned"});
  entry["offset"] = 0;
  write_raw_qhxt(file, {{"tensors", {entry}}}, 1200);
  expect_error([&] { QhxtFile::open(file); }, {"tensor table"});
  entry["offset"] = 1024;
  entry["nbytes"] = 60;
  write_raw_qhxt(file, {{"tensors", {entry}}}, 1200);
  expect_error([&] { QhxtFile::open(file); }, {"nbytes"});
  entry["nbytes"] = 64;
  Json second = entry;
  second["name"] = "v";
  write_raw_qhxt(file, {{"tensors", {entry, second}}}, 1200);
  expect_error([&] { QhxtFile::open(file); }, {"overlapping"});
}

TEST_F(BundleTest, ConvertKilledMidwayLeavesNoBundle) {
  // A file-size limit kills the converter (SIGXFSZ) while it writes the embedding table.
  const std::string command = "ulimit -f 256; exec " + std::string(QHX_CLI_PATH) +
                              " forge convert " +
                              (test::source_dir() / "models/qwen3-tiny-random").string() + " -o " +
                              bundle("killed").string() + " >/dev/null 2>&1";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0));
  EXPECT_FALSE(fs::exists(bundle("killed")));
  bool partial_left = false;  // proves the kill came mid-write, not before anything was written
  for (const auto& e : fs::directory_iterator(dir_.path())) {
    partial_left |= e.path().filename().string().starts_with(".killed.partial-");
    EXPECT_FALSE(is_bundle(e.path())) << e.path();
  }
  EXPECT_TRUE(partial_left);
}

TEST_F(BundleTest, ModelCardDescribesTheBundle) {
  const fs::path b = convert(kQwen3_5, "carded", f32_options());
  const Json card = read_json_file(b / "card.json");
  EXPECT_EQ(card["family"], "qwen3_5");
  EXPECT_TRUE(card["gate"]["passed"].get<bool>());
  std::ifstream readme(b / "README.md");
  std::stringstream text;
  text << readme.rdbuf();
  EXPECT_NE(text.str().find("Oracle gate"), std::string::npos);
  EXPECT_NE(text.str().find(manifest(b)["files"][0]["sha256"].get<std::string>()),
            std::string::npos);
}

TEST_F(BundleTest, PacksPickTheBundleForThisMachine) {
  ConvertOptions o = f32_options();
  const fs::path generic = convert(kQwen3, "generic", o);
  o.target = host_target().starts_with("x86_64") ? "aarch64" : "x86_64";
  const fs::path other = convert(kQwen3, "other", o);
  write_pack(bundle("pack"), {generic, other}, false);
  EXPECT_EQ(select_pack_bundle(bundle("pack")).filename(), "generic");
  EXPECT_EQ(logits_of(bundle("pack"), kPrompt), logits_of(kQwen3, kPrompt));

  write_pack(bundle("foreign"), {other}, false);
  expect_error([&] { load_model(bundle("foreign")); },
               {"MANIFEST.json", "no bundle for this machine", o.target});
  std::ofstream(bundle("pack") / "generic" / "embed.qhxt", std::ios::app) << "x";
  expect_error([&] { load_model(bundle("pack")); }, {"embed.qhxt", "size"});
  expect_error(
      [&] {
        write_pack(bundle("twice"), {generic, generic}, false);
      },
      {"second bundle", "generic"});
}

}  // namespace
}  // namespace qhx
