#include "models/decoder.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <tuple>

#include "backend/cpu_backend.h"
#include "core/dtype.h"
#include "graph/schedule.h"
#include "kernels/cpu_context.h"
#include "models/decoder_state.h"
#include "models/weights.h"
#include "util/error.h"

namespace qhx {
namespace {

// Nodes both plans (the forward pass, the MTP head) are made of, over rows from `in.row`.
void add_embed(Plan& plan, const MatrixRef& table, ValueId out) {
  Node& n = plan.add(Op::kEmbed);
  n.out = {out};
  n.rows = plan.n_tokens;
  n.matrix = &table;
}

void add_norm(Plan& plan, Operand in, int64_t rows, const std::vector<float>& scale, float eps,
              ValueId out) {
  Node& n = plan.add(Op::kRmsNorm);
  n.in[0] = in;
  n.out = {out};
  n.rows = rows;
  n.width = plan.values[out].cols;
  n.vector = scale.data();
  n.eps = eps;
}

void add_sum(Plan& plan, ValueId sum, int64_t row, int64_t rows, ValueId term) {
  Node& n = plan.add(Op::kAdd);
  n.in[0] = {term, row};
  n.out = {sum, row};
  n.rows = rows;
}

void add_product(Plan& plan, Operand in, int64_t rows, const MatrixRef& w, ValueId out) {
  Node& n = plan.add(Op::kMatmul);
  n.in[0] = in;
  n.out = {out};
  n.rows = rows;
  n.matrix = &w;
}

// Whether any node of the schedule runs on a device (backend 0 is the CPU).
bool uses_devices(const Schedule& s) {
  return std::any_of(s.plan.nodes.begin(), s.plan.nodes.end(),
                     [](const Node& n) { return n.backend > 0; });
}

class Decoder final : public Model {
 public:
  Decoder(const ModelConfig& config, Checkpoint checkpoint, DecoderWeights weights,
          AttentionParams attention, GatedDeltaNetParams deltanet,
          std::shared_ptr<CpuContext> context, std::vector<std::shared_ptr<Backend>> devices)
      : context_(std::move(context)),
        cpu_(std::make_unique<CpuBackend>(*context_)),
        devices_(std::move(devices)),
        config_(config),
        checkpoint_(std::move(checkpoint)),
        weights_(std::move(weights)),
        attention_(std::move(attention)),
        deltanet_(deltanet),
        fingerprint_(checkpoint_.fingerprint()),
        devices_enabled_(!devices_.empty()) {
    backends_.push_back(cpu_.get());
    for (const auto& d : devices_) backends_.push_back(d.get());
    try {
      prepare_weights();
    } catch (...) {  // no destructor runs: the devices must not keep addresses into the files
      release_device_weights();
      throw;
    }
  }
  // The devices may read the mapped files in place, and may outlive the model.
  ~Decoder() override { release_device_weights(); }

  const ModelConfig& config() const override { return config_; }
  CpuContext& context() const override { return *context_; }
  const std::string& fingerprint() const override { return fingerprint_; }
  int64_t weights_bytes() const override {
    int64_t total = 0;
    for (const auto& file : checkpoint_.files())
      total += static_cast<int64_t>(file->bytes().size());
    return total;
  }

  int64_t decode_step_bytes(int64_t context) const override {
    int64_t total = 0;
    for (const MatrixRef* m : matrix_list(weights_)) {
      if (m->data == nullptr) continue;  // a mixer this layer does not have
      total += static_cast<int64_t>(matrix_bytes(m->dtype, m->rows, m->cols, m->group_size) +
                                    matrix_scale_bytes(m->dtype, m->rows, m->cols, m->group_size));
    }
    const AttentionShape& a = attention_.shape;
    const DeltaRuleShape& d = deltanet_.heads;
    for (const DecoderLayer& l : weights_.layers) {
      total += static_cast<int64_t>(sizeof(float)) *
               (l.kind == LayerKind::kLinearAttention
                    ? (deltanet_.conv_kernel - 1) * deltanet_.conv_channels() +
                          d.n_v_heads * d.k_dim * d.v_dim
                    : 2 * context * a.n_kv_heads * a.head_dim);
    }
    return total;
  }

