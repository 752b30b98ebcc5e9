#include "models/decoder.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <optional>

#include "core/dtype.h"
#include "graph/runner.h"
#include "kernels/cpu_context.h"
#include "models/decoder_state.h"
#include "models/vision_tower.h"
#include "models/weights.h"
#include "util/error.h"
#include "util/sha256.h"

namespace qhx {
namespace {

// Nodes both plans (the forward pass, the MTP head) are made of, over rows from `in.row`.
void add_embed(Plan& plan, const MatrixRef& table, ValueId out) {
  Node& n = plan.add(Op::kEmbed);
  n.out = {out};
  n.rows = plan.n_tokens;
  n.matrix = &table;
}

void add_norm(Plan& plan, Operand in, int64_t rows, const WeightVector& scale, float eps,
              ValueId out) {
  Node& n = plan.add(Op::kRmsNorm);
  n.in[0] = in;
  n.out = {out};
  n.rows = rows;
  n.width = plan.values[out].cols;
  n.vector = &scale;
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

// A forward pass's outputs in the caller's vectors, sized for it: the logits `which` asks for
// (binding 0) and, when `hidden` is given, every row's final-norm output (binding 1).
class PassOutputs {
 public:
  PassOutputs(LogitsFor which, int64_t n_tokens, int64_t vocab, int64_t hidden_size,
              std::vector<float>& logits, std::vector<float>* hidden) {
    logits.resize(rows(which, n_tokens) * vocab);
    logits_.emplace(BufferKind::kHost, logits.data(), logits.size() * sizeof(float),
                    BorrowedBuffer::kWritable);
    if (hidden != nullptr) {
      hidden->resize(n_tokens * hidden_size);
      hidden_.emplace(BufferKind::kHost, hidden->data(), hidden->size() * sizeof(float),
                      BorrowedBuffer::kWritable);
    }
  }
  Buffer* logits() { return &*logits_; }
  Buffer* hidden() { return hidden_ ? &*hidden_ : nullptr; }

 private:
  static int64_t rows(LogitsFor which, int64_t n_tokens) {
    if (which == LogitsFor::kLastToken) return 1;
    return which == LogitsFor::kNoneStepwise || which == LogitsFor::kNone ? 0 : n_tokens;
  }
  std::optional<BorrowedBuffer> logits_, hidden_;
};

class Decoder final : public Model {
 public:
  Decoder(const ModelConfig& config, Checkpoint checkpoint, DecoderWeights weights,
          AttentionParams attention, GatedDeltaNetParams deltanet,
          std::shared_ptr<CpuContext> context, std::vector<std::shared_ptr<Backend>> backends)
      : context_(std::move(context)),
        config_(config),
        checkpoint_(std::move(checkpoint)),
        weights_(std::move(weights)),
        attention_(std::move(attention)),
        deltanet_(deltanet),
        fingerprint_(checkpoint_.fingerprint()),
        cpu_(backends.at(0)),
        runner_(
            *context_, std::move(backends), [this](const PlanKey& key) { return build(key); },
            PlanKey{1, variant(LogitsFor::kLastToken, PlanKind::kForward)}) {
    try {
      prepare_weights();
    } catch (...) {  // no destructor runs: the devices must not keep addresses into the files
      release_device_weights();
      throw;
    }
    open_vision();
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
                    : 2 * context * a.kv_row_floats());
    }
    return total;
  }

  bool has_devices() const override { return runner_.has_devices(); }
  bool devices_enabled() const override { return runner_.devices_enabled(); }
  void set_devices_enabled(bool on) override { runner_.set_devices_enabled(on); }
  std::string device_load_failure() const override { return runner_.device_load_failure(); }
  int64_t device_failures() const override { return runner_.device_failures(); }
  DeviceTraffic device_traffic() const override { return runner_.device_traffic(); }
  int64_t prompt_rows_multiple() const override { return runner_.rows_multiple(); }
  std::string device_failure() const override { return runner_.device_failure(); }

