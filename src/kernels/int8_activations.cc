#include "kernels/int8_activations.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu_context.h"

namespace qhx {
namespace {

// Σ of one block's kActivationBlock quantized values.
int32_t block_sum(const int8_t* q) {
  static_assert(kActivationBlock == 32);
#if defined(__x86_64__)
  // SSE2 (every x86-64): sums of absolute differences of q + 128 from 0, 8 bytes at a time.
  const __m128i offset = _mm_set1_epi8(-128), zero = _mm_setzero_si128();
  const __m128i lo = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), offset);
  const __m128i hi =
      _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)), offset);
  const __m128i sums = _mm_add_epi64(_mm_sad_epu8(lo, zero), _mm_sad_epu8(hi, zero));
  return _mm_cvtsi128_si32(sums) + _mm_extract_epi16(sums, 4) - 128 * kActivationBlock;
#else
  int32_t sum = 0;
  for (int64_t c = 0; c < kActivationBlock; ++c) sum += q[c];
  return sum;
#endif
}

// The column of kernel byte i within each chunk of a nibble-split token: the chunk's even
// columns, then its odd ones, matching weights unpacked as all low nibbles then all high ones.
int64_t column_of_byte(int64_t chunk, int64_t i) {
  const int64_t half = chunk / 2;
  return i < half ? 2 * i : 2 * (i - half) + 1;
}

}  // namespace

void prepare_activations(CpuContext& cx, QuantizeToken quantize, const float* x, int64_t n_tokens,
                         int64_t cols, const ActivationLayout& layout, Int8Activations& a) {
  const int64_t chunk = layout.chunk;
  const bool nibble_split = layout.nibble_split;
  const int32_t nibble_offset = layout.nibble_offset;
  const int64_t n_blocks = cols / kActivationBlock;
  a.cols = cols;
  a.q.resize(n_tokens * cols);
  a.block_stride = n_blocks + 16;
  a.block_scales.assign(n_tokens * a.block_stride, 0.0f);
  a.pairs = nibble_offset != 0 ? cols / 8 : 0;
  a.pair_corrections.resize(n_tokens * a.pairs);
  a.block_corrections.resize(layout.block_offset != 0 ? n_tokens * n_blocks : 0);
  auto prepare = [&](int64_t t, Scratch& scratch) {
    float* sx = a.block_scales.data() + t * a.block_stride;
    int8_t* q = a.q.data() + t * cols;
    // Quantized in place when the kernel reads the columns in order; else reordered from a copy.
    int8_t* quantized = q;
    if (nibble_split) quantized = scratch.buffer<int8_t>(Scratch::kActivationSplit, cols);
    quantize(x + t * cols, cols, quantized, sx);
    if (nibble_split) {
      for (int64_t c0 = 0; c0 < cols; c0 += chunk) {
        for (int64_t i = 0; i < chunk; ++i) q[c0 + i] = quantized[c0 + column_of_byte(chunk, i)];
      }
    }
    for (int64_t pair = 0; pair < a.pairs; ++pair) {
      // Pair k of the chunk at c0: bytes 4k.. of its even half and 4k.. of its odd half.
      const int64_t c0 = 8 * pair / chunk * chunk, k = pair - c0 / 8;
      const int8_t* even = q + c0 + 4 * k;
      int32_t sum = 0;
      for (int64_t i = 0; i < 4; ++i) sum += even[i] + even[chunk / 2 + i];
      a.pair_corrections[t * a.pairs + pair] = -nibble_offset * sum;
    }
    if (layout.block_offset != 0) {
      for (int64_t b = 0; b < n_blocks; ++b) {
        a.block_corrections[t * n_blocks + b] =
            -layout.block_offset * block_sum(quantized + b * kActivationBlock);
      }
    }
  };
  if (n_tokens >= 4 && cx.threads() > 1) {
    cx.run(n_tokens, prepare);
  } else {
    for (int64_t t = 0; t < n_tokens; ++t) prepare(t, cx.caller_scratch());
  }
}

}  // namespace qhx