  bool has_devices() const override { return !devices_.empty(); }
  bool devices_enabled() const override { return devices_enabled_.load(); }
  void set_devices_enabled(bool on) override {
    devices_enabled_ = on && !devices_.empty() && load_failure_.empty();
  }
  std::string device_load_failure() const override { return load_failure_; }
  int64_t device_failures() const override { return device_failures_.load(); }
  DeviceTraffic device_traffic() const override {
    const CpuContext::Turn turn(*context_);
    return traffic_;
  }
  std::string device_failure() const override {
    const CpuContext::Turn turn(*context_);
    return device_failure_;
  }

  std::unique_ptr<ModelState> new_state() const override {
    // In memory the CPU and the device the sequence shares with it both address (the CPU's
    // when it runs alone).
    const BufferType& memory = devices_.empty() || !load_failure_.empty()
                                   ? cpu_->buffer_type()
                                   : devices_[0]->state_buffer_type();
    std::vector<LayerState> layers(weights_.layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      LayerState& l = layers[i];
      if (weights_.layers[i].kind == LayerKind::kLinearAttention) {
        const auto& h = deltanet_.heads;
        l.conv = StateBuffer(memory, (deltanet_.conv_kernel - 1) * deltanet_.conv_channels());
        l.recurrent = StateBuffer(memory, h.n_v_heads * h.k_dim * h.v_dim);
      } else {
        l.kv_width = attention_.shape.n_kv_heads * attention_.shape.head_dim;
        l.keys = StateBuffer(memory);
        l.values = StateBuffer(memory);
      }
    }
    return std::make_unique<DecoderState>(std::move(layers));
  }

  void forward(std::span<const int32_t> ids, ModelState& base_state, LogitsFor which,
               std::vector<float>& logits, std::vector<float>* hidden) const override;
  int64_t activation_bytes(int64_t n_tokens) const override;

  bool has_mtp() const override { return weights_.mtp.has_value(); }
  std::string mtp_unavailable() const override { return weights_.mtp_unavailable; }
  std::span<const int32_t> mtp_vocab() const override {
    return weights_.mtp ? std::span<const int32_t>(weights_.mtp->vocab)
                        : std::span<const int32_t>();
  }
  std::unique_ptr<ModelState> new_mtp_state() const override {
    if (!weights_.mtp) return nullptr;
    std::vector<LayerState> layers(1);
    layers[0].kv_width = attention_.shape.n_kv_heads * attention_.shape.head_dim;
    layers[0].keys = StateBuffer(cpu_->buffer_type());
    layers[0].values = StateBuffer(cpu_->buffer_type());
    return std::make_unique<DecoderState>(std::move(layers));
  }
  void mtp_forward(std::span<const float> hidden, std::span<const int32_t> ids,
                   ModelState& mtp_state, std::vector<float>& out,
                   std::vector<float>* logits) const override;

