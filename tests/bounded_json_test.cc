// The bounded JSON parser: the same documents as nlohmann's own parser (key order, duplicate
// keys), its bounds refused with a message that says which, and time linear in the keys.
#include "util/bounded_json.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "support/fixtures.h"

namespace qhx {
namespace {

using Json = nlohmann::ordered_json;

Json parse(const std::string& text, const JsonBounds& bounds = {}) {
  std::string error;
  auto parsed = parse_bounded_json(text, bounds, &error);
  EXPECT_TRUE(parsed.has_value()) << text << ": " << error;
  return parsed.value_or(Json());
}

std::string refusal(const std::string& text, const JsonBounds& bounds = {}) {
  std::string error;
  EXPECT_FALSE(parse_bounded_json(text, bounds, &error).has_value()) << text;
  return error;
}

TEST(BoundedJson, SameDocumentsAsNlohmann) {
  for (const std::string text :
       {"{}", "[]", "null", "0", "-5", "18446744073709551615", "1.5e3", "\"\\u00e9\\ud83d\\ude00\"",
        R"({"b": 1, "a": [true, false, null, {"z": {}, "y": []}], "c": "x"})",
        R"({"a": 1, "b": 2, "a": {"c": 3}})", R"([[[]], {"k": [1, 2, {"k": 3}]}])"}) {
    EXPECT_EQ(parse(text).dump(), Json::parse(text).dump()) << text;
  }
  // Key order as sent; a repeated key keeps its first place and its last value, as nlohmann's own
  // parser merges it.
  for (const std::string text :
       {R"({"z": 1, "a": 2, "z": 3})", R"({"b": 1, "a": 2, "b": {"x": 1}, "a": 4, "b": [5]})",
        R"({"k": {"k": 1, "k": 2}, "k": {"j": 3}})"}) {
    EXPECT_EQ(parse(text).dump(), Json::parse(text).dump()) << text;
  }
}

TEST(BoundedJson, MalformedTextSaysWhere) {
  EXPECT_NE(refusal("{\"a\": ").find("invalid JSON at byte"), std::string::npos);
  EXPECT_NE(refusal("[1, 2] x").find("invalid JSON"), std::string::npos);
  EXPECT_NE(refusal("").find("invalid JSON"), std::string::npos);
  EXPECT_NE(refusal("\"\xff\"").find("invalid JSON"), std::string::npos);
}

TEST(BoundedJson, BoundsAreRefusedByName) {
  JsonBounds bounds;
  bounds.max_depth = 3;
  bounds.max_object_keys = 2;
  bounds.max_array_length = 2;
  EXPECT_EQ(parse("[[[1]]]", bounds).dump(), "[[[1]]]");
  EXPECT_EQ(refusal("[[[[1]]]]", bounds), "nested deeper than 3 levels");
  EXPECT_EQ(refusal("{\"a\": {\"b\": {\"c\": {}}}}", bounds), "nested deeper than 3 levels");
  EXPECT_EQ(parse(R"({"a": 1, "a": 2})", bounds).size(), 1u);
  EXPECT_EQ(refusal(R"({"a": 1, "b": 2, "c": 3})", bounds), "an object has more than 2 keys");
  // Repeats count: the bound is on what the parser holds.
  EXPECT_EQ(refusal(R"({"a": 1, "b": 2, "a": 3})", bounds), "an object has more than 2 keys");
  EXPECT_EQ(refusal("[1, 2, 3]", bounds), "an array has more than 2 elements");
  // The default depth bound: deep nesting is refused before it can exhaust the stack.
  EXPECT_EQ(refusal(std::string(100000, '[') + std::string(100000, ']')),
            "nested deeper than 64 levels");
}

// nlohmann's ordered_json takes ~12 s over 160,000 keys (a linear search per key); sorting the
// keys once makes it a matter of milliseconds. The bound is a complexity check, an order of
// magnitude above the time taken.
TEST(BoundedJson, ManyKeysParseInLinearTime) {
  // Distinct keys, and one key repeated.
  for (const bool repeated : {false, true}) {
    std::string text = "{\"x\": {";
    for (int i = 0; i < 200000; ++i) {
      if (i > 0) text += ',';
      text += '"' + std::to_string(repeated ? 0 : i) + "\":" + std::to_string(i % 7);
    }
    text += "}}";
    const auto start = std::chrono::steady_clock::now();
    const Json j = parse(text);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_EQ(j["x"].size(), repeated ? 1u : 200000u);
    EXPECT_EQ(j["x"][repeated ? "0" : "199999"], 199999 % 7);
    EXPECT_LT(seconds, 1.0 * test::kBuildSlowdown);
  }
}

}  // namespace
}  // namespace qhx
