#include "kernels/attention.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/simd_avx2.h"
#include "kernels/simd_avx512.h"
#elif defined(__aarch64__)
#include "kernels/neon.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu_context.h"
#include "kernels/matmul.h"

namespace qhx {
namespace {

// causal_attention gathers a head's rows from this many blocks of positions per head, and while
// the copy takes at most kMaxGatherBytes per thread (past that the head's rows spill out of L2
// anyway, and the copy would be scratch memory no plan counts).
constexpr int64_t kMinBlocksToGather = 8;
constexpr int64_t kMaxGatherBytes = int64_t{4} << 20;

// The AVX-512 kernel's scores come this many keys at a time, and it reads gathered keys transposed
// in blocks of this many (GatheredHead).
constexpr int kKeysAtOnce = 16;

// Query rows that read the same keys and values (the query heads of one key/value head, at a few
// consecutive positions), each with its scores scratch; sorted by n_keys, ascending.
struct AttentionRow {
  const float* q;
  float* out;
  float* scores;
  int64_t n_keys;
};

// A kernel for such rows. Every row gets exactly what it would get alone, so a token decoded
// by itself equals its row inside a batched prefill.
using AttendRows = void (*)(const AttentionRow* rows, int n_rows, const float* keys,
                            const float* values, int64_t kv_stride, int64_t head_dim, float scale);

#if defined(__x86_64__)
#define QHX_AVX2 __attribute__((target("avx2,fma,f16c")))

using avx2::horizontal_sum;

// ref::softmax with 8 lanes (sums in another order, so equal up to rounding).
QHX_AVX2 void softmax_avx2(float* x, int64_t n) {
  float max = x[0];
  int64_t i = 0;
  if (n >= 8) {
    __m256 m = _mm256_loadu_ps(x);
    for (i = 8; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    for (const float v : lanes) max = std::fmax(max, v);
  }
  for (; i < n; ++i) max = std::fmax(max, x[i]);
  const __m256 mv = _mm256_set1_ps(max);
  __m256 sums = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    _mm256_storeu_ps(x + i, e);
    sums = _mm256_add_ps(sums, e);
  }
  float sum = horizontal_sum(sums);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= 1.0f / sum;
}

// Rows are taken up to 8 at a time and each key and value vector is loaded once for all of them:
// a query alone would stream its head's whole K and V from L2, which bounds it at a few
// multiply-adds per cycle. Each (row, key) score is one accumulator summed over head_dim in
// order, and each output column sums p_j · v_j over j in order from zero, whichever rows share
// the batch.
constexpr int kRowsAtOnce = 8;

// Output vectors per row in one pass over the values: as many as 16 accumulators hold, so that a
// decode step's one or two rows read each value row once, whole.
template <int R>
constexpr int kVectorsPerPass = R <= 2 ? 8 : (R <= 4 ? 4 : 2);

// How the AVX2 kernel reads a cached head of each KV type (core/kv_layout.h): load gives the 8
// elements at d as floats (the codes, for the quantized types), scale the scale of the group of
// `group` elements holding element d. Scores sum q·code over each group in order, then add
// scale · that sum group by group; outputs take p · scale as each value's weight.
struct F32Head {
  static constexpr bool kScaled = false;
  static int64_t group(int64_t head_dim) { return head_dim; }
  QHX_AVX2 static __m256 load(const float* head, int64_t d) { return _mm256_loadu_ps(head + d); }
  static float scale(const float*, int64_t, int64_t) { return 1.0f; }
};
struct F16Head {
  static constexpr bool kScaled = false;
  static int64_t group(int64_t head_dim) { return head_dim; }
  QHX_AVX2 static __m256 load(const float* head, int64_t d) {
    const auto* halves = reinterpret_cast<const uint16_t*>(head) + d;
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(halves)));
  }
  static float scale(const float*, int64_t, int64_t) { return 1.0f; }
};
struct Q8Head {
  static constexpr bool kScaled = true;
  static int64_t group(int64_t head_dim) { return head_dim; }
  QHX_AVX2 static __m256 load(const float* head, int64_t d) {
    const auto* codes = reinterpret_cast<const int8_t*>(head) + d;
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))));
  }
  static float scale(const float* head, int64_t head_dim, int64_t) { return head[head_dim / 4]; }
};
struct Q4Head {
  static constexpr bool kScaled = true;
  static int64_t group(int64_t) { return kKvQ4Group; }
  QHX_AVX2 static __m256 load(const float* head, int64_t d) {
    int32_t nibbles;  // elements d..d+7, two per byte, the even one low
    std::memcpy(&nibbles, reinterpret_cast<const uint8_t*>(head) + d / 2, sizeof(nibbles));
    const __m256i shifted = _mm256_srlv_epi32(_mm256_set1_epi32(nibbles),
                                              _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const __m256i codes =
        _mm256_sub_epi32(_mm256_and_si256(shifted, _mm256_set1_epi32(15)), _mm256_set1_epi32(8));
    return _mm256_cvtepi32_ps(codes);
  }
  static float scale(const float* head, int64_t head_dim, int64_t d) {
    return head[head_dim / 8 + d / kKvQ4Group];
  }
};

// scores[j] = scale · q·k_j for keys [j_begin, j_end) of R rows.
template <typename Head, int R>
QHX_AVX2 void row_scores(const AttentionRow* rows, const float* keys, int64_t kv_stride,
                         int64_t head_dim, float scale, int64_t j_begin, int64_t j_end) {
  const int64_t group = Head::group(head_dim);
  for (int64_t j = j_begin; j < j_end; ++j) {
    const float* k = keys + j * kv_stride;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < head_dim; g += group) {
      __m256 part[R];
      for (int r = 0; r < R; ++r) part[r] = _mm256_setzero_ps();
      for (int64_t d = g; d < g + group; d += 8) {
        const __m256 kd = Head::load(k, d);
        for (int r = 0; r < R; ++r) {
          part[r] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[r].q + d), kd, part[r]);
        }
      }
      for (int r = 0; r < R; ++r) {
        acc[r] = Head::kScaled
                     ? _mm256_fmadd_ps(part[r], _mm256_set1_ps(Head::scale(k, head_dim, g)), acc[r])
                     : part[r];
      }
    }
    for (int r = 0; r < R; ++r) rows[r].scores[j] = horizontal_sum(acc[r]) * scale;
  }
}