  std::unique_ptr<ModelState> new_state() const override {
    // In memory the CPU and the device the sequence shares with it both address (the CPU's
    // when it runs alone).
    const BufferType& memory = runner_.state_memory();
    std::vector<LayerState> layers(weights_.layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      LayerState& l = layers[i];
      if (weights_.layers[i].kind == LayerKind::kLinearAttention) {
        const auto& h = deltanet_.heads;
        l.conv = StateBuffer(memory, (deltanet_.conv_kernel - 1) * deltanet_.conv_channels());
        l.recurrent = StateBuffer(memory, h.n_v_heads * h.k_dim * h.v_dim);
      } else {
        l.kv_row_floats = attention_.shape.kv_row_floats();
        l.kv = attention_.shape.kv;
        l.keys = StateBuffer(memory);
        l.values = StateBuffer(memory);
      }
    }
    return std::make_unique<DecoderState>(std::move(layers));
  }

  void forward(std::span<const int32_t> ids, ModelState& base_state, LogitsFor which,
               std::vector<float>& logits, std::vector<float>* hidden) const override;
  int64_t activation_bytes(int64_t n_tokens) const override;

  bool has_vision() const override { return vision_ != nullptr; }
  std::string vision_unavailable() const override { return vision_unavailable_; }
  const ImageProcessorConfig& image_processor() const override {
    if (!vision_) Model::image_processor();
    return image_processor_;
  }
  std::vector<int32_t> image_ids(const PixelValues& pixels) const override;
  HeldImage held_image(int32_t id) const override;
  void forget_old_images(int64_t keep) const;  // under images_mutex_; slot `keep` stays
  int32_t adopt_image(const HeldImage& image) const override;
  std::vector<float> image_features(const PixelValues& pixels) const override {
    if (!vision_) return Model::image_features(pixels);
    const CpuContext::Turn turn(*context_);
    return vision_->encode(pixels);
  }
  bool is_image_id(int32_t id) const override {
    if (!vision_ || id < config_.vocab_size) return false;
    const std::lock_guard lock(images_mutex_);
    const int64_t slot = (id - config_.vocab_size) / kImageSlotRows;
    return slot < static_cast<int64_t>(images_.size()) &&
           (id - config_.vocab_size) % kImageSlotRows < images_[slot].tokens;
  }

  bool has_mtp() const override { return weights_.mtp.has_value(); }
  std::string mtp_unavailable() const override { return weights_.mtp_unavailable; }
  std::span<const int32_t> mtp_vocab() const override {
    return weights_.mtp ? std::span<const int32_t>(weights_.mtp->vocab)
                        : std::span<const int32_t>();
  }
  std::unique_ptr<ModelState> new_mtp_state() const override {
    if (!weights_.mtp) return nullptr;
    std::vector<LayerState> layers(1);
    layers[0].kv_row_floats = attention_.shape.kv_row_floats();
    layers[0].kv = attention_.shape.kv;
    layers[0].keys = StateBuffer(runner_.cpu_memory());
    layers[0].values = StateBuffer(runner_.cpu_memory());
    return std::make_unique<DecoderState>(std::move(layers));
  }
  void mtp_forward(std::span<const float> hidden, std::span<const int32_t> ids,
                   ModelState& mtp_state, std::vector<float>& out,
                   std::vector<float>* logits) const override;