 private:
  // The plans a model runs: the forward pass (with every row's final-norm output bound as
  // output 1, or not), and the MTP head (with the last row's logits, or not).
  enum class PlanKind { kForward, kForwardWithHidden, kMtp, kMtpWithLogits };
  // The forward pass over n_tokens new tokens as the spec reads (models/blocks.h).
  Plan build_plan(int64_t n_tokens, LogitsFor which, bool hidden) const;
  // The MTP head over n_tokens rows (MtpWeights): input 1 the hidden rows, output 2 the head's.
  Plan build_mtp_plan(int64_t n_tokens, bool logits) const;
  // A decoder layer over every row: h += mixer(norm(h)), then y = mlp(norm(h)), which the
  // caller adds to the rows of h it goes on with.
  void add_layer(Plan& plan, const DecoderLayer& layer, int index,
                 const GatedDeltaNetParams& deltanet, ValueId h, ValueId x, ValueId y) const;
  // y = the layer's mixer (attention or Gated DeltaNet) of x, updating its state.
  void add_mixer(Plan& plan, const DecoderLayer& layer, int index,
                 const GatedDeltaNetParams& deltanet, ValueId x, ValueId y) const;
  // That plan placed, fused and laid out for this model's backends (or the CPU alone), cached.
  // Call on the turn.
  Schedule& schedule_for(int64_t n_tokens, LogitsFor which, bool devices,
                         PlanKind kind = PlanKind::kForward) const;
  bool decodes_on_devices() const;  // whether a decode step's plan puts nodes on a device
  // Whether every conv and delta-rule node of the schedule runs on devices that keep the states
  // they compute (Backend::keep_states), and tells them to keep them or not accordingly.
  bool keeps_states(const Schedule& s) const;
  // Brings the state's host memory up to date after passes whose states a device kept
  // (DecoderState::device_passes): writes them back, or when the device fails, redoes the passes
  // on the CPU from that memory. settle takes the context's turn; settle_on_turn is for a caller
  // that has it.
  void settle(const DecoderState& state) const;
  void settle_on_turn(const DecoderState& state) const;
  // A device failed: it is not used again, and the state's kept passes are redone on the CPU.
  void device_failed(const Error& e, DecoderState& state) const;
  std::span<Backend* const> backends(bool devices) const {
    return std::span<Backend* const>(backends_).first(devices ? backends_.size() : 1);
  }

  // Weight preparation is each backend's: the devices first (they copy from the mapped pages),
  // then the CPU (which releases the pages of what it packs). A tied embedding table is then
  // read from the lm_head's layout (read_row).
  void prepare_weights() {
    const std::vector<MatrixRef*> matrices = matrix_list(weights_);
    for (size_t b = backends_.size(); b-- > 1;) {
      try {
        backends_[b]->prepare_weights(matrices);
      } catch (const Error& e) {
        // A device without room for the weights (or failing as they go up) leaves the model on
        // the CPU, saying why (check_devices), rather than failing to load it.
        if (e.kind() != ErrorKind::kOutOfMemory && e.kind() != ErrorKind::kDeviceFailed) throw;
        backends_[b]->release_weights(matrices);
        devices_enabled_ = false;
        ++device_failures_;
        device_failure_ = load_failure_ = e.what();
      }
    }
    cpu_->prepare_weights(matrices);
    MatrixRef& embed = weights_.embed_tokens;
    if (embed.data == weights_.lm_head.data) embed.packed = weights_.lm_head.packed;
    // The MTP head drafts on the CPU.
    if (weights_.mtp) {
      MtpWeights& m = *weights_.mtp;
      AttentionWeights& a = m.layer.attention;
      std::vector<MatrixRef*> head = {&m.fc_embedding,
                                      &m.fc_hidden,
                                      &a.q_proj,
                                      &a.k_proj,
                                      &a.v_proj,
                                      &a.o_proj,
                                      &m.layer.mlp.gate_proj,
                                      &m.layer.mlp.up_proj,
                                      &m.layer.mlp.down_proj};
      if (m.vocab_head) head.push_back(&m.vocab_head->matrix);
      cpu_->prepare_weights(head);
    }
  }

  void release_device_weights() noexcept {
    std::vector<MatrixRef*> matrices = matrix_list(weights_);
    matrices.push_back(&weights_.embed_tokens);  // a device looks its rows up when it decodes
    for (const auto& d : devices_) {
      try {
        d->release_weights(matrices);
      } catch (...) {  // a lost device: its memory went with it
      }
    }
  }