// Value j's weight for output columns [d, d + 8): its probability times its group's scale.
template <typename Head>
QHX_AVX2 inline __m256 value_weight(float p, const float* v, int64_t head_dim, int64_t d) {
  return _mm256_set1_ps(Head::kScaled ? p * Head::scale(v, head_dim, d) : p);
}

// Output columns [d, d + 8·NV) of R rows: the keys all rows see are shared, then each row
// finishes its own.
template <typename Head, int R, int NV>
QHX_AVX2 void row_outputs(const AttentionRow* rows, const float* values, int64_t kv_stride,
                          int64_t head_dim, int64_t d) {
  __m256 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < NV; ++i) acc[r][i] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < rows[0].n_keys; ++j) {
    const float* vj = values + j * kv_stride;
    __m256 v[NV];
    for (int i = 0; i < NV; ++i) v[i] = Head::load(vj, d + 8 * i);
    for (int r = 0; r < R; ++r) {
      for (int i = 0; i < NV; ++i) {
        const __m256 p = value_weight<Head>(rows[r].scores[j], vj, head_dim, d + 8 * i);
        acc[r][i] = _mm256_fmadd_ps(p, v[i], acc[r][i]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t j = rows[0].n_keys; j < rows[r].n_keys; ++j) {
      const float* vj = values + j * kv_stride;
      for (int i = 0; i < NV; ++i) {
        const __m256 p = value_weight<Head>(rows[r].scores[j], vj, head_dim, d + 8 * i);
        acc[r][i] = _mm256_fmadd_ps(p, Head::load(vj, d + 8 * i), acc[r][i]);
      }
    }
    for (int i = 0; i < NV; ++i) _mm256_storeu_ps(rows[r].out + d + 8 * i, acc[r][i]);
  }
}

template <typename Head, int R>
QHX_AVX2 void attend_batch(const AttentionRow* rows, const float* keys, const float* values,
                           int64_t kv_stride, int64_t head_dim, float scale) {
  row_scores<Head, R>(rows, keys, kv_stride, head_dim, scale, 0, rows[0].n_keys);
  for (int r = 0; r < R; ++r) {
    row_scores<Head, 1>(rows + r, keys, kv_stride, head_dim, scale, rows[0].n_keys, rows[r].n_keys);
    softmax_avx2(rows[r].scores, rows[r].n_keys);
  }
  int64_t d = 0;
  for (; d + 8 * kVectorsPerPass<R> <= head_dim; d += 8 * kVectorsPerPass<R>) {
    row_outputs<Head, R, kVectorsPerPass<R>>(rows, values, kv_stride, head_dim, d);
  }
  for (; d < head_dim; d += 8) row_outputs<Head, R, 1>(rows, values, kv_stride, head_dim, d);
}

// head_dim a multiple of 8 (of kKvQ4Group for q4 heads).
template <typename Head>
void attend_rows_avx2(const AttentionRow* rows, int n_rows, const float* keys, const float* values,
                      int64_t kv_stride, int64_t head_dim, float scale) {
  using Batch = void (*)(const AttentionRow*, const float*, const float*, int64_t, int64_t, float);
  static constexpr Batch batches[] = {
      attend_batch<Head, 1>, attend_batch<Head, 2>, attend_batch<Head, 3>, attend_batch<Head, 4>,
      attend_batch<Head, 5>, attend_batch<Head, 6>, attend_batch<Head, 7>, attend_batch<Head, 8>};
  for (int r = 0; r < n_rows; r += kRowsAtOnce) {
    const int n = std::min(kRowsAtOnce, n_rows - r);
    batches[n - 1](rows + r, keys, values, kv_stride, head_dim, scale);
  }
}

#define QHX_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")))

// softmax_avx2 with 16 lanes and masked tails.
QHX_AVX512 void softmax_avx512(float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(x[0]);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512::first_lanes(n - i);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + i));
  }
  const __m512 max = _mm512_set1_ps(avx512::horizontal<true>(m));
  __m512 sums = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512::first_lanes(n - i);
    const __m512 e = avx512::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), max));
    _mm512_mask_storeu_ps(x + i, k, e);
    sums = _mm512_mask_add_ps(sums, k, sums, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / avx512::horizontal<false>(sums));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512::first_lanes(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
  }
}

