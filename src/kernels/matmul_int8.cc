// W8/W4 matmuls with int8 activations (ref::matmul defines the arithmetic; kernels/matmul.h
// dispatches here when uses_int8_activations(w)). The activations are quantized once per call,
// then each (row, token) dot product runs in integer multiply-adds of 4 bytes per 32-bit lane,
// block by block, scaled into a float accumulator. Each (row, token) pair is computed by the
// same instruction sequence whatever the batch, tile and thread count, so a token decoded alone
// gets exactly the bits it gets inside a batched prefill. These are the x86-64 kernels; the
// aarch64 ones are in matmul_int8_neon.cc, and both share kernels/int8_activations.h.
//
// The integer multiply-adds take one unsigned and one signed operand, so the weights enter
// offset to unsigned and the offset is subtracted after scaling:
//   W8, AVX-512 VNNI: (q_w + 128) · q_x, the 128 · Σ q_x term removed once per token;
//   W8, AVX2:        |q_w| · (q_x with q_w's sign) (cannot overflow 16 bits, so no offset);
//   W4, both:        (q_w + 8) · q_x — the nibble XOR 8 — removed per block, since W4 scales
//                    change along the row.
#include "kernels/matmul_int8.h"

#include "kernels/int8_activations.h"
#include "kernels/matmul.h"
#include "kernels/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/simd_avx2.h"
#elif defined(__aarch64__)
#include "kernels/neon.h"
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own -Wuninitialized
// reports inside every caller (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>
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

// ---- AVX-512 VNNI: 64 columns per vector, 16 lanes of 4 bytes ----

template <bool kFull>
QHX_AVX512 inline __m512i load64(const int8_t* p, __mmask64 mask) {
  return kFull ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(mask, p);
}

// 64 columns from c of a W8 tile (kFull) or its last, shorter piece (the mask's columns).
template <int MR, int NR, bool kFull>
QHX_AVX512 inline void w8_chunk_vnni(const int8_t* const* w, const Int8Activations& a, int64_t t0,
                                     int64_t c, __mmask64 mask, __m512 (&acc)[MR][NR]) {
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i wv[MR];
  for (int r = 0; r < MR; ++r) wv[r] = _mm512_xor_si512(load64<kFull>(w[r] + c, mask), offset);
  for (int t = 0; t < NR; ++t) {
    const __m512i xv = load64<kFull>(a.q_of(t0 + t) + c, mask);
    // Lanes 0-7 hold the chunk's first block, 8-15 its second.
    const __m512 sx =
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                              _mm512_loadu_ps(a.block_scales_of(t0 + t) + c / kActivationBlock));
    for (int r = 0; r < MR; ++r) {
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[r], xv);
      acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sx, acc[r][t]);
    }
  }
}

// A tile of MR rows × NR tokens. W8: out = Σ lanes Σ_chunks sx · Σ_4 (q_w + 128) q_x, less the
// offset's share, 128 · Σ_b sx_b · Σ q_x.
template <int MR, int NR>
QHX_AVX512 void w8_tile_vnni(const int8_t* const* w, const Int8Activations& a, int64_t t0,
                             float (*out)[NR]) {
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  int64_t c = 0;
  for (; c + 64 <= a.cols; c += 64) w8_chunk_vnni<MR, NR, true>(w, a, t0, c, 0, acc);
  // Masked loads only at the end: unmasked ones stream faster.
  if (c < a.cols) {
    w8_chunk_vnni<MR, NR, false>(w, a, t0, c, (__mmask64{1} << (a.cols - c)) - 1, acc);
  }
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) {
      out[r][t] = _mm512_reduce_add_ps(acc[r][t]) - 128.0f * a.token_offsets[t0 + t];
    }
  }
}

