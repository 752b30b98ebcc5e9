// Causal attention on the real models' full-attention shapes: a 512-token prefill and one decode
// step after 1,024 positions. Threads: QHX_BENCH_THREADS (default 1).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu_context.h"

namespace qhx {
namespace {

// {n_queries, first_pos, n_heads, n_kv_heads, head_dim}
void BM_Attention(benchmark::State& state) {
  const int64_t n_queries = state.range(0), first_pos = state.range(1);
  const AttentionShape shape{state.range(2), state.range(3), state.range(4)};
  const char* threads = std::getenv("QHX_BENCH_THREADS");
  CpuContext cx(threads != nullptr ? std::atoi(threads) : 1, CpuKernels::from_environment());
  const int64_t n_keys = first_pos + n_queries;
  const int64_t q_width = shape.n_heads * shape.head_dim;
  const int64_t kv_width = shape.n_kv_heads * shape.head_dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(n_queries * q_width), k(n_keys * kv_width), v(n_keys * kv_width),
      out(n_queries * q_width);
  for (std::vector<float>* x : {&q, &k, &v}) {
    for (float& e : *x) e = normal(rng);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  for (auto _ : state) {
    causal_attention(cx, q.data(), n_queries, first_pos, k.data(), v.data(), shape, scale,
                     out.data());
    benchmark::DoNotOptimize(out.data());
  }
  // Multiply-adds of q·k and p·v over the (query, key) pairs the causal mask keeps.
  const double pairs = static_cast<double>(n_queries) * first_pos +
                       static_cast<double>(n_queries) * (n_queries + 1) / 2;
  state.counters["GFLOP/s"] =
      benchmark::Counter(pairs * static_cast<double>(shape.n_heads * shape.head_dim) * 4 * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_Attention)
    ->ArgNames({"queries", "past", "heads", "kv_heads", "head_dim"})
    ->Args({512, 0, 16, 8, 128})   // Qwen3-0.6B prefill
    ->Args({1, 1024, 16, 8, 128})  // Qwen3-0.6B decode
    ->Args({512, 0, 8, 2, 256})    // Qwen3.5-2B full-attention prefill
    ->Args({1, 1024, 8, 2, 256})   // Qwen3.5-2B full-attention decode
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace qhx

BENCHMARK_MAIN();
