// W8/W4 matmuls with int8 activations (ref::matmul defines the arithmetic; kernels/matmul.h
// dispatches here when uses_int8_activations(w)). The activations are quantized once per call,
// then each (row, token) dot product runs in integer multiply-adds of 4 bytes per 32-bit lane,
// block by block, scaled into a float accumulator. Each (row, token) pair is computed by the
// same instruction sequence whatever the batch, tile and thread count, so a token decoded alone
// gets exactly the bits it gets inside a batched prefill. These are the x86-64 kernels; the
// aarch64 ones are in matmul_int8_neon.cc, and both share kernels/int8_activations.h.
//
// Two layouts. On AVX-512 VNNI CPUs a loaded model's matrices are packed into panels of 16 rows
// (pack_for_int8_kernels), which one multiply-add serves at once. A matrix as it lies (row-major)
// runs on the AVX2 tiles, on any x86-64 CPU with AVX2.
//
// The integer multiply-adds take one unsigned and one signed operand, so the weights enter
// offset to unsigned, and each 32-bit accumulator starts from the offset's share, −offset · Σ q_x,
// so that it ends exact:
//   W8 panels: q_w + 128;   W4 (panels and AVX2): q_w + 8, the nibble XOR 8;
//   W8, AVX2: |q_w| · (q_x with q_w's sign) instead (cannot overflow 16 bits, so no offset).
#include "kernels/matmul_int8.h"

#include "kernels/cpu_context.h"
#include "kernels/int8_activations.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "util/error.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/simd_avx2.h"
#include "kernels/simd_avx512.h"
#elif defined(__aarch64__)
#include "kernels/neon.h"
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own -Wuninitialized
// reports inside every caller (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace qhx {

#if defined(__x86_64__)
namespace {

#define QHX_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QHX_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

using avx2::horizontal_sum;

// ref::quantize_activations for one token, vectorised: the same float32 operations, so the same
// bits (cvtps rounds to nearest even, as nearbyint does in the default rounding mode).
QHX_AVX2 void quantize_token(const float* x, int64_t cols, int8_t* q, float* scales) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 largest = _mm256_set1_ps(3.40282347e38f);
  const __m256i byte_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < cols / kActivationBlock; ++b) {
    const float* xb = x + b * kActivationBlock;
    __m256 v[4];
    __m256 max_abs = _mm256_setzero_ps(), non_finite = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      const __m256 a = _mm256_and_ps(v[k], abs_mask);
      max_abs = _mm256_max_ps(max_abs, a);
      non_finite = _mm256_or_ps(non_finite, _mm256_cmp_ps(a, largest, _CMP_NLE_UQ));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(max_abs), _mm256_extractf128_ps(max_abs, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    const float block_max = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    int8_t* qb = q + b * kActivationBlock;
    if (_mm256_movemask_ps(non_finite) != 0 || block_max == 0.0f) {
      // The reference's special cases, kept in one place.
      ref::quantize_activations(xb, kActivationBlock, qb, scales + b);
      continue;
    }
    scales[b] = block_max / 127.0f;
    const __m256 inverse = _mm256_set1_ps(127.0f / block_max);
    __m256i i[4];
    for (int k = 0; k < 4; ++k) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inverse));
    const __m256i bytes =
        _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb),
                        _mm256_permutevar8x32_epi32(bytes, byte_order));
  }
}

// Maxima of neighbouring lanes of a (lanes 0–7) and b (lanes 8–15): avx512::lane_pairs' tree.
QHX_AVX512 inline __m512 max_lane_pairs(__m512 a, __m512 b) {
  const avx512::LanePairs p = avx512::lane_pairs(a, b);
  return _mm512_max_ps(p.even, p.odd);
}

