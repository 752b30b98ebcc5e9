// Per-sequence state of a decoder whose layers are softmax attention (KV cache) or Gated
// DeltaNet (conv state + f32 recurrent state): one LayerState (graph/plan.h) per layer.
#pragma once

#include <functional>
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

  void advance(int64_t n_tokens) { n_past_ += n_tokens; }
  // The first n tokens are the sequence again; what the states hold of them is the caller's
  // business (the KV caches are cut to n rows).
  void back_to(int64_t n);
  // The conv and recurrent states (two per Gated DeltaNet layer).
  std::vector<const StateBuffer*> whole_states() const;

  std::vector<LayerState> layers;

  // The passes since the host memory of the conv and recurrent states was last up to date: a
  // device that keeps the states it computes (Backend::keep_states) holds what they did, and
  // the model it ran on brings it to the host (`settle`: writes it back, or when the device
  // fails, redoes the passes on the CPU from that memory). Empty in a copy: one is made from
  // settled memory.
  struct DevicePasses {
    struct Pass {
      std::vector<int32_t> ids;
      LogitsFor which;
    };
    std::vector<Pass> passes;
    int64_t tokens = 0;
    std::function<void(const DecoderState&)> settle;

    DevicePasses() = default;
    DevicePasses(const DevicePasses&) {}
    DevicePasses& operator=(const DevicePasses&) {
      passes.clear();
      tokens = 0;
      settle = nullptr;
      return *this;
    }
  };
  mutable DevicePasses device_passes;
  // The host memory of every state up to date (what reads it calls first).
  void settle() const {
    if (!device_passes.passes.empty()) device_passes.settle(*this);
  }

 private:
  size_t checkpoint_parts() const;  // vectors a checkpoint of this model holds
  int64_t n_past_ = 0;
};

}  // namespace qhx
