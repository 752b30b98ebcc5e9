#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "support/fixtures.h"
#include "util/error.h"
#include "util/json_file.h"

namespace qhx {
namespace {

std::filesystem::path fixture_dir(const std::string& family) {
  return test::tokenizer_fixture_dir(family);
}

std::filesystem::path qwen3_dir() {
  return fixture_dir("qwen3");
}

const Tokenizer& tokenizer(const std::string& family) {
  static const Tokenizer qwen3 = Tokenizer::load(fixture_dir("qwen3"));
  static const Tokenizer qwen3_5 = Tokenizer::load(fixture_dir("qwen3_5"));
  return family == "qwen3" ? qwen3 : qwen3_5;
}

const Tokenizer& qwen3() {
  return tokenizer("qwen3");
}

const Json& qwen3_tokenizer_json() {
  static const Json json = read_json_file(qwen3_dir() / "tokenizer.json");
  return json;
}

struct Case {
  std::string label;  // "id" of cases.jsonl, "name" of chat.jsonl
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;       // decode(ids)
  std::string decoded_skip;  // decode(ids, skip_special=true)
};

std::vector<Case> read_cases(const std::string& family, const std::string& name) {
  const std::filesystem::path path = fixture_dir(family) / name;
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::vector<Case> cases;
  std::string line;
  for (int64_t n = 0; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const Json j = parse_json(line, path.string());
    Case c;
    c.label = j.contains("id") ? std::to_string(j["id"].get<int64_t>())
                               : j.value("name", std::to_string(n));
    c.text = j["text"].get<std::string>();
    c.ids = j["ids"].get<std::vector<int32_t>>();
    c.decoded = j.value("decoded", c.text);
    c.decoded_skip = j.value("decoded_skip_special", c.decoded);
    cases.push_back(std::move(c));
  }
  return cases;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string out;
  for (const int32_t id : ids) {
    out += out.empty() ? "[" : ",";
    out += std::to_string(id);
  }
  return out.empty() ? "[]" : out + "]";
}

// The genuine Qwen3 and Qwen3.5 tokenizers against Hugging Face's ids for them.
class TokenizerCases : public testing::TestWithParam<std::string> {
 protected:
  const Tokenizer& tok() const { return tokenizer(GetParam()); }

