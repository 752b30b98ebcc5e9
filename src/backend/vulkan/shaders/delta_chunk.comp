#version 450
#extension GL_GOOGLE_include_directive : require
// The gated delta rule in chunks of C tokens (the WY/UT form of ref::gated_delta_rule_chunked),
// for prefill: three dispatches, of which only the second walks the chunks in order.
//   PREPARE  (one workgroup per value head and chunk) the cumulative log-decay G, the strictly
//            lower A = β_i (k_i·k_p) e^{G_i−G_p}, and by forward substitution U = (I+A)⁻¹ βv and
//            W = (I+A)⁻¹ β e^G k.
//   STATE    (one workgroup per value head and 16 value columns, chunk after chunk) keeps the
//            state's columns in registers, split over 4 lanes per column: stores the state each
//            chunk starts from, turns U into V' = U − W S and moves S to the chunk's end,
//            S ← e^{G_n} S + Σ_p e^{G_n−G_p} k_p V'_pᵀ.
//   OUTPUT   (one workgroup per value head and chunk) o_i = e^{G_i} Sᵀq_i +
//            Σ_{p≤i} (q_i·k_p) e^{G_i−G_p} V'_p from the stored start state.
// The serial part is one chunk's two small products per step instead of every token's, and far
// more lanes share it than the recurrent kernel has (delta_rule.comp). Shared memory stays under
// the 16 KiB every Vulkan device has.
layout(local_size_x = 64) in;
#define MAX_K_DIM 128
#define MAX_CHUNK 64
#define COLUMNS 16                  // value columns per STATE workgroup
#define SPLIT 4                     // lanes per column in STATE (64 = COLUMNS · SPLIT)
#define SLICE (MAX_K_DIM / SPLIT)   // state rows per lane in STATE

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(std430, binding = 1) buffer State { float state[]; };
layout(std430, binding = 2) buffer Scratch { float scratch[]; };
layout(push_constant) uniform Params {
  uint q_offset, k_offset, v_offset, beta_offset, g_offset, out_offset;
  uint n_tokens, n_k_heads, n_v_heads, k_dim, v_dim, chunk;
} p;
#include "common.glsl"

// The scratch buffer, per value head and chunk: G [C], U then V' [C, v_dim], W [C, k_dim], and
// the state the chunk starts from [k_dim, v_dim].
uint n_chunks() { return (p.n_tokens + p.chunk - 1) / p.chunk; }
uint slot(uint head, uint c) { return head * n_chunks() + c; }
uint g_at(uint head, uint c) { return slot(head, c) * p.chunk; }
uint u_at(uint head, uint c) {
  return p.n_v_heads * n_chunks() * p.chunk + slot(head, c) * p.chunk * p.v_dim;
}
uint w_at(uint head, uint c) {
  return p.n_v_heads * n_chunks() * p.chunk * (1 + p.v_dim) + slot(head, c) * p.chunk * p.k_dim;
}
uint h_at(uint head, uint c) {
  return p.n_v_heads * n_chunks() * p.chunk * (1 + p.v_dim + p.k_dim) +
         slot(head, c) * p.k_dim * p.v_dim;
}

uint key_head(uint head) { return head / (p.n_v_heads / p.n_k_heads); }
uint q_row(uint t, uint head) { return p.q_offset + (t * p.n_k_heads + key_head(head)) * p.k_dim; }
uint k_row(uint t, uint head) { return p.k_offset + (t * p.n_k_heads + key_head(head)) * p.k_dim; }

float dot_rows(uint x, uint y) {
  float sum = 0.0;
  for (uint i = 0; i < p.k_dim; ++i) sum += a[x + i] * a[y + i];
  return sum;
}

#if defined(PREPARE)
shared float cumulative[MAX_CHUNK];
shared float lower[MAX_CHUNK * (MAX_CHUNK - 1) / 2];  // A, row i at i(i−1)/2

void main() {
  const uint head = flat_group() / n_chunks(), c = flat_group() % n_chunks();
  const uint first = c * p.chunk, n = min(p.chunk, p.n_tokens - first), lane = gl_LocalInvocationID.x;
  if (lane == 0) {
    float sum = 0.0;
    for (uint i = 0; i < n; ++i) {
      sum += a[p.g_offset + (first + i) * p.n_v_heads + head];
      cumulative[i] = sum;
      scratch[g_at(head, c) + i] = sum;
    }
  }
  barrier();
  if (lane < n) {
    const float beta = a[p.beta_offset + (first + lane) * p.n_v_heads + head];
    for (uint j = 0; j < lane; ++j) {
      lower[lane * (lane - 1) / 2 + j] = beta *
          dot_rows(k_row(first + lane, head), k_row(first + j, head)) *
          exp(cumulative[lane] - cumulative[j]);
    }
  }
  barrier();
  // Forward substitution, one column of [U | W] per lane at a time.
  for (uint col = lane; col < p.v_dim + p.k_dim; col += 64) {
    const bool of_u = col < p.v_dim;
    const uint dest = of_u ? u_at(head, c) + col : w_at(head, c) + col - p.v_dim;
    const uint width = of_u ? p.v_dim : p.k_dim;
    float x[MAX_CHUNK];
    for (uint i = 0; i < n; ++i) {
      const uint t = first + i;
      const float beta = a[p.beta_offset + t * p.n_v_heads + head];
      float value = of_u ? beta * a[p.v_offset + (t * p.n_v_heads + head) * p.v_dim + col]
                         : beta * exp(cumulative[i]) * a[k_row(t, head) + col - p.v_dim];
      for (uint j = 0; j < i; ++j) value -= lower[i * (i - 1) / 2 + j] * x[j];
      x[i] = value;
      scratch[dest + i * width] = value;
    }
  }
}