 private:
  // The plans a model runs: the forward pass (with every row's final-norm output bound as
  // output 1, or not), and the MTP head (with the last row's logits, or not).
  // kEmbedded*: the forward pass from given embeddings (input 2: an image's rows among the
  // tokens'), at M-RoPE positions.
  enum class PlanKind {
    kForward,
    kForwardWithHidden,
    kMtp,
    kMtpWithLogits,
    kEmbedded,
    kEmbeddedWithHidden
  };
  // The forward pass over n_tokens new tokens as the spec reads (models/blocks.h).
  Plan build_plan(int64_t n_tokens, LogitsFor which, bool hidden, bool embedded) const;
  // The MTP head over n_tokens rows (MtpWeights): input 1 the hidden rows, output 2 the head's.
  Plan build_mtp_plan(int64_t n_tokens, bool logits) const;
  // A decoder layer over every row: h += mixer(norm(h)), then y = mlp(norm(h)), which the
  // caller adds to the rows of h it goes on with.
  void add_layer(Plan& plan, const DecoderLayer& layer, int index, const AttentionParams& attention,
                 const GatedDeltaNetParams& deltanet, ValueId h, ValueId x, ValueId y) const;
  // y = the layer's mixer (attention or Gated DeltaNet) of x, updating its state.
  void add_mixer(Plan& plan, const DecoderLayer& layer, int index, const AttentionParams& attention,
                 const GatedDeltaNetParams& deltanet, ValueId x, ValueId y) const;
  // The forward pass of a sequence that holds an image: the rows' embeddings and M-RoPE
  // positions made here, on the CPU.
  void forward_embedded(std::span<const int32_t> ids, DecoderState& state, LogitsFor which,
                        std::vector<float>& logits, std::vector<float>* hidden) const;
  // The vision tower, when config.json has one qhx reads and its weights are there.
  void open_vision();
  // A plan key's variant: which plan, and which logits it computes.
  static int variant(LogitsFor which, PlanKind kind) {
    return static_cast<int>(which) * 8 + static_cast<int>(kind);
  }
  Plan build(const PlanKey& key) const {
    const auto which = static_cast<LogitsFor>(key.variant / 8);
    const auto kind = static_cast<PlanKind>(key.variant % 8);
    if (kind == PlanKind::kMtp || kind == PlanKind::kMtpWithLogits) {
      return build_mtp_plan(key.n_tokens, kind == PlanKind::kMtpWithLogits);
    }
    return build_plan(key.n_tokens, which,
                      kind == PlanKind::kForwardWithHidden || kind == PlanKind::kEmbeddedWithHidden,
                      kind == PlanKind::kEmbedded || kind == PlanKind::kEmbeddedWithHidden);
  }

  // Weight preparation is the runner's backends'. A tied embedding table is then read from the
  // lm_head's layout (read_row).
  void prepare_weights() {
    runner_.prepare_weights(weight_list());
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
      WeightList cpu_only;
      cpu_only.matrices = std::move(head);
      runner_.prepare_cpu_weights(cpu_only);
    }
  }

  void release_device_weights() noexcept { runner_.release_weights(weight_list()); }

  // The weights the runner's backends prepare (numbered in this order): the matrices, the
  // embedding table (a device looks its rows up when it decodes) and the vectors. The MTP
  // head's are the CPU's alone.
  WeightList weight_list() {
    WeightList w;
    w.matrices = matrix_list(weights_);
    w.tables = {&weights_.embed_tokens};
    w.vectors = {&weights_.final_norm, &attention_.inv_freq};
    for (DecoderLayer& l : weights_.layers) {
      for (WeightVector* v :
           {&l.input_norm, &l.post_attention_norm, &l.attention.q_norm, &l.attention.k_norm,
            &l.deltanet.conv, &l.deltanet.a_log, &l.deltanet.dt_bias, &l.deltanet.norm}) {
        if (!v->empty()) w.vectors.push_back(v);
      }
    }
    return w;
  }

