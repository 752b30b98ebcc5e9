#include "models/decoder_state.h"

#include <algorithm>

#include "util/error.h"

namespace qhx {

void DecoderState::reset() {
  for (LayerState& l : layers) {
    l.keys.clear();
    l.values.clear();
    std::fill(l.conv.begin(), l.conv.end(), 0.0f);
    std::fill(l.recurrent.begin(), l.recurrent.end(), 0.0f);
  }
  n_past_ = 0;
}

void DecoderState::restore(const ModelState& snapshot) {
  const auto* other = dynamic_cast<const DecoderState*>(&snapshot);
  if (other == nullptr || other->layers.size() != layers.size()) {
    fail("state", "snapshot belongs to a different model");
  }
  *this = *other;
}

std::vector<StateTensor> DecoderState::tensors() const {
  std::vector<StateTensor> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string p = "layer" + std::to_string(i) + ".";
    const LayerState& l = layers[i];
    if (!l.conv.empty()) {
      out.push_back({p + "conv", l.conv});
      out.push_back({p + "recurrent", l.recurrent});
    } else {
      out.push_back({p + "keys", l.keys});
      out.push_back({p + "values", l.values});
    }
  }
  return out;
}

void DecoderState::reserve(int64_t n_tokens) {
  for (LayerState& l : layers) {
    l.keys.reserve(n_tokens * l.kv_width);
    l.values.reserve(n_tokens * l.kv_width);
  }
}

int64_t DecoderState::bytes() const {
  int64_t floats = 0;
  for (const LayerState& l : layers) {
    floats += l.keys.capacity() + l.values.capacity() + l.conv.size() + l.recurrent.size();
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

}  // namespace qhx
