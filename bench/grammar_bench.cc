// What structured output costs per token, on the genuine Qwen3 (151,936 logits) and Qwen3.5
// (248,320) vocabularies: each case of grammar_cases.json compiled (cold, then from the cache),
// then its reply walked token by token as a session walks it: the mask of the tokens allowed
// next, then the chosen token accepted. Prints per case the compile times and the distribution of
// the per-token cost (mean, p50, p99, max over several walks), and what the sampler pays to apply
// a mask to a row of logits, to set beside a decode step's time.
//
//   build/bench/grammar_bench [--cases FILE] [--walks N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "grammar/structured_output.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(q * values.size()));
  return values[i];
}

struct Vocabulary {
  const char* name;
  const char* fixture;
  int64_t logits;
  qhx::ToolCallStyle style;
};

qhx::ReplyStart reply_start(const std::string& start) {
  if (start == "answer") return qhx::ReplyStart::kAnswer;
  if (start == "may_think") return qhx::ReplyStart::kMayThink;
  throw qhx::Error("grammar_cases: start \"" + start + "\" is not answer or may_think");
}

// One case on one vocabulary: prints a row of the table.
void run_case(const qhx::Tokenizer& tokenizer, const Vocabulary& vocab, const Json& test_case,
              int walks) {
  const qhx::StructuredOutput cold(tokenizer, vocab.logits, vocab.style);
  const std::string format = test_case.at("format").dump();
  const qhx::ReplyStart start = reply_start(test_case.at("start").get<std::string>());
  const Json& text_field = test_case.at("text");
  const std::string text =
      text_field.is_string()
          ? text_field.get<std::string>()
          : text_field.at(vocab.style == qhx::ToolCallStyle::kXml ? "xml" : "json")
                .get<std::string>();
  const std::vector<int32_t> stops = {tokenizer.token_to_id("<|im_end|>").value()};

  Clock::time_point t0 = Clock::now();
  std::unique_ptr<qhx::GrammarConstraint> constraint = cold.constraint(format, start, stops);
  const double compile_cold = seconds_since(t0);
  t0 = Clock::now();
  cold.constraint(format, start, stops);
  const double compile_cached = seconds_since(t0);

  std::vector<int32_t> ids = tokenizer.encode(text);
  ids.push_back(stops[0]);
  std::vector<uint32_t> words(static_cast<size_t>((vocab.logits + 31) / 32));
  std::vector<double> per_token;
  for (int walk = 0; walk < walks; ++walk) {
    constraint->reset();
    for (const int32_t id : ids) {
      t0 = Clock::now();
      const bool masked = constraint->allowed_next(words);
      const bool allowed = !masked || ((words[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u);
      if (!allowed) {
        throw qhx::Error(std::string("grammar_cases: ") + test_case.at("name").get<std::string>() +
                         ": the constraint refuses token " + std::to_string(id) + " (" +
                         tokenizer.decode(std::vector<int32_t>{id}) + ")");
      }
      constraint->accept(id);
      per_token.push_back(seconds_since(t0));
    }
  }
  double mean = 0;
  for (const double t : per_token) mean += t;
  mean /= static_cast<double>(per_token.size());
  printf("| %s | %s | %zu | %.0f | %.2f | %.1f | %.1f | %.0f | %.0f |\n",
         test_case.at("name").get<std::string>().c_str(), vocab.name, ids.size(),
         compile_cold * 1e3, compile_cached * 1e3, mean * 1e6, quantile(per_token, 0.5) * 1e6,
         quantile(per_token, 0.99) * 1e6,
         *std::max_element(per_token.begin(), per_token.end()) * 1e6);
  fflush(stdout);
}

// The sampler's own share: greedy and sampled picks over a row of logits, with and without a mask
// that allows 1 token in 64 (the argmax left out, so the masked path is the one taken).
void run_sampler(const Vocabulary& vocab) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab.logits));
  for (float& l : logits) l = normal(rng);
  std::vector<uint32_t> mask(static_cast<size_t>((vocab.logits + 31) / 32), 0);
  for (size_t i = 0; i < mask.size(); i += 2) mask[i] = 1u;
  const auto top = std::max_element(logits.begin(), logits.end()) - logits.begin();
  mask[static_cast<size_t>(top) / 32] &= ~(1u << (top % 32));
  for (const bool greedy : {true, false}) {
    qhx::SamplingParams params;
    params.greedy = greedy;
    params.temperature = 0.7f;
    params.top_p = 0.9f;
    qhx::Sampler sampler(params);
    for (const bool masked : {false, true}) {
      const std::span<const uint32_t> allowed =
          masked ? std::span<const uint32_t>(mask) : std::span<const uint32_t>();
      constexpr int kReps = 200;
      const Clock::time_point t0 = Clock::now();
      for (int i = 0; i < kReps; ++i) sampler.sample(logits, {}, {}, allowed);
      printf("| %s | %s | %s | %.1f |\n", vocab.name, greedy ? "greedy" : "t 0.7, top-p 0.9",
             masked ? "masked" : "none", seconds_since(t0) / kReps * 1e6);
    }
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const std::filesystem::path source(QHX_SOURCE_DIR);
  std::filesystem::path cases_path = source / "bench" / "grammar_cases.json";
  int walks = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cases" && i + 1 < argc) {
      cases_path = argv[++i];
    } else if (arg == "--walks" && i + 1 < argc) {
      walks = std::max(1, std::stoi(argv[++i]));
    } else {
      fprintf(stderr, "usage: %s [--cases FILE] [--walks N]\n", argv[0]);
      return 2;
    }
  }
  std::ifstream in(cases_path);
  if (!in) throw qhx::Error(cases_path.string() + ": cannot be read");
  const Json cases = Json::parse(in).at("cases");
  const Vocabulary vocabularies[] = {
      {"Qwen3", "qwen3", 151936, qhx::ToolCallStyle::kJson},
      {"Qwen3.5", "qwen3_5", 248320, qhx::ToolCallStyle::kXml},
  };
  printf(
      "| case | vocabulary | tokens | compile ms | cached ms | mean µs | p50 µs | p99 µs | max µs "
      "|\n");
  printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Vocabulary& vocab : vocabularies) {
    const qhx::Tokenizer tokenizer =
        qhx::Tokenizer::load(source / "tests" / "fixtures" / "tokenizer" / vocab.fixture);
    for (const Json& test_case : cases) run_case(tokenizer, vocab, test_case, walks);
  }
  printf("\n| vocabulary | sampling | mask | µs per token |\n|---|---|---|---:|\n");
  for (const Vocabulary& vocab : vocabularies) run_sampler(vocab);
  return 0;
} catch (const std::exception& e) {
  fprintf(stderr, "grammar_bench: %s\n", e.what());
  return 1;
}
