#version 450
#extension GL_GOOGLE_include_directive : require
// Causal GQA attention (ref::causal_attention) over the layer's KV cache, which already holds the
// new rows: query t sees keys 0..first_pos+t. One workgroup per (query, head), streaming the keys
// in blocks of 64 with a running max and sum (online softmax), so no score array is stored.
layout(local_size_x = 64) in;
#define MAX_HEAD_DIM 256

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(std430, binding = 1) readonly buffer Keys { float keys[]; };
layout(std430, binding = 2) readonly buffer Values { float values[]; };
layout(push_constant) uniform Params {
  uint q_offset, out_offset, n_queries, first_pos, n_heads, n_kv_heads, head_dim;
  float scale;
} p;
#include "common.glsl"

shared float query[MAX_HEAD_DIM];
shared float weights[64];
shared float reduce[64];

void main() {
  const uint item = flat_group();
  if (item >= p.n_queries * p.n_heads) return;
  const uint t = item / p.n_heads, h = item % p.n_heads;
  const uint kv_head = h / (p.n_heads / p.n_kv_heads);
  const uint lane = gl_LocalInvocationID.x;
  const uint q_width = p.n_heads * p.head_dim, kv_width = p.n_kv_heads * p.head_dim;
  for (uint d = lane; d < p.head_dim; d += 64) query[d] = a[p.q_offset + t * q_width + h * p.head_dim + d];
  barrier();
  const uint n_keys = p.first_pos + t + 1;
  float running_max = -1.0 / 0.0, running_sum = 0.0;
  float acc[MAX_HEAD_DIM / 64];
  for (uint k = 0; k < MAX_HEAD_DIM / 64; ++k) acc[k] = 0.0;
  for (uint block = 0; block < n_keys; block += 64) {
    const uint key = block + lane;
    float score = -1.0 / 0.0;
    if (key < n_keys) {
      score = 0.0;
      const uint base = key * kv_width + kv_head * p.head_dim;
      for (uint d = 0; d < p.head_dim; ++d) score += query[d] * keys[base + d];
      score *= p.scale;
    }
    reduce[lane] = score;
    barrier();
    for (uint w = 32; w > 0; w >>= 1) {
      if (lane < w) reduce[lane] = max(reduce[lane], reduce[lane + w]);
      barrier();
    }
    const float new_max = max(running_max, reduce[0]);
    barrier();
    const float weight = key < n_keys ? exp(score - new_max) : 0.0;
    weights[lane] = weight;
    reduce[lane] = weight;
    barrier();
    for (uint w = 32; w > 0; w >>= 1) {
      if (lane < w) reduce[lane] += reduce[lane + w];
      barrier();
    }
    const float correction = exp(running_max - new_max);
    running_sum = running_sum * correction + reduce[0];
    running_max = new_max;
    const uint in_block = min(64u, n_keys - block);
    for (uint k = 0; k * 64 + lane < p.head_dim; ++k) {
      const uint d = k * 64 + lane;
      float sum = acc[k] * correction;
      for (uint j = 0; j < in_block; ++j) {
        sum += weights[j] * values[(block + j) * kv_width + kv_head * p.head_dim + d];
      }
      acc[k] = sum;
    }
    barrier();
  }
  for (uint k = 0; k * 64 + lane < p.head_dim; ++k) {
    a[p.out_offset + t * q_width + h * p.head_dim + k * 64 + lane] = acc[k] / running_sum;
  }
}