// The AVX-512 kernel keeps each (row, key) score in a vector over head_dim and turns sixteen of
// them (kKeysAtOnce) into sixteen scores at once with a fixed tree of shuffles and adds: the AVX2
// kernel's horizontal sum per score costs as much as the score's multiply-adds.

// Sums of neighbouring lanes of a (lanes 0–7) and b (lanes 8–15): avx512::lane_pairs' tree.
QHX_AVX512 inline __m512 add_lane_pairs(__m512 a, __m512 b) {
  const avx512::LanePairs p = avx512::lane_pairs(a, b);
  return _mm512_add_ps(p.even, p.odd);
}

// scale · sums into the row's scores of keys [j, j + kKeysAtOnce), as far as the row has keys.
QHX_AVX512 inline void store_scores(const AttentionRow& row, int64_t j, __m512 sums, float scale) {
  _mm512_mask_storeu_ps(row.scores + j, avx512::first_lanes(row.n_keys - j),
                        _mm512_mul_ps(sums, _mm512_set1_ps(scale)));
}

// For RT rows and the four keys k[0..4): quads[r] holds, in lanes 4j..4j+3, four partial sums of
// q_r·k_j; each (row, key) product is summed lane by lane over head_dim in order, so a row gets the
// same bits in any tile. The rows share each key load and the keys each row load; keys are read
// along their rows (they lie kv_stride apart, 4 KB and more, and sixteen read column by column
// would keep missing the L1 set they share).
template <int RT>
QHX_AVX512 void score_quads(const AttentionRow* rows, const float* const k[4], int64_t head_dim,
                            __m512* quads) {
  __m512 acc[RT][4];
  for (int r = 0; r < RT; ++r) {
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < head_dim; d += 16) {
    __m512 kd[4];
    for (int j = 0; j < 4; ++j) kd[j] = _mm512_loadu_ps(k[j] + d);
    for (int r = 0; r < RT; ++r) {
      const __m512 qd = _mm512_loadu_ps(rows[r].q + d);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(qd, kd[j], acc[r][j]);
    }
  }
  for (int r = 0; r < RT; ++r) {
    quads[r] =
        add_lane_pairs(add_lane_pairs(acc[r][0], acc[r][1]), add_lane_pairs(acc[r][2], acc[r][3]));
  }
}

