// Sentence embeddings against transformers and sentence-transformers on the tiny Qwen3-Embedding
// fixture (tools/oracle/make_embedding_fixtures.py): token ids, last-token and mean pooling, the
// Matryoshka cut; through the C API as apps call it; the sentence-transformers files' errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "forge/convert.h"
#include "io/safetensors.h"
#include "qhx/qhx.h"
#include "runtime/embedding.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/json_file.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

const fs::path kFixture = test::source_dir() / "tests/fixtures/embedding/qwen3_tiny";
// transformers ran one left-padded batch in float32; qhx runs each input alone.
constexpr float kTolerance = 2e-5f;

struct Golden {
  std::vector<std::string> queries, documents, texts;
  std::string query_prompt;
  std::vector<std::vector<int32_t>> ids;
  int64_t truncate_dim = 0;
  std::vector<float> last_token, mean, truncated;  // [texts, dims]
};

std::vector<float> f32_tensor(const SafetensorsFile& file, const std::string& name) {
  const TensorView* t = file.find(name);
  if (t == nullptr || t->dtype != DType::kF32) throw std::runtime_error("golden tensor " + name);
  std::vector<float> out(t->numel());
  std::memcpy(out.data(), t->data, t->nbytes);
  return out;
}

const Golden& golden() {
  static const Golden g = [] {
    Golden g;
    const Json meta = read_json_file(kFixture / "golden.json");
    g.queries = meta["queries"].get<std::vector<std::string>>();
    g.documents = meta["documents"].get<std::vector<std::string>>();
    g.texts = meta["texts"].get<std::vector<std::string>>();
    g.query_prompt = meta["query_prompt"];
    g.ids = meta["ids"].get<std::vector<std::vector<int32_t>>>();
    g.truncate_dim = meta["truncate_dim"];
    const SafetensorsFile file = SafetensorsFile::open(kFixture / "golden.safetensors");
    g.last_token = f32_tensor(file, "last_token");
    g.mean = f32_tensor(file, "mean");
    g.truncated = f32_tensor(file, "truncated");
    return g;
  }();
  return g;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tolerance,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance) << what << " [" << i << "]";
  }
}

struct Opened {
  qhx_model* model = nullptr;
  qhx_session* session = nullptr;
  explicit Opened(const fs::path& dir = kFixture, int64_t prefill_chunk = 0,
                  int64_t context_length = 0) {
    EXPECT_EQ(qhx_model_open(dir.c_str(), nullptr, &model), QHX_OK) << qhx_last_error();
    qhx_session_options o;
    qhx_session_options_default(&o);
    if (prefill_chunk > 0) o.prefill_chunk = prefill_chunk;
    o.context_length = context_length;
    EXPECT_EQ(qhx_session_create(model, &o, &session), QHX_OK) << qhx_last_error();
  }
  ~Opened() {
    qhx_session_destroy(session);
    qhx_model_close(model);
  }
  Opened(const Opened&) = delete;
  Opened& operator=(const Opened&) = delete;

  // The texts' vectors, one after the other; the status must be QHX_OK.
  std::vector<float> embed(const std::vector<std::string>& texts, qhx_embed_options o) {
    std::vector<const char*> pointers;
    std::vector<size_t> lens;
    for (const std::string& t : texts) {
      pointers.push_back(t.c_str());
      lens.push_back(t.size());
    }
    qhx_embed_result result;
    EXPECT_EQ(
        qhx_embed(session, pointers.data(), lens.data(), texts.size(), &o, nullptr, 0, &result),
        texts.empty() ? QHX_OK : QHX_ERROR_BUFFER_TOO_SMALL);
    std::vector<float> out(texts.size() * result.dimensions);
    EXPECT_EQ(qhx_embed(session, pointers.data(), lens.data(), texts.size(), &o, out.data(),
                        out.size(), &result),
              QHX_OK)
        << qhx_last_error();
    return out;
  }
};

qhx_embed_options defaults() {
  qhx_embed_options o;
  qhx_embed_options_default(&o);
  return o;
}

TEST(Embedding, TokenIdsAreTransformers) {
  const Tokenizer tokenizer = Tokenizer::load(kFixture);
  const Golden& g = golden();
  ASSERT_EQ(g.texts.size(), g.ids.size());
  for (size_t i = 0; i < g.texts.size(); ++i) {
    EXPECT_EQ(tokenizer.encode_with_special_tokens(g.texts[i]), g.ids[i]) << g.texts[i];
  }
}

