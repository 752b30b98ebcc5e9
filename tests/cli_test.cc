// The qhx command line as a user meets it: outputs in the documented shape, and for each kind
// of malformed input a one-line error naming the file and the problem, exit code 1, no crash.
#include <gtest/gtest.h>
#include <algorithm>

#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/thread_pool.h"
#include "support/cli_run.h"
#include "support/fixtures.h"
#include "support/raw_safetensors.h"
#include "util/json_file.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

using test::CliRun;
using test::read_file;

CliRun qhx(const std::string& args, const std::string& input = "") {
  return test::run_qhx(args, input);
}

const fs::path kSmallModel = test::source_dir() / "tests/fixtures/qwen3/gqa2_tied_bf16";
const fs::path kDefaultModel = test::source_dir() / "models/qwen3.5-kjv";  // README's default

// A user error: exit 1, stdout empty, one stderr line holding every part.
void expect_user_error(const CliRun& r, std::initializer_list<std::string> parts) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.out, "");
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  for (const auto& part : parts) EXPECT_NE(r.err.find(part), std::string::npos) << r.err;
}

TEST(Cli, PrintIdsGivesOneLineOfIds) {
  const CliRun r = qhx("generate --model " + kSmallModel.string() +
                       " --prompt-ids 5,17,300 -n 7 --greedy --print-ids");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 6) << r.out;
  for (const char* figure : {"prefill", "decode", "tok/s", "TTFT", "peak RSS"}) {
    EXPECT_NE(r.err.find(figure), std::string::npos) << r.err;
  }
}

TEST(Cli, GeneratesTextFromTheDefaultModel) {
  const CliRun r = qhx("generate --model " + kDefaultModel.string() +
                       " --prompt 'Once upon a time' -n 16 --seed 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  const CliRun again = qhx("generate --model " + kDefaultModel.string() +
                           " --prompt 'Once upon a time' -n 16 --seed 3");
  EXPECT_EQ(r.out, again.out) << "same seed, same text";
}

// The ids of a --print-ids run's one line.
std::vector<std::string> ids_of(const CliRun& r) {
  std::vector<std::string> ids;
  std::stringstream in(r.out.substr(0, r.out.find('\n')));
  for (std::string id; std::getline(in, id, ',');) ids.push_back(id);
  return ids;
}

// The contract of issue 21: speculation prints the same one line of ids, on both families' trained
// models (the drafts are verified, some kept); a bad --speculative is refused.
TEST(Cli, SpeculativeDecodingPrintsTheSameIds) {
  const fs::path models = test::source_dir() / "models";
  for (const char* name : {"qwen3-kjv", "qwen3.5-kjv"}) {
    const std::string run = "generate --model " + (models / name).string() +
                            " --prompt-ids 1,2,3 -n 48 --greedy --print-ids";
    const CliRun plain = qhx(run);
    // Prompt lookup, the other trained model as the draft model, and Qwen3.5's MTP head (over its
    // draft vocabulary and over every token).
    const bool qwen35 = std::string(name) == "qwen3.5-kjv";
    const std::string other = qwen35 ? "qwen3-kjv" : "qwen3.5-kjv";
    std::vector<std::string> spec_flags = {"ngram", "draft:" + (models / other).string()};
    if (qwen35) spec_flags.insert(spec_flags.end(), {"mtp", "mtp --draft-vocab -1"});
    for (const std::string& spec_flag : spec_flags) {
      const CliRun spec = qhx(run + " --speculative " + spec_flag + " --draft-max 4");
      ASSERT_EQ(spec.exit_code, 0) << spec.err;
      EXPECT_EQ(std::count(spec.out.begin(), spec.out.end(), '\n'), 1) << spec.out;
      EXPECT_EQ(spec.out, plain.out) << name << " " << spec_flag;
      EXPECT_EQ(ids_of(spec).size(), 48u);
      EXPECT_NE(spec.err.find("speculative " + spec_flag.substr(0, spec_flag.find_first_of(" :"))),
                std::string::npos)
          << spec.err;
    }
  }
  const CliRun bad =
      qhx("generate --model " + kSmallModel.string() + " --prompt-ids 1 --speculative guess");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--speculative"), std::string::npos) << bad.err;
  // A draft model of another tokenizer is refused, naming it.
  const fs::path qwen35_random = models / "qwen3.5-tiny-random";
  expect_user_error(
      qhx("generate --model " + kSmallModel.string() +
          " --prompt-ids 1 --print-ids --speculative draft:" + qwen35_random.string()),
      {qwen35_random.string(), "vocab_size"});
}