// scores = scale · q·k for every row and its keys, sixteen keys at a time, taken four at a time
// (2 or 4 KB at head_dim 128 or 256) while they are in L1 by every tile of rows.
template <int R>
QHX_AVX512 void row_scores_avx512(const AttentionRow* rows, const float* keys, int64_t kv_stride,
                                  int64_t head_dim, float scale) {
  using Quads = void (*)(const AttentionRow*, const float* const*, int64_t, __m512*);
  static constexpr Quads tiles[] = {score_quads<1>, score_quads<2>, score_quads<3>, score_quads<4>};
  __m512 quads[4][R];  // [key quad][row]
  int first = 0;       // rows are sorted by n_keys: those before first have no keys left
  for (int64_t j0 = 0; j0 < rows[R - 1].n_keys; j0 += kKeysAtOnce) {
    while (rows[first].n_keys <= j0) ++first;
    for (int g = 0; g < 4; ++g) {
      for (int r = first; r < R; r += 4) {
        const int rt = std::min(4, R - r);
        // Keys past the tile's last one are not read: their lanes repeat it, and no row stores
        // them.
        const int64_t last_key = rows[r + rt - 1].n_keys - 1;
        const float* k[4];
        for (int j = 0; j < 4; ++j) k[j] = keys + std::min(j0 + 4 * g + j, last_key) * kv_stride;
        tiles[rt - 1](rows + r, k, head_dim, quads[g] + r);
      }
    }
    for (int r = first; r < R; ++r) {
      const __m512 sums = add_lane_pairs(add_lane_pairs(quads[0][r], quads[1][r]),
                                         add_lane_pairs(quads[2][r], quads[3][r]));
      store_scores(rows[r], j0, sums, scale);
    }
  }
}

// The same scores from keys transposed in blocks of kKeysAtOnce ([block][d][key], as
// GatheredHead lays them out): lane j of a vector is key j, so no tree crosses lanes. The sums
// keep row_scores_avx512's order to the bit: the partial sum of head_dim lanes ≡ l (mod 16),
// multiply-added in order from zero, then the same pairwise tree over l = 0..15 (here adds of
// whole vectors, pairs of neighbours first), so a gathered prefill row equals its decode.
// KB consecutive blocks × RT rows into sums[b · RT + r].
template <int RT, int KB>
QHX_AVX512 void score_blocks_transposed(const AttentionRow* rows, const float* blocks,
                                        int64_t head_dim, __m512* sums) {
  __m512 pending[4][KB][RT];  // [level]: the sum of the last 2^level lanes still unpaired
  const int64_t block_floats = head_dim * kKeysAtOnce;
  for (int l = 0; l < kKeysAtOnce; ++l) {
    __m512 acc[KB][RT];
    for (int b = 0; b < KB; ++b) {
      for (int r = 0; r < RT; ++r) acc[b][r] = _mm512_setzero_ps();
    }
    for (int64_t d = l; d < head_dim; d += kKeysAtOnce) {
      __m512 kd[KB];
      for (int b = 0; b < KB; ++b) {
        kd[b] = _mm512_loadu_ps(blocks + b * block_floats + d * kKeysAtOnce);
      }
      for (int r = 0; r < RT; ++r) {
        const __m512 qd = _mm512_set1_ps(rows[r].q[d]);
        for (int b = 0; b < KB; ++b) acc[b][r] = _mm512_fmadd_ps(qd, kd[b], acc[b][r]);
      }
    }
    int level = 0;
    for (; l >> level & 1; ++level) {
      for (int b = 0; b < KB; ++b) {
        for (int r = 0; r < RT; ++r) acc[b][r] = _mm512_add_ps(pending[level][b][r], acc[b][r]);
      }
    }
    for (int b = 0; b < KB; ++b) {
      for (int r = 0; r < RT; ++r) {
        (level == 4 ? sums[b * RT + r] : pending[level][b][r]) = acc[b][r];
      }
    }
  }
}

