// W8/W4 matmuls with int8 activations on aarch64 (ref::matmul defines the arithmetic;
// kernels/matmul_int8.cc dispatches here). The activations are quantized once per call
// (kernels/int8_activations.h, shared with the x86 kernels), then each (row, token) dot product
// runs block by block: the 32 products of a block are summed exactly in four int32 lanes, which
// are converted to float32 and multiply-added, times the block's scale, into a float32x4
// accumulator, reduced once at the end. Each (row, token) pair is computed by the same instruction
// sequence whatever the batch, tile and thread count, so a token decoded alone gets exactly the
// bits it gets inside a batched prefill.
//
// Both operands of the integer products are signed, so unlike x86 no offset is needed. A block is
// summed in one of two ways, picked once per process:
//   dot product (SDOT, ARMv8.2, optional before ARMv8.4): four products per 32-bit lane at once;
//   baseline: SMULL/SMLAL2 put pairs of products in 16 bits (|q_w · q_x| ≤ 128 · 127, so two
//             fit), SADDLP/SADALP add pairs of those into 32 bits.
// The two put different columns in each lane, so their float32 sums round differently.
//
// W8 rows are read as they lie; a W4 block (16 packed bytes) unpacks to its 16 low nibbles (its
// even columns) and 16 high nibbles (its odd ones), and the activations are laid out to match.
#include <arm_neon.h>

#if defined(__linux__)
#include <sys/auxv.h>
#endif

#include <algorithm>
#include <cfloat>

#include "kernels/cpu_context.h"
#include "kernels/int8_activations.h"
#include "kernels/matmul.h"
#include "kernels/neon.h"

#if defined(__ARM_FEATURE_DOTPROD)  // built for CPUs that all have it
#define QHX_DOTPROD_KERNELS 1
#define QHX_DOTPROD
#elif defined(__GNUC__) && !defined(__clang__)
#define QHX_DOTPROD_KERNELS 1
// GCC's arm_neon.h declares vdotq_s32 for armv8.2-a+dotprod, which its callers must target.
#define QHX_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#else  // clang's arm_neon.h (before clang 16) declares vdotq_s32 only to files built for it
#define QHX_DOTPROD_KERNELS 0
#endif

#if !defined(HWCAP_ASIMDDP)
#define HWCAP_ASIMDDP (1UL << 20)  // Linux's aarch64 hwcap bit for SDOT/UDOT
#endif

namespace qhx::neon {
namespace {

// ref::quantize_activations for one token, vectorised: the same float32 operations, so the same
// bits (FCVTNS rounds to nearest even, as nearbyint does in the default rounding mode).
void quantize_token(const float* x, int64_t cols, int8_t* q, float* scales) {
  const float32x4_t largest = vdupq_n_f32(FLT_MAX);
  for (int64_t b = 0; b < cols / kActivationBlock; ++b) {
    const float* xb = x + b * kActivationBlock;
    int8_t* qb = q + b * kActivationBlock;
    float32x4_t v[8];
    float32x4_t max_abs = vdupq_n_f32(0.0f);
    uint32x4_t finite = vdupq_n_u32(~0u);
    for (int k = 0; k < 8; ++k) {
      v[k] = vld1q_f32(xb + 4 * k);
      const float32x4_t a = vabsq_f32(v[k]);
      max_abs = vmaxq_f32(max_abs, a);
      finite = vandq_u32(finite, vcleq_f32(a, largest));  // false for inf and NaN
    }
    const float block_max = vmaxvq_f32(max_abs);
    if (vminvq_u32(finite) == 0 || block_max == 0.0f) {
      // The reference's special cases, kept in one place.
      ref::quantize_activations(xb, kActivationBlock, qb, scales + b);
      continue;
    }
    scales[b] = block_max / 127.0f;
    const float inverse = 127.0f / block_max;
    int16x8_t halves[4];
    for (int k = 0; k < 4; ++k) {
      const int32x4_t first = vcvtnq_s32_f32(vmulq_n_f32(v[2 * k], inverse));
      const int32x4_t second = vcvtnq_s32_f32(vmulq_n_f32(v[2 * k + 1], inverse));
      halves[k] = vcombine_s16(vqmovn_s32(first), vqmovn_s32(second));
    }
    vst1q_s8(qb, vcombine_s8(vqmovn_s16(halves[0]), vqmovn_s16(halves[1])));
    vst1q_s8(qb + 16, vcombine_s8(vqmovn_s16(halves[2]), vqmovn_s16(halves[3])));
  }
}

// The two ways to sum a block: Σ w0·x0 + w1·x1 over 16 + 16 bytes, in four int32 lanes.
#if QHX_DOTPROD_KERNELS
struct DotProduct {
  QHX_DOTPROD static int32x4_t block(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, x0), w1, x1);
  }
};
#endif