TEST(Cli, StopStringEndsTheTextBeforeIt) {
  const std::string run = "generate --model " + kDefaultModel.string() +
                          " --prompt 'And it came to pass' -n 40 --greedy";
  const CliRun full = qhx(run);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  ASSERT_GT(full.out.size(), 60u) << full.out;
  // A stretch from the middle of the greedy text, which spans several tokens.
  const std::string stop = full.out.substr(30, 12);
  ASSERT_EQ(stop.find('\''), std::string::npos);
  const CliRun cut = qhx(run + " --stop 'never appears' --stop '" + stop + "'");
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  EXPECT_EQ(cut.out, full.out.substr(0, full.out.find(stop)) + "\n");
  EXPECT_EQ(cut.err.find("decode: 40 tokens"), std::string::npos) << "did not stop: " << cut.err;
  expect_user_error(qhx(run + " --stop x --print-ids"), {"--stop", "--print-ids"});
}

TEST(Cli, LogitBiasAndPenaltiesChangeTheTokens) {
  const std::string run =
      "generate --model " + kSmallModel.string() + " --prompt-ids 5,17,300 --greedy --print-ids";
  const CliRun plain = qhx(run + " -n 12");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::vector<std::string> ids = ids_of(plain);
  ASSERT_EQ(ids.size(), 12u);
  ASSERT_LT(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size()) << "no repeats";
  const CliRun banned = qhx(run + " -n 1 --logit-bias " + ids[0] + "=-inf --logit-bias 0=0.5");
  ASSERT_EQ(banned.exit_code, 0) << banned.err;
  EXPECT_NE(ids_of(banned).at(0), ids[0]);
  // A presence penalty this large forbids any repeat among the generated tokens.
  const CliRun fresh = qhx(run + " -n 12 --presence-penalty 1000");
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  const std::vector<std::string> fresh_ids = ids_of(fresh);
  EXPECT_EQ(std::set<std::string>(fresh_ids.begin(), fresh_ids.end()).size(), fresh_ids.size())
      << fresh.out;
  for (const char* flag : {"--repeat-penalty 1.3", "--frequency-penalty 0.5", "--min-p 0.1"}) {
    const CliRun r = qhx(run + " -n 4 " + flag);
    EXPECT_EQ(r.exit_code, 0) << flag << ": " << r.err;
  }
  expect_user_error(qhx(run + " -n 1 --logit-bias 5"), {"--logit-bias", "ID=BIAS"});
  expect_user_error(qhx(run + " -n 1 --logit-bias 999999999=1"),
                    {"logit_bias", "outside the vocabulary"});
  expect_user_error(qhx(run + " -n 1 --repeat-penalty 0"), {"repetition_penalty"});
}

TEST(Cli, DefaultsComeFromGenerationConfig) {
  // The shipped model's generation_config.json samples; --greedy overrides it.
  const std::string run = "generate --model " + kDefaultModel.string() + " --prompt 'And' -n 2";
  CliRun r = qhx(run);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("sampled, seed"), std::string::npos) << r.err;
  r = qhx(run + " --greedy");
  EXPECT_NE(r.err.find("| greedy"), std::string::npos) << r.err;

  test::TempDir dir;
  test::copy_dir(kSmallModel, dir.path());
  const std::string small =
      "generate --model " + dir.path().string() + " --prompt-ids 5 --print-ids";
  r = qhx(small);  // transformers' minimal file: greedy, -n 64
  EXPECT_NE(r.err.find("| greedy"), std::string::npos) << r.err;
  EXPECT_EQ(ids_of(r).size(), 64u);
  std::ofstream(dir.path() / "generation_config.json") << R"({"do_sample": true, "top_k": 3,
      "max_new_tokens": 5})";
  r = qhx(small);
  EXPECT_NE(r.err.find("sampled, seed"), std::string::npos) << r.err;
  EXPECT_EQ(ids_of(r).size(), 5u);
  std::ofstream(dir.path() / "generation_config.json") << R"({"num_beams": 4})";
  expect_user_error(qhx(small), {"generation_config.json", "num_beams", "not supported"});
}

// qhx's perplexity of the shipped model on its held-out text equals the one transformers measured
// when the model was trained (training.json: same text, same 512-token windows): a guard for the
// kernels, the loader and the tokenizer together on the full vocabulary.
TEST(Cli, DefaultModelPerplexityMatchesTransformers) {
  const Json training = read_json_file(kDefaultModel / "training.json");
  const double reference = training.at("held_out_ppl").at("shipped_bf16").get<double>();
  ASSERT_EQ(training.at("held_out_ppl").at("window").get<int>(), 512);
  const CliRun r = qhx("perplexity -m " + kDefaultModel.string() + " -f " +
                       (kDefaultModel / "held_out.txt").string() + " --window 512 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json out = Json::parse(r.out);
  EXPECT_EQ(out.at("tokens").get<int64_t>(),
            training.at("held_out_ppl").at("tokens").get<int64_t>());
  EXPECT_NEAR(out.at("perplexity").get<double>(), reference, 1e-4 * reference) << r.out;
}

TEST(Cli, TokenizePrintsAJsonArray) {
  const CliRun r = qhx("tokenize --model " + kDefaultModel.string(), "Hello world");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[9707,1879]\n");
}

TEST(Cli, TokenizeNeedsOnlyTokenizerFiles) {
  test::TempDir dir;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(kDefaultModel / f, dir.path() / f);
  }
  const CliRun r = qhx("tokenize --model " + dir.path().string(), " Hello world");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[21927,1879]\n");
}

