// The matmul kernels on Qwen3-0.6B's MLP shapes: W8 with float32 or int8 activations, W4, bf16,
// for one token (decode: bandwidth) and 64 or 512 tokens (prefill: arithmetic). Each iteration
// multiplies the next of enough matrices to overflow the last-level cache, so decode reads DRAM
// as a real model does. Threads: QHX_BENCH_THREADS (default 1).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cpu_context.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"
#include "kernels/matmul_int8.h"
#include "kernels/quant.h"

namespace qhx {
namespace {

// Copies of each matrix, enough for 256 MB, far past the last-level cache (24 copies, 36 MB of
// W4, had let part of them come from L3: decode measured 40–52 GB/s there against 25–29 from DRAM).
constexpr uint64_t kFootprintBytes = uint64_t{256} << 20;

struct Weights {
  std::vector<std::vector<int8_t>> q8;
  std::vector<std::vector<uint8_t>> q4;
  std::vector<std::vector<uint16_t>> bf16, scales4;
  std::vector<std::vector<float>> scales8;
  std::vector<PackedMatrix> packed;
  std::vector<MatrixRef> refs;
};

// packed: laid out for this CPU's int8 kernels, as a loaded model's matrices are.
const Weights& weights(DType dtype, Activations activations, bool packed, int64_t rows,
                       int64_t cols) {
  static std::vector<std::pair<std::tuple<DType, Activations, bool, int64_t, int64_t>, Weights>>
      cache;
  const auto key = std::tuple{dtype, activations, packed, rows, cols};
  for (const auto& [k, w] : cache) {
    if (k == key) return w;
  }
  Weights w;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> f(rows * cols);
  for (float& v : f) v = normal(rng);
  const uint64_t bytes = matrix_bytes(dtype, rows, cols, dtype == DType::kW4 ? 64 : 0);
  for (uint64_t i = 0; i < std::max<uint64_t>(8, kFootprintBytes / bytes); ++i) {
    MatrixRef m{dtype, nullptr, rows, cols};
    m.activations = activations;
    if (dtype == DType::kW8) {
      w.q8.emplace_back(rows * cols);
      w.scales8.emplace_back(rows);
      quantize_w8(f.data(), rows, cols, w.q8.back().data(), w.scales8.back().data());
      m.data = w.q8.back().data();
      m.scales = w.scales8.back().data();
    } else if (dtype == DType::kW4) {
      w.q4.emplace_back(rows * cols / 2);
      w.scales4.emplace_back(rows * cols / 64);
      quantize_w4(f.data(), rows, cols, 64, w.q4.back().data(), w.scales4.back().data());
      m.data = w.q4.back().data();
      m.scales = w.scales4.back().data();
      m.group_size = 64;
    } else {
      w.bf16.emplace_back(rows * cols);
      for (int64_t j = 0; j < rows * cols; ++j) w.bf16.back()[j] = f32_to_bf16(f[j]);
      m.data = w.bf16.back().data();
    }
    if (packed) {
      w.packed.push_back(pack_for_int8_kernels(CpuKernels::from_environment(), m));
      m.packed = w.packed.back().data();
    }
    w.refs.push_back(m);
  }
  cache.emplace_back(key, std::move(w));
  return cache.back().second;
}

void BM_Matmul(benchmark::State& state, DType dtype, Activations activations, bool packed) {
  const int64_t tokens = state.range(0), rows = state.range(1), cols = state.range(2);
  const char* threads = std::getenv("QHX_BENCH_THREADS");
  CpuContext cx(threads != nullptr ? std::atoi(threads) : 1, CpuKernels::from_environment());
  const Weights& w = weights(dtype, activations, packed, rows, cols);
  std::vector<float> x(tokens * cols), y(tokens * rows);
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  int64_t i = 0;
  for (auto _ : state) {
    matmul(cx, x.data(), tokens, w.refs[i++ % w.refs.size()], y.data());
    benchmark::DoNotOptimize(y.data());
  }
  const double macs = static_cast<double>(tokens * rows * cols);
  state.counters["GMAC/s"] =
      benchmark::Counter(macs * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight GB/s"] = benchmark::Counter(
      static_cast<double>(matrix_bytes(dtype, rows, cols, dtype == DType::kW4 ? 64 : 0)) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

// {tokens, rows, cols}: gate/up (3072 × 1024) and down (1024 × 3072) projections.
void shapes(benchmark::internal::Benchmark* b) {
  for (const int64_t tokens : {1, 64, 512}) {
    b->Args({tokens, 3072, 1024});
    b->Args({tokens, 1024, 3072});
  }
  b->Unit(benchmark::kMicrosecond)->ArgNames({"tokens", "rows", "cols"});
}

BENCHMARK_CAPTURE(BM_Matmul, w8_f32act, DType::kW8, Activations::kF32, false)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Matmul, w8_int8act, DType::kW8, Activations::kInt8, false)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Matmul, w8_int8act_packed, DType::kW8, Activations::kInt8, true)
    ->Apply(shapes);
BENCHMARK_CAPTURE(BM_Matmul, w4_f32act, DType::kW4, Activations::kF32, false)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Matmul, w4_int8act, DType::kW4, Activations::kInt8, false)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Matmul, w4_int8act_packed, DType::kW4, Activations::kInt8, true)
    ->Apply(shapes);
BENCHMARK_CAPTURE(BM_Matmul, bf16, DType::kBF16, Activations::kF32, false)->Apply(shapes);

// A speculative verify pass's matmuls: the KJV models' lm_head (151,936 × 128) over 1 to 5 tokens
// and a 0.6B-sized projection, where a pass of k + 1 tokens should cost about one token's weight
// traffic.
void verify_shapes(benchmark::internal::Benchmark* b) {
  for (const int64_t tokens : {1, 2, 3, 4, 5}) b->Args({tokens, 151936, 128});
  for (const int64_t tokens : {1, 3, 5, 8}) b->Args({tokens, 3072, 1024});
  b->Unit(benchmark::kMicrosecond)->ArgNames({"tokens", "rows", "cols"});
}
BENCHMARK_CAPTURE(BM_Matmul, verify_w8_int8act_packed, DType::kW8, Activations::kInt8, true)
    ->Apply(verify_shapes);

}  // namespace
}  // namespace qhx

BENCHMARK_MAIN();