  // Every matrix of the model but the embedding table, the lm_head first (the largest: it starts
  // first when packing). Weights: DecoderWeights, const or not.
  template <typename Weights>
  static auto matrix_list(Weights& weights) -> std::vector<decltype(&weights.lm_head)> {
    std::vector<decltype(&weights.lm_head)> matrices{&weights.lm_head};
    for (auto& l : weights.layers) {
      for (auto* m : {&l.attention.q_proj, &l.attention.k_proj, &l.attention.v_proj,
                      &l.attention.o_proj, &l.deltanet.in_proj_qkv, &l.deltanet.in_proj_z,
                      &l.deltanet.in_proj_b, &l.deltanet.in_proj_a, &l.deltanet.out_proj,
                      &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj}) {
        matrices.push_back(m);
      }
    }
    return matrices;
  }

  std::shared_ptr<CpuContext> context_;  // where this model computes
  std::unique_ptr<CpuBackend> cpu_;      // on context_ (a pointer: backends_ keeps its address)
  std::vector<std::shared_ptr<Backend>> devices_;
  std::vector<Backend*> backends_;  // the CPU, then the devices
  struct CachedSchedule {
    std::tuple<int64_t, LogitsFor, bool, PlanKind> key;
    Schedule schedule;
    uint64_t last_used = 0;
  };
  mutable std::vector<CachedSchedule> schedules_;  // used on the context's turn
  mutable uint64_t schedule_clock_ = 0;
  ModelConfig config_;
  Checkpoint checkpoint_;  // owns the mappings every MatrixRef points into
  DecoderWeights weights_;
  AttentionParams attention_;
  GatedDeltaNetParams deltanet_;
  std::string fingerprint_;
  // Off after a device failed (forward disables it, so mutable) or failed its check.
  mutable std::atomic<bool> devices_enabled_;
  mutable std::atomic<int64_t> device_failures_{0};
  mutable DeviceTraffic traffic_;       // under the context's turn, as the schedules
  mutable std::string device_failure_;  // on the turn
  std::string load_failure_;            // why the devices took no weights: they stay unused
};

Plan Decoder::build_plan(int64_t n_tokens, LogitsFor which, bool hidden) const {
  const int64_t H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  Plan plan;
  plan.n_tokens = n_tokens;
  GatedDeltaNetParams stepwise = deltanet_;
  stepwise.chunk = 0;  // the recurrent form over every row

  // h = embed[ids]; per layer h += mixer(norm(h)); h += mlp(norm(h)).
  const bool step_exact = which == LogitsFor::kEveryStep || which == LogitsFor::kNoneStepwise;
  const int64_t first_out = which == LogitsFor::kLastToken ? n_tokens - 1 : 0;
  const int64_t n_out = n_tokens - first_out;
  // Rows that go through the final norm: all of them when their outputs are asked for.
  const int64_t first_normed = hidden ? 0 : first_out, n_normed = n_tokens - first_normed;
  const ValueId h = plan.add_value(n_tokens, H), x = plan.add_value(n_tokens, H);
  const ValueId y = plan.add_value(n_tokens, H);
  add_embed(plan, weights_.embed_tokens, h);
  for (size_t i = 0; i < weights_.layers.size(); ++i) {
    const bool final_layer = i + 1 == weights_.layers.size();
    if (final_layer && which == LogitsFor::kNoneStepwise) {
      // Only the states matter: the last layer's mixer updates them; its MLP feeds the logits.
      add_norm(plan, {h}, n_tokens, weights_.layers[i].input_norm, eps, x);
      add_mixer(plan, weights_.layers[i], static_cast<int>(i), stepwise, x, y);
      return plan;
    }
    add_layer(plan, weights_.layers[i], static_cast<int>(i), step_exact ? stepwise : deltanet_, h,
              x, y);
    // The last block's output joins only the rows whose logits (or outputs) are asked for.
    if (!final_layer) {
      add_sum(plan, h, 0, n_tokens, y);
    } else {
      add_sum(plan, h, first_normed, n_normed, y);
    }
  }

  // logits = lm_head(norm(h)).
  const ValueId last = plan.add_value(n_normed, H, hidden ? 1 : -1);
  add_norm(plan, {h, first_normed}, n_normed, weights_.final_norm, eps, last);
  const ValueId logits = plan.add_value(n_out, config_.vocab_size, /*binding=*/0);
  add_product(plan, {last, first_out - first_normed}, n_out, weights_.lm_head, logits);
  return plan;
}

void Decoder::add_layer(Plan& plan, const DecoderLayer& layer, int index,
                        const GatedDeltaNetParams& deltanet, ValueId h, ValueId x,
                        ValueId y) const {
  const int64_t n = plan.n_tokens;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  add_norm(plan, {h}, n, layer.input_norm, eps, x);
  add_mixer(plan, layer, index, deltanet, x, y);
  add_sum(plan, h, 0, n, y);
  add_norm(plan, {h}, n, layer.post_attention_norm, eps, x);
  add_mlp(plan, layer.mlp, x, y);
}

void Decoder::add_mixer(Plan& plan, const DecoderLayer& layer, int index,
                        const GatedDeltaNetParams& deltanet, ValueId x, ValueId y) const {
  if (layer.kind == LayerKind::kFullAttention) {
    add_attention(plan, layer.attention, attention_, index, x, y);
  } else {
    add_gated_deltanet(plan, layer.deltanet, deltanet, index, x, y);
  }
}

Plan Decoder::build_mtp_plan(int64_t n_tokens, bool logits) const {
  const MtpWeights& m = *weights_.mtp;
  const int64_t H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  Plan plan;
  plan.n_tokens = n_tokens;
  const ValueId hidden = plan.add_value(n_tokens, H, /*binding=*/1);
  const ValueId out = plan.add_value(n_tokens, H, /*binding=*/2);
  const ValueId e = plan.add_value(n_tokens, H), x = plan.add_value(n_tokens, H);
  const ValueId h = plan.add_value(n_tokens, H), y = plan.add_value(n_tokens, H);
  // h = fc([norm_e(embed[ids]) ; norm_h(hidden)]), as its two halves.
  add_embed(plan, weights_.embed_tokens, e);
  add_norm(plan, {e}, n_tokens, m.embedding_norm, eps, x);
  add_product(plan, {x}, n_tokens, m.fc_embedding, h);
  add_norm(plan, {hidden}, n_tokens, m.hidden_norm, eps, x);
  add_product(plan, {x}, n_tokens, m.fc_hidden, y);
  add_sum(plan, h, 0, n_tokens, y);
  // One full-attention decoder layer, on the head's own KV cache (layer 0 of its state).
  add_layer(plan, m.layer, 0, deltanet_, h, x, y);
  add_sum(plan, h, 0, n_tokens, y);
  add_norm(plan, {h}, n_tokens, m.final_norm, eps, out);
  if (logits) {
    const MatrixRef& head = m.vocab_head ? m.vocab_head->matrix : weights_.lm_head;
    const ValueId row_logits = plan.add_value(1, head.rows, /*binding=*/0);
    add_product(plan, {out, n_tokens - 1}, 1, head, row_logits);
  }
  return plan;
}

Schedule& Decoder::schedule_for(int64_t n_tokens, LogitsFor which, bool devices,
                                PlanKind kind) const {
  const auto key = std::tuple{n_tokens, which, devices, kind};
  ++schedule_clock_;
  for (CachedSchedule& c : schedules_) {
    if (c.key == key) {
      c.last_used = schedule_clock_;
      return c.schedule;
    }
  }
  Plan plan = kind == PlanKind::kMtp || kind == PlanKind::kMtpWithLogits
                  ? build_mtp_plan(n_tokens, kind == PlanKind::kMtpWithLogits)
                  : build_plan(n_tokens, which, kind == PlanKind::kForwardWithHidden);
  Schedule made = schedule(std::move(plan), backends(devices));
  // A bounded cache (a schedule is its nodes' layout; the arenas it runs in are each backend's,
  // one per backend): a decode step, the prefill chunks and decoding with speculation's small
  // plans (verify passes of 2..k+1 tokens, replays, the MTP head's) stay; odd tails come and go.
  constexpr size_t kMaxSchedules = 32;
  if (schedules_.size() == kMaxSchedules) {
    schedules_.erase(std::min_element(schedules_.begin(), schedules_.end(),
                                      [](const CachedSchedule& a, const CachedSchedule& b) {
                                        return a.last_used < b.last_used;
                                      }));
  }
  schedules_.push_back({key, std::move(made), schedule_clock_});
  return schedules_.back().schedule;
}

bool Decoder::decodes_on_devices() const {
  return uses_devices(schedule_for(1, LogitsFor::kLastToken, true));
}

int64_t Decoder::activation_bytes(int64_t n_tokens) const {
  const CpuContext::Turn turn(*context_);
  return schedule_for(n_tokens, LogitsFor::kLastToken, devices_enabled_).arena_bytes() +
         config_.vocab_size * static_cast<int64_t>(sizeof(float));
}

void Decoder::forward(std::span<const int32_t> ids, ModelState& base_state, LogitsFor which,
                      std::vector<float>& logits, std::vector<float>* hidden) const {
  auto& state = dynamic_cast<DecoderState&>(base_state);
  const int64_t n_tokens = static_cast<int64_t>(ids.size());
  const int64_t first_pos = state.n_past();
  const int64_t vocab = config_.vocab_size;
  if (n_tokens == 0) fail("forward", "no tokens to process");
  if (which == LogitsFor::kNoneStepwise && hidden != nullptr) {
    fail("forward", "final-norm rows are computed only with logits");
  }
  if (first_pos + n_tokens > config_.max_position_embeddings) {
    fail("context", std::to_string(first_pos + n_tokens) +
                        " tokens exceed the model's max_position_embeddings (" +
                        std::to_string(config_.max_position_embeddings) + ")");
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      fail("token ids", "id " + std::to_string(ids[t]) + " is outside the vocabulary [0, " +
                            std::to_string(vocab) + ")");
    }
  }
  const int64_t logit_rows = which == LogitsFor::kLastToken      ? 1
                             : which == LogitsFor::kNoneStepwise ? 0
                                                                 : n_tokens;
  logits.resize(logit_rows * vocab);
  if (hidden != nullptr) hidden->resize(n_tokens * config_.hidden_size);
  const PlanKind kind = hidden != nullptr ? PlanKind::kForwardWithHidden : PlanKind::kForward;
  // The sessions of the models on this context take turns; the schedules and arenas are theirs
  // for the pass.
  const CpuContext::Turn turn(*context_);
  BorrowedBuffer logits_memory(BufferKind::kHost, logits.data(), logits.size() * sizeof(float),
                               BorrowedBuffer::kWritable);
  std::optional<BorrowedBuffer> hidden_memory;
  if (hidden != nullptr) {
    hidden_memory.emplace(BufferKind::kHost, hidden->data(), hidden->size() * sizeof(float),
                          BorrowedBuffer::kWritable);
  }
  Buffer* const outputs[] = {&logits_memory, hidden_memory ? &*hidden_memory : nullptr};
  const RunInputs inputs{.ids = ids,
                         .first_pos = first_pos,
                         .layers = state.layers,
                         .external = std::span<Buffer* const>(outputs).first(hidden ? 2 : 1)};
  bool devices = devices_enabled_;
  // A step-exact pass (verifying a draft) must compute what decoding computes: it runs where a
  // decode step runs, not where prompts do.
  if (devices && (which == LogitsFor::kEveryStep || which == LogitsFor::kNoneStepwise)) {
    devices = decodes_on_devices();
  }
  Schedule* s = &schedule_for(n_tokens, which, devices, kind);
  if (devices && !uses_devices(*s)) {
    devices = false;  // nothing of this pass runs on a device (a decode step, say)
  }
  const bool kept = devices && keeps_states(*s);
  if (!kept) {
    settle_on_turn(state);  // this pass reads the states' host memory
    // A write-back that failed has turned the devices off; replaying may evict schedules.
    devices = devices && devices_enabled_;
    s = &schedule_for(n_tokens, which, devices, kind);
  }
  const auto on_cpu = [&] {
    execute(schedule_for(n_tokens, which, false, kind), backends(false), inputs);
  };
  if (!devices) {
    on_cpu();
  } else if (kept) {
    // The device leaves the states' host memory as it was (at the start of the kept passes).
    try {
      execute(*s, backends(true), inputs);
      traffic_ += {.passes = 1, .copies = s->copies, .copy_bytes = s->copy_bytes};
      DecoderState::DevicePasses& passes = state.device_passes;
      passes.passes.push_back({{ids.begin(), ids.end()}, which});
      passes.tokens += n_tokens;
      passes.settle = [this](const DecoderState& settled) { settle(settled); };
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kDeviceFailed) throw;
      device_failed(e, state);
      on_cpu();
    }
  } else {
    // A device may fail part-way, after updating recurrent states in place: what it started
    // from is kept (the conv and recurrent states; KV rows past n_past are rewritten anyway).
    const StateCheckpoint start = state.checkpoint();
    try {
      execute(*s, backends(true), inputs);
      traffic_ += {.passes = 1, .copies = s->copies, .copy_bytes = s->copy_bytes};
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kDeviceFailed) throw;
      device_failed(e, state);
      state.rewind(first_pos, &start);
      on_cpu();
    }
  }
  state.advance(n_tokens);
  // Written back now and then: a failure then costs the CPU at most this many tokens to redo.
  constexpr int64_t kMaxKeptTokens = 256;
  if (state.device_passes.tokens >= kMaxKeptTokens) settle_on_turn(state);
}