  // Every matrix of the model but the embedding table, the lm_head first (the largest: it starts
  // first when packing). Weights: DecoderWeights, const or not.
  template <typename Weights>
  static auto matrix_list(Weights& weights) -> std::vector<decltype(&weights.lm_head)> {
    std::vector<decltype(&weights.lm_head)> matrices{&weights.lm_head};  // null when headless
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
  ModelConfig config_;
  Checkpoint checkpoint_;  // owns the mappings every MatrixRef points into
  DecoderWeights weights_;
  AttentionParams attention_;
  GatedDeltaNetParams deltanet_;
  std::string fingerprint_;
  std::shared_ptr<Backend> cpu_;
  Runner runner_;  // the CPU and the devices

  // Images: the tower, the processor's settings, the text attention with M-RoPE axes, and the
  // images encoded so far. Image slot k's token r has the id vocab_size + k·kImageSlotRows + r.
  static constexpr int64_t kImageSlotRows = int64_t{1} << 16;
  static constexpr int64_t kImageMemory = int64_t{512} << 20;  // features kept, in bytes
  struct EncodedImage {
    std::string key;                 // sha256 of the pixel values and grid
    int64_t grid_w = 0, tokens = 0;  // the merged grid's width, and its tokens
    std::vector<float> features;     // [tokens, hidden]
  };
  std::unique_ptr<VisionTower> vision_;
  std::string vision_unavailable_ = "the checkpoint has no vision tower";
  ImageProcessorConfig image_processor_;
  std::vector<int8_t> mrope_axes_;
  AttentionParams mrope_attention_;
  mutable std::mutex images_mutex_;
  mutable std::vector<EncodedImage> images_;
};

Plan Decoder::build_plan(int64_t n_tokens, LogitsFor which, bool hidden, bool embedded) const {
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
  const ValueId h = plan.add_value(n_tokens, H, embedded ? 2 : -1);
  const ValueId x = plan.add_value(n_tokens, H), y = plan.add_value(n_tokens, H);
  if (!embedded) add_embed(plan, weights_.embed_tokens, h);
  const AttentionParams& attention = embedded ? mrope_attention_ : attention_;
  for (size_t i = 0; i < weights_.layers.size(); ++i) {
    const bool final_layer = i + 1 == weights_.layers.size();
    if (final_layer && which == LogitsFor::kNoneStepwise) {
      // Only the states matter: the last layer's mixer updates them; its MLP feeds the logits.
      add_norm(plan, {h}, n_tokens, weights_.layers[i].input_norm, eps, x);
      add_mixer(plan, weights_.layers[i], static_cast<int>(i), attention, stepwise, x, y);
      return plan;
    }
    add_layer(plan, weights_.layers[i], static_cast<int>(i), attention,
              step_exact ? stepwise : deltanet_, h, x, y);
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
  if (which == LogitsFor::kNone) return plan;
  const ValueId logits = plan.add_value(n_out, config_.vocab_size, /*binding=*/0);
  add_product(plan, {last, first_out - first_normed}, n_out, weights_.lm_head, logits);
  return plan;
}

void Decoder::add_layer(Plan& plan, const DecoderLayer& layer, int index,
                        const AttentionParams& attention, const GatedDeltaNetParams& deltanet,
                        ValueId h, ValueId x, ValueId y) const {
  const int64_t n = plan.n_tokens;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  add_norm(plan, {h}, n, layer.input_norm, eps, x);
  add_mixer(plan, layer, index, attention, deltanet, x, y);
  add_sum(plan, h, 0, n, y);
  add_norm(plan, {h}, n, layer.post_attention_norm, eps, x);
  add_mlp(plan, layer.mlp, x, y);
}

void Decoder::add_mixer(Plan& plan, const DecoderLayer& layer, int index,
                        const AttentionParams& attention, const GatedDeltaNetParams& deltanet,
                        ValueId x, ValueId y) const {
  if (layer.kind == LayerKind::kFullAttention) {
    add_attention(plan, layer.attention, attention, index, x, y);
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
  add_layer(plan, m.layer, 0, attention_, deltanet_, h, x, y);
  add_sum(plan, h, 0, n_tokens, y);
  add_norm(plan, {h}, n_tokens, m.final_norm, eps, out);
  if (logits) {
    const MatrixRef& head = m.vocab_head ? m.vocab_head->matrix : weights_.lm_head;
    const ValueId row_logits = plan.add_value(1, head.rows, /*binding=*/0);
    add_product(plan, {out, n_tokens - 1}, 1, head, row_logits);
  }
  return plan;
}

int64_t Decoder::activation_bytes(int64_t n_tokens) const {
  const CpuContext::Turn turn(*context_);
  if (weights_.lm_head.data == nullptr) {  // headless: its passes give final-norm rows only
    return runner_.arena_bytes(
               {n_tokens, variant(LogitsFor::kNone, PlanKind::kForwardWithHidden)}) +
           n_tokens * config_.hidden_size * static_cast<int64_t>(sizeof(float));
  }
  return runner_.arena_bytes({n_tokens, variant(LogitsFor::kLastToken, PlanKind::kForward)}) +
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
  if (which == LogitsFor::kNone && hidden == nullptr) {
    fail("forward", "a pass without logits computes the final-norm rows: pass `hidden`");
  }
  if (weights_.lm_head.data == nullptr && which != LogitsFor::kNone &&
      which != LogitsFor::kNoneStepwise) {
    fail(checkpoint_.dir().string(),
         "has no lm_head.weight (a base model saved alone, tie_word_embeddings false): it "
         "computes embeddings, not tokens");
  }
  if (first_pos + n_tokens > config_.max_position_embeddings) {
    fail("context", std::to_string(first_pos + n_tokens) +
                        " tokens exceed the model's max_position_embeddings (" +
                        std::to_string(config_.max_position_embeddings) + ")");
  }
  bool images = !state.rope_t.empty();  // positions are no longer the tokens' indices
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (ids[t] >= vocab && is_image_id(ids[t])) {
      images = true;
    } else if (ids[t] < 0 || ids[t] >= vocab) {
      fail("token ids", "id " + std::to_string(ids[t]) + " is outside the vocabulary [0, " +
                            std::to_string(vocab) + ")");
    }
  }
  if (images) return forward_embedded(ids, state, which, logits, hidden);
  PassOutputs out(which, n_tokens, vocab, config_.hidden_size, logits, hidden);
  const PlanKind kind = hidden != nullptr ? PlanKind::kForwardWithHidden : PlanKind::kForward;
  // The sessions of the models on this context take turns; the schedules and arenas are theirs
  // for the pass.
  const CpuContext::Turn turn(*context_);
  Buffer* const outputs[] = {out.logits(), out.hidden()};
  // A pass a device kept the states of is redone, if it must be, for its states alone: a
  // step-exact pass with no logits, any other with the last token's.
  const bool step_exact = which == LogitsFor::kEveryStep || which == LogitsFor::kNoneStepwise;
  const Runner::Pass pass{
      .plan = {n_tokens, variant(which, kind)},
      .replay = {n_tokens, variant(step_exact ? LogitsFor::kNoneStepwise : LogitsFor::kLastToken,
                                   PlanKind::kForward)},
      .step_exact = step_exact};
  runner_.run(ids, pass, state, std::span<Buffer* const>(outputs).first(hidden ? 2 : 1));
}

void Decoder::forward_embedded(std::span<const int32_t> ids, DecoderState& state, LogitsFor which,
                               std::vector<float>& logits, std::vector<float>* hidden) const {
  const int64_t n = static_cast<int64_t>(ids.size()), H = config_.hidden_size;
  const int64_t vocab = config_.vocab_size;
  // Positions as transformers' get_rope_index gives them: a text token at one past the largest
  // position so far on all three axes; an image's token r at (s, s + r / w, s + r % w), s one past
  // the largest position before the image.
  if (state.rope_t.empty()) {
    for (int32_t i = 0; i < static_cast<int32_t>(state.n_past()); ++i) {
      state.rope_t.push_back(i);
      state.rope_max.push_back(i);
    }
  }
  std::vector<int32_t> positions(3 * n), rope_t(n), rope_max(n);
  std::vector<float> embeddings(n * H);
  {
    const std::lock_guard lock(images_mutex_);
    int32_t last_t = state.rope_t.empty() ? -1 : state.rope_t.back();
    int32_t last_max = state.rope_max.empty() ? -1 : state.rope_max.back();
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = ids[t];
      float* row = &embeddings[t * H];
      int32_t p[3];
      if (id < vocab) {
        ref::read_row(weights_.embed_tokens, id, row);
        p[0] = p[1] = p[2] = last_max + 1;
        last_t = last_max = p[0];
      } else {
        const int64_t slot = (id - vocab) / kImageSlotRows, r = (id - vocab) % kImageSlotRows;
        const EncodedImage& image = images_[slot];
        if (image.features.empty()) {
          fail("image", "an image of this conversation is no longer in memory: send it again");
        }
        if (r > 0 && t > 0 && ids[t - 1] != id - 1) {
          fail("token ids", "an image's tokens must come in order, all of them");
        }
        std::copy_n(&image.features[r * H], H, row);
        const int32_t start = r == 0 ? last_max + 1 : last_t;
        p[0] = start;
        p[1] = start + static_cast<int32_t>(r / image.grid_w);
        p[2] = start + static_cast<int32_t>(r % image.grid_w);
        last_t = start;
        last_max = std::max({last_max, p[1], p[2]});
      }
      for (int a = 0; a < 3; ++a) positions[a * n + t] = p[a];
      rope_t[t] = last_t;
      rope_max[t] = last_max;
    }
  }
  PassOutputs out(which, n, vocab, H, logits, hidden);
  const CpuContext::Turn turn(*context_);
  state.settle();  // what a device kept, back in host memory: this pass runs on the CPU
  BorrowedBuffer embedding_memory(BufferKind::kHost, embeddings.data(),
                                  embeddings.size() * sizeof(float), BorrowedBuffer::kWritable);
  Buffer* const external[] = {out.logits(), out.hidden(), &embedding_memory};
  const PlanKind kind = hidden != nullptr ? PlanKind::kEmbeddedWithHidden : PlanKind::kEmbedded;
  runner_.run_on_cpu(ids, {n, variant(which, kind)}, state, external, positions);
  state.rope_t.insert(state.rope_t.end(), rope_t.begin(), rope_t.end());
  state.rope_max.insert(state.rope_max.end(), rope_max.begin(), rope_max.end());
}

void Decoder::open_vision() {
  if (!config_.vision) {
    if (!config_.vision_unavailable.empty()) vision_unavailable_ = config_.vision_unavailable;
    return;
  }
  if (config_.family != Family::kQwen3_5 || config_.mrope_section.size() != 3) {
    vision_unavailable_ = "only Qwen3.5 checkpoints read images";
    return;
  }
  if (!checkpoint_.contains("model.visual.patch_embed.proj.weight")) {
    vision_unavailable_ =
        "the checkpoint has a vision_config but no vision tower weights (model.visual.*)";
    return;
  }
  try {
    image_processor_ = read_image_processor_config(checkpoint_.dir());
    vision_ = std::make_unique<VisionTower>(*config_.vision, checkpoint_, *context_, cpu_,
                                            config_.int8_activations);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidInput) throw;
    vision_unavailable_ = e.what();
    return;
  }
  // transformers' interleaved M-RoPE: frequency i turns by height when i % 3 == 1 and
  // i < 3·section[1], by width when i % 3 == 2 and i < 3·section[2], else by time.
  const std::vector<int64_t>& section = config_.mrope_section;
  for (int64_t i = 0; i < attention_.rotary_dim / 2; ++i) {
    const int8_t axis = i % 3 == 1 && i < 3 * section[1]   ? 1
                        : i % 3 == 2 && i < 3 * section[2] ? 2
                                                           : 0;
    mrope_axes_.push_back(axis);
  }
  mrope_attention_ = attention_;
  mrope_attention_.rope_axes = mrope_axes_.data();
}