  // Encodes every case and reports all mismatches in one message.
  void expect_encodes(const std::vector<Case>& cases) const {
    ASSERT_FALSE(cases.empty());
    std::ostringstream failures;
    int failed = 0;
    for (const Case& c : cases) {
      const std::vector<int32_t> got = tok().encode(c.text);
      if (got != c.ids) {
        ++failed;
        failures << "\n  " << c.label << ": expected " << join(c.ids) << " got " << join(got);
      }
    }
    EXPECT_EQ(failed, 0) << failed << " of " << cases.size() << " cases fail:" << failures.str();
  }
};

INSTANTIATE_TEST_SUITE_P(Families, TokenizerCases, testing::Values("qwen3", "qwen3_5"));

TEST_P(TokenizerCases, EncodeMatchesReference) {
  expect_encodes(read_cases(GetParam(), "cases.jsonl"));
}

TEST_P(TokenizerCases, EncodeChatTextsMatchesReference) {
  expect_encodes(read_cases(GetParam(), "chat.jsonl"));
}

TEST_P(TokenizerCases, DecodeMatchesReference) {
  const std::vector<Case> cases = read_cases(GetParam(), "cases.jsonl");
  ASSERT_FALSE(cases.empty());
  std::ostringstream failures;
  for (const Case& c : cases) {
    if (tok().decode(c.ids) != c.decoded) failures << " " << c.label;
    if (tok().decode(c.ids, true) != c.decoded_skip) failures << " " << c.label << "(skip_special)";
  }
  EXPECT_EQ(failures.str(), "") << "decode fails for ids:" << failures.str();
}

TEST_P(TokenizerCases, StreamingMatchesDecode) {
  const std::vector<Case> cases = read_cases(GetParam(), "cases.jsonl");
  ASSERT_FALSE(cases.empty());
  std::ostringstream failures;
  for (const bool skip : {false, true}) {
    for (const Case& c : cases) {
      StreamingDecoder stream(tok(), skip);
      std::string text;
      for (const int32_t id : c.ids) text += stream.push(id);
      text += stream.flush();
      if (text != (skip ? c.decoded_skip : c.decoded)) {
        failures << " " << c.label << (skip ? "(skip_special)" : "");
      }
    }
  }
  EXPECT_EQ(failures.str(), "") << "streaming decode fails for ids:" << failures.str();
}

TEST(Tokenizer, Metadata) {
  const Tokenizer& tok = qwen3();
  EXPECT_EQ(tok.size(), 151669);
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_EQ(tok.pad_id(), 151643);
  EXPECT_EQ(tok.bos_id(), std::nullopt);
  EXPECT_FALSE(tok.add_bos_token());
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(tok.token_to_id("<think>"), 151667);
  EXPECT_EQ(tok.token_to_id("Ġthe"), 279);
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  EXPECT_TRUE(tok.is_special(151643));
  EXPECT_FALSE(tok.is_special(151667));  // <think> is added but not special
  EXPECT_FALSE(tok.is_special(279));
  EXPECT_EQ(tok.token_bytes(279), " the");
  EXPECT_EQ(tok.token_bytes(151644), "<|im_start|>");
  EXPECT_THROW(tok.token_bytes(151669), Error);
  EXPECT_THROW(tok.token_bytes(-1), Error);
}

TEST(Tokenizer, Qwen35Metadata) {
  const Tokenizer& tok = tokenizer("qwen3_5");
  EXPECT_EQ(tok.size(), 248077);
  EXPECT_EQ(tok.eos_id(), 248046);
  EXPECT_EQ(tok.pad_id(), 248044);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 248046);
  EXPECT_EQ(tok.token_to_id("<think>"), 248068);
  EXPECT_FALSE(tok.is_special(248068));
  // The 7 audio tokens only tokenizer_config.json's added_tokens_decoder lists, with its flags.
  EXPECT_EQ(tok.token_to_id("<|audio_start|>"), 248070);
  EXPECT_EQ(tok.token_to_id("<|audio_pad|>"), 248076);
  EXPECT_TRUE(tok.is_special(248070));
  EXPECT_EQ(tok.encode("a<|audio_start|>b"), (std::vector<int32_t>{64, 248070, 65}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{64, 248070, 65}, true), "ab");
}

// Hugging Face's NFC uses Unicode 9.0 tables: every string whose normalization depends on the
// table version (tests/fixtures/tokenizer/nfc, made by tokenizers itself) comes back from an
// encode and decode as tokenizers normalized it.
TEST(Tokenizer, NfcIsHuggingFaces) {
  const std::filesystem::path path =
      test::source_dir() / "tests/fixtures/tokenizer/nfc/cases.jsonl";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  int checked = 0, failed = 0;
  std::ostringstream failures;
  for (std::string line; std::getline(in, line); ++checked) {
    const Json j = parse_json(line, path.string());
    const std::string text = j["text"].get<std::string>(), nfc = j["nfc"].get<std::string>();
    const std::string got = tokenizer("qwen3_5").decode(tokenizer("qwen3_5").encode(text));
    if (got != nfc && ++failed <= 10)
      failures << "\n  " << j["text"].dump() << " -> " << Json(got).dump();
  }
  EXPECT_GT(checked, 5000);
  EXPECT_EQ(failed, 0) << failures.str();
}

TEST(Tokenizer, SkipSpecialKeepsNonSpecialAddedTokens) {
  const std::vector<int32_t> ids = {151644, 151667, 271, 151668, 151645};
  EXPECT_EQ(qwen3().decode(ids, true), "<think>\n\n</think>");
  EXPECT_EQ(qwen3().decode(ids), "<|im_start|><think>\n\n</think><|im_end|>");
}

TEST(Tokenizer, DecodeSkipsUnknownIds) {
  const std::vector<int32_t> ids = {9707, 151900, -5, 1879};
  EXPECT_EQ(qwen3().decode(ids), "Hello world");
}

TEST(Tokenizer, WhitespaceIsUnicodeWhiteSpace) {
  // U+180E is a format character, not White_Space, so " \u180E" is one piece through
  // " ?[^\s\p{L}\p{N}]+"; PCRE2's own \s would take U+180E and split the space off.
  // Ids from Hugging Face tokenizers 0.23.3.
  EXPECT_EQ(qwen3().encode("x \u180E1"), (std::vector<int32_t>{87, 86089, 254, 236, 16}));
}

TEST(Tokenizer, InvalidUtf8IsRejected) {
  try {
    qwen3().encode("ab\xFF", "user message");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "user message: invalid UTF-8 at byte 2");
  }
  EXPECT_THROW(qwen3().encode("\xED\xA0\x80"), Error);  // a UTF-16 surrogate
  EXPECT_THROW(qwen3().encode("\xC0\xAF"), Error);      // overlong
  EXPECT_THROW(qwen3().encode("x\xE2\x82"), Error);     // truncated
}