// quantize_token with 16 lanes: a block is two vectors, narrowed to bytes in one instruction each.
// Sixteen blocks at a time share one tree for their largest magnitudes and one division for their
// scales (a maximum is exact in any order, and the division is the reference's, lane by lane):
// one horizontal maximum per block had been the longest step.
QHX_AVX512 void quantize_token_avx512(const float* x, int64_t cols, int8_t* q, float* scales) {
  const __m512 largest = _mm512_set1_ps(3.40282347e38f);
  const int64_t n_blocks = cols / kActivationBlock;
  for (int64_t b0 = 0; b0 < n_blocks; b0 += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, n_blocks - b0));
    __m512 block_max[16];
    __mmask16 special = 0;  // blocks for the reference's rules: non-finite, then all zero too
    for (int j = 0; j < 16; ++j) {
      if (j >= n) {
        block_max[j] = _mm512_setzero_ps();
        continue;
      }
      const float* xb = x + (b0 + j) * kActivationBlock;
      const __m512 a0 = _mm512_abs_ps(_mm512_loadu_ps(xb));
      const __m512 a1 = _mm512_abs_ps(_mm512_loadu_ps(xb + 16));
      if ((_mm512_cmp_ps_mask(a0, largest, _CMP_NLE_UQ) |
           _mm512_cmp_ps_mask(a1, largest, _CMP_NLE_UQ)) != 0) {
        special |= static_cast<__mmask16>(1u << j);
      }
      block_max[j] = _mm512_max_ps(a0, a1);
    }
    for (int width = 16; width > 1; width /= 2) {
      for (int j = 0; j < width / 2; ++j) {
        block_max[j] = max_lane_pairs(block_max[2 * j], block_max[2 * j + 1]);
      }
    }
    const __m512 maxima = block_max[0];  // lane j: block b0 + j
    special |= _mm512_cmp_ps_mask(maxima, _mm512_setzero_ps(), _CMP_EQ_OQ);
    alignas(64) float block_scales[16], inverses[16];
    _mm512_store_ps(block_scales, _mm512_div_ps(maxima, _mm512_set1_ps(127.0f)));
    _mm512_store_ps(inverses, _mm512_div_ps(_mm512_set1_ps(127.0f), maxima));
    for (int j = 0; j < n; ++j) {
      const float* xb = x + (b0 + j) * kActivationBlock;
      int8_t* qb = q + (b0 + j) * kActivationBlock;
      if ((special >> j) & 1) {  // all zero or not finite: the reference's rules
        ref::quantize_activations(xb, kActivationBlock, qb, scales + b0 + j);
        continue;
      }
      scales[b0 + j] = block_scales[j];
      const __m512 inverse = _mm512_set1_ps(inverses[j]);
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(qb),
          _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb), inverse))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16),
                       _mm512_cvtsepi32_epi8(
                           _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), inverse))));
    }
  }
}

// The groups of a W4 row, walked `step` columns at a time (a divisor of the group size: groups
// are whole numbers of 64 columns, uses_int8_activations), counted rather than divided out of the
// column, since a 64-bit division per step costs as much as a decode step's multiply-adds.
class GroupCounter {
 public:
  GroupCounter(int64_t group_size, int64_t step) : steps_per_group_(group_size / step) {}
  // The group of the next `step` columns.
  int64_t next() {
    const int64_t group = group_;
    if (++step_ == steps_per_group_) {
      step_ = 0;
      ++group_;
    }
    return group;
  }

 private:
  int64_t steps_per_group_, group_ = 0, step_ = 0;
};

// ---- AVX-512 VNNI, W8 and W4 in panels of 16 rows (pack_for_int8_kernels) ----
//
// Panel p holds rows 16p..16p+15 (the last padded with rows of zeros), 64 bytes per step of
// columns: for each of the 16 rows in order, 4 bytes.
//   W8: a step is a quad of 4 columns, as q + 128.
//   W4: a step is an octet of 8 columns: byte j of a row holds columns j (low nibble) and 4 + j
//       (high nibble) of the octet, as q + 8. The group scales (f16, 16 rows per group) come in
//       lines of 64 bytes, two groups to a line, each line just before its groups' octets: the
//       panel reads front to back. (With all scales after the octets, the octets' stream skipped
//       them at each panel's end and the hardware prefetchers lost it there: a W4 decode matmul
//       read DRAM at 26 GB/s on one core, 24-29 with software prefetches; now 37-40, as W8.)
// One multiply-add with 4 activation bytes broadcast then serves all 16 rows, and a block's
// steps accumulate in integers, started from the block's correction −offset · Σ q_x: exact
// Σ q_w · q_x, scaled once per block (the row-major tiles scale every 64 columns of every
// row-token pair).