// The model card's computation: queries with the "query" prompt, documents with none.
TEST(Embedding, LastTokenVectorsAreTransformers) {
  const Golden& g = golden();
  Opened m;
  qhx_model_info info;
  ASSERT_EQ(qhx_model_get_info(m.model, &info), QHX_OK);
  EXPECT_STREQ(info.pooling, "last");
  const int64_t H = info.embedding_size;
  EXPECT_EQ(H, 64);
  qhx_embed_options query = defaults();
  query.prompt_name = "query";
  std::vector<float> got = m.embed(g.queries, query);
  const std::vector<float> documents = m.embed(g.documents, defaults());
  got.insert(got.end(), documents.begin(), documents.end());
  expect_near(got, g.last_token, kTolerance, "last-token vectors");
  for (size_t t = 0; t < g.texts.size(); ++t) {
    double norm = 0;
    for (int64_t k = 0; k < H; ++k) norm += got[t * H + k] * got[t * H + k];
    EXPECT_NEAR(norm, 1.0, 1e-6) << t;
  }
  // The prompt's own text instead of its name: the same input, the same vector, to the bit.
  qhx_embed_options text = defaults();
  text.prompt = g.query_prompt.c_str();
  EXPECT_EQ(m.embed(g.queries, text), std::vector<float>(got.begin(), got.begin() + 2 * H));
}

TEST(Embedding, MeanPoolingAndTheMatryoshkaCutAreTransformers) {
  const Golden& g = golden();
  Opened m;
  qhx_embed_options mean = defaults();
  mean.pooling = "mean";
  mean.normalize = 0;
  expect_near(m.embed(g.texts, mean), g.mean, kTolerance, "mean pooling");
  qhx_embed_options cut = defaults();
  cut.dimensions = g.truncate_dim;
  expect_near(m.embed(g.texts, cut), g.truncated, kTolerance, "first dimensions");
}