class CliBrokenModel : public ::testing::Test {
 protected:
  void SetUp() override { test::copy_dir(source(), model()); }
  virtual fs::path source() const { return kSmallModel; }
  fs::path model() const { return dir_.path() / "model"; }
  CliRun generate() {
    return qhx("generate --model " + model().string() + " --prompt-ids 1,2,3 -n 4 --print-ids");
  }
  test::RawSafetensors weights() const {
    return test::RawSafetensors::read(model() / "model.safetensors");
  }
  test::TempDir dir_;
};

TEST_F(CliBrokenModel, TruncatedSafetensors) {
  const fs::path file = model() / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) / 2);
  expect_user_error(generate(), {"model.safetensors", "past the end"});
  fs::resize_file(file, 6);
  expect_user_error(generate(), {"model.safetensors", "truncated"});
}

TEST_F(CliBrokenModel, HeaderOffsetsPastTheEnd) {
  test::RawSafetensors raw = weights();
  raw.header["model.norm.weight"]["data_offsets"][1] = raw.data.size() + 64;
  raw.write(model() / "model.safetensors");
  expect_user_error(generate(), {"model.safetensors", "model.norm.weight", "past the end"});
}

TEST_F(CliBrokenModel, MissingTensor) {
  test::RawSafetensors raw = weights();
  raw.erase("model.layers.1.mlp.up_proj.weight");
  raw.write(model() / "model.safetensors");
  expect_user_error(generate(),
                    {"model.safetensors: missing tensor 'model.layers.1.mlp.up_proj.weight'"});
}

// A flipped bit in a tensor's name: the error names the damaged file and the name it holds.
TEST_F(CliBrokenModel, DamagedTensorName) {
  test::RawSafetensors raw = weights();
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  raw.header["model.layers.1.mlp.up_proj.weighu"] = raw.header[name];
  raw.header.erase(name);
  raw.write(model() / "model.safetensors");
  expect_user_error(generate(), {"model.safetensors: missing tensor '" + name + "'",
                                 "'model.layers.1.mlp.up_proj.weighu' instead"});
  // In a bundle, the .qhxt file that holds it.
  const fs::path bundle = dir_.path() / "bundle";
  test::copy_dir(kSmallModel, dir_.path() / "intact");
  ASSERT_EQ(qhx("forge convert " + (dir_.path() / "intact").string() + " -o " + bundle.string())
                .exit_code,
            0);
  const fs::path shard = bundle / "decoder-0.qhxt";
  std::string bytes = read_file(shard);
  const size_t at = bytes.find(name);
  ASSERT_NE(at, std::string::npos);
  bytes[at + name.size() - 1] ^= 1;  // 't' -> 'u'
  std::ofstream(shard, std::ios::binary) << bytes;
  expect_user_error(
      qhx("generate --model " + bundle.string() + " --prompt-ids 1,2,3 -n 4 --print-ids"),
      {"decoder-0.qhxt: missing tensor '" + name + "'"});
}

TEST_F(CliBrokenModel, TensorOfTheWrongShape) {
  test::RawSafetensors raw = weights();
  Json& shape = raw.header["model.layers.0.self_attn.k_proj.weight"]["shape"];
  std::swap(shape[0], shape[1]);
  raw.write(model() / "model.safetensors");
  expect_user_error(generate(), {"model.safetensors", "model.layers.0.self_attn.k_proj.weight",
                                 "one of the two is wrong"});
}

TEST_F(CliBrokenModel, BadJsonConfig) {
  std::ofstream(model() / "config.json") << "{\"model_type\": \"qwen3\", ";
  expect_user_error(generate(), {"config.json", "invalid JSON"});
}

TEST_F(CliBrokenModel, TokenizerJsonWithoutModelSection) {
  Json tok = Json::parse(read_file(kDefaultModel / "tokenizer.json"));
  tok.erase("model");
  std::ofstream(model() / "tokenizer.json") << tok.dump();
  expect_user_error(qhx("tokenize --model " + model().string(), "hi"), {"tokenizer.json", "model"});
}

// Qwen3.5 checkpoints broken in the ways peers' converters break them.
class CliBrokenQwen3_5 : public CliBrokenModel {
 protected:
  fs::path source() const override {
    return test::source_dir() / "tests/fixtures/qwen3_5/gva2_tied";
  }
  void edit_config(const std::function<void(Json&)>& edit) {
    Json config = Json::parse(read_file(model() / "config.json"));
    edit(config);
    std::ofstream(model() / "config.json") << config.dump(2);
  }
};

TEST_F(CliBrokenQwen3_5, RunsWhenIntact) {
  const CliRun r = generate();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 3) << r.out;
}