constexpr int kPanelRows = 16;
// Prefill tiles: W8 3 panels × 4 tokens, so that each weight vector serves 4 tokens and each
// broadcast activation 3 panels (12 integer and 12 float accumulators, no spills). One panel × 8
// tokens, which loaded a broadcast for every multiply-add, ran 64-token matmuls at 260-280 GMAC/s
// on one core; 2 × 4 at 380-400 (512 tokens); 3 × 4 at 410-430; 4 × 4 and 3 × 5, which spill,
// at 360-400. A range's panels that do not fill 3s go in tiles of 2 (…, 3, 2, 2 or …, 3, 2).
// W4, whose steps also split nibbles, stays at 2 × 4: 350-375 GMAC/s, 3 × 4 ran 283-346.
constexpr int kPanelTokens = 4;
// Decode walks this many parts of a thread's panels side by side: one stream per core left memory
// idle (whole 0.6B model, 2 threads, alternated: W4 84-87 → 89-93 tok/s, W8 67-68 → 69-70;
// four streams measured the same as two).
constexpr int kDecodeStreams = 2;
// Up to this many tokens (decode, verifying a speculative draft) a matmul is bound by memory, not
// by multiply-adds: it walks the streams above, every token of a panel while it is in L1.
constexpr int kStreamedTokens = 8;

int64_t panel_count(int64_t rows) {
  return (rows + kPanelRows - 1) / kPanelRows;
}
// W4: groups whose scales share a line.
constexpr int64_t kGroupsPerScaleLine = 2;
int64_t scale_lines(const MatrixRef& w) {
  return (w.cols / w.group_size + kGroupsPerScaleLine - 1) / kGroupsPerScaleLine;
}
int64_t panel_bytes(const MatrixRef& w) {
  return w.dtype == DType::kW8 ? kPanelRows * w.cols
                               : kPanelRows * w.cols / 2 + 64 * scale_lines(w);
}

// Panel p of w into out (panel_bytes(w) bytes), 4 bytes of a row at a time.
void pack_panel(const MatrixRef& w, int64_t p, uint8_t* out) {
  const bool w4 = w.dtype == DType::kW4;
  const int64_t row_bytes = w4 ? w.cols / 2 : w.cols;
  const uint8_t* rows[kPanelRows];
  for (int64_t i = 0; i < kPanelRows; ++i) {
    const int64_t row = p * kPanelRows + i;
    rows[i] = row < w.rows ? static_cast<const uint8_t*>(w.data) + row * row_bytes : nullptr;
  }
  // Each row's 4 bytes: W8 columns 4k..4k+3 (two's complement, so q + 128 is q XOR 0x80); W4
  // columns 8k..8k+7 as 8 nibbles in column order, regrouped so that byte j holds columns j
  // and 4 + j (and q + 8 is q XOR 8).
  const auto panel_word = [w4](uint32_t v) {
    if (!w4) return v ^ 0x80808080u;
    const auto spread = [](uint32_t half) {  // 4 nibbles into the low nibbles of 4 bytes
      half = (half | half << 8) & 0x00FF00FFu;
      return (half | half << 4) & 0x0F0F0F0Fu;
    };
    return (spread(v & 0xFFFF) | spread(v >> 16) << 4) ^ 0x88888888u;
  };
  for (int64_t k = 0; k < row_bytes / 4; ++k) {
    // W4: a scale line before every other group's first octet (a last group alone pads it).
    if (w4 && 8 * k % (kGroupsPerScaleLine * w.group_size) == 0) {
      const int64_t first = 8 * k / w.group_size, groups = w.cols / w.group_size;
      for (int64_t g = first; g < first + kGroupsPerScaleLine; ++g) {
        for (int64_t i = 0; i < kPanelRows; ++i, out += 2) {
          const int64_t row = p * kPanelRows + i;
          const uint16_t scale = row < w.rows && g < groups ? w4_group_scales(w, row)[g] : 0;
          std::memcpy(out, &scale, 2);
        }
      }
    }
    for (int64_t i = 0; i < kPanelRows; ++i, out += 4) {
      uint32_t v = 0;
      if (rows[i] != nullptr) std::memcpy(&v, rows[i] + 4 * k, 4);
      v = panel_word(v);
      std::memcpy(out, &v, 4);
    }
  }
}

