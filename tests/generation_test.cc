// Generation around the model: the sampler's distributions against transformers' logits
// processors (tests/fixtures/sampling, tools/oracle/make_sampling_fixtures.py).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "util/json_file.h"

namespace qhx {
namespace {

SamplingParams params_of(const Json& j) {
  SamplingParams p;
  p.greedy = j.value("greedy", false);
  p.temperature = j.value("temperature", 1.0f);
  p.top_k = j.value("top_k", int64_t{0});
  p.top_p = j.value("top_p", 1.0f);
  p.min_p = j.value("min_p", 0.0f);
  p.repetition_penalty = j.value("repetition_penalty", 1.0f);
  p.presence_penalty = j.value("presence_penalty", 0.0f);
  p.frequency_penalty = j.value("frequency_penalty", 0.0f);
  for (const Json& bias : j.value("logit_bias", Json::array())) {
    p.logit_bias.emplace_back(bias[0].get<int32_t>(), bias[1].get<float>());
  }
  return p;
}

TEST(SamplingGolden, DistributionsMatchTransformers) {
  const Json fixture = read_json_file("tests/fixtures/sampling/distributions.json");
  ASSERT_GE(fixture["cases"].size(), 8u);
  for (const Json& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto logits = c["logits"].get<std::vector<float>>();
    const auto prompt = c["prompt"].get<std::vector<int32_t>>();
    const auto generated = c["generated"].get<std::vector<int32_t>>();
    Sampler sampler(params_of(c["params"]));
    const std::vector<TokenProb> dist = sampler.distribution(logits, prompt, generated);
    const Json& expected = c["expected"];
    ASSERT_EQ(dist.size(), expected.size());
    for (size_t i = 0; i < dist.size(); ++i) {
      EXPECT_EQ(dist[i].id, expected[i][0].get<int32_t>());
      EXPECT_NEAR(dist[i].prob, expected[i][1].get<double>(), 1e-6) << "id " << dist[i].id;
    }
    // A draw lands on a survivor.
    const int32_t token = sampler.sample(logits, prompt, generated);
    bool survivor = false;
    for (const TokenProb& t : dist) survivor = survivor || t.id == token;
    EXPECT_TRUE(survivor) << token;
  }
}

}  // namespace
}  // namespace qhx