// Within the CPU backend a vector does not depend on how the input is cut into passes, nor on
// whether it came as text or as its ids.
TEST(Embedding, ChunksAndTokenInputGiveTheSameBits) {
  const Golden& g = golden();
  const std::vector<float> whole = Opened().embed(g.texts, defaults());
  EXPECT_EQ(Opened(kFixture, /*prefill_chunk=*/7).embed(g.texts, defaults()), whole);

  Opened m;
  std::vector<int32_t> ids;
  std::vector<size_t> offsets = {0};
  for (const auto& row : g.ids) {
    ids.insert(ids.end(), row.begin(), row.end());
    offsets.push_back(ids.size());
  }
  std::vector<float> out(whole.size());
  qhx_embed_result result;
  const qhx_embed_options o = defaults();
  ASSERT_EQ(qhx_embed_tokens(m.session, ids.data(), offsets.data(), g.ids.size(), &o, out.data(),
                             out.size(), &result),
            QHX_OK)
      << qhx_last_error();
  EXPECT_EQ(out, whole);
  EXPECT_EQ(result.n_tokens, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(result.dimensions, 64);
}

// A generative checkpoint has no pooling of its own: it embeds when asked how.
TEST(Embedding, GenerativeModelsNeedAPooling) {
  Opened m(test::source_dir() / "models/qwen3-kjv");
  qhx_model_info info;
  ASSERT_EQ(qhx_model_get_info(m.model, &info), QHX_OK);
  EXPECT_STREQ(info.pooling, "");
  const char* text = "In the beginning";
  const qhx_embed_options o = defaults();
  std::vector<float> out(info.embedding_size);
  EXPECT_EQ(qhx_embed(m.session, &text, nullptr, 1, &o, out.data(), out.size(), nullptr),
            QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("is not an embedding checkpoint"), std::string::npos)
      << qhx_last_error();
  qhx_embed_options last = defaults();
  last.pooling = "last";
  ASSERT_EQ(qhx_embed(m.session, &text, nullptr, 1, &last, out.data(), out.size(), nullptr), QHX_OK)
      << qhx_last_error();
  double norm = 0;
  for (const float v : out) norm += v * v;
  EXPECT_NEAR(norm, 1.0, 1e-5);  // normalized unless told otherwise
}

TEST(Embedding, BadRequestsAreNamed) {
  Opened m(kFixture, 0, /*context_length=*/16);
  const std::string long_text(200, 'a');
  const char* texts[] = {"short", long_text.c_str()};
  std::vector<float> out(2 * 64);
  const auto error = [&](qhx_embed_options o, size_t n = 2) {
    const qhx_status s =
        qhx_embed(m.session, texts, nullptr, n, &o, out.data(), out.size(), nullptr);
    return std::to_string(s) + " " + qhx_last_error();
  };
  qhx_embed_options o = defaults();
  EXPECT_NE(error(o).find("4 input[1]: context: "), std::string::npos) << error(o);
  o.pooling = "max";
  EXPECT_NE(error(o, 1).find("1 pooling: 'max' is not last, mean or cls"), std::string::npos);
  o = defaults();
  o.dimensions = 65;
  EXPECT_NE(error(o, 1).find("dimensions: must be 0 (all) or 1..64, got 65"), std::string::npos);
  o = defaults();
  o.prompt_name = "passage";
  EXPECT_NE(error(o, 1).find("'passage' is not one of the model's prompts (document, query)"),
            std::string::npos)
      << error(o, 1);
  o.prompt = "x";
  EXPECT_NE(error(o, 1).find("give prompt or prompt_name, not both"), std::string::npos);
  // Too small a buffer: the size needed, nothing run.
  qhx_embed_result result;
  o = defaults();
  EXPECT_EQ(qhx_embed(m.session, texts, nullptr, 1, &o, out.data(), 10, &result),
            QHX_ERROR_BUFFER_TOO_SMALL);
  EXPECT_EQ(result.dimensions, 64);
  // An empty token input.
  const size_t offsets[] = {0, 0};
  EXPECT_EQ(qhx_embed_tokens(m.session, nullptr, offsets, 1, &o, out.data(), out.size(), nullptr),
            QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("input[0]: tokens: none to embed"),
            std::string::npos)
      << qhx_last_error();
}

// A copy of the fixture with `edit` applied to the files it names (name -> new JSON).
struct EditedFixture {
  test::TempDir dir;
  explicit EditedFixture(const std::vector<std::pair<std::string, Json>>& edits) {
    fs::copy(kFixture, dir.path(), fs::copy_options::recursive);
    for (const auto& [name, json] : edits) std::ofstream(dir.path() / name) << json.dump();
  }
};

// What a failed call leaves behind is an empty state: the session generates as a fresh one.
TEST(Embedding, AFailedCallLeavesTheSessionAsNew) {
  Opened m(kFixture, /*prefill_chunk=*/7);
  std::vector<int32_t> ids = golden().ids[1];
  ids.push_back(99999);  // outside the vocabulary, after several chunks' worth of good ids
  const size_t offsets[] = {0, ids.size()};
  std::vector<float> out(64);
  const qhx_embed_options o = defaults();
  EXPECT_EQ(
      qhx_embed_tokens(m.session, ids.data(), offsets, 1, &o, out.data(), out.size(), nullptr),
      QHX_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qhx_last_error()).find("input[0]: tokens[44]: 99999 is outside"),
            std::string::npos)
      << qhx_last_error();
  const auto reply = [](qhx_model* model, qhx_session* session) {
    qhx_generate_options g;
    qhx_generate_options_default(model, &g);
    g.max_new_tokens = 8;
    g.sampling.greedy = 1;
    g.stop_at_eos = 0;
    const int32_t prompt[] = {5, 6, 7};
    qhx_generate_result result;
    EXPECT_EQ(qhx_session_generate(session, prompt, 3, &g, nullptr, nullptr, &result), QHX_OK)
        << qhx_last_error();
    const std::string text = result.text;
    qhx_string_free(result.text);
    return text + "/" + std::to_string(result.n_reused);
  };
  Opened fresh;
  EXPECT_EQ(reply(m.model, m.session), reply(fresh.model, fresh.session));
}

