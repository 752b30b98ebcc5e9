// The tokenizer: loading each genuine vocabulary (Qwen3's 151,669 tokens and Qwen3.5's 248,077),
// with the resident memory a loaded tokenizer keeps and the peak its loading reaches, and
// throughput on ~4 MB of mixed text built from the fixture cases (English, code, CJK, other
// scripts, emoji, whitespace, special tokens). Fixtures: tests/fixtures/tokenizer/<family>.
#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/json_file.h"

namespace {

std::filesystem::path fixture_dir(const std::string& family) {
  return std::filesystem::path(QHX_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer" / family;
}

// A field of /proc/self/status in MB ("VmRSS", "VmHWM"); 0 where there is no /proc.
double status_mb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return 0.0;
}

// Sets the peak resident size back to the current one (Linux 4.0+), so VmHWM then tells the
// peak of what follows.
void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

const qhx::Tokenizer& tokenizer(const std::string& family) {
  static std::map<std::string, qhx::Tokenizer> loaded;
  auto it = loaded.find(family);
  if (it == loaded.end())
    it = loaded.emplace(family, qhx::Tokenizer::load(fixture_dir(family))).first;
  return it->second;
}

// Loads the tokenizer in a child process (fork) so that no earlier allocation of this one can
// hide its memory: {MB resident while it is loaded, MB at the peak of loading}, both above the
// child's resident size before. {-1, -1} where it cannot be measured.
std::pair<double, double> load_memory(const std::string& family) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, -1};
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    reset_peak_rss();
    const double before = status_mb("VmRSS");
    const qhx::Tokenizer tok = qhx::Tokenizer::load(fixture_dir(family));
    const double figures[2] = {status_mb("VmRSS") - before, status_mb("VmHWM") - before};
    const ssize_t written = write(fds[1], figures, sizeof(figures));
    _exit(written == sizeof(figures) && tok.size() > 0 ? 0 : 1);
  }
  close(fds[1]);
  double figures[2] = {-1, -1};
  if (child < 0 || read(fds[0], figures, sizeof(figures)) != sizeof(figures)) figures[0] = -1;
  close(fds[0]);
  if (child > 0) waitpid(child, nullptr, 0);
  return {figures[0], figures[1]};
}

// Load time, and (from a child process) rss_added_MB: what a loaded tokenizer keeps resident,
// peak_added_MB: the most that loading had resident.
void BM_Load(benchmark::State& state, const std::string& family) {
  // Both measured before this process has loaded anything (its heap is as small as it gets).
  static const std::map<std::string, std::pair<double, double>> memory = {
      {"qwen3", load_memory("qwen3")}, {"qwen3_5", load_memory("qwen3_5")}};
  for (auto _ : state) {
    const qhx::Tokenizer tok = qhx::Tokenizer::load(fixture_dir(family));
    benchmark::DoNotOptimize(tok.size());
  }
  const auto [kept, peak] = memory.at(family);
  state.counters["rss_added_MB"] = kept;
  state.counters["peak_added_MB"] = peak;
}
BENCHMARK_CAPTURE(BM_Load, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Load, qwen3_5, std::string("qwen3_5"))->Unit(benchmark::kMillisecond);

// The case texts joined by newlines, repeated until the text reaches 4 MB.
const std::string& corpus() {
  static const std::string text = [] {
    std::vector<std::string> texts;
    for (const char* family : {"qwen3", "qwen3_5"}) {
      std::ifstream in(fixture_dir(family) / "cases.jsonl");
      for (std::string line; std::getline(in, line);) {
        texts.push_back(qhx::parse_json(line, "cases.jsonl")["text"].get<std::string>());
      }
    }
    if (texts.empty()) throw std::runtime_error("no cases in " + fixture_dir("qwen3").string());
    std::string all;
    while (all.size() < (4u << 20)) {
      for (const std::string& t : texts) all += t + "\n";
    }
    return all;
  }();
  return text;
}

void BM_Encode(benchmark::State& state, const std::string& family) {
  const qhx::Tokenizer& tok = tokenizer(family);  // loading is not part of the measurement
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
BENCHMARK_CAPTURE(BM_Encode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, qwen3_5, std::string("qwen3_5"))->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state, const std::string& family) {
  const qhx::Tokenizer& tok = tokenizer(family);
  const std::vector<int32_t> ids = tok.encode(corpus());
  for (auto _ : state) {
    const std::string out = tok.decode(ids);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
}
BENCHMARK_CAPTURE(BM_Decode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);

void BM_StreamingDecode(benchmark::State& state, const std::string& family) {
  const qhx::Tokenizer& tok = tokenizer(family);
  const std::vector<int32_t> ids = tok.encode(corpus());
  for (auto _ : state) {
    qhx::StreamingDecoder stream(tok);
    size_t bytes = 0;
    for (const int32_t id : ids) bytes += stream.push(id).size();
    benchmark::DoNotOptimize(bytes += stream.flush().size());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
}
BENCHMARK_CAPTURE(BM_StreamingDecode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