// Byte-level spelling of raw bytes, through the byte table of MODELS.md §4.2.
std::string spelling(std::string_view bytes) {
  const auto same = [](int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  };
  std::string out;
  for (const char c : bytes) {
    const int b = static_cast<uint8_t>(c);
    int code = b;
    if (!same(b)) {
      code = 256;
      for (int x = 0; x < b; ++x) code += same(x) ? 0 : 1;
    }
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }
  return out;
}

int32_t byte_token(uint8_t b) {
  const std::optional<int32_t> id =
      qwen3().token_to_id(spelling(std::string(1, static_cast<char>(b))));
  EXPECT_TRUE(id.has_value()) << "no token for byte " << int{b};
  return id.value_or(0);
}

std::vector<int32_t> byte_tokens(std::string_view bytes) {
  std::vector<int32_t> ids;
  for (const char c : bytes) ids.push_back(byte_token(static_cast<uint8_t>(c)));
  return ids;
}

TEST(Tokenizer, DecodeReplacesLikePython) {
  // Expected strings are what bytes.decode("utf-8", errors="replace") gives in Python.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(qwen3().decode(byte_tokens("\xE2\x82\xAC")), "\xE2\x82\xAC");
  EXPECT_EQ(qwen3().decode(byte_tokens("\xE2\x82")), r);
  EXPECT_EQ(qwen3().decode(byte_tokens("\xE2\x82"
                                       "A")),
            r + "A");
  EXPECT_EQ(qwen3().decode(byte_tokens("\xE0\x80")), r + r);
  EXPECT_EQ(qwen3().decode(byte_tokens("\xED\xA0\x80")), r + r + r);
  EXPECT_EQ(qwen3().decode(byte_tokens("\xF0\x9F\x98"
                                       "A\xFF")),
            r + "A" + r);
  EXPECT_EQ(qwen3().decode(byte_tokens("\xF4\x90\x80\x80")), r + r + r + r);
  EXPECT_EQ(qwen3().decode(byte_tokens("\xC3\xA9\x80")), "\xC3\xA9" + r);
}

TEST(Tokenizer, StreamingHoldsIncompleteSequences) {
  StreamingDecoder stream(qwen3());
  const std::vector<int32_t> euro = byte_tokens("\xE2\x82\xAC");
  EXPECT_EQ(stream.push(9707), "Hello");
  EXPECT_EQ(stream.push(euro[0]), "");
  EXPECT_EQ(stream.push(euro[1]), "");
  EXPECT_EQ(stream.push(euro[2]), "\xE2\x82\xAC");
  EXPECT_EQ(stream.push(euro[0]), "");
  EXPECT_EQ(stream.push(1879), "\xEF\xBF\xBD world");  // the sequence can no longer complete
  EXPECT_EQ(stream.push(euro[0]), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.flush(), "");
}

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "qhx_tok_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  std::filesystem::path path_;
};

