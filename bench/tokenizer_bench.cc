// Tokenizer throughput on ~4 MB of mixed text built from the fixture cases (English, code,
// CJK, other scripts, emoji, whitespace, special tokens). Fixtures are read from
// $QHX_SHARED_DIR, else <source>/../shared.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/json_file.h"

namespace {

std::filesystem::path fixture_dir() {
  const char* env = std::getenv("QHX_SHARED_DIR");
  const std::filesystem::path shared =
      (env != nullptr && *env != '\0') ? std::filesystem::path(env)
                                       : std::filesystem::path(QHX_SOURCE_DIR) / ".." / "shared";
  return shared / "fixtures" / "tokenizer" / "qwen3";
}

const qhx::Tokenizer& tokenizer() {
  static const qhx::Tokenizer tok = qhx::Tokenizer::load(fixture_dir());
  return tok;
}

// The case texts joined by newlines, repeated until the text reaches `bytes`.
const std::string& corpus() {
  static const std::string text = [] {
    std::vector<std::string> texts;
    std::ifstream in(fixture_dir() / "cases.jsonl");
    for (std::string line; std::getline(in, line);) {
      texts.push_back(qhx::parse_json(line, "cases.jsonl")["text"].get<std::string>());
    }
    if (texts.empty()) throw std::runtime_error("no cases in " + fixture_dir().string());
    std::string all;
    while (all.size() < (4u << 20)) {
      for (const std::string& t : texts) all += t + "\n";
    }
    return all;
  }();
  return text;
}

void BM_Encode(benchmark::State& state) {
  const qhx::Tokenizer& tok = tokenizer();  // loading is not part of the measurement
  const std::string& text = corpus();
  size_t tokens = 0;
  for (auto _ : state) {
    const std::vector<int32_t> ids = tok.encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const std::string& text = corpus();
  const std::vector<int32_t> ids = tokenizer().encode(text);
  for (auto _ : state) {
    const std::string out = tokenizer().decode(ids);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_StreamingDecode(benchmark::State& state) {
  const std::string& text = corpus();
  const std::vector<int32_t> ids = tokenizer().encode(text);
  for (auto _ : state) {
    qhx::StreamingDecoder stream(tokenizer());
    size_t bytes = 0;
    for (const int32_t id : ids) bytes += stream.push(id).size();
    benchmark::DoNotOptimize(bytes += stream.flush().size());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_StreamingDecode)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