bool Decoder::keeps_states(const Schedule& s) const {
  // (Attention-only models have no such states: their passes change only KV rows past the
  // sequence, which the device writes back as it goes.)
  bool any = false, on_devices = true;
  for (const Node& n : s.plan.nodes) {
    if (n.op != Op::kConvSilu && n.op != Op::kDeltaRule) continue;
    any = true;
    if (n.backend == 0) on_devices = false;
  }
  on_devices = on_devices && any;
  bool kept = on_devices;
  for (const std::shared_ptr<Backend>& device : devices_) {
    kept = device->keep_states(on_devices) && kept;
  }
  return kept;
}

void Decoder::settle(const DecoderState& state) const {
  const CpuContext::Turn turn(*context_);
  settle_on_turn(state);
}

void Decoder::settle_on_turn(const DecoderState& settled) const {
  if (settled.device_passes.passes.empty()) return;
  // Settling changes no token of the sequence, only where its states' newest elements lie.
  auto& state = const_cast<DecoderState&>(settled);
  try {
    const std::vector<const StateBuffer*> whole = state.whole_states();
    for (const std::shared_ptr<Backend>& device : devices_) device->write_back_states(whole);
    state.device_passes = {};
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kDeviceFailed) throw;
    device_failed(e, state);
  }
}