void Decoder::forget_old_images(int64_t keep) const {
  // The oldest images' features go past kImageMemory (their ids stay theirs: sending one again
  // brings it back under the same ids, so a conversation's prefix still matches).
  int64_t bytes = 0;
  for (size_t k = images_.size(); k-- > 0;) {
    bytes += static_cast<int64_t>(images_[k].features.size() * sizeof(float));
    if (bytes > kImageMemory && static_cast<int64_t>(k) != keep) {
      std::vector<float>().swap(images_[k].features);
    }
  }
}

HeldImage Decoder::held_image(int32_t id) const {
  if (!is_image_id(id)) fail("image", "id " + std::to_string(id) + " is no image's");
  const int64_t slot = (id - config_.vocab_size) / kImageSlotRows;
  const std::lock_guard lock(images_mutex_);
  const EncodedImage& image = images_[slot];
  if (image.features.empty()) {
    fail("image", "an image of the conversation was let go (past " +
                      std::to_string(kImageMemory >> 20) +
                      " MiB of images): send it again before saving");
  }
  return {image.key, static_cast<int32_t>(config_.vocab_size + slot * kImageSlotRows), image.grid_w,
          image.tokens, image.features};
}

int32_t Decoder::adopt_image(const HeldImage& image) const {
  if (!vision_) return Model::adopt_image(image);
  if (image.tokens <= 0 || image.tokens > kImageSlotRows || image.grid_w <= 0 ||
      image.tokens % image.grid_w != 0 ||
      static_cast<int64_t>(image.features.size()) != image.tokens * config_.hidden_size) {
    fail("image", "an image of " + std::to_string(image.tokens) + " tokens, grid width " +
                      std::to_string(image.grid_w) + " and " +
                      std::to_string(image.features.size()) +
                      " feature values does not fit this model");
  }
  const std::lock_guard lock(images_mutex_);
  int64_t slot = -1;
  for (size_t k = 0; k < images_.size(); ++k) {
    if (images_[k].key == image.key) slot = static_cast<int64_t>(k);
  }
  if (slot < 0) {
    if (static_cast<int64_t>(images_.size() + 1) * kImageSlotRows >
        std::numeric_limits<int32_t>::max() - config_.vocab_size) {
      fail("image", "this model has taken as many images as it can tell apart");
    }
    slot = static_cast<int64_t>(images_.size());
    images_.push_back({image.key, image.grid_w, image.tokens, image.features});
  } else if (images_[slot].features.empty()) {
    images_[slot].features = image.features;
  }
  forget_old_images(slot);
  return static_cast<int32_t>(config_.vocab_size + slot * kImageSlotRows);
}

