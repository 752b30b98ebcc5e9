#include "core/kv_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "util/error.h"

namespace qhx {
namespace {

constexpr KvType kKvTypes[] = {KvType::kF32, KvType::kF16, KvType::kQ8, KvType::kQ4};

// max|x| over n, NaN when any element is inf or NaN.
float max_magnitude(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return NAN;
    m = std::max(m, std::fabs(x[i]));
  }
  return m;
}

// One scale for x's n elements at ±levels: scale = max|x| / levels, q = nearbyint(x / scale)
// (0 where the scale is 0 or NaN).
float quantize_run(const float* x, int64_t n, float levels, int8_t* q) {
  const float m = max_magnitude(x, n);
  const float scale = m / levels;
  const bool usable = std::isfinite(scale) && scale > 0.0f;
  const float inverse = usable ? levels / m : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    q[i] = usable ? static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inverse), -levels, levels))
                  : 0;
  }
  return scale;
}

}  // namespace

const char* kv_type_name(KvType type) {
  switch (type) {
    case KvType::kF32:
      return "f32";
    case KvType::kF16:
      return "f16";
    case KvType::kQ8:
      return "q8";
    case KvType::kQ4:
      return "q4";
  }
  return "?";
}

KvType parse_kv_type(std::string_view name, const std::string& where) {
  for (const KvType t : kKvTypes) {
    if (name == kv_type_name(t)) return t;
  }
  fail(where, "KV type '" + std::string(name) + "' is not one of f32, f16, q8, q4");
}

bool kv_type_fits(KvType type, int64_t head_dim) {
  switch (type) {
    case KvType::kF32:
      return head_dim > 0;
    case KvType::kF16:
      return head_dim > 0 && head_dim % 2 == 0;
    case KvType::kQ8:
      return head_dim > 0 && head_dim % 4 == 0;
    case KvType::kQ4:
      return head_dim > 0 && head_dim % kKvQ4Group == 0;
  }
  return false;
}

int64_t kv_head_floats(KvType type, int64_t head_dim) {
  switch (type) {
    case KvType::kF32:
      return head_dim;
    case KvType::kF16:
      return head_dim / 2;
    case KvType::kQ8:
      return head_dim / 4 + 1;
    case KvType::kQ4:
      return head_dim / 8 + head_dim / kKvQ4Group;
  }
  return 0;
}

void kv_store_row(KvType type, const float* x, int64_t n_heads, int64_t head_dim, float* dst) {
  const int64_t head_floats = kv_head_floats(type, head_dim);
  int8_t q[kKvQ4Group];
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* xh = x + h * head_dim;
    float* out = dst + h * head_floats;
    switch (type) {
      case KvType::kF32:
        std::memcpy(out, xh, head_dim * sizeof(float));
        break;
      case KvType::kF16: {
        auto* halves = reinterpret_cast<uint16_t*>(out);
        for (int64_t d = 0; d < head_dim; ++d) halves[d] = f32_to_f16(xh[d]);
        break;
      }
      case KvType::kQ8:
        out[head_dim / 4] = quantize_run(xh, head_dim, 127.0f, reinterpret_cast<int8_t*>(out));
        break;
      case KvType::kQ4: {
        auto* nibbles = reinterpret_cast<uint8_t*>(out);
        float* scales = out + head_dim / 8;
        for (int64_t g = 0; g < head_dim / kKvQ4Group; ++g) {
          scales[g] = quantize_run(xh + g * kKvQ4Group, kKvQ4Group, 7.0f, q);
          for (int64_t i = 0; i < kKvQ4Group; i += 2) {
            nibbles[(g * kKvQ4Group + i) / 2] =
                static_cast<uint8_t>((q[i] + 8) | (q[i + 1] + 8) << 4);
          }
        }
        break;
      }
    }
  }
}

void kv_load_head(KvType type, const float* head, int64_t head_dim, float* out) {
  switch (type) {
    case KvType::kF32:
      std::memcpy(out, head, head_dim * sizeof(float));
      return;
    case KvType::kF16: {
      const auto* halves = reinterpret_cast<const uint16_t*>(head);
      for (int64_t d = 0; d < head_dim; ++d) out[d] = f16_to_f32(halves[d]);
      return;
    }
    case KvType::kQ8: {
      const auto* codes = reinterpret_cast<const int8_t*>(head);
      const float scale = head[head_dim / 4];
      for (int64_t d = 0; d < head_dim; ++d) out[d] = scale * static_cast<float>(codes[d]);
      return;
    }
    case KvType::kQ4: {
      const auto* nibbles = reinterpret_cast<const uint8_t*>(head);
      const float* scales = head + head_dim / 8;
      for (int64_t d = 0; d < head_dim; ++d) {
        const int code = d % 2 == 0 ? nibbles[d / 2] & 15 : nibbles[d / 2] >> 4;
        out[d] = scales[d / kKvQ4Group] * static_cast<float>(code - 8);
      }
      return;
    }
  }
}

}  // namespace qhx