// Step k of block b (kW4: both quads of the octet).
template <bool kW4>
QHX_AVX512 inline void add_panel_step(const uint8_t* step, const int8_t* x, __m512i& dot) {
  int32_t x4;
  if (kW4) {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
    const __m512i v = _mm512_loadu_si512(step);
    std::memcpy(&x4, x, 4);
    dot = _mm512_dpbusd_epi32(dot, _mm512_and_si512(v, low_nibbles), _mm512_set1_epi32(x4));
    std::memcpy(&x4, x + 4, 4);
    dot = _mm512_dpbusd_epi32(dot, _mm512_and_si512(_mm512_srli_epi16(v, 4), low_nibbles),
                              _mm512_set1_epi32(x4));
  } else {
    std::memcpy(&x4, x, 4);
    dot = _mm512_dpbusd_epi32(dot, _mm512_loadu_si512(step), _mm512_set1_epi32(x4));
  }
}

// NP panels × NR tokens from t0: out[i][t] = panel i's 16 rows' Σ_b sx_b · sw_b · Σ_{c∈b} q_w ·
// q_x, where sw_b is the group scale (W4) or 1 (W8: the row scales are applied by the caller). Each
// panel is summed the same way whatever NP is: panels side by side share each broadcast
// activation (prefill) or keep more of memory's streams in flight (decode).
template <bool kW4, int NP, int NR>
QHX_AVX512 void panel_tile_vnni(const MatrixRef& w, const uint8_t* const (&panels)[NP],
                                const Int8Activations& a, int64_t t0, __m512 (&out)[NP][NR]) {
  constexpr int kStepCols = kW4 ? 8 : 4;
  constexpr int kStepsPerBlock = kActivationBlock / kStepCols;
  const uint8_t* panel[NP];
  __m512 sw[NP];
  for (int i = 0; i < NP; ++i) {
    panel[i] = panels[i];
    sw[i] = _mm512_set1_ps(1.0f);
    for (int t = 0; t < NR; ++t) out[i][t] = _mm512_setzero_ps();
  }
  GroupCounter groups(kW4 ? w.group_size : kActivationBlock, kActivationBlock);
  int64_t group = -1;
  const uint8_t* scale_line[NP];
  for (int64_t b = 0; b < a.cols / kActivationBlock; ++b) {
    if (kW4 && groups.next() != group) {
      ++group;
      const int64_t in_line = group % kGroupsPerScaleLine;
      for (int i = 0; i < NP; ++i) {
        if (in_line == 0) {
          scale_line[i] = panel[i];
          panel[i] += 64;
        }
        sw[i] = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale_line[i] + 32 * in_line)));
      }
    }
    __m512i dot[NP][NR];
    for (int i = 0; i < NP; ++i) {
      for (int t = 0; t < NR; ++t) dot[i][t] = _mm512_set1_epi32(a.block_corrections_of(t0 + t)[b]);
    }
    for (int k = 0; k < kStepsPerBlock; ++k) {
      for (int i = 0; i < NP; ++i) {
        for (int t = 0; t < NR; ++t) {
          add_panel_step<kW4>(panel[i] + 64 * k,
                              a.q_of(t0 + t) + kActivationBlock * b + kStepCols * k, dot[i][t]);
        }
      }
    }
    for (int i = 0; i < NP; ++i) {
      for (int t = 0; t < NR; ++t) {
        const __m512 sx = _mm512_set1_ps(a.block_scales_of(t0 + t)[b]);
        out[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][t]),
                                    kW4 ? _mm512_mul_ps(sx, sw[i]) : sx, out[i][t]);
      }
      panel[i] += kStepsPerBlock * 64;
    }
  }
}

// Panels p[0..NP) × NR tokens from t0 into y (W8: times the row scales; rows past the matrix
// dropped).
template <bool kW4, int NP, int NR>
QHX_AVX512 void run_panel_tile(const MatrixRef& w, const Int8Activations& a, const int64_t (&p)[NP],
                               int64_t t0, float* y) {
  const uint8_t* panels[NP];
  for (int i = 0; i < NP; ++i)
    panels[i] = static_cast<const uint8_t*>(w.packed) + p[i] * panel_bytes(w);
  __m512 out[NP][NR];
  panel_tile_vnni<kW4, NP, NR>(w, panels, a, t0, out);
  for (int i = 0; i < NP; ++i) {
    const int64_t r0 = p[i] * kPanelRows;
    const __mmask16 rows = avx512::first_lanes(w.rows - r0);
    const __m512 scales =
        kW4 ? _mm512_set1_ps(1.0f)
            : _mm512_maskz_loadu_ps(rows, static_cast<const float*>(w.scales) + r0);
    for (int t = 0; t < NR; ++t) {
      _mm512_mask_storeu_ps(y + (t0 + t) * w.rows + r0, rows, _mm512_mul_ps(out[i][t], scales));
    }
  }
}

