// Per-sequence state of a decoder whose layers are softmax attention (KV cache) or Gated
// DeltaNet (conv state + f32 recurrent state): one LayerState (graph/plan.h) per layer.
#pragma once

#include <vector>

#include "graph/plan.h"
#include "models/model.h"

namespace qhx {

class DecoderState final : public ModelState {
 public:
  // `empty` gives each layer's state at the start of a sequence (zeroed, correctly sized).
  explicit DecoderState(std::vector<LayerState> empty) : layers(std::move(empty)) {}

  int64_t n_past() const override { return n_past_; }
  void reset() override;
  std::unique_ptr<ModelState> clone() const override {
    return std::make_unique<DecoderState>(*this);
  }
  void restore(const ModelState& snapshot) override;
  std::vector<StateTensor> tensors() const override;
  void assign(std::span<const StateTensor> tensors, int64_t n_past,
              const std::string& where) override;
  bool can_truncate() const override;
  StateCheckpoint checkpoint() const override;
  void rewind(int64_t n, const StateCheckpoint* at) override;
  void reserve(int64_t n_tokens) override;
  int64_t bytes() const override;

  void advance(int64_t n_tokens) { n_past_ += n_tokens; }

  std::vector<LayerState> layers;

 private:
  size_t checkpoint_parts() const;  // vectors a checkpoint of this model holds
  int64_t n_past_ = 0;
};

}  // namespace qhx