// W4: weights unpacked as 32 low nibbles then 32 high nibbles, XOR 8 (= q + 8, unsigned);
// out = Σ_chunks sw_group · Σ lanes (sx · Σ_4 (q_w + 8) q_x − lane offset).
template <int MR, int NR>
QHX_AVX512 void w4_tile_vnni(const uint8_t* const* w, const uint16_t* const* scales,
                             int64_t group_size, const Int8Activations& a, int64_t t0,
                             float (*out)[NR]) {
  const int64_t cols = a.cols;
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m512i eight = _mm512_set1_epi8(8);
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  // The group is counted, not divided out of the column: a 64-bit division per chunk cost more
  // than the chunk's arithmetic (measured: W4 decode up to 1.25× faster with the count).
  const int64_t chunks_per_group = group_size / 64;
  for (int64_t c = 0, g = 0, chunk_in_group = 0; c < cols; c += 64) {
    __m512i wv[MR];
    __m512 sw[MR];
    for (int r = 0; r < MR; ++r) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + c / 2));
      const __m256i low = _mm256_and_si256(packed, low_nibbles);
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
      wv[r] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1), eight);
      sw[r] = _mm512_set1_ps(_cvtsh_ss(scales[r][g]));
    }
    if (++chunk_in_group == chunks_per_group) {
      chunk_in_group = 0;
      ++g;
    }
    for (int t = 0; t < NR; ++t) {
      const __m512i xv = _mm512_loadu_si512(a.q_of(t0 + t) + c);
      // Lanes 0-3 and 8-11 hold the chunk's first block (its even and odd columns), the rest
      // its second.
      const __m512 sx =
          _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1),
                                _mm512_loadu_ps(a.block_scales_of(t0 + t) + c / kActivationBlock));
      const __m512 offsets = _mm512_loadu_ps(a.offsets_of(t0 + t) + c / 4);
      for (int r = 0; r < MR; ++r) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[r], xv);
        const __m512 block = _mm512_fmsub_ps(_mm512_cvtepi32_ps(dot), sx, offsets);
        acc[r][t] = _mm512_fmadd_ps(block, sw[r], acc[r][t]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) out[r][t] = _mm512_reduce_add_ps(acc[r][t]);
  }
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

template <int MR, int NR>
QHX_AVX2 void w4_tile_avx2(const uint8_t* const* w, const uint16_t* const* scales,
                           int64_t group_size, const Int8Activations& a, int64_t t0,
                           float (*out)[NR]) {
  const __m128i low_nibbles = _mm_set1_epi8(0x0F);
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  const int64_t blocks_per_group = group_size / 32;  // counted, as in w4_tile_vnni
  for (int64_t c = 0, g = 0, block_in_group = 0; c < a.cols; c += 32) {
    __m256i wv[MR];
    __m256 sw[MR];
    for (int r = 0; r < MR; ++r) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[r] + c / 2));
      const __m128i low = _mm_and_si128(packed, low_nibbles);
      const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), low_nibbles);
      wv[r] = _mm256_xor_si256(_mm256_set_m128i(high, low), eight);
      sw[r] = _mm256_set1_ps(_cvtsh_ss(scales[r][g]));
    }
    if (++block_in_group == blocks_per_group) {
      block_in_group = 0;
      ++g;
    }
    for (int t = 0; t < NR; ++t) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q_of(t0 + t) + c));
      const __m256 sx = _mm256_broadcast_ss(a.block_scales_of(t0 + t) + c / kActivationBlock);
      const __m256 offsets = _mm256_loadu_ps(a.offsets_of(t0 + t) + c / 4);
      for (int r = 0; r < MR; ++r) {
        const __m256 block = _mm256_fmsub_ps(lane_dots(wv[r], xv), sx, offsets);
        acc[r][t] = _mm256_fmadd_ps(block, sw[r], acc[r][t]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) out[r][t] = horizontal_sum(acc[r][t]);
  }
}

// ---- Driving the tiles ----

enum class Isa { kAvx512Vnni, kAvx2 };

constexpr int kTileRows = 4;
constexpr int kTileTokens = 4;

struct VnniTiles {
  template <int MR, int NR>
  static void w8(const int8_t* const* w, const Int8Activations& a, int64_t t0, float (*out)[NR]) {
    w8_tile_vnni<MR, NR>(w, a, t0, out);
  }
  template <int MR, int NR>
  static void w4(const uint8_t* const* w, const uint16_t* const* scales, int64_t group_size,
                 const Int8Activations& a, int64_t t0, float (*out)[NR]) {
    w4_tile_vnni<MR, NR>(w, scales, group_size, a, t0, out);
  }
};

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