using ScoreBlocks = void (*)(const AttentionRow*, const float*, int64_t, __m512*);
template <int KB, typename RowCounts>
struct ScoreTiles;
template <int KB, int... RT>
struct ScoreTiles<KB, std::integer_sequence<int, RT...>> {
  static constexpr ScoreBlocks tiles[] = {score_blocks_transposed<RT + 1, KB>...};
};

// row_scores_avx512 for keys transposed in blocks (score_blocks_transposed), up to
// kBlocksAtOnce blocks at a time: each broadcast element of a query serves them all (one block at
// a time ran 0.6B-shaped prefill attention at 140-145 GFLOP/s on one core, two at 164-168,
// three at 162-169 and four at 147-151).
constexpr int kBlocksAtOnce = 2;
template <int R>
QHX_AVX512 void row_scores_transposed(const AttentionRow* rows, const float* keys, int64_t head_dim,
                                      float scale) {
  using RowCounts = std::make_integer_sequence<int, kRowsAtOnce>;
  static constexpr const ScoreBlocks* tiles[] = {ScoreTiles<1, RowCounts>::tiles,
                                                 ScoreTiles<2, RowCounts>::tiles};
  static_assert(std::size(tiles) == kBlocksAtOnce);
  __m512 sums[kBlocksAtOnce * R];
  int first = 0;  // rows are sorted by n_keys: those before first have no keys left
  for (int64_t j0 = 0; j0 < rows[R - 1].n_keys; j0 += kBlocksAtOnce * kKeysAtOnce) {
    while (rows[first].n_keys <= j0) ++first;
    const int rt = R - first;
    const int blocks = static_cast<int>(std::min<int64_t>(
        kBlocksAtOnce, (rows[R - 1].n_keys - j0 + kKeysAtOnce - 1) / kKeysAtOnce));
    tiles[blocks - 1][rt - 1](rows + first, keys + j0 * head_dim, head_dim, sums);
    for (int b = 0; b < blocks; ++b) {
      const int64_t j = j0 + b * kKeysAtOnce;
      for (int r = first; r < R; ++r) store_scores(rows[r], j, sums[b * rt + r - first], scale);
    }
  }
}

// Output columns [d, d + 16·NV) of R rows, as row_outputs does with 8 lanes.
template <int R, int NV>
QHX_AVX512 void row_outputs_avx512(const AttentionRow* rows, const float* values, int64_t kv_stride,
                                   int64_t d) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < NV; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < rows[0].n_keys; ++j) {
    __m512 v[NV];
    for (int i = 0; i < NV; ++i) v[i] = _mm512_loadu_ps(values + j * kv_stride + d + 16 * i);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(rows[r].scores[j]);
      for (int i = 0; i < NV; ++i) acc[r][i] = _mm512_fmadd_ps(p, v[i], acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t j = rows[0].n_keys; j < rows[r].n_keys; ++j) {
      const __m512 p = _mm512_set1_ps(rows[r].scores[j]);
      for (int i = 0; i < NV; ++i) {
        acc[r][i] =
            _mm512_fmadd_ps(p, _mm512_loadu_ps(values + j * kv_stride + d + 16 * i), acc[r][i]);
      }
    }
    for (int i = 0; i < NV; ++i) _mm512_storeu_ps(rows[r].out + d + 16 * i, acc[r][i]);
  }
}

template <int R, bool kKeysTransposed>
QHX_AVX512 void attend_batch_avx512(const AttentionRow* rows, const float* keys,
                                    const float* values, int64_t kv_stride, int64_t head_dim,
                                    float scale) {
  if (kKeysTransposed) {
    row_scores_transposed<R>(rows, keys, head_dim, scale);
  } else {
    row_scores_avx512<R>(rows, keys, kv_stride, head_dim, scale);
  }
  for (int r = 0; r < R; ++r) softmax_avx512(rows[r].scores, rows[r].n_keys);
  int64_t d = 0;
  for (; d + 16 * kVectorsPerPass<R> <= head_dim; d += 16 * kVectorsPerPass<R>) {
    row_outputs_avx512<R, kVectorsPerPass<R>>(rows, values, kv_stride, d);
  }
  for (; d < head_dim; d += 16) row_outputs_avx512<R, 1>(rows, values, kv_stride, d);
}