// Panels p[0..NP) for all tokens, kPanelTokens at a time (the last tile holds the rest).
template <bool kW4, int NP, int... NR>
void run_panel_tokens(const MatrixRef& w, const Int8Activations& a, int64_t n_tokens, float* y,
                      const int64_t (&p)[NP], std::integer_sequence<int, NR...>) {
  using Tile =
      void (*)(const MatrixRef&, const Int8Activations&, const int64_t(&)[NP], int64_t, float*);
  static constexpr Tile tiles[] = {run_panel_tile<kW4, NP, NR + 1>...};
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kPanelTokens) {
    tiles[std::min<int64_t>(kPanelTokens, n_tokens - t0) - 1](w, a, p, t0, y);
  }
}

// Panels [p, p + NP), adjacent, for all tokens.
template <bool kW4, int NP, int... NR>
void run_panels_all_tokens(const MatrixRef& w, const Int8Activations& a, int64_t n_tokens, float* y,
                           int64_t p, std::integer_sequence<int, NR...> tokens) {
  int64_t ps[NP];
  for (int i = 0; i < NP; ++i) ps[i] = p + i;
  run_panel_tokens<kW4, NP>(w, a, n_tokens, y, ps, tokens);
}

// Panels [panel_begin, panel_end) for all tokens, kPanelTokens tokens at a time: W8 in tiles of 3
// panels (the rest in tiles of 2), W4 in tiles of 2 (a last odd panel alone). One token (decode)
// walks kDecodeStreams parts of the range side by side: one stream per core left memory idle.
template <bool kW4>
void run_panels(const MatrixRef& w, const Int8Activations& a, int64_t n_tokens, float* y,
                int64_t panel_begin, int64_t panel_end) {
  constexpr auto tokens = std::make_integer_sequence<int, kPanelTokens>{};
  if (n_tokens <= kStreamedTokens) {
    const int64_t part = (panel_end - panel_begin) / kDecodeStreams;
    int64_t p[kDecodeStreams];
    for (int64_t j = 0; j < part; ++j) {
      for (int i = 0; i < kDecodeStreams; ++i) p[i] = panel_begin + i * part + j;
      run_panel_tokens<kW4, kDecodeStreams>(w, a, n_tokens, y, p, tokens);
    }
    for (int64_t rest = panel_begin + kDecodeStreams * part; rest < panel_end; ++rest) {
      run_panel_tokens<kW4, 1>(w, a, n_tokens, y, {rest}, tokens);
    }
    return;
  }
  // W8: n = 3k + 2j panels with as few tiles of 2 as can be (j = 0, 2, 1 for n % 3 = 0, 1, 2).
  const int64_t n = panel_end - panel_begin;
  const int64_t threes = kW4 || n < 3 ? 0 : n / 3 - (n % 3 == 1 ? 1 : 0);
  int64_t p = panel_begin;
  for (int64_t i = 0; i < threes; ++i, p += 3) {
    run_panels_all_tokens<kW4, 3>(w, a, n_tokens, y, p, tokens);
  }
  for (; p + 2 <= panel_end; p += 2) run_panels_all_tokens<kW4, 2>(w, a, n_tokens, y, p, tokens);
  if (p < panel_end) run_panels_all_tokens<kW4, 1>(w, a, n_tokens, y, p, tokens);
}

// ---- AVX2: 32 columns (one activation block) per vector, 8 lanes of 4 bytes ----