std::vector<int32_t> Decoder::image_ids(const PixelValues& pixels) const {
  if (!vision_) return Model::image_ids(pixels);
  const int64_t m = vision_->config().spatial_merge_size;
  const int64_t tokens = pixels.grid.tokens(m);
  if (tokens > kImageSlotRows) {
    fail("image", std::to_string(tokens) + " tokens, more than one image may have (" +
                      std::to_string(kImageSlotRows) + ")");
  }
  Sha256 hash;
  hash.update(std::as_bytes(std::span(pixels.values)));
  const int64_t grid[3] = {pixels.grid.t, pixels.grid.h, pixels.grid.w};
  hash.update(std::as_bytes(std::span(grid)));
  const std::string key = hash.hex();
  int64_t slot = -1;
  bool forgotten = false;
  {
    const std::lock_guard lock(images_mutex_);
    for (size_t k = 0; k < images_.size(); ++k) {
      if (images_[k].key == key) slot = static_cast<int64_t>(k);
    }
    forgotten = slot >= 0 && images_[slot].features.empty();
  }
  if (forgotten) {  // its features went: encoded again, under the same ids
    std::vector<float> features = image_features(pixels);
    const std::lock_guard lock(images_mutex_);
    images_[slot].features = std::move(features);
  }
  if (slot < 0) {
    std::vector<float> features = image_features(pixels);
    const std::lock_guard lock(images_mutex_);
    if (static_cast<int64_t>(images_.size() + 1) * kImageSlotRows >
        std::numeric_limits<int32_t>::max() - config_.vocab_size) {
      fail("image", "this model has taken as many images as it can tell apart");
    }
    slot = static_cast<int64_t>(images_.size());
    images_.push_back({key, pixels.grid.w / m, tokens, std::move(features)});
    forget_old_images(slot);
  }
  std::vector<int32_t> ids(tokens);
  for (int64_t r = 0; r < tokens; ++r) {
    ids[r] = static_cast<int32_t>(config_.vocab_size + slot * kImageSlotRows + r);
  }
  return ids;
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
  const PlanKind kind = logits != nullptr ? PlanKind::kMtpWithLogits : PlanKind::kMtp;
  runner_.run_on_cpu(ids, {n_tokens, variant(LogitsFor::kLastToken, kind)}, state, external);
}

}  // namespace

MlpWeights read_mlp(const WeightReader& model, const std::string& layer, const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  return {model.matrix(layer + "mlp.gate_proj.weight", I, H),
          model.matrix(layer + "mlp.up_proj.weight", I, H),
          model.matrix(layer + "mlp.down_proj.weight", H, I)};
}

AttentionParams attention_params(const ModelConfig& c, bool output_gate, KvType kv) {
  if (!kv_type_fits(kv, c.head_dim)) {
    fail("kv_type", std::string("a ") + kv_type_name(kv) +
                        " KV cache needs head_dim a multiple of " +
                        (kv == KvType::kQ4 ? std::to_string(kKvQ4Group) : "4") +
                        "; this model's is " + std::to_string(c.head_dim));
  }
  AttentionParams p;
  p.shape = {c.num_heads, c.num_kv_heads, c.head_dim, kv};
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
                                    std::vector<std::shared_ptr<Backend>> backends) {
  return std::make_unique<Decoder>(config, std::move(checkpoint), std::move(weights),
                                   std::move(attention), deltanet, std::move(context),
                                   std::move(backends));
}

}  // namespace qhx