// head_dim a multiple of 16; keys as they lie (kKeysTransposed false) or transposed in blocks of
// kKeysAtOnce (GatheredHead).
template <bool kKeysTransposed>
void attend_rows_avx512(const AttentionRow* rows, int n_rows, const float* keys,
                        const float* values, int64_t kv_stride, int64_t head_dim, float scale) {
  using Batch = void (*)(const AttentionRow*, const float*, const float*, int64_t, int64_t, float);
  static constexpr Batch batches[] = {
      attend_batch_avx512<1, kKeysTransposed>, attend_batch_avx512<2, kKeysTransposed>,
      attend_batch_avx512<3, kKeysTransposed>, attend_batch_avx512<4, kKeysTransposed>,
      attend_batch_avx512<5, kKeysTransposed>, attend_batch_avx512<6, kKeysTransposed>,
      attend_batch_avx512<7, kKeysTransposed>, attend_batch_avx512<8, kKeysTransposed>};
  for (int r = 0; r < n_rows; r += kRowsAtOnce) {
    const int n = std::min(kRowsAtOnce, n_rows - r);
    batches[n - 1](rows + r, keys, values, kv_stride, head_dim, scale);
  }
}
#elif defined(__aarch64__)
// head_dim a multiple of 4 (of 8 for the f16 and q8 heads, of kKvQ4Group for q4).
template <KvType kKv>
void attend_rows_neon(const AttentionRow* rows, int n_rows, const float* keys, const float* values,
                      int64_t kv_stride, int64_t head_dim, float scale) {
  for (int r = 0; r < n_rows; ++r) {
    neon::attend_query(kKv, rows[r].q, rows[r].n_keys, keys, values, kv_stride, head_dim, scale,
                       rows[r].scores, rows[r].out);
  }
}
#endif

// One key/value head's first rows, side by side (causal_attention), kept for the next task. The
// AVX-512 kernel takes the keys transposed in blocks of kKeysAtOnce ([block][d][key]); the others
// read them as rows.
struct GatheredHead {
  uint64_t call = 0;  // causal_attention call whose rows these are
  int64_t kv = -1;
  int64_t n_rows = 0;
  std::vector<float> keys, values;

  // Rows [0, n) of head kv in this call (capacity for `most` rows); rows already here are kept.
  void gather(uint64_t for_call, int64_t for_kv, const float* all_keys, const float* all_values,
              int64_t n, int64_t most, int64_t kv_stride, int64_t head_dim, bool transpose_keys) {
    if (call != for_call || kv != for_kv) {
      call = for_call;
      kv = for_kv;
      n_rows = 0;
    }
    // Whole blocks of keys: lanes past the last row hold what they held (no row stores them).
    const int64_t key_rows = (most + kKeysAtOnce - 1) / kKeysAtOnce * kKeysAtOnce;
    keys.resize(std::max<size_t>(keys.size(), key_rows * head_dim));
    values.resize(std::max<size_t>(values.size(), most * head_dim));
    for (; n_rows < n; ++n_rows) {
      const int64_t from = n_rows * kv_stride + kv * head_dim;
      std::copy_n(all_values + from, head_dim, values.data() + n_rows * head_dim);
      if (!transpose_keys) {
        std::copy_n(all_keys + from, head_dim, keys.data() + n_rows * head_dim);
        continue;
      }
      float* column =
          keys.data() + n_rows / kKeysAtOnce * kKeysAtOnce * head_dim + n_rows % kKeysAtOnce;
      for (int64_t d = 0; d < head_dim; ++d) column[d * kKeysAtOnce] = all_keys[from + d];
    }
  }
};

