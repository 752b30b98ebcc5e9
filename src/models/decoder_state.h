// Per-sequence state of a decoder whose layers are softmax attention (KV cache) or Gated
// DeltaNet (conv state + f32 recurrent state): one LayerState (graph/plan.h) per layer, as the
// runner (graph/runner.h) advances it.
#pragma once

#include <vector>

#include "graph/runner.h"
#include "models/model.h"

namespace qhx {

class DecoderState final : public ModelState, public Sequence {
 public:
  // `empty` gives each layer's state at the start of a sequence (zeroed, correctly sized).
  explicit DecoderState(std::vector<LayerState> empty) { layers = std::move(empty); }

  int64_t n_past() const override { return tokens; }
  void reset() override;
  std::unique_ptr<ModelState> clone() const override {
    settle();
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
  std::vector<int32_t> positions() const override;
  void assign_positions(std::span<const int32_t> positions, const std::string& where) override;

  // M-RoPE positions (sequences holding an image): each token's temporal position and the
  // largest position of any axis up to it. Empty while every position is the token's index.
  std::vector<int32_t> rope_t, rope_max;

 private:
  size_t checkpoint_parts() const;  // vectors a checkpoint of this model holds
};

}  // namespace qhx