// The message of the Error that loading `dir` throws, or "" when it loads.
std::string load_error(const std::filesystem::path& dir) {
  try {
    Tokenizer::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerLoad, DirectoryWithOnlyTokenizerJsonLoads) {
  TempDir dir;
  std::filesystem::copy_file(qwen3_dir() / "tokenizer.json", dir.path() / "tokenizer.json");
  const Tokenizer tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(tok.eos_id(), std::nullopt);
  EXPECT_EQ(tok.chat_template(), "");
}

TEST(TokenizerLoad, ChatTemplateJinjaOverridesConfig) {
  TempDir dir;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(qwen3_dir() / name, dir.path() / name);
  }
  dir.write("chat_template.jinja", "{{ messages }}");
  const Tokenizer tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.chat_template(), "{{ messages }}");
  EXPECT_EQ(tok.eos_id(), 151645);
}

TEST(TokenizerLoad, MissingModelIsNamed) {
  TempDir dir;
  Json json = qwen3_tokenizer_json();
  json.erase("model");
  dir.write("tokenizer.json", json.dump());
  const std::string error = load_error(dir.path());
  EXPECT_NE(error.find((dir.path() / "tokenizer.json").string()), std::string::npos) << error;
  EXPECT_NE(error.find("model: missing"), std::string::npos) << error;
}

TEST(TokenizerLoad, BadJsonIsAnError) {
  TempDir dir;
  dir.write("tokenizer.json", "{\"model\": {");
  const std::string error = load_error(dir.path());
  EXPECT_NE(error.find("tokenizer.json"), std::string::npos) << error;
  EXPECT_NE(error.find("invalid JSON"), std::string::npos) << error;
}

TEST(TokenizerLoad, MissingFileIsAnError) {
  TempDir dir;
  EXPECT_NE(load_error(dir.path()).find("tokenizer.json: cannot open"), std::string::npos);
}

