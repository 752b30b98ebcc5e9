// How a KV cache holds one position's keys (or values): the element type of its rows. A row is
// n_kv_heads heads side by side, each head its own run of floats of storage (kv_head_floats):
//   f32  head_dim floats;
//   f16  head_dim IEEE halves (rounded to nearest even);
//   q8   head_dim int8 codes, then one f32 scale for the head: x ≈ scale · q,
//        scale = max|x| / 127, q = nearbyint(x / scale), |q| ≤ 127;
//   q4   head_dim 4-bit codes (two per byte, element 2i in the low nibble of byte i), then one
//        f32 scale per kKvQ4Group elements: x ≈ scale · (c − 8), scale = max|x| / 7, c − 8 in
//        −7..7.
// A head of zeros gets scale 0; one holding an inf or NaN gets scale NaN (the NaN reaches every
// score it touches, as it would in f32).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace qhx {

enum class KvType : uint8_t { kF32, kF16, kQ8, kQ4 };

inline constexpr int64_t kKvQ4Group = 32;

const char* kv_type_name(KvType type);  // "f32", "f16", "q8", "q4"
// One of those names; else Error naming `where` and the choices.
KvType parse_kv_type(std::string_view name, const std::string& where);

// Whether heads of head_dim elements can be held as `type` (q8: a multiple of 4; q4: of
// kKvQ4Group; f16: of 2).
bool kv_type_fits(KvType type, int64_t head_dim);

// Floats of storage one head of head_dim elements takes.
int64_t kv_head_floats(KvType type, int64_t head_dim);

// One row of n_heads heads: x [n_heads · head_dim] into dst [n_heads · kv_head_floats].
void kv_store_row(KvType type, const float* x, int64_t n_heads, int64_t head_dim, float* dst);

// One head's elements back as float32 (scale · q for the quantized types).
void kv_load_head(KvType type, const float* head, int64_t head_dim, float* out);

}  // namespace qhx