#elif defined(STATE)
shared float partial[SPLIT][COLUMNS][COLUMNS];  // [lane's slice][token of the block][column]
shared float corrected[MAX_CHUNK][COLUMNS];     // V' of the chunk's tokens, this block's columns
shared float weight[MAX_CHUNK];                 // e^{G_n−G_p}

void main() {
  const uint blocks = (p.v_dim + COLUMNS - 1) / COLUMNS;
  const uint head = flat_group() / blocks, block = flat_group() % blocks;
  const uint lane = gl_LocalInvocationID.x, column = lane % COLUMNS, part = lane / COLUMNS;
  const uint col = block * COLUMNS + column;
  const bool owns = col < p.v_dim;
  const uint base = head * p.k_dim * p.v_dim;
  // This lane's rows of the state: part, part + SPLIT, ...
  float s[SLICE];
  for (uint r = 0; r < SLICE; ++r) {
    const uint row = part + r * SPLIT;
    s[r] = owns && row < p.k_dim ? state[base + row * p.v_dim + col] : 0.0;
  }
  for (uint c = 0; c < n_chunks(); ++c) {
    const uint first = c * p.chunk, n = min(p.chunk, p.n_tokens - first);
    for (uint r = 0; r < SLICE; ++r) {
      const uint row = part + r * SPLIT;
      if (owns && row < p.k_dim) scratch[h_at(head, c) + row * p.v_dim + col] = s[r];
    }
    barrier();  // the previous chunk is done with `corrected` and `weight`
    const float last = scratch[g_at(head, c) + n - 1];
    if (lane < n) weight[lane] = exp(last - scratch[g_at(head, c) + lane]);
    // V' = U − W S, sixteen tokens at a time: each lane sums its slice, then lanes add slices.
    for (uint block_start = 0; block_start < n; block_start += COLUMNS) {
      for (uint i = 0; i < COLUMNS; ++i) {
        const uint token = block_start + i;
        float sum = 0.0;
        if (token < n) {
          const uint w = w_at(head, c) + token * p.k_dim;
          for (uint r = 0; r < SLICE; ++r) {
            const uint row = part + r * SPLIT;
            if (row < p.k_dim) sum += scratch[w + row] * s[r];
          }
        }
        partial[part][i][column] = sum;
      }
      barrier();
      for (uint e = lane; e < COLUMNS * COLUMNS; e += 64) {
        const uint i = e / COLUMNS, cl = e % COLUMNS, token = block_start + i;
        const uint ucol = block * COLUMNS + cl;
        if (token < n) {
          const uint u = u_at(head, c) + token * p.v_dim + ucol;
          const float ws = partial[0][i][cl] + partial[1][i][cl] + partial[2][i][cl] +
                           partial[3][i][cl];
          const float value = (ucol < p.v_dim ? scratch[u] : 0.0) - ws;
          corrected[token][cl] = value;
          if (ucol < p.v_dim) scratch[u] = value;
        }
      }
      barrier();
    }
    const float decay = exp(last);
    for (uint r = 0; r < SLICE; ++r) {
      const uint row = part + r * SPLIT;
      if (row >= p.k_dim) continue;
      float acc = s[r] * decay;
      for (uint j = 0; j < n; ++j) acc += weight[j] * a[k_row(first + j, head) + row] * corrected[j][column];
      s[r] = acc;
    }
  }
  for (uint r = 0; r < SLICE; ++r) {
    const uint row = part + r * SPLIT;
    if (owns && row < p.k_dim) state[base + row * p.v_dim + col] = s[r];
  }
}

#elif defined(OUTPUT)
shared float cumulative[MAX_CHUNK];
shared float scores[MAX_CHUNK * (MAX_CHUNK + 1) / 2];  // (q_i·k_p) e^{G_i−G_p}, row i at i(i+1)/2

void main() {
  const uint head = flat_group() / n_chunks(), c = flat_group() % n_chunks();
  const uint first = c * p.chunk, n = min(p.chunk, p.n_tokens - first), lane = gl_LocalInvocationID.x;
  if (lane < n) cumulative[lane] = scratch[g_at(head, c) + lane];
  barrier();
  if (lane < n) {
    for (uint j = 0; j <= lane; ++j) {
      scores[lane * (lane + 1) / 2 + j] =
          dot_rows(q_row(first + lane, head), k_row(first + j, head)) *
          exp(cumulative[lane] - cumulative[j]);
    }
  }
  barrier();
  const uint start = h_at(head, c), corrected = u_at(head, c);
  for (uint col = lane; col < p.v_dim; col += 64) {
    for (uint i = 0; i < n; ++i) {
      const uint q = q_row(first + i, head);
      float o = 0.0;
      for (uint r = 0; r < p.k_dim; ++r) o += a[q + r] * scratch[start + r * p.v_dim + col];
      o *= exp(cumulative[i]);
      for (uint j = 0; j <= i; ++j) o += scores[i * (i + 1) / 2 + j] * scratch[corrected + j * p.v_dim + col];
      a[p.out_offset + ((first + i) * p.n_v_heads + head) * p.v_dim + col] = o;
    }
  }
}
#endif