// The 8 lanes of Σ_4 u · s for unsigned u and signed s bytes (pairs cannot overflow 16 bits
// for the operands used here: |u·s| ≤ 128 · 127).
QHX_AVX2 inline __m256 lane_dots(__m256i u, __m256i s) {
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

template <int MR, int NR>
QHX_AVX2 void w8_tile_avx2(const int8_t* const* w, const Int8Activations& a, int64_t t0,
                           float (*out)[NR]) {
  __m256 acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < a.cols; c += 32) {
    __m256i wv[MR], magnitude[MR];
    for (int r = 0; r < MR; ++r) {
      wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + c));
      magnitude[r] = _mm256_abs_epi8(wv[r]);
    }
    for (int t = 0; t < NR; ++t) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q_of(t0 + t) + c));
      const __m256 sx = _mm256_broadcast_ss(a.block_scales_of(t0 + t) + c / kActivationBlock);
      for (int r = 0; r < MR; ++r) {
        const __m256 dot = lane_dots(magnitude[r], _mm256_sign_epi8(xv, wv[r]));
        acc[r][t] = _mm256_fmadd_ps(dot, sx, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) out[r][t] = horizontal_sum(acc[r][t]);
  }
}

// W4, 64 columns (32 packed bytes) per step: XOR 0x88 makes every nibble q + 8; the low nibbles
// are the even columns, the high ones the odd columns. Lane i of the even and the odd half (columns
// 8i..8i+7, block i / 4) summed in 16 bits (|sum| ≤ 2 · 2 · 15 · 127), widened and started from the
// pair's correction.
template <int MR, int NR>
QHX_AVX2 void w4_tile_avx2(const uint8_t* const* w, const uint16_t* const* scales,
                           int64_t group_size, const Int8Activations& a, int64_t t0,
                           float (*out)[NR]) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x88));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  GroupCounter groups(group_size, 64);
  for (int64_t c = 0; c < a.cols; c += 64) {
    const int64_t g = groups.next();
    __m256i even[MR], odd[MR];
    __m256 sw[MR];
    for (int r = 0; r < MR; ++r) {
      const __m256i packed = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + c / 2)), bias);
      even[r] = _mm256_and_si256(packed, low_nibbles);
      odd[r] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
      sw[r] = _mm256_set1_ps(_cvtsh_ss(scales[r][g]));
    }
    for (int t = 0; t < NR; ++t) {
      const int8_t* xq = a.q_of(t0 + t) + c;
      const __m256i x_even = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
      const __m256i x_odd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
      const __m256i correction =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.corrections_of(t0 + t) + c / 8));
      const float* block_scales = a.block_scales_of(t0 + t) + c / kActivationBlock;
      const __m256 sx =
          _mm256_set_m128(_mm_broadcast_ss(block_scales + 1), _mm_broadcast_ss(block_scales));
      for (int r = 0; r < MR; ++r) {
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(even[r], x_even),
                                               _mm256_maddubs_epi16(odd[r], x_odd));
        const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), correction);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sx, sw[r]), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) out[r][t] = horizontal_sum(acc[r][t]);
  }
}

// ---- Driving the AVX2 tiles ----

constexpr int kTileRows = 4;
constexpr int kTileTokens = 4;

struct Avx2Tiles {
  template <int MR, int NR>
  static void w8(const int8_t* const* w, const Int8Activations& a, int64_t t0, float (*out)[NR]) {
    w8_tile_avx2<MR, NR>(w, a, t0, out);
  }
  template <int MR, int NR>
  static void w4(const uint8_t* const* w, const uint16_t* const* scales, int64_t group_size,
                 const Int8Activations& a, int64_t t0, float (*out)[NR]) {
    w4_tile_avx2<MR, NR>(w, scales, group_size, a, t0, out);
  }
};

// Tiles of MR rows over all tokens, sizeof...(NR) tokens at a time, then the rest.
template <int MR, int... NR>
void run_tiles(const MatrixRef& w, const Int8Activations& a, int64_t r0, int64_t n_tokens, float* y,
               std::integer_sequence<int, NR...>) {
  using Tile = void (*)(const MatrixRef&, const Int8Activations&, int64_t, int64_t, float*);
  static constexpr Tile tiles[] = {run_int8_tile<Avx2Tiles, MR, NR + 1>...};
  constexpr int64_t kTokens = sizeof...(NR);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokens) {
    const int64_t nr = std::min<int64_t>(kTokens, n_tokens - t0);
    tiles[nr - 1](w, a, r0, t0, y);
  }
}