// An untied base model saved without its head (as Qwen3-Embedding-8B's shape is) embeds; asked
// for tokens, it says why it has none.
TEST(Embedding, HeadlessUntiedCheckpointsEmbedButDoNotGenerate) {
  Json config = read_json_file(kFixture / "config.json");
  config["tie_word_embeddings"] = false;
  const EditedFixture untied({{"config.json", config}});
  const Golden& g = golden();
  Opened m(untied.dir.path());
  expect_near(m.embed(g.documents, defaults()),
              std::vector<float>(g.last_token.begin() + 2 * 64, g.last_token.end()), kTolerance,
              "untied, headless");
  qhx_generate_options o;
  qhx_generate_options_default(m.model, &o);
  const int32_t prompt[] = {5, 6, 7};
  EXPECT_NE(qhx_session_generate(m.session, prompt, 3, &o, nullptr, nullptr, nullptr), QHX_OK);
  EXPECT_NE(std::string(qhx_last_error()).find("has no lm_head.weight"), std::string::npos)
      << qhx_last_error();
}

// sentence_bert_config.json's max_seq_length cuts a text as sentence-transformers does: its ids
// first, <|endoftext|> kept (the oracle checks that sentence-transformers cuts so).
TEST(Embedding, LongTextsAreCutToMaxSeqLength) {
  const EditedFixture short_inputs(
      {{"sentence_bert_config.json", Json{{"max_seq_length", 16}, {"do_lower_case", false}}}});
  Opened m(short_inputs.dir.path());
  const Golden& g = golden();
  const std::string& text = g.documents[1];  // 55 ids with <|endoftext|>
  const char* texts[] = {text.c_str(), "short"};
  std::vector<float> out(2 * 64);
  qhx_embed_result result;
  const qhx_embed_options o = defaults();
  ASSERT_EQ(qhx_embed(m.session, texts, nullptr, 2, &o, out.data(), out.size(), &result), QHX_OK)
      << qhx_last_error();
  EXPECT_EQ(result.n_truncated, 1);
  std::vector<int32_t> cut(g.ids[3].begin(), g.ids[3].begin() + 15);
  cut.push_back(g.ids[3].back());
  const size_t offsets[] = {0, cut.size()};
  std::vector<float> want(64);
  ASSERT_EQ(
      qhx_embed_tokens(m.session, cut.data(), offsets, 1, &o, want.data(), want.size(), nullptr),
      QHX_OK);
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 64), want);
}

TEST(Embedding, CancelledBetweenPasses) {
  const std::unique_ptr<Model> model = load_model(kFixture);
  const std::unique_ptr<ModelState> state = model->new_state();
  const std::atomic<bool> cancel{true};
  const std::vector<int32_t> ids = golden().ids[0];
  EXPECT_EQ(embed_tokens(*model, *state, ids, {.cancel = &cancel}), std::nullopt);
  const std::atomic<bool> go{false};
  EXPECT_TRUE(embed_tokens(*model, *state, ids, {.cancel = &go}).has_value());
}

// A bundle carries the checkpoint's pooling, normalization and prompts in its manifest: an f32
// one embeds as the checkpoint does; W8 (int8 activations) stays close to it.
TEST(Embedding, BundlesEmbedAsTheirCheckpoint) {
  const Golden& g = golden();
  const test::TempDir dir;
  for (const DType weights : {DType::kF32, DType::kW8}) {
    const fs::path bundle = dir.path() / std::string(dtype_name(weights));
    ConvertOptions options;
    options.weights = weights;
    options.gate = false;  // random weights: the logit gate says nothing about vectors
    forge_convert(kFixture, bundle, options);
    Opened m(bundle);
    qhx_model_info info;
    ASSERT_EQ(qhx_model_get_info(m.model, &info), QHX_OK);
    EXPECT_STREQ(info.pooling, "last");
    qhx_embed_options query = defaults();
    query.prompt_name = "query";
    std::vector<float> got = m.embed(g.queries, query);
    const std::vector<float> documents = m.embed(g.documents, defaults());
    got.insert(got.end(), documents.begin(), documents.end());
    if (weights == DType::kF32) {
      expect_near(got, g.last_token, kTolerance, "f32 bundle");
      continue;
    }
    for (size_t t = 0; t < g.texts.size(); ++t) {
      double dot = 0;
      for (size_t k = 0; k < 64; ++k) dot += got[t * 64 + k] * g.last_token[t * 64 + k];
      EXPECT_GT(dot, 0.99) << "W8 bundle, text " << t;  // unit vectors: the cosine
    }
  }
}