void Decoder::device_failed(const Error& e, DecoderState& state) const {
  devices_enabled_ = false;
  ++device_failures_;
  device_failure_ = e.what();
  // What the device kept is lost: the host memory holds the states as the kept passes found
  // them, and the CPU redoes those passes as they ran (their logits are not needed again).
  for (const StateBuffer* whole : state.whole_states()) whole->forget_shadow();
  const int64_t redone = state.device_passes.tokens;
  const std::vector<DecoderState::DevicePasses::Pass> passes =
      std::move(state.device_passes.passes);
  state.device_passes = {};
  state.back_to(state.n_past() - redone);
  std::vector<float> logits;
  for (const DecoderState::DevicePasses::Pass& pass : passes) {
    const int64_t n = static_cast<int64_t>(pass.ids.size());
    const bool stepwise =
        pass.which == LogitsFor::kEveryStep || pass.which == LogitsFor::kNoneStepwise;
    const LogitsFor which = stepwise ? LogitsFor::kNoneStepwise : LogitsFor::kLastToken;
    logits.resize(which == LogitsFor::kLastToken ? config_.vocab_size : 0);
    BorrowedBuffer logits_memory(BufferKind::kHost, logits.data(), logits.size() * sizeof(float),
                                 BorrowedBuffer::kWritable);
    Buffer* const outputs[] = {&logits_memory};
    const RunInputs inputs{
        .ids = pass.ids, .first_pos = state.n_past(), .layers = state.layers, .external = outputs};
    execute(schedule_for(n, which, false), backends(false), inputs);
    state.advance(n);
  }
}