TEST_F(CliBrokenQwen3_5, MissingALog) {
  test::RawSafetensors raw = weights();
  raw.erase("model.layers.1.linear_attn.A_log");
  raw.write(model() / "model.safetensors");
  expect_user_error(generate(), {"missing tensor 'model.layers.1.linear_attn.A_log'"});
}

// A tensor simply missing from a Qwen3.5 attention layer (every fourth) is not taken for a
// damaged name of its sibling (k_norm beside a missing q_norm), which other layers have too.
TEST_F(CliBrokenQwen3_5, MissingAttentionTensorIsNotCalledDamaged) {
  test::RawSafetensors raw = weights();
  std::string missing;
  for (const auto& [name, entry] : raw.header.items()) {
    if (name.find("self_attn.q_norm.weight") != std::string::npos) {
      missing = name;
      break;
    }
  }
  ASSERT_FALSE(missing.empty());
  raw.erase(missing);
  raw.write(model() / "model.safetensors");
  const CliRun r = generate();
  expect_user_error(r, {"model.safetensors: missing tensor '" + missing + "'"});
  EXPECT_EQ(r.err.find("damaged"), std::string::npos) << r.err;
}

TEST_F(CliBrokenQwen3_5, ConvWeightOfTheWrongShape) {
  test::RawSafetensors raw = weights();
  Json& shape = raw.header["model.layers.0.linear_attn.conv1d.weight"]["shape"];
  shape = {shape[0], shape[2], shape[1]};  // [C, K, 1]: same bytes, wrong layout
  raw.write(model() / "model.safetensors");
  expect_user_error(generate(), {"model.safetensors", "conv1d.weight", "one of the two is wrong"});
}

TEST_F(CliBrokenQwen3_5, LayerTypesOfTheWrongLength) {
  edit_config([](Json& c) { c["layer_types"].erase(c["layer_types"].size() - 1); });
  expect_user_error(generate(), {"config.json", "layer_types", "num_hidden_layers"});
}

TEST_F(CliBrokenQwen3_5, ValueHeadsNotAMultipleOfKeyHeads) {
  edit_config([](Json& c) { c["linear_num_value_heads"] = 3; });
  expect_user_error(generate(), {"config.json", "linear_num_value_heads", "multiple"});
}

// A9: a config.json value that the weights contradict (null takes transformers' default, as
// there) is named with config.json, not only as the tensor's shape.
TEST_F(CliBrokenModel, ConfigValueTheWeightsContradict) {
  Json config = Json::parse(read_file(model() / "config.json"));
  config["num_key_value_heads"] = nullptr;  // defaults to num_attention_heads
  std::ofstream(model() / "config.json") << config.dump(2);
  expect_user_error(generate(),
                    {"config.json: num_key_value_heads", "is 4", "transformers' default",
                     "model.safetensors's 'model.layers.0.self_attn.k_proj.weight'"});
  config["num_key_value_heads"] = 2;
  config["num_hidden_layers"] = config["num_hidden_layers"].get<int>() - 1;
  config.erase("layer_types");
  std::ofstream(model() / "config.json") << config.dump(2);
  expect_user_error(generate(), {"config.json: num_hidden_layers", "more layers"});
}

// A9: an eos id no token can match is taken (as transformers takes it), with a note.
TEST_F(CliBrokenModel, EosOutsideTheVocabularyIsNoted) {
  std::ofstream(model() / "generation_config.json") << R"({"eos_token_id": 1000000000})";
  const CliRun r = generate();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("note: " + model().string() +
                       ": eos token id 1000000000 is outside the "
                       "vocabulary"),
            std::string::npos)
      << r.err;
}

TEST_F(CliBrokenQwen3_5, HeadDimsThatDisagreeWithTheWeights) {
  edit_config([](Json& c) {
    c["linear_value_head_dim"] = 16;
    c["linear_key_head_dim"] = 16;
  });
  expect_user_error(generate(), {"config.json: linear_value_head_dim", "model.safetensors"});
}