// The sentence-transformers files: what would give other vectors than theirs is refused by name.
TEST(EmbeddingConfig, FilesThatWouldChangeTheVectorsAreRefused) {
  const auto with = [](const Json& modules, const Json& pooling) {
    test::TempDir dir;
    fs::create_directories(dir.path() / "1_Pooling");
    std::ofstream(dir.path() / "modules.json") << modules.dump();
    std::ofstream(dir.path() / "1_Pooling/config.json") << pooling.dump();
    try {
      read_embedding_config(dir.path());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const Json transformer = {{"type", "sentence_transformers.models.Transformer"}, {"path", ""}};
  const Json pool = {{"type", "sentence_transformers.models.Pooling"}, {"path", "1_Pooling"}};
  const Json normalize = {{"type", "sentence_transformers.models.Normalize"}, {"path", "2"}};
  const Json dense = {{"type", "sentence_transformers.models.Dense"}, {"path", "2_Dense"}};
  const Json last = {{"pooling_mode_lasttoken", true}, {"include_prompt", true}};
  EXPECT_EQ(with({transformer, pool, normalize}, last), "");
  EXPECT_NE(with({transformer, pool, dense, normalize}, last)
                .find("modules.json: [2]: type: 'sentence_transformers.models.Dense' here is not "
                      "supported"),
            std::string::npos);
  EXPECT_NE(with({transformer, normalize}, last).find("[1]: type: "), std::string::npos);
  EXPECT_NE(with({transformer, pool}, {{"pooling_mode_max_tokens", true}})
                .find("1_Pooling/config.json: pooling_mode_max_tokens: this pooling is not"),
            std::string::npos);
  EXPECT_NE(with({transformer, pool},
                 {{"pooling_mode_lasttoken", true}, {"pooling_mode_mean_tokens", true}})
                .find("concatenated poolings are not supported"),
            std::string::npos);
  EXPECT_NE(with({transformer, pool}, {{"pooling_mode_mean_tokens", false}})
                .find("no pooling mode is true"),
            std::string::npos);
  EXPECT_NE(
      with({transformer, pool}, {{"pooling_mode_mean_tokens", true}, {"include_prompt", false}})
          .find("include_prompt: false is supported with last-token pooling only"),
      std::string::npos);
  EXPECT_NE(with({transformer, pool}, {{"pooling_mode_lasttoken", true}, {"include_prompt", 0}})
                .find("include_prompt: expected true or false"),
            std::string::npos);
  {
    test::TempDir dir;
    fs::create_directories(dir.path() / "1_Pooling");
    std::ofstream(dir.path() / "modules.json") << Json{transformer, pool}.dump();
    std::ofstream(dir.path() / "1_Pooling/config.json") << last.dump();
    std::ofstream(dir.path() / "sentence_bert_config.json") << R"({"do_lower_case": true})";
    test::expect_error([&] { read_embedding_config(dir.path()); },
                       {"sentence_bert_config.json: do_lower_case: true is not supported"});
    std::ofstream(dir.path() / "sentence_bert_config.json") << R"({"max_seq_length": 0})";
    test::expect_error([&] { read_embedding_config(dir.path()); },
                       {"sentence_bert_config.json: max_seq_length: expected a positive integer"});
    fs::remove(dir.path() / "sentence_bert_config.json");
    std::ofstream(dir.path() / "config_sentence_transformers.json")
        << R"({"prompts": {"query": "Q:"}, "default_prompt_name": "passage"})";
    test::expect_error(
        [&] { read_embedding_config(dir.path()); },
        {"config_sentence_transformers.json: default_prompt_name: 'passage' is not one of its"});
  }
  EXPECT_NE(with({transformer, pool}, {{"pooling_mode_cls_token", "yes"}})
                .find("pooling_mode_cls_token: expected true or false"),
            std::string::npos);

  const EmbeddingConfig fixture = read_embedding_config(kFixture);
  EXPECT_EQ(fixture.pooling, Pooling::kLastToken);
  EXPECT_TRUE(fixture.normalize);
  EXPECT_EQ(fixture.prompt("query"), golden().query_prompt);
  EXPECT_EQ(fixture.prompt("document"), "");
  EXPECT_EQ(fixture.max_seq_length, 512);
  EXPECT_EQ(read_embedding_config(test::source_dir() / "models/qwen3-kjv").pooling, std::nullopt);
}

}  // namespace
}  // namespace qhx