void Decoder::mtp_forward(std::span<const float> hidden, std::span<const int32_t> ids,
                          ModelState& base_state, std::vector<float>& out,
                          std::vector<float>* logits) const {
  if (!weights_.mtp) Model::mtp_forward(hidden, ids, base_state, out, logits);
  auto& state = dynamic_cast<DecoderState&>(base_state);
  const int64_t n_tokens = static_cast<int64_t>(ids.size()), H = config_.hidden_size;
  if (n_tokens == 0 || static_cast<int64_t>(hidden.size()) != n_tokens * H) {
    fail("mtp", "expected one hidden row per id");
  }
  for (const int32_t id : ids) {
    if (id < 0 || id >= config_.vocab_size) {
      fail("mtp: token ids", "id " + std::to_string(id) + " is outside the vocabulary");
    }
  }
  out.resize(n_tokens * H);
  if (logits != nullptr) {
    logits->resize(weights_.mtp->vocab.empty() ? config_.vocab_size : weights_.mtp->vocab.size());
  }
  const CpuContext::Turn turn(*context_);
  BorrowedBuffer logits_memory(BufferKind::kHost, logits != nullptr ? logits->data() : nullptr,
                               logits != nullptr ? logits->size() * sizeof(float) : 0,
                               BorrowedBuffer::kWritable);
  BorrowedBuffer hidden_memory(BufferKind::kHost, hidden.data(), hidden.size_bytes(),
                               BorrowedBuffer::kReadOnly);
  BorrowedBuffer out_memory(BufferKind::kHost, out.data(), out.size() * sizeof(float),
                            BorrowedBuffer::kWritable);
  Buffer* const external[] = {&logits_memory, &hidden_memory, &out_memory};
  const RunInputs inputs{
      .ids = ids, .first_pos = state.n_past(), .layers = state.layers, .external = external};
  const PlanKind kind = logits != nullptr ? PlanKind::kMtpWithLogits : PlanKind::kMtp;
  execute(schedule_for(n_tokens, LogitsFor::kLastToken, false, kind), backends(false), inputs);
  state.advance(n_tokens);
}

}  // namespace

MlpWeights read_mlp(const WeightReader& model, const std::string& layer, const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  return {model.matrix(layer + "mlp.gate_proj.weight", I, H),
          model.matrix(layer + "mlp.up_proj.weight", I, H),
          model.matrix(layer + "mlp.down_proj.weight", H, I)};
}

AttentionParams attention_params(const ModelConfig& c, bool output_gate) {
  AttentionParams p;
  p.shape = {c.num_heads, c.num_kv_heads, c.head_dim};
  p.rotary_dim = c.rotary_dim;
  p.inv_freq = rope_inv_freq(c.rope_theta, c.rotary_dim);
  p.output_gate = output_gate;
  p.norm_eps = static_cast<float>(c.rms_norm_eps);
  return p;
}

std::unique_ptr<Model> make_decoder(const ModelConfig& config, Checkpoint checkpoint,
                                    DecoderWeights weights, AttentionParams attention,
                                    GatedDeltaNetParams deltanet,
                                    std::shared_ptr<CpuContext> context,
                                    std::vector<std::shared_ptr<Backend>> devices) {
  return std::make_unique<Decoder>(config, std::move(checkpoint), std::move(weights),
                                   std::move(attention), deltanet, std::move(context),
                                   std::move(devices));
}

}  // namespace qhx