struct Widening {
  static int32x4_t block(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1) {
    const int16x8_t p0 = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0);
    const int16x8_t p1 = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1);
    return vpadalq_s16(vpaddlq_s16(p0), p1);
  }
};

// A tile of MR W8 rows × NR tokens from t0: out = Σ_b sx_b · Σ_{c∈b} q_w q_x (the row's scale is
// applied by the caller). The rows' weights are loaded once per block for all NR tokens.
template <typename Dot, int MR, int NR>
inline void w8_tile(const int8_t* const* w, const Int8Activations& a, int64_t t0,
                    float (*out)[NR]) {
  float32x4_t acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) acc[r][t] = vdupq_n_f32(0.0f);
  }
  const int8_t* x[NR];
  const float* sx[NR];
  for (int t = 0; t < NR; ++t) {
    x[t] = a.q_of(t0 + t);
    sx[t] = a.block_scales_of(t0 + t);
  }
  for (int64_t b = 0; b < a.cols / kActivationBlock; ++b) {
    const int64_t c = b * kActivationBlock;
    int8x16_t w0[MR], w1[MR];
    for (int r = 0; r < MR; ++r) {
      w0[r] = vld1q_s8(w[r] + c);
      w1[r] = vld1q_s8(w[r] + c + 16);
    }
    for (int t = 0; t < NR; ++t) {
      const int8x16_t x0 = vld1q_s8(x[t] + c), x1 = vld1q_s8(x[t] + c + 16);
      for (int r = 0; r < MR; ++r) {
        const int32x4_t dot = Dot::block(w0[r], w1[r], x0, x1);
        acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(dot), sx[t][b]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) out[r][t] = vaddvq_f32(acc[r][t]);
  }
}

// W4: out = Σ_b (sw_group · sx_b) · Σ_{c∈b} q_w q_x, with the weights sign-extended from their
// nibbles (low nibbles: the block's even columns; high: its odd ones). The MR rows' group scales
// share a vector, which each token's block scale multiplies into one scale per row.
template <typename Dot, int MR, int NR>
inline void w4_tile(const uint8_t* const* w, const uint16_t* const* scales, int64_t group_size,
                    const Int8Activations& a, int64_t t0, float (*out)[NR]) {
  static_assert(MR <= 4);
  float32x4_t acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) acc[r][t] = vdupq_n_f32(0.0f);
  }
  const int8_t* x[NR];
  const float* sx[NR];
  for (int t = 0; t < NR; ++t) {
    x[t] = a.q_of(t0 + t);
    sx[t] = a.block_scales_of(t0 + t);
  }
  const int64_t blocks_per_group = group_size / kActivationBlock;
  for (int64_t g = 0; g < a.cols / group_size; ++g) {
    float group_scales[4] = {};
    for (int r = 0; r < MR; ++r) group_scales[r] = f16_to_f32(scales[r][g]);
    const float32x4_t sw = vld1q_f32(group_scales);
    for (int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b) {
      const int64_t c = b * kActivationBlock;
      int8x16_t low[MR], high[MR];
      for (int r = 0; r < MR; ++r) {
        const int8x16_t packed = vreinterpretq_s8_u8(vld1q_u8(w[r] + c / 2));
        low[r] = vshrq_n_s8(vshlq_n_s8(packed, 4), 4);  // arithmetic shifts sign-extend
        high[r] = vshrq_n_s8(packed, 4);
      }
      for (int t = 0; t < NR; ++t) {
        const int8x16_t x0 = vld1q_s8(x[t] + c), x1 = vld1q_s8(x[t] + c + 16);
        float scale[4];  // row r's in scale[r]
        vst1q_f32(scale, vmulq_n_f32(sw, sx[t][b]));
        for (int r = 0; r < MR; ++r) {
          const int32x4_t dot = Dot::block(low[r], high[r], x0, x1);
          acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(dot), scale[r]);
        }
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) out[r][t] = vaddvq_f32(acc[r][t]);
  }
}

// ---- Driving the tiles ----

// A 4 × 4 tile keeps 16 accumulators, 8 weight and 2 activation vectors in the 32 registers
// (built with GCC's -fno-schedule-insns, src/CMakeLists.txt, to stay within them).
constexpr int kTileRows = 4;
constexpr int kTileTokens = 4;