// The audit's checkpoint: a multimodal Qwen3.5 whose MTP module holds mtp.fc and mtp.norm only.
// transformers runs it as a text model; so does every command here, with one note, and
// --speculative mtp says which tensors are missing.
TEST(Cli, AnIncompleteMtpHeadRunsAsATextModel) {
  const fs::path whole = test::source_dir() / "tests/fixtures/qwen3_5/multimodal_layout";
  test::TempDir dir;
  const fs::path partial = dir.path() / "partial";
  test::copy_checkpoint(whole, partial, [](const std::string& name) {
    return name.starts_with("mtp.") && name != "mtp.fc.weight" && name != "mtp.norm.weight";
  });
  const std::string args = " --prompt-ids 1,2,3,4 -n 12 --greedy --print-ids";
  const CliRun expected = qhx("generate --model " + whole.string() + args);
  ASSERT_EQ(expected.exit_code, 0) << expected.err;
  const CliRun r = qhx("generate --model " + partial.string() + args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, expected.out);
  EXPECT_NE(r.err.find("note: " + partial.string() +
                       ": its MTP head (mtp.*) is incomplete, missing 13 of 15 tensors: "
                       "mtp.pre_fc_norm_embedding.weight"),
            std::string::npos)
      << r.err;
  // The note, then the refusal: one line naming the missing tensors.
  const CliRun refused = qhx("generate --model " + partial.string() + args + " --speculative mtp");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_EQ(refused.out, "");
  const size_t error_at = refused.err.find("qhx: error: ");
  ASSERT_NE(error_at, std::string::npos) << refused.err;
  const std::string error = refused.err.substr(error_at);
  EXPECT_EQ(error.find('\n'), error.size() - 1) << error;
  for (const char* part : {"speculative", "MTP head", "mtp.pre_fc_norm_hidden.weight"}) {
    EXPECT_NE(error.find(part), std::string::npos) << error;
  }
  const CliRun converted =
      qhx("forge convert " + partial.string() + " -o " + (dir.path() / "b").string());
  ASSERT_EQ(converted.exit_code, 0) << converted.err;
  EXPECT_NE(converted.err.find("missing 13 of 15 tensors"), std::string::npos) << converted.err;
  const CliRun bundled = qhx("generate --model " + (dir.path() / "b").string() + args);
  ASSERT_EQ(bundled.exit_code, 0) << bundled.err;
  EXPECT_EQ(bundled.out, expected.out);
}

// Options out of range are refused in one short line that names the option and the bound.
TEST(Cli, OutOfRangeOptionsNameTheirBound) {
  const std::string model = " --model " + kSmallModel.string() + " --prompt-ids 1,2 --print-ids";
  for (const auto& [args, expected] : std::vector<std::pair<std::string, std::string>>{
           {"-n -1", "--n-predict: must be >= 0, got -1"},
           {"-n 2 --seed -1", "--seed: must be >= 0, got -1"},
           {"-n abc", "--n-predict: 'abc' is not a whole number"},
           {"-n 1.5", "--n-predict: '1.5' is not a whole number"},
           {"-n 99999999999999999999",
            "--n-predict: '99999999999999999999' is too large (at most 9223372036854775807)"},
           {"-n 08", ""},  // decimal: 8 tokens (CLI11 reads octal, and 08 is none)
           {"-n 2 -t 0x2", "--threads: '0x2' is not a whole number"},
           {"-n 9223372036854775808",
            "--n-predict: '9223372036854775808' is too large (at most 9223372036854775807)"}}) {
    const CliRun r = qhx("generate" + model + " " + args);
    if (expected.empty()) {
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 7) << r.out;
      continue;
    }
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(r.err.substr(0, r.err.find('\n')), expected);
    EXPECT_LT(r.err.size(), 200u) << r.err;
  }
  // A seed is read in decimal: 010 is 10, not 8 (sampled, so the seed decides the tokens).
  const auto sampled = [&](const std::string& seed) {
    const CliRun r = qhx("generate" + model + " -n 16 --temperature 1.5 --seed " + seed);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  };
  EXPECT_EQ(sampled("010"), sampled("10"));
  EXPECT_NE(sampled("010"), sampled("8"));
}

// An empty API key would turn authentication off: refused however it is given.
TEST(Cli, ServeRefusesAnEmptyApiKey) {
  const std::string serve = "serve --model " + kSmallModel.string() + " --port 0";
  const std::string qhx_path = QHX_CLI_PATH;
  for (const std::string& command : {"timeout 60 " + qhx_path + " " + serve + " --api-key ''",
                                     "QHX_API_KEY= timeout 60 " + qhx_path + " " + serve}) {
    const test::TempDir dir;
    const int status =
        std::system((command + " 2>" + (dir.path() / "err").string() + " >/dev/null").c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 124)
        << command;  // refused at once, not stopped by the timeout
    const std::string err = read_file(dir.path() / "err");
    EXPECT_NE(err.find("would turn authentication off"), std::string::npos) << err;
  }
  // A key given on the command line wins over an empty QHX_API_KEY (a systemd unit's default).
  // It starts (however long the model takes to open), and stops on SIGTERM with status 0.
  const test::TempDir dir;
  const std::string err_file = (dir.path() / "err").string();
  const std::string script =
      "QHX_API_KEY= " + qhx_path + " " + serve + " --api-key secret 2>" + err_file +
      " >/dev/null & p=$!; for i in $(seq 1200); do grep -q 'listening on' " + err_file +
      " && break; sleep 0.1; done; kill -TERM $p; wait $p";
  const int status = std::system(script.c_str());
  const std::string err = read_file(dir.path() / "err");
  EXPECT_NE(err.find("listening on"), std::string::npos) << err;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
}