// The SIMD kernel for this CPU, head size and KV type, or null for the reference.
AttendRows fast_attend_rows([[maybe_unused]] const CpuKernels& kernels,
                            [[maybe_unused]] int64_t head_dim, [[maybe_unused]] KvType kv) {
  if (!kv_type_fits(kv, head_dim)) return nullptr;
#if defined(__x86_64__)
  if (!kernels.avx2 || head_dim % 8 != 0) return nullptr;
  switch (kv) {
    case KvType::kF32:
      return kernels.avx512 && head_dim % 16 == 0 ? attend_rows_avx512<false>
                                                  : attend_rows_avx2<F32Head>;
    case KvType::kF16:
      return attend_rows_avx2<F16Head>;
    case KvType::kQ8:
      return attend_rows_avx2<Q8Head>;
    case KvType::kQ4:
      return attend_rows_avx2<Q4Head>;
  }
#elif defined(__aarch64__)
  if (!kernels.neon || head_dim % (kv == KvType::kF32 ? 4 : 8) != 0) return nullptr;
  if (kv != KvType::kF32 && head_dim > neon::kMaxQuantizedHeadDim) return nullptr;
  switch (kv) {
    case KvType::kF32:
      return attend_rows_neon<KvType::kF32>;
    case KvType::kF16:
      return attend_rows_neon<KvType::kF16>;
    case KvType::kQ8:
      return attend_rows_neon<KvType::kQ8>;
    case KvType::kQ4:
      return attend_rows_neon<KvType::kQ4>;
  }
#endif
  return nullptr;
}

// The kernel for rows of a GatheredHead (f32 rows), and whether it takes their keys transposed.
AttendRows gathered_attend_rows(const CpuKernels& kernels, int64_t head_dim,
                                bool& transposed_keys) {
  const AttendRows attend = fast_attend_rows(kernels, head_dim, KvType::kF32);
#if defined(__x86_64__)
  transposed_keys = attend == attend_rows_avx512<false>;
  if (transposed_keys) return attend_rows_avx512<true>;
#endif
  transposed_keys = false;
  return attend;
}

}  // namespace

const char* attention_kernel_path(const CpuKernels& kernels, int64_t head_dim, KvType kv) {
  const AttendRows attend = fast_attend_rows(kernels, head_dim, kv);
  if (attend == nullptr) return "scalar reference";
#if defined(__x86_64__)
  return attend == attend_rows_avx512<false> ? "avx512" : "avx2+fma";
#elif defined(__aarch64__)
  return "neon";
#else
  return "scalar reference";
#endif
}