// Rows [row_begin, row_end) for all tokens: tiles of kTileRows rows (single rows at the end),
// each against every token block while its weights are in L1. A single token (decode) goes row
// by row instead: one contiguous stream of weights is what the hardware prefetcher follows best,
// and with one token there is nothing for a tile's rows to share.
void matmul_rows(const MatrixRef& w, const Int8Activations& a, int64_t n_tokens, float* y,
                 int64_t row_begin, int64_t row_end) {
  const auto token_counts = std::make_integer_sequence<int, kTileTokens>{};
  int64_t r = row_begin;
  for (; n_tokens > 1 && r + kTileRows <= row_end; r += kTileRows) {
    run_tiles<kTileRows>(w, a, r, n_tokens, y, token_counts);
  }
  for (; r < row_end; ++r) run_tiles<1>(w, a, r, n_tokens, y, token_counts);
}

}  // namespace

void matmul_int8(CpuContext& cx, const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  const MatmulOutput one[] = {{w, y}};
  matmul_int8(cx, x, n_tokens, one);
}

void matmul_int8(CpuContext& cx, const float* x, int64_t n_tokens,
                 std::span<const MatmulOutput> outputs) {
  if (!cx.kernels().avx2) {
    for (const MatmulOutput& o : outputs) ref::matmul(x, n_tokens, o.w, o.y);
    return;
  }
  const MatrixRef& w = outputs[0].w;  // dtype, columns and packing are those of every matrix
  const bool w4 = w.dtype == DType::kW4;
  const bool panels = w.packed != nullptr && cx.kernels().avx512_vnni;
  // The caller's: the workers read it.
  Int8Activations& activations =
      cx.caller_scratch().object<Int8Activations>(Scratch::kInt8Activations);
  // Panels on AVX-512 VNNI; row-major on AVX2 (also on AVX-512 CPUs, for matrices nobody
  // packed): W4 chunks of 64 columns (32 packed bytes), W8 ones of a vector.
  const ActivationLayout layout =
      panels ? ActivationLayout{.block_offset = w4 ? 8 : 128}
             : ActivationLayout{
                   .chunk = w4 ? 64 : 32, .nibble_split = w4, .nibble_offset = w4 ? 8 : 0};
  prepare_activations(cx, panels ? quantize_token_avx512 : quantize_token, x, n_tokens, w.cols,
                      layout, activations);
  // The units (panels or rows) of all the matrices as one range, matrix i's from first[i].
  std::vector<int64_t> first = {0};
  int64_t work = 0;
  for (const MatmulOutput& o : outputs) {
    first.push_back(first.back() + (panels ? panel_count(o.w.rows) : o.w.rows));
    work += o.w.rows * o.w.cols * n_tokens;
  }
  cx.split_rows(first.back(), panels ? 1 : kTileRows, work, [&](int64_t begin, int64_t end) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const int64_t lo = std::max(begin, first[i]) - first[i];
      const int64_t hi = std::min(end, first[i + 1]) - first[i];
      if (lo >= hi) continue;
      const MatmulOutput& o = outputs[i];
      if (!panels) {
        matmul_rows(o.w, activations, n_tokens, o.y, lo, hi);
      } else if (w4) {
        run_panels<true>(o.w, activations, n_tokens, o.y, lo, hi);
      } else {
        run_panels<false>(o.w, activations, n_tokens, o.y, lo, hi);
      }
    }
  });
}