template <typename Dot>
struct NeonTiles {
  template <int MR, int NR>
  static void w8(const int8_t* const* w, const Int8Activations& a, int64_t t0, float (*out)[NR]) {
    w8_tile<Dot, MR, NR>(w, a, t0, out);
  }
  template <int MR, int NR>
  static void w4(const uint8_t* const* w, const uint16_t* const* scales, int64_t group_size,
                 const Int8Activations& a, int64_t t0, float (*out)[NR]) {
    w4_tile<Dot, MR, NR>(w, scales, group_size, a, t0, out);
  }
};

// One tile of MR rows from r0 and NR tokens from t0, written into y.
template <typename Dot, int MR, int NR>
inline void run_tile(const MatrixRef& w, const Int8Activations& a, int64_t r0, int64_t t0,
                     float* y) {
  run_int8_tile<NeonTiles<Dot>, MR, NR>(w, a, r0, t0, y);
}

// The last n_tokens - t0 < NR tokens of MR rows from r0, as one tile.
template <typename Dot, int MR, int NR>
inline void run_last_tile(const MatrixRef& w, const Int8Activations& a, int64_t r0, int64_t t0,
                          int64_t n_tokens, float* y) {
  if constexpr (NR > 0) {
    if (n_tokens - t0 == NR) return run_tile<Dot, MR, NR>(w, a, r0, t0, y);
    run_last_tile<Dot, MR, NR - 1>(w, a, r0, t0, n_tokens, y);
  }
}

// MR rows from r0 against every token, kTileTokens at a time (direct calls, not a table of
// functions, so that all of them inline into matmul_rows_*).
template <typename Dot, int MR>
inline void run_tiles(const MatrixRef& w, const Int8Activations& a, int64_t r0, int64_t n_tokens,
                      float* y) {
  int64_t t0 = 0;
  for (; t0 + kTileTokens <= n_tokens; t0 += kTileTokens) {
    run_tile<Dot, MR, kTileTokens>(w, a, r0, t0, y);
  }
  run_last_tile<Dot, MR, kTileTokens - 1>(w, a, r0, t0, n_tokens, y);
}

// Rows [row_begin, row_end) for all tokens: tiles of kTileRows rows (single rows at the end),
// each against every token block while its weights are in L1. A single token (decode) also goes
// four rows at a time: four independent accumulator chains and four weight streams.
template <typename Dot>
inline void matmul_rows(const MatrixRef& w, const Int8Activations& a, int64_t n_tokens, float* y,
                        int64_t row_begin, int64_t row_end) {
  int64_t r = row_begin;
  for (; r + kTileRows <= row_end; r += kTileRows) run_tiles<Dot, kTileRows>(w, a, r, n_tokens, y);
  for (; r < row_end; ++r) run_tiles<Dot, 1>(w, a, r, n_tokens, y);
}

// One function per way of summing a block, with every call inlined into it (flatten): the
// dot-product instructions may only run inside functions built for them.
using MatmulRows = void (*)(const MatrixRef&, const Int8Activations&, int64_t, float*, int64_t,
                            int64_t);

#if QHX_DOTPROD_KERNELS
QHX_DOTPROD __attribute__((flatten)) void matmul_rows_dotprod(const MatrixRef& w,
                                                              const Int8Activations& a,
                                                              int64_t n_tokens, float* y,
                                                              int64_t row_begin, int64_t row_end) {
  matmul_rows<DotProduct>(w, a, n_tokens, y, row_begin, row_end);
}
#endif

__attribute__((flatten)) void matmul_rows_widening(const MatrixRef& w, const Int8Activations& a,
                                                   int64_t n_tokens, float* y, int64_t row_begin,
                                                   int64_t row_end) {
  matmul_rows<Widening>(w, a, n_tokens, y, row_begin, row_end);
}

}  // namespace

bool dotprod_available() {
#if QHX_DOTPROD_KERNELS && defined(__ARM_FEATURE_DOTPROD)
  return true;
#elif QHX_DOTPROD_KERNELS && defined(__linux__)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return false;
#endif
}

void matmul_int8(CpuContext& cx, const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  MatmulRows rows = matmul_rows_widening;
#if QHX_DOTPROD_KERNELS
  if (cx.kernels().neon_dotprod) rows = matmul_rows_dotprod;
#endif
  // The caller's: the workers read it.
  Int8Activations& activations =
      cx.caller_scratch().object<Int8Activations>(Scratch::kInt8Activations);
  prepare_activations(cx, quantize_token, x, n_tokens, w.cols,
                      {.chunk = kActivationBlock, .nibble_split = w.dtype == DType::kW4},
                      activations);
  cx.split_rows(w.rows, kTileRows, w.rows * w.cols * n_tokens,
                [&](int64_t begin, int64_t end) { rows(w, activations, n_tokens, y, begin, end); });
}

}  // namespace qhx::neon