// Calibrated W4 with mixed precision on the shipped Qwen3.5 model: the statistics and the choice
// are recorded, the budget is kept, the gate passes, and the bundle scores the held-out text
// closer to the float model than plain W4 does.
TEST(CliForge, CalibratedMixedW4KeepsTheBudgetAndDivergesLess) {
  test::TempDir dir;
  const fs::path text = kDefaultModel / "calibration.txt";
  const std::string plain = (dir.path() / "plain").string(),
                    mixed = (dir.path() / "mixed").string();
  ASSERT_EQ(
      qhx("forge convert " + kDefaultModel.string() + " -o " + plain + " --weights w4 --no-gate")
          .exit_code,
      0);
  // The plain bundle's tensor files (every matrix W4, and their headers) and 150 kB more.
  uint64_t budget = 150000;
  const Json manifest = read_json_file(dir.path() / "plain" / "manifest.json");
  for (const Json& f : manifest.at("files")) {
    if (f.at("path").get<std::string>().ends_with(".qhxt")) budget += f.at("size").get<uint64_t>();
  }
  CliRun r = qhx("forge convert " + kDefaultModel.string() + " -o " + mixed +
                 " --weights w4 --calibrate " + text.string() +
                 " --calibrate-tokens 1024 --sensitivity-tokens 128 --size-budget " +
                 std::to_string(budget) + " --gate-prompts 2 --gate-tokens 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json policy = read_json_file(dir.path() / "mixed" / "manifest.json").at("precision_policy");
  EXPECT_EQ(policy.at("calibration").at("method"), "gptq");
  EXPECT_EQ(policy.at("calibration").at("tokens"), 1024);
  EXPECT_FALSE(policy.at("mixed").at("w8_matrices").empty());
  EXPECT_LE(policy.at("mixed").at("weight_bytes").get<uint64_t>(), budget);
  const auto kl = [&](const std::string& bundle) {
    const CliRun p =
        qhx("perplexity -m " + bundle + " -f " + (kDefaultModel / "held_out.txt").string() +
            " --max-tokens 1025 --kl-divergence " + kDefaultModel.string() + " --json");
    EXPECT_EQ(p.exit_code, 0) << p.err;
    return Json::parse(p.out).at("kl_mean").get<double>();
  };
  EXPECT_LT(kl(mixed), 0.6 * kl(plain));
  expect_user_error(
      qhx("forge convert " + kDefaultModel.string() + " -o " + (dir.path() / "x").string() +
          " --weights w4 --calibrate " + text.string() + " --size-budget 1M --no-gate"),
      {"--size-budget", "every matrix in W4"});
  expect_user_error(
      qhx("forge convert " + kDefaultModel.string() + " -o " + (dir.path() / "x").string() +
          " --weights bf16 --calibrate " + text.string() + " --no-gate"),
      {"--calibrate", "w8 or w4"});
}

TEST(CliForge, ConvertVerifyGateAndRun) {
  test::TempDir dir;
  const std::string b = (dir.path() / "b").string();
  CliRun r = qhx("forge convert " + kSmallModel.string() + " -o " + b + " --weights w8 --shards 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("gate passed"), std::string::npos) << r.err;

  r = qhx("verify " + b);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("verified"), std::string::npos) << r.out;
  // The bundle keeps the checkpoint's generation_config.json (checksummed with the rest).
  EXPECT_EQ(read_file(dir.path() / "b" / "generation_config.json"),
            read_file(kSmallModel / "generation_config.json"));

  r = qhx("generate --model " + b + " --prompt-ids 5,17,300 -n 4 --print-ids");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("bundle: qwen3, weights w8"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gate passed"), std::string::npos) << r.err;

  r = qhx("forge gate " + b + " --reference " + kSmallModel.string() + " --min-top1 1.01");
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("below threshold: top-1"), std::string::npos) << r.err;

  {
    std::fstream f(dir.path() / "b" / "decoder-1.qhxt",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  expect_user_error(qhx("verify " + b), {"decoder-1.qhxt", "sha256"});
  expect_user_error(qhx("generate --model " + b + " --verify --prompt-ids 1 -n 1 --print-ids"),
                    {"decoder-1.qhxt", "sha256"});
  expect_user_error(qhx("forge convert " + kSmallModel.string() + " -o " + b), {"already exists"});
  expect_user_error(qhx("forge convert " + kSmallModel.string() + " -o " + b + "2 --weights q3"),
                    {"--weights", "q3"});
}

TEST(CliForge, GateOnAPromptFileReportsJson) {
  test::TempDir dir;
  const std::string b = (dir.path() / "b").string();
  ASSERT_EQ(
      qhx("forge convert " + kDefaultModel.string() + " -o " + b + " --weights bf16 --no-gate")
          .exit_code,
      0);
  std::ofstream(dir.path() / "prompts.txt")
      << "In the beginning\n\n  \nAnd it came to pass\n\"Two\\nlines\"\n\"Said,\" he said\n";
  const CliRun r =
      qhx("forge gate " + b + " --reference " + kDefaultModel.string() + " --gate-prompt-file " +
          (dir.path() / "prompts.txt").string() +
          " --gate-tokens 3 --min-top1 0 --min-top5 0 --min-pearson 0 --max-kl 1e9 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("line1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("line4"), std::string::npos) << "blank lines are skipped: " << r.err;
  // A JSON string's line, and a line that only starts with a quote (read as it is).
  EXPECT_NE(r.out.find("\"prompts\":4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"per_prompt\""), std::string::npos) << r.out;

  std::ofstream(dir.path() / "empty.txt") << "\n \n";
  expect_user_error(qhx("forge gate " + b + " --reference " + kDefaultModel.string() +
                        " --gate-prompt-file " + (dir.path() / "empty.txt").string()),
                    {"empty.txt", "no prompts"});
  std::ofstream(dir.path() / "bad.txt", std::ios::binary) << "fine\nnot \xff fine\n";
  expect_user_error(qhx("forge gate " + b + " --reference " + kDefaultModel.string() +
                        " --gate-prompt-file " + (dir.path() / "bad.txt").string()),
                    {"bad.txt:2", "UTF-8"});
  std::ofstream(dir.path() / "quoted.txt") << "fine\n\"\"\n";
  expect_user_error(qhx("forge gate " + b + " --reference " + kDefaultModel.string() +
                        " --gate-prompt-file " + (dir.path() / "quoted.txt").string()),
                    {"quoted.txt:2", "an empty prompt"});
}

TEST(Cli, BenchContextSweep) {
  const std::string held_out = (test::source_dir() / "models/qwen3.5-kjv/held_out.txt").string();
  const CliRun r = qhx("bench " + kDefaultModel.string() + " --context-sweep --prompt-file " +
                       held_out + " --sweep-depths 64,200 --sweep-tokens 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  ASSERT_EQ(j["sweep"].size(), 2u) << r.out;
  EXPECT_EQ(j["sweep"][1]["depth"], 200);
  EXPECT_EQ(j["sweep"][1]["first_departure"], -1);  // the model against itself on the CPU
  EXPECT_TRUE(j["sweep"][1]["coherent"].get<bool>());
  const CliRun table = qhx("bench " + kDefaultModel.string() + " --context-sweep --prompt-file " +
                           held_out + " --sweep-depths 64 --sweep-tokens 2");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("never departs from the reference; coherent through depth 64"),
            std::string::npos)
      << table.out;
  expect_user_error(qhx("bench " + kDefaultModel.string() + " --context-sweep"),
                    {"--context-sweep", "--prompt-file"});
}

TEST(Cli, PerplexityOfATextFile) {
  test::TempDir dir;
  const fs::path text = dir.path() / "text.txt";
  std::ofstream(text) << "In the beginning God created the heaven and the earth. And the earth was "
                         "without form, and void; and darkness was upon the face of the deep.";
  CliRun r = qhx("perplexity -m " + kDefaultModel.string() + " -f " + text.string() +
                 " --window 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"perplexity\":"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"window\":8"), std::string::npos) << r.out;
  r = qhx("perplexity -m " + kDefaultModel.string() + " -f " + text.string() + " --max-tokens 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("over 4 tokens (1 windows of 512"), std::string::npos) << r.out;

  expect_user_error(qhx("perplexity -m " + kDefaultModel.string() + " -f " +
                        (dir.path() / "missing.txt").string()),
                    {"missing.txt", "cannot open"});
  std::ofstream(dir.path() / "one.txt") << "Hello";
  expect_user_error(
      qhx("perplexity -m " + kDefaultModel.string() + " -f " + (dir.path() / "one.txt").string()),
      {"perplexity", "fewer than two tokens"});
  expect_user_error(
      qhx("perplexity -m " + kDefaultModel.string() + " -f " + text.string() + " --window 100000"),
      {"window 100000", "context"});
}

TEST(Cli, PromptWithInvalidUtf8) {
  const CliRun r = qhx("generate --model " + kDefaultModel.string() +
                       " --prompt \"$(printf 'ok \\377 no')\" -n 4");
  expect_user_error(r, {"--prompt", "invalid UTF-8 at byte 3"});
  expect_user_error(qhx("tokenize --model " + kDefaultModel.string(), "ab\xC3"),
                    {"stdin", "invalid UTF-8 at byte 2"});
}

TEST(Cli, PromptLongerThanTheContext) {
  std::string ids = "1";
  for (int i = 0; i < 4100; ++i) ids += ",1";
  expect_user_error(qhx("generate --model " + kSmallModel.string() + " --prompt-ids " + ids +
                        " -n 4 --print-ids"),
                    {"prompt", "context"});
}

TEST(Cli, TokenIdOutsideTheVocabulary) {
  expect_user_error(
      qhx("generate --model " + kSmallModel.string() + " --prompt-ids 1,99999 -n 2 --print-ids"),
      {"99999", "vocabulary"});
}

TEST(Cli, ModelWithoutTokenizerNeedsIds) {
  expect_user_error(qhx("generate --model " + kSmallModel.string() + " --prompt hi -n 2"),
                    {"tokenizer.json", "--prompt-ids"});
}

// `qhx chat` reads turns from stdin: the second turn reuses the first, /regen runs no prompt
// token, and a saved chat continues after /load in a new process exactly as it did before.
TEST(Cli, ChatReusesTurnsAndSavesAndLoads) {
  test::TempDir tmp;
  const std::string saved = (tmp.path() / "chat").string();
  const std::string chat = "chat --model " + kDefaultModel.string() + " --greedy -n 8 --stats";
  const CliRun first =
      qhx(chat, "And it came to pass\n/regen\nWho begat whom?\n/save " + saved + "\nAmen.\n");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  const std::vector<std::string> replies = lines(first.out);
  ASSERT_EQ(replies.size(), 4u) << first.out;
  EXPECT_EQ(replies[0], replies[1]);  // greedy regeneration
  const std::vector<std::string> stats = lines(first.err);
  ASSERT_GE(stats.size(), 5u) << first.err;
  // Without -t the chat runs on every hardware thread the process may use.
  EXPECT_NE(stats[0].find("| threads " + std::to_string(hardware_threads()) + "]"),
            std::string::npos)
      << stats[0];
  EXPECT_NE(stats[2].find(", 0 processed"), std::string::npos) << stats[2];
  EXPECT_EQ(stats[3].find(" 0 reused"), std::string::npos) << stats[3];
  EXPECT_EQ(stats[4].find("saved "), 0u) << stats[4];

  const CliRun resumed = qhx(chat, "/load " + saved + "\nAmen.\n");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(resumed.out, replies[3] + "\n");
  EXPECT_NE(resumed.err.find("loaded 4 messages"), std::string::npos) << resumed.err;
  EXPECT_EQ(resumed.err.find(" 0 reused"), std::string::npos) << resumed.err;

  const CliRun missing = qhx(chat, "/load " + saved + "-missing\n");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find(saved + "-missing"), std::string::npos) << missing.err;
}

// Greedy chat replies are the same with prompt-lookup speculation, turn after turn.
TEST(Cli, ChatWithSpeculationGivesTheSameReplies) {
  const std::string chat = "chat --model " + kDefaultModel.string() + " --greedy -n 24";
  const std::string turns = "And it came to pass\nAnd it came to pass\nWho begat whom?\n";
  const CliRun plain = qhx(chat, turns);
  EXPECT_FALSE(plain.out.empty());
  const fs::path draft = test::source_dir() / "models/qwen3-kjv";
  for (const std::string& spec_flag : {std::string("ngram"), "draft:" + draft.string()}) {
    const CliRun spec = qhx(chat + " --speculative " + spec_flag + " --stats", turns);
    ASSERT_EQ(spec.exit_code, 0) << spec.err;
    EXPECT_EQ(spec.out, plain.out) << spec_flag;
    EXPECT_NE(spec.err.find("drafted accepted"), std::string::npos) << spec.err;  // drafts ran
  }
}

// Errors the chat can recover from leave the conversation as it was: a refused /load, a failed
// /save (which leaves no file), a line that is not UTF-8. The next turn still reuses the first;
// read from a script, the exit status says something failed.
TEST(Cli, ChatKeepsTheConversationOnErrors) {
  test::TempDir tmp;
  const std::string chat = "chat --model " + kDefaultModel.string() + " --greedy -n 4 --stats";
  const std::string input = "And it came to pass\n/load " + (tmp.path() / "missing").string() +
                            "\n/save /nonexistent/dir/chat\nbad \xff line\nAmen.\n";
  const CliRun r = qhx(chat, input);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  EXPECT_NE(r.err.find("missing.json: cannot open"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/dir/chat"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not valid UTF-8 (byte 5)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
  // The second turn's prompt reused the first turn.
  const size_t second = r.err.rfind("[prompt ");
  ASSERT_NE(second, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(" 0 reused", second), std::string::npos) << r.err;
}

// A conversation that outgrows the context goes on without its oldest turns.
TEST(Cli, FullContextDropsTheOldestTurns) {
  const std::string chat =
      "chat --model " + kDefaultModel.string() + " --greedy -n 24 -c 96 --system 'Be brief.'";
  std::string input;
  for (int i = 0; i < 6; ++i) input += "And the LORD spake unto Moses, saying, Speak unto them\n";
  const CliRun r = qhx(chat, input);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 6) << r.out;
  EXPECT_NE(r.err.find("[context full: the "), std::string::npos) << r.err;
}

// The real Qwen3.5 vocabulary and chat template in `qhx chat`: the second turn reuses the first.
TEST(Cli, ChatRunsOnTheFullQwen35Vocabulary) {
  const std::string chat = "chat --model " +
                           (test::source_dir() / "models/qwen3.5-tiny-random").string() +
                           " --greedy -n 6 --stats";
  const CliRun r = qhx(chat, "Hello\nName a colour.\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[qwen3.5-tiny-random | context 4096 | threads"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("prompt 13 tokens: 0 reused, 13 processed"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(" 0 reused", r.err.find("reply 6 tokens")), std::string::npos) << r.err;
}

}  // namespace
}  // namespace qhx