TEST(TokenizerLoad, UnsupportedShapesAreNamed) {
  const auto error_for = [](const std::function<void(Json&)>& edit) {
    TempDir dir;
    Json json = {{"model", {{"type", "BPE"}, {"vocab", Json::object()}, {"merges", Json::array()}}},
                 {"normalizer", {{"type", "NFC"}}},
                 {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                 {"decoder", {{"type", "ByteLevel"}}}};
    // A minimal byte-level vocabulary: Qwen3's first 256 tokens, one per byte.
    const Json& full = qwen3_tokenizer_json()["model"]["vocab"];
    for (auto it = full.begin(); it != full.end(); ++it) {
      if (it.value().get<int32_t>() < 256) json["model"]["vocab"][it.key()] = it.value();
    }
    edit(json);
    dir.write("tokenizer.json", json.dump());
    return load_error(dir.path());
  };

  EXPECT_EQ(error_for([](Json&) {}), "");
  EXPECT_NE(error_for([](Json& j) {
              j["model"]["type"] = "WordPiece";
            }).find("tokenizer.json: model.type: unsupported 'WordPiece', expected BPE"),
            std::string::npos);
  EXPECT_NE(error_for([](Json& j) {
              j["normalizer"]["type"] = "NFKC";
            }).find("normalizer.type: unsupported 'NFKC'"),
            std::string::npos);
  EXPECT_NE(error_for([](Json& j) {
              j["pre_tokenizer"] = {{"type", "Whitespace"}};
            }).find("pre_tokenizer.type: unsupported 'Whitespace'"),
            std::string::npos);
  EXPECT_NE(error_for([](Json& j) {
              j["model"]["vocab"].erase("A");
            }).find("model.vocab: no token for byte 65"),
            std::string::npos);
  EXPECT_NE(error_for([](Json& j) {
              j["model"]["merges"] = Json::array({Json::array({"A", "B"})});
            }).find("model.merges[0]: 'A' + 'B': token not in model.vocab"),
            std::string::npos);
  const std::string bad_regex = error_for([](Json& j) {
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", "(\\p{L}"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  });
  EXPECT_NE(bad_regex.find("pre_tokenizer.pretokenizers[0].pattern.Regex: bad regex at offset"),
            std::string::npos)
      << bad_regex;
  EXPECT_NE(bad_regex.find("missing closing parenthesis"), std::string::npos) << bad_regex;
}

TEST(TokenizerLoad, AddedTokensDecoderMustAgreeWithTokenizerJson) {
  TempDir dir;
  std::filesystem::copy_file(qwen3_dir() / "tokenizer.json", dir.path() / "tokenizer.json");
  Json config = read_json_file(qwen3_dir() / "tokenizer_config.json");
  config["added_tokens_decoder"]["151645"]["content"] = "<|im_stop|>";
  dir.write("tokenizer_config.json", config.dump());
  const std::string error = load_error(dir.path());
  EXPECT_NE(error.find("tokenizer_config.json: added_tokens_decoder.151645.content: "
                       "'<|im_stop|>' disagrees with tokenizer.json's added tokens"),
            std::string::npos)
      << error;
  config["added_tokens_decoder"].erase("151645");
  config["added_tokens_decoder"]["x"] = {{"content", "<x>"}};
  dir.write("tokenizer_config.json", config.dump());
  EXPECT_NE(load_error(dir.path()).find("added_tokens_decoder.x: expected a token id"),
            std::string::npos);
}

// tokenizer.json's post_processor: what encode_with_special_tokens adds (Hugging Face's
// add_special_tokens=True), composed in a Sequence's order; shapes that would add something else
// are refused by name.
TEST(TokenizerLoad, PostProcessorTemplates) {
  const Tokenizer genuine = Tokenizer::load(qwen3_dir());  // ByteLevel: adds nothing
  EXPECT_EQ(genuine.encode_with_special_tokens("Hello world"), genuine.encode("Hello world"));

  const auto special = [](const std::string& name) {
    return Json{{"SpecialToken", {{"id", name}, {"type_id", 0}}}};
  };
  const Json sequence = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const Json specials = {
      {"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {151643}}, {"tokens", {"x"}}}},
      {"<|im_start|>", {{"id", "<|im_start|>"}, {"ids", {151644}}, {"tokens", {"x"}}}}};
  const auto with_processor = [&](const Json& processor, TempDir& dir) {
    Json json = qwen3_tokenizer_json();
    json["post_processor"] = processor;
    dir.write("tokenizer.json", json.dump());
  };
  {
    TempDir dir;
    const Json appends = {{"type", "TemplateProcessing"},
                          {"single", {sequence, special("<|endoftext|>")}},
                          {"special_tokens", specials}};
    const Json wraps = {{"type", "TemplateProcessing"},
                        {"single", {special("<|im_start|>"), sequence, special("<|im_start|>")}},
                        {"special_tokens", specials}};
    with_processor(
        {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, appends, wraps}}}, dir);
    const Tokenizer tok = Tokenizer::load(dir.path());
    EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
    EXPECT_EQ(tok.encode_with_special_tokens("Hello world"),
              (std::vector<int32_t>{151644, 9707, 1879, 151643, 151644}));
    EXPECT_EQ(tok.encode_with_special_tokens(""), (std::vector<int32_t>{151644, 151643, 151644}));
    // Cut as tokenizer(..., truncation=True, max_length=N): the text's ids go, the special
    // tokens stay.
    bool cut = false;
    EXPECT_EQ(tok.encode_with_special_tokens("Hello world", "text", 4, &cut),
              (std::vector<int32_t>{151644, 9707, 151643, 151644}));
    EXPECT_TRUE(cut);
    EXPECT_EQ(tok.encode_with_special_tokens("Hello world", "text", 5, &cut).size(), 5u);
    EXPECT_FALSE(cut);
  }
  // A post-processor qhx cannot follow leaves the tokenizer loading (generation adds no special
  // tokens); what would add them says why not.
  const auto error_for = [&](const Json& processor) {
    TempDir dir;
    with_processor(processor, dir);
    EXPECT_EQ(load_error(dir.path()), "");
    const Tokenizer tok = Tokenizer::load(dir.path());
    EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
    try {
      tok.encode_with_special_tokens("Hello world", "input[0]");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_for({{"type", "RobertaProcessing"}})
                .find("tokenizer.json: post_processor.type: unsupported 'RobertaProcessing'"),
            std::string::npos);
  EXPECT_NE(error_for({{"type", "TemplateProcessing"},
                       {"single", {sequence, special("<eos>")}},
                       {"special_tokens", specials}})
                .find("post_processor.special_tokens.<eos>: missing"),
            std::string::npos);
  Json unknown = specials;
  unknown["<|endoftext|>"]["ids"] = {999999};
  EXPECT_NE(error_for({{"type", "TemplateProcessing"},
                       {"single", {sequence, special("<|endoftext|>")}},
                       {"special_tokens", unknown}})
                .find("special_tokens.<|endoftext|>.ids[0]: no token has id 999999"),
            std::string::npos);
  EXPECT_NE(error_for({{"type", "Sequence"},
                       {"processors",
                        {{{"type", "TemplateProcessing"},
                          {"single", {special("<|endoftext|>")}},
                          {"special_tokens", specials}}}}})
                .find("post_processor.processors[0].single: has no {\"Sequence\""),
            std::string::npos);
}

// The streaming reader names the entry of the big tables that is wrong.
TEST(TokenizerLoad, BadTableEntriesAreNamed) {
  const auto error_for = [](const std::string& model_tables, const std::string& type = "BPE") {
    TempDir dir;
    Json json = qwen3_tokenizer_json();
    json.erase("model");
    std::string text = json.dump();
    text.insert(1, "\"model\": {\"type\": \"" + type + "\", " + model_tables + "}, ");
    dir.write("tokenizer.json", text);
    return load_error(dir.path());
  };
  const std::string bytes = [] {
    std::string out;
    for (int b = 0; b < 256; ++b) {
      out += (b ? ", " : "") + Json(spelling(std::string(1, static_cast<char>(b)))).dump() + ": " +
             std::to_string(b);
    }
    return out;
  }();
  const std::string vocab = "\"vocab\": {" + bytes + "}";
  EXPECT_EQ(error_for(vocab + ", \"merges\": []"), "");
  // A key given twice keeps its last value, as a JSON tree does.
  EXPECT_EQ(error_for("\"vocab\": {\"x\": 5}, " + vocab + ", \"merges\": []"), "");
  struct Bad {
    std::string tables, type, error;
  };
  const std::vector<Bad> bad = {
      {"\"vocab\": {" + bytes + ", \"ab\": -1}, \"merges\": []", "BPE",
       "model.vocab.ab: expected a token id"},
      {"\"vocab\": {" + bytes + ", \"ab\": \"1\"}, \"merges\": []", "BPE",
       "model.vocab.ab: expected a token id"},
      {"\"vocab\": {" + bytes + ", \"a\": 300}, \"merges\": []", "BPE",
       "model.vocab.a: listed twice"},
      {"\"vocab\": {" + bytes + ", \"ab\": 7}, \"merges\": []", "BPE",
       "model.vocab.ab: id 7 used twice"},
      {"\"vocab\": [], \"merges\": []", "BPE", "model.vocab: expected a JSON object"},
      {"\"vocab\": 1, \"merges\": []", "BPE", "model.vocab: expected a JSON object"},
      {"\"vocab\": null, \"merges\": []", "BPE", "model.vocab: missing"},
      // A Unigram model (its vocab an array) is named by its type, as before the streaming reader.
      {"\"vocab\": [[\"a\", 0.0]], \"merges\": []", "Unigram",
       "model.type: unsupported 'Unigram', expected BPE"},
      // The last of two "merges" counts.
      {vocab + ", \"merges\": [\"a b\"], \"merges\": [\"a c d\"]", "BPE",
       "model.merges[0]: expected \"left right\""},
      {vocab, "BPE", "model.merges: missing"},
      {vocab + ", \"merges\": {}", "BPE", "model.merges: expected an array"},
      {vocab + ", \"merges\": [\"a b\", \"a b c\"]", "BPE",
       "model.merges[1]: expected \"left right\""},
      {vocab + ", \"merges\": [[\"a\"]]", "BPE",
       "model.merges[0]: expected [\"left\", \"right\"] or \"left right\""},
      {vocab + ", \"merges\": [[\"a\", 1]]", "BPE",
       "model.merges[0]: expected [\"left\", \"right\"]"},
  };
  for (const Bad& b : bad) {
    const std::string error = error_for(b.tables, b.type);
    EXPECT_NE(error.find("tokenizer.json: " + b.error), std::string::npos) << error;
  }
}

// A copy of the Qwen3 tokenizer whose split regex is replaced by `pattern`.
Tokenizer with_pattern(const std::string& pattern) {
  TempDir dir;
  Json json = qwen3_tokenizer_json();
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern;
  dir.write("tokenizer.json", json.dump());
  return Tokenizer::load(dir.path());
}

// Qwen3.5 treats combining marks \p{M} like letters (MODELS.md §4.3); Qwen3 splits them off.
TEST(TokenizerPattern, Qwen35SplitsCombiningMarksDifferently) {
  const Tokenizer qwen35 =
      with_pattern(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|)"
                   R"( ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  // Splits nothing, so its encoding of a piece is the BPE of that piece alone.
  const Tokenizer whole = with_pattern(R"([\s\S]+)");
  const auto bpe = [&](const std::vector<std::string>& pieces) {
    std::vector<int32_t> ids;
    for (const std::string& p : pieces) {
      const std::vector<int32_t> piece_ids = whole.encode(p);
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    }
    return ids;
  };

  struct Example {
    std::string text;
    std::vector<std::string> qwen3_pieces;
    std::vector<std::string> qwen35_pieces;
  };
  // Thai vowel and tone marks are \p{M}. Qwen3 lets a mark run be the optional non-letter
  // prefix of the next letter run, or a piece of its own through " ?[^\s\p{L}\p{N}]+".
  const std::vector<Example> examples = {
      {"\u0E44\u0E21\u0E48", {"\u0E44\u0E21", "\u0E48"}, {"\u0E44\u0E21\u0E48"}},
      {"\u0E17\u0E35\u0E48\u0E19\u0E35\u0E48",
       {"\u0E17", "\u0E35\u0E48", "\u0E19", "\u0E35\u0E48"},
       {"\u0E17\u0E35\u0E48\u0E19\u0E35\u0E48"}},
      {"\u0E2A\u0E27\u0E31\u0E2A\u0E14\u0E35\u0E04\u0E23\u0E31\u0E1A",
       {"\u0E2A\u0E27", "\u0E31\u0E2A\u0E14", "\u0E35\u0E04\u0E23", "\u0E31\u0E1A"},
       {"\u0E2A\u0E27\u0E31\u0E2A\u0E14\u0E35\u0E04\u0E23\u0E31\u0E1A"}},
  };
  for (const Example& e : examples) {
    SCOPED_TRACE(e.text);
    const std::vector<int32_t> ids3 = qwen3().encode(e.text);
    const std::vector<int32_t> ids35 = qwen35.encode(e.text);
    EXPECT_EQ(ids3, bpe(e.qwen3_pieces));
    EXPECT_EQ(ids35, bpe(e.qwen35_pieces));
    EXPECT_NE(ids3, ids35);
  }
  // "ไม่" is one vocabulary token, reachable only when the tone mark stays with the letters.
  const std::optional<int32_t> mai = qwen3().token_to_id(spelling("\u0E44\u0E21\u0E48"));
  ASSERT_TRUE(mai.has_value());
  EXPECT_EQ(qwen35.encode("\u0E44\u0E21\u0E48"), std::vector<int32_t>{*mai});
  // NFC composes a + U+0308 into "ä" but leaves U+0301 combining; Qwen3 makes "ä" a piece of
  // its own, which is the single token spelled with its two bytes' characters.
  EXPECT_EQ(qwen3().encode("a\u0308\u0301x").front(), qwen3().token_to_id(spelling("\u00E4")));
  // Text without marks splits the same way.
  EXPECT_EQ(qwen35.encode("Hello world 123"), qwen3().encode("Hello world 123"));
}

}  // namespace
}  // namespace qhx