// One tile of MR rows from r0 and NR tokens from t0, written into y.
template <int MR, int NR>
void run_tile(Isa isa, const MatrixRef& w, const Int8Activations& a, int64_t r0, int64_t t0,
              float* y) {
  if (isa == Isa::kAvx512Vnni) return run_int8_tile<VnniTiles, MR, NR>(w, a, r0, t0, y);
  run_int8_tile<Avx2Tiles, MR, NR>(w, a, r0, t0, y);
}

// Tiles for every token count up to kTileTokens, with MR rows.
template <int MR, int... NR>
void run_tiles(Isa isa, const MatrixRef& w, const Int8Activations& a, int64_t r0, int64_t n_tokens,
               float* y, std::integer_sequence<int, NR...>) {
  using Tile = void (*)(Isa, const MatrixRef&, const Int8Activations&, int64_t, int64_t, float*);
  static constexpr Tile tiles[] = {run_tile<MR, NR + 1>...};
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTileTokens) {
    const int64_t nr = std::min<int64_t>(kTileTokens, n_tokens - t0);
    tiles[nr - 1](isa, w, a, r0, t0, y);
  }
}

// Rows [row_begin, row_end) for all tokens: tiles of kTileRows rows (single rows at the end),
// each against every token block while its weights are in L1. A single token (decode) goes row
// by row instead: one contiguous stream of weights is what the hardware prefetcher follows best,
// and with one token there is nothing for a tile's rows to share.
void matmul_rows(Isa isa, const MatrixRef& w, const Int8Activations& a, int64_t n_tokens, float* y,
                 int64_t row_begin, int64_t row_end) {
  const auto token_counts = std::make_integer_sequence<int, kTileTokens>{};
  int64_t r = row_begin;
  for (; n_tokens > 1 && r + kTileRows <= row_end; r += kTileRows) {
    run_tiles<kTileRows>(isa, w, a, r, n_tokens, y, token_counts);
  }
  for (; r < row_end; ++r) run_tiles<1>(isa, w, a, r, n_tokens, y, token_counts);
}

// QHX_KERNELS=avx2 keeps to the AVX2 kernels (to compare, or to test them on an AVX-512 CPU).
bool cpu_has_avx512_vnni() {
  const char* choice = std::getenv("QHX_KERNELS");
  if (choice != nullptr && std::string_view(choice) == "avx2") return false;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

}  // namespace

namespace simd {

bool has_avx512_vnni() {
  static const bool yes = has_avx2() && cpu_has_avx512_vnni();
  return yes;
}

}  // namespace simd

void matmul_int8(const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  if (!simd::has_avx2()) return ref::matmul(x, n_tokens, w, y);
  const Isa isa = simd::has_avx512_vnni() ? Isa::kAvx512Vnni : Isa::kAvx2;
  const bool w4 = w.dtype == DType::kW4;
  thread_local Int8Activations scratch;
  Int8Activations& activations = scratch;  // the workers must see the caller's, not their own
  prepare_activations(quantize_token, x, n_tokens, w.cols, isa == Isa::kAvx512Vnni ? 64 : 32,
                      /*nibble_split=*/w4, /*lane_offset=*/w4 ? 8.0f : 0.0f,
                      /*token_offset=*/!w4 && isa == Isa::kAvx512Vnni, activations);
  split_rows(w.rows, kTileRows, w.rows * w.cols * n_tokens, [&](int64_t begin, int64_t end) {
    matmul_rows(isa, w, activations, n_tokens, y, begin, end);
  });
}

const char* matmul_int8_kernel_path() {
  if (!simd::has_avx2()) return "scalar reference";
  return simd::has_avx512_vnni() ? "avx512-vnni" : "avx2";
}

#else  // not x86-64

#if defined(__aarch64__)  // the NEON kernels, in matmul_int8_neon.cc

void matmul_int8(const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  if (!neon::enabled()) return ref::matmul(x, n_tokens, w, y);
  neon::matmul_int8(x, n_tokens, w, y);
}

const char* matmul_int8_kernel_path() {
  if (!neon::enabled()) return "scalar reference";
  return neon::has_dotprod() ? "neon-dotprod" : "neon";
}

#else  // no SIMD kernels for this architecture

void matmul_int8(const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  ref::matmul(x, n_tokens, w, y);
}

const char* matmul_int8_kernel_path() {
  return "scalar reference";
}

#endif

namespace simd {
bool has_avx512_vnni() {
  return false;
}
}  // namespace simd

#endif

}  // namespace qhx
