#include "models/decoder_state.h"

#include <algorithm>

#include "util/error.h"

namespace qhx {

namespace {

// What a KV cache's state tensors are named by after "layerN.keys": nothing for f32 rows.
std::string kv_suffix(KvType kv) {
  return kv == KvType::kF32 ? "" : std::string(".") + kv_type_name(kv);
}

}  // namespace

int64_t StateCheckpoint::bytes() const {
  int64_t floats = 0;
  for (const std::vector<float>& part : recurrent) floats += static_cast<int64_t>(part.size());
  return floats * static_cast<int64_t>(sizeof(float));
}

void DecoderState::reset() {
  kept = {};
  for (LayerState& l : layers) {
    l.keys.clear();
    l.values.clear();
    l.conv.fill_zero();
    l.recurrent.fill_zero();
  }
  tokens = 0;
  rope_t.clear();
  rope_max.clear();
}

void DecoderState::restore(const ModelState& snapshot) {
  const auto* other = dynamic_cast<const DecoderState*>(&snapshot);
  if (other == nullptr || other->layers.size() != layers.size()) {
    fail("state", "snapshot belongs to a different model");
  }
  other->settle();
  kept = {};
  *this = *other;  // this one's device passes forgotten with its elements
}

std::vector<StateTensor> DecoderState::tensors() const {
  settle();
  std::vector<StateTensor> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string p = "layer" + std::to_string(i) + ".";
    const LayerState& l = layers[i];
    if (!l.conv.empty()) {
      out.push_back({p + "conv", l.conv.host_span()});
      out.push_back({p + "recurrent", l.recurrent.host_span()});
    } else {
      // The sequence's rows only: a forward pass grows the caches before it counts its tokens.
      // Quantized rows are named by their type ("layer3.keys.q8"): a state saved with another
      // KV type than the model's is refused by name.
      const size_t rows = static_cast<size_t>(std::min(l.keys.size(), tokens * l.kv_row_floats));
      out.push_back({p + "keys" + kv_suffix(l.kv), l.keys.host_span().first(rows)});
      out.push_back({p + "values" + kv_suffix(l.kv), l.values.host_span().first(rows)});
    }
  }
  return out;
}

void DecoderState::assign(std::span<const StateTensor> tensors, int64_t n_past,
                          const std::string& where) {
  const std::vector<StateTensor> expected = this->tensors();
  if (tensors.size() != expected.size()) {
    fail(where, std::to_string(tensors.size()) + " state tensors, this model has " +
                    std::to_string(expected.size()));
  }
  if (n_past < 0) fail(where, "negative token count");
  kept = {};  // every element is replaced
  StateBuffer* targets[2];
  size_t t = 0;
  for (LayerState& l : layers) {
    const bool recurrent = !l.conv.empty();
    targets[0] = recurrent ? &l.conv : &l.keys;
    targets[1] = recurrent ? &l.recurrent : &l.values;
    for (StateBuffer* target : targets) {
      const StateTensor& in = tensors[t];
      const std::string& name = expected[t++].name;
      if (in.name != name)
        fail(where, "state tensor '" + in.name + "' where '" + name + "' belongs");
      const size_t size =
          static_cast<size_t>(recurrent ? target->size() : n_past * l.kv_row_floats);
      if (in.data.size() != size) {
        fail(where + ": " + name,
             std::to_string(in.data.size()) + " values, expected " + std::to_string(size));
      }
      target->assign(in.data);
    }
  }
  tokens = n_past;
}

std::vector<int32_t> DecoderState::positions() const {
  std::vector<int32_t> out(rope_t);
  out.insert(out.end(), rope_max.begin(), rope_max.end());
  return out;
}

void DecoderState::assign_positions(std::span<const int32_t> positions, const std::string& where) {
  if (positions.empty()) {
    rope_t.clear();
    rope_max.clear();
    return;
  }
  if (positions.size() != 2 * static_cast<size_t>(tokens)) {
    fail(where + ": positions", std::to_string(positions.size()) + " values for " +
                                    std::to_string(tokens) + " tokens (expected two per token)");
  }
  rope_t.assign(positions.begin(), positions.begin() + tokens);
  rope_max.assign(positions.begin() + tokens, positions.end());
  for (int64_t i = 0; i < tokens; ++i) {
    if (rope_t[i] < 0 || rope_max[i] < rope_t[i] || (i > 0 && rope_max[i] < rope_max[i - 1])) {
      fail(where + ": positions",
           "not the positions of a sequence (token " + std::to_string(i) + ")");
    }
  }
}

bool DecoderState::can_truncate() const {
  return std::none_of(layers.begin(), layers.end(),
                      [](const LayerState& l) { return !l.conv.empty(); });
}

StateCheckpoint DecoderState::checkpoint() const {
  settle();
  StateCheckpoint c;
  c.n_past = tokens;
  for (const LayerState& l : layers) {
    if (l.conv.empty()) continue;
    c.recurrent.push_back(l.conv.to_vector());
    c.recurrent.push_back(l.recurrent.to_vector());
  }
  return c;
}

void DecoderState::rewind(int64_t n, const StateCheckpoint* at) {
  if (n < 0 || n > tokens) {
    fail("state",
         "cannot rewind to " + std::to_string(n) + " of " + std::to_string(tokens) + " tokens");
  }
  const bool truncatable = can_truncate();
  if (!truncatable && (at == nullptr || at->n_past != n)) {
    fail("state", "rewinding a model with recurrent layers to token " + std::to_string(n) +
                      " needs a checkpoint taken there");
  }
  if (at != nullptr && at->recurrent.size() != checkpoint_parts()) {
    fail("state", "checkpoint belongs to a different model");
  }
  if (!truncatable) {  // the conv and recurrent states are replaced, what a device kept too
    for (const StateBuffer* whole : whole_states()) whole->forget_shadow();
    kept = {};
  }
  size_t part = 0;
  for (LayerState& l : layers) {
    if (l.conv.empty()) {
      l.keys.resize(n * l.kv_row_floats);
      l.values.resize(n * l.kv_row_floats);
    } else {
      for (StateBuffer* target : {&l.conv, &l.recurrent}) {
        const std::vector<float>& saved = at->recurrent[part++];
        if (static_cast<int64_t>(saved.size()) != target->size())
          fail("state", "checkpoint belongs to a different model");
        target->assign(saved);
      }
    }
  }
  tokens = n;
  if (!rope_t.empty()) {
    rope_t.resize(n);
    rope_max.resize(n);
  }
}

size_t DecoderState::checkpoint_parts() const {
  return 2 *
         static_cast<size_t>(std::count_if(layers.begin(), layers.end(),
                                           [](const LayerState& l) { return !l.conv.empty(); }));
}

void DecoderState::reserve(int64_t n_tokens) {
  for (LayerState& l : layers) {
    l.keys.reserve(n_tokens * l.kv_row_floats);
    l.values.reserve(n_tokens * l.kv_row_floats);
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
