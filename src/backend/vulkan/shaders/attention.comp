#version 450
#extension GL_GOOGLE_include_directive : require
#include "reduce.glsl"
// Causal GQA attention (ref::causal_attention) over the layer's KV cache, which already holds the
// new rows: query t sees keys 0..first_pos+t. The keys stream in blocks of 64 with a running max
// and sum (online softmax), so no score array is stored.
//   (default)  one workgroup per (query, head) over all its keys;
//   PARTIAL    split-key, for few queries over a long context (decode), and for a cache larger
//              than one binding: one workgroup per (query, head, split of keys_per_split keys),
//              writing its max, sum and unnormalized output to `partials`. A dispatch covers
//              splits first_split.. (splits_here of them) and binds the keys from key_base on;
//   COMBINE    then one workgroup per (query, head) merges the splits.
layout(local_size_x = 64) in;
#define MAX_HEAD_DIM 256

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(std430, binding = 1) readonly buffer Keys { float keys[]; };
layout(std430, binding = 2) readonly buffer Values { float values[]; };
layout(std430, binding = 3) buffer Partials { float partials[]; };  // [query·head, split, 2 + head_dim]
layout(push_constant) uniform Params {
  uint q_offset, out_offset, n_queries, first_pos, n_heads, n_kv_heads, head_dim;
  float scale;
  uint keys_per_split, n_splits, first_split, splits_here, key_base;
} p;
#include "common.glsl"

shared float query[MAX_HEAD_DIM];
shared float weights[64];

uint partial_at(uint item, uint split) { return (item * p.n_splits + split) * (2 + p.head_dim); }

#if defined(COMBINE)
void main() {
  const uint item = flat_group();
  if (item >= p.n_queries * p.n_heads) return;
  const uint t = item / p.n_heads, h = item % p.n_heads, lane = gl_LocalInvocationID.x;
  const uint q_width = p.n_heads * p.head_dim;
  float top = -1.0 / 0.0;
  for (uint s = 0; s < p.n_splits; ++s) top = max(top, partials[partial_at(item, s)]);
  float sum = 0.0;
  for (uint s = 0; s < p.n_splits; ++s) {
    const uint at = partial_at(item, s);
    if (partials[at + 1] > 0.0) sum += exp(partials[at] - top) * partials[at + 1];
  }
  for (uint d = lane; d < p.head_dim; d += 64) {
    float acc = 0.0;
    for (uint s = 0; s < p.n_splits; ++s) {
      const uint at = partial_at(item, s);
      if (partials[at + 1] > 0.0) acc += exp(partials[at] - top) * partials[at + 2 + d];
    }
    a[p.out_offset + t * q_width + h * p.head_dim + d] = acc / sum;
  }
}

#else
void main() {
#if defined(PARTIAL)
  const uint item = flat_group() / p.splits_here;
  const uint split = p.first_split + flat_group() % p.splits_here;
#else
  const uint item = flat_group(), split = 0;
#endif
  if (item >= p.n_queries * p.n_heads) return;
  const uint t = item / p.n_heads, h = item % p.n_heads;
  const uint kv_head = h / (p.n_heads / p.n_kv_heads);
  const uint lane = gl_LocalInvocationID.x;
  const uint q_width = p.n_heads * p.head_dim, kv_width = p.n_kv_heads * p.head_dim;
  for (uint d = lane; d < p.head_dim; d += 64) query[d] = a[p.q_offset + t * q_width + h * p.head_dim + d];
  barrier();
#if defined(PARTIAL)
  const uint first_key = split * p.keys_per_split;
  const uint end_key = min(p.first_pos + t + 1, first_key + p.keys_per_split);
#else
  const uint first_key = 0, end_key = p.first_pos + t + 1;
#endif
  float running_max = -1.0 / 0.0, running_sum = 0.0;
  float acc[MAX_HEAD_DIM / 64];
  for (uint k = 0; k < MAX_HEAD_DIM / 64; ++k) acc[k] = 0.0;
  for (uint block = first_key; block < end_key; block += 64) {
    const uint key = block + lane;
    float score = -1.0 / 0.0;
    if (key < end_key) {
      score = 0.0;
      const uint base = (key - p.key_base) * kv_width + kv_head * p.head_dim;
      for (uint d = 0; d < p.head_dim; ++d) score += query[d] * keys[base + d];
      score *= p.scale;
    }
    const float new_max = max(running_max, workgroup_max(score));
    const float weight = key < end_key ? exp(score - new_max) : 0.0;
    weights[lane] = weight;
    const float block_sum = workgroup_sum(weight);  // its barrier also publishes `weights`
    const float correction = exp(running_max - new_max);
    running_sum = running_sum * correction + block_sum;
    running_max = new_max;
    const uint in_block = min(64u, end_key - block);
    for (uint k = 0; k * 64 + lane < p.head_dim; ++k) {
      const uint d = k * 64 + lane;
      float sum = acc[k] * correction;
      for (uint j = 0; j < in_block; ++j) {
        sum += weights[j] * values[(block + j - p.key_base) * kv_width + kv_head * p.head_dim + d];
      }
      acc[k] = sum;
    }
    barrier();
  }
#if defined(PARTIAL)
  // A split past this query's last key holds nothing: sum 0, which COMBINE skips.
  const uint at = partial_at(item, split);
  if (lane == 0) {
    partials[at] = running_max;
    partials[at + 1] = running_sum;
  }
  for (uint k = 0; k * 64 + lane < p.head_dim; ++k) partials[at + 2 + k * 64 + lane] = acc[k];
#else
  for (uint k = 0; k * 64 + lane < p.head_dim; ++k) {
    a[p.out_offset + t * q_width + h * p.head_dim + k * 64 + lane] = acc[k] / running_sum;
  }
#endif
}
#endif