namespace {

// Causal: query t sees keys 0..first_pos+t; else every query sees all first_pos + n_queries.
void attend_queries(CpuContext& cx, const float* q, int64_t n_queries, int64_t first_pos,
                    const float* keys, const float* values, const AttentionShape& shape,
                    float scale, float* out, bool causal) {
  const int64_t hd = shape.head_dim;
  const AttendRows attend = fast_attend_rows(cx.kernels(), hd, shape.kv);
  const int64_t all_keys = first_pos + n_queries;
  if (attend == nullptr) {
    float* scores = cx.caller_scratch().buffer<float>(Scratch::kAttentionScores, all_keys);
    if (causal) {
      ref::causal_attention(q, n_queries, first_pos, keys, values, shape, scale, out, scores);
    } else {
      ref::bidirectional_attention(q, n_queries, keys, values, shape, scale, out, scores);
    }
    return;
  }
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const int64_t q_stride = shape.n_heads * hd;
  const int64_t head_floats = kv_head_floats(shape.kv, hd);
  const int64_t kv_stride = shape.kv_row_floats();
  // A block is one key/value head at a few consecutive positions: its query heads there share
  // every key and value load.
  const int64_t positions = std::max<int64_t>(1, 8 / group);
  const int64_t blocks = (n_queries + positions - 1) / positions;
  // A head's rows lie kv_stride apart (4 KB and more), in one L1 set, where the hardware
  // prefetchers do not follow them. When many blocks read them, the thread first copies its
  // head's rows side by side, as far as its blocks need them (a copy of 2 × 256 KB per head of
  // Qwen3-0.6B at 512 positions, next to 1 ms of arithmetic). Where a row lies changes no result.
  // (f32 rows only: quantized rows are a quarter the size and are read where they lie.)
  const bool gather =
      shape.kv == KvType::kF32 && kv_stride != hd && blocks >= kMinBlocksToGather &&
      2 * (first_pos + n_queries) * hd * static_cast<int64_t>(sizeof(float)) <= kMaxGatherBytes;
  bool transposed_keys = false;
  const AttendRows attend_gathered = gathered_attend_rows(cx.kernels(), hd, transposed_keys);
  // Numbers this call for the threads' GatheredHeads (the context runs one call at a time).
  uint64_t& calls = cx.caller_scratch().object<uint64_t>(Scratch::kAttentionCalls);
  const uint64_t call = gather ? ++calls : 0;
  const auto attend_block = [&](int64_t kv, int64_t block, Scratch& scratch) {
    const int64_t t_begin = block * positions;
    const int64_t t_end = std::min(n_queries, t_begin + positions);
    const int64_t max_keys = causal ? first_pos + t_end : all_keys;
    float* scores =
        scratch.buffer<float>(Scratch::kAttentionScores, (t_end - t_begin) * group * max_keys);
    std::vector<AttentionRow>& rows =
        scratch.object<std::vector<AttentionRow>>(Scratch::kAttentionRows);
    rows.clear();
    for (int64_t t = t_begin; t < t_end; ++t) {
      for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
        rows.push_back({q + t * q_stride + h * hd, out + t * q_stride + h * hd,
                        scores + rows.size() * max_keys, causal ? first_pos + t + 1 : all_keys});
      }
    }
    if (!gather) {
      attend(rows.data(), static_cast<int>(rows.size()), keys + kv * head_floats,
             values + kv * head_floats, kv_stride, hd, scale);
      return;
    }
    GatheredHead& head = scratch.object<GatheredHead>(Scratch::kGatheredHead);
    head.gather(call, kv, keys, values, max_keys, all_keys, kv_stride, hd, transposed_keys);
    attend_gathered(rows.data(), static_cast<int>(rows.size()), head.keys.data(),
                    head.values.data(), hd, hd, scale);
  };
  // A task is a run of one head's blocks: each head in as few parts as keep every thread busy
  // (whole heads measured 10-17% faster on two threads than blocks handed out one at a time, which
  // had both threads read and copy every head), cut where the causal work splits evenly.
  const int64_t threads = cx.threads();
  int64_t parts = (threads + shape.n_kv_heads - 1) / shape.n_kv_heads;
  if (shape.n_kv_heads * parts % threads != 0) parts *= 2;  // uneven: smaller tasks to even out
  parts = std::min(parts, blocks);
  std::vector<int64_t> part_begin = {0};
  const auto keys_before = [&](int64_t block) {  // (query, key) pairs of blocks [0, block)
    const int64_t t = std::min(n_queries, block * positions);
    return causal ? t * first_pos + t * (t + 1) / 2 : t * all_keys;
  };
  for (int64_t part = 1, block = 0; part < parts; ++part) {
    while (keys_before(block) * parts < keys_before(blocks) * part) ++block;
    part_begin.push_back(block);
  }
  part_begin.push_back(blocks);
  cx.run(shape.n_kv_heads * parts, [&](int64_t task, Scratch& scratch) {
    const int64_t kv = task / parts, part = task % parts;
    for (int64_t block = part_begin[part]; block < part_begin[part + 1]; ++block) {
      attend_block(kv, block, scratch);
    }
  });
}

}  // namespace

void causal_attention(CpuContext& cx, const float* q, int64_t n_queries, int64_t first_pos,
                      const float* keys, const float* values, const AttentionShape& shape,
                      float scale, float* out) {
  attend_queries(cx, q, n_queries, first_pos, keys, values, shape, scale, out, /*causal=*/true);
}

void bidirectional_attention(CpuContext& cx, const float* q, int64_t n_rows, const float* keys,
                             const float* values, const AttentionShape& shape, float scale,
                             float* out) {
  attend_queries(cx, q, n_rows, 0, keys, values, shape, scale, out, /*causal=*/false);
}

}  // namespace qhx