void read_row(CpuContext& cx, const MatrixRef& w, int64_t row, float* out) {
  if (w.packed == nullptr) return ref::read_row(w, row, out);
  // The row's 4 bytes of each step, 64 bytes apart, back into the row-major layout.
  const uint8_t* step = static_cast<const uint8_t*>(w.packed) + row / kPanelRows * panel_bytes(w) +
                        4 * (row % kPanelRows);
  std::vector<uint8_t>& bytes =
      cx.caller_scratch().object<std::vector<uint8_t>>(Scratch::kRowBytes);
  MatrixRef one_row = w;
  one_row.rows = 1;
  if (w.dtype == DType::kW8) {
    bytes.resize(w.cols);
    for (int64_t c = 0; c < w.cols; c += 4, step += 64) {
      for (int64_t j = 0; j < 4; ++j) bytes[c + j] = step[j] ^ 0x80;
    }
    one_row.scales = static_cast<const float*>(w.scales) + row;
  } else {
    bytes.assign(w.cols / 2, 0);
    // The group scales from the panel too (the row-major ones may have been released as well):
    // the row's 2 bytes of each group in the scale line before the group's octets.
    std::vector<uint16_t>& scales =
        cx.caller_scratch().object<std::vector<uint16_t>>(Scratch::kRowScales);
    scales.resize(w.cols / w.group_size);
    const uint8_t* scale = step - 2 * (row % kPanelRows);
    for (int64_t c = 0; c < w.cols; c += 8, step += 64) {
      if (c % w.group_size == 0) {
        const int64_t group = c / w.group_size;
        if (group % kGroupsPerScaleLine == 0) {
          scale = step - 2 * (row % kPanelRows);
          step += 64;
        }
        std::memcpy(&scales[group], scale + 32 * (group % kGroupsPerScaleLine), 2);
      }
      for (int64_t j = 0; j < 4; ++j) {
        for (const int64_t col : {c + j, c + 4 + j}) {
          const int nibble = (col == c + j ? step[j] : step[j] >> 4) & 0x0F;
          bytes[col / 2] |= static_cast<uint8_t>(((nibble - 8) & 0x0F) << (4 * (col % 2)));
        }
      }
    }
    one_row.scales = scales.data();
  }
  one_row.data = bytes.data();
  ref::read_row(one_row, 0, out);
}

bool packs_for_int8_kernels(const CpuKernels& kernels, const MatrixRef& w) {
  return kernels.avx512_vnni && uses_int8_activations(w);
}

PackedMatrix pack_for_int8_kernels(const CpuKernels& kernels, const MatrixRef& w) {
  PackedMatrix packed;
  if (!packs_for_int8_kernels(kernels, w)) return packed;
  const size_t size = panel_count(w.rows) * panel_bytes(w);
  // Its pages populated at once: page faults one page at a time cost more than the packing.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    fail(std::string(dtype_name(w.dtype)) + " matrix [" + std::to_string(w.rows) + ", " +
             std::to_string(w.cols) + "]",
         "cannot map " + std::to_string(size >> 20) +
             " MiB for its int8 panels: " + std::strerror(errno),
         ErrorKind::kOutOfMemory);
  }
  packed.bytes_ = {static_cast<uint8_t*>(p), {size}};
  // On the calling thread (loading a model packs several matrices at once on threads of its own).
  for (int64_t p = 0; p < panel_count(w.rows); ++p) {
    pack_panel(w, p, packed.bytes_.get() + p * panel_bytes(w));
  }
  return packed;
}

#else  // not x86-64

#if defined(__aarch64__)  // the NEON kernels, in matmul_int8_neon.cc

void matmul_int8(CpuContext& cx, const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  if (!cx.kernels().neon) return ref::matmul(x, n_tokens, w, y);
  neon::matmul_int8(cx, x, n_tokens, w, y);
}

void matmul_int8(CpuContext& cx, const float* x, int64_t n_tokens,
                 std::span<const MatmulOutput> outputs) {
  for (const MatmulOutput& o : outputs) matmul_int8(cx, x, n_tokens, o.w, o.y);
}

#else  // no SIMD kernels for this architecture

void matmul_int8(CpuContext&, const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  ref::matmul(x, n_tokens, w, y);
}

void matmul_int8(CpuContext&, const float* x, int64_t n_tokens,
                 std::span<const MatmulOutput> outputs) {
  for (const MatmulOutput& o : outputs) ref::matmul(x, n_tokens, o.w, o.y);
}

#endif

bool packs_for_int8_kernels(const CpuKernels&, const MatrixRef&) {
  return false;  // the NEON kernels read matrices as they lie
}

PackedMatrix pack_for_int8_kernels(const CpuKernels&, const MatrixRef&) {
  return {};
}

void read_row(CpuContext&, const MatrixRef& w, int64_t row, float* out) {
  ref::read_row(w, row, out);
}

#endif

bool share_int8_activations(std::span<const MatmulOutput> outputs) {
  if (outputs.empty()) return false;
  const MatrixRef& w = outputs[0].w;
  for (const MatmulOutput& o : outputs) {
    if (!uses_int8_activations(o.w) || o.w.dtype != w.dtype || o.w.cols != w.cols ||
        (o.w.packed == nullptr) != (w.packed == nullptr)) {
      return false;
    }
  }
  return true;
}
void PackedMatrix::Unmap::operator()(uint8_t* p) const {
  ::munmap(p, size);
}

}  // namespace qhx
