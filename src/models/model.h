// What the runtime needs from a model family: a forward pass over new tokens that extends a
// per-sequence state, and logits out.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/backend.h"
#include "graph/runner.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "kernels/cpu_context.h"
#include "util/error.h"
#include "vision/image_processor.h"

namespace qhx {

// A named piece of a sequence's state, e.g. "layer3.recurrent".
struct StateTensor {
  std::string name;
  std::span<const float> data;
};

// What a state cannot get back by cutting its KV caches short: the conv and recurrent states of
// the linear-attention layers (nothing for attention-only models), at position n_past. A few MB
// for a Qwen3.5 model, against the KV cache's per-token growth.
struct StateCheckpoint {
  int64_t n_past = 0;
  std::vector<std::vector<float>> recurrent;  // one entry per recurrent layer state
  int64_t bytes() const;
};

// Everything a sequence carries between forward calls: KV caches, conv and recurrent states.
class ModelState {
 public:
  virtual ~ModelState() = default;
  virtual int64_t n_past() const = 0;  // tokens already processed
  virtual void reset() = 0;            // back to the empty sequence
  // A snapshot: an independent copy that can be continued or restored from.
  virtual std::unique_ptr<ModelState> clone() const = 0;
  // Becomes a copy of `snapshot` (a state of the same model).
  virtual void restore(const ModelState& snapshot) = 0;
  virtual std::vector<StateTensor> tensors() const = 0;
  // Replaces the whole state with `tensors` (names and sizes as tensors() gives them for a
  // sequence of n_past tokens). Throws Error naming `where` and the tensor on any mismatch.
  virtual void assign(std::span<const StateTensor> tensors, int64_t n_past,
                      const std::string& where) = 0;

  // Whether the state can go back to any shorter prefix by cutting its KV caches (true when the
  // model has no recurrent layers). Otherwise it can go back only to a checkpoint.
  virtual bool can_truncate() const = 0;
  virtual StateCheckpoint checkpoint() const = 0;
  // Goes back to the first n tokens of the sequence: KV caches are cut to n rows, recurrent layers
  // take `at`, a checkpoint taken at n on this sequence while its first n tokens were the same as
  // now. `at` may be null only when can_truncate(). Throws Error on a mismatched checkpoint.
  virtual void rewind(int64_t n, const StateCheckpoint* at) = 0;
  // Makes room for a sequence of n_tokens in all: the KV caches then grow without reallocating,
  // so they hold exactly what the sequence needs (growing by doubling could take twice that).
  virtual void reserve(int64_t n_tokens) = 0;
  // Bytes the state holds now (KV caches, conv and recurrent states), reserved room included.
  virtual int64_t bytes() const = 0;
  // The sequence's positions where they are not its tokens' indices (M-RoPE, once an image is in
  // it): per token its temporal position, then per token the largest position of any axis up to
  // it; empty otherwise. assign_positions (after assign) takes what positions() gave.
  virtual std::vector<int32_t> positions() const { return {}; }
  virtual void assign_positions(std::span<const int32_t> positions, const std::string& where) {
    if (!positions.empty()) fail(where, "this model's sequences have no positions of their own");
  }
};

// An image a model has encoded, as a saved state carries it: its ids are first_id + r for its
// token r (a model's own numbering, so a state read elsewhere maps them to the reader's).
struct HeldImage {
  std::string key;  // sha256 of its pixel values and grid
  int32_t first_id = 0;
  int64_t grid_w = 0, tokens = 0;  // the merged grid's width, its tokens
  std::vector<float> features;     // [tokens, hidden]
};

// Which logits a forward pass returns: the last token's, or every token's; kEveryStep is every
// token's computed as decoding them one at a time would compute them, to the bit (the Gated
// DeltaNet rule in its recurrent form rather than the chunked one): what verifying a draft of
// several tokens in one pass needs for speculative decoding to be exact. kNoneStepwise returns no
// logits and leaves the state as kEveryStep would, to the bit: replaying accepted tokens after a
// rejected draft, where the lm_head's work would be thrown away. kNone returns no logits, only the
// final-norm rows (`hidden`, required): an embedding model's pass.
enum class LogitsFor { kLastToken, kEveryToken, kEveryStep, kNoneStepwise, kNone };

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // The CPU context its forward passes run on (they take turns there: Model::forward may be
  // called from several threads, for different states).
  virtual CpuContext& context() const = 0;
  // Identifies these weights (sha256 over the configuration, the tensor tables and samples of
  // every weight file), so that a saved state is never continued on another model.
  virtual const std::string& fingerprint() const = 0;
  virtual int64_t weights_bytes() const = 0;  // of the mapped weight files
  // Bytes one decoded token reads with `context` tokens before it: every matrix but the embedding
  // table (of which it reads a row), and the state (KV caches of `context` rows, conv and
  // recurrent states). Decode is bound by it: divided into the memory's read bandwidth, it
  // gives the tokens per second no kernel can pass.
  virtual int64_t decode_step_bytes(int64_t context) const = 0;
  virtual std::unique_ptr<ModelState> new_state() const = 0;
  // Processes `ids` at positions n_past(), n_past()+1, ... and appends them to `state`.
  // `logits` receives [1 or ids.size(), vocab_size] floats; `hidden`, if given, every row's
  // final-norm output (what the lm_head reads), [ids.size(), hidden_size]: the MTP head's input.
  // Throws Error on an id outside the vocabulary or a context longer than
  // max_position_embeddings.
  virtual void forward(std::span<const int32_t> ids, ModelState& state, LogitsFor which,
                       std::vector<float>& logits, std::vector<float>* hidden = nullptr) const = 0;

  // Qwen3.5's multi-token-prediction head (checkpoints with mtp.* weights), a drafter for
  // speculative decoding. Row r pairs hidden[r], the model's final-norm output at some position,
  // with ids[r], the token after that position; the head predicts the token after ids[r]. Its
  // own state (new_mtp_state(): a KV cache) gains one row per pair, at its positions n_past()...
  // `out` receives each row's output [rows, hidden_size] (the next step's hidden), `logits`, if
  // given, the last row's logits: over mtp_vocab()'s tokens, in its order, or over the whole
  // vocabulary when it is empty.
  // A checkpoint whose mtp.* tensors do not make a whole head (some missing, or of the wrong
  // shape or type) loads as a text model, as transformers runs it: has_mtp() is false and
  // mtp_unavailable() says why ("" when there is a head, or no mtp.* tensor at all).
  virtual bool has_mtp() const { return false; }
  virtual std::string mtp_unavailable() const { return ""; }
  virtual std::span<const int32_t> mtp_vocab() const { return {}; }
  virtual std::unique_ptr<ModelState> new_mtp_state() const { return nullptr; }
  virtual void mtp_forward(std::span<const float> hidden, std::span<const int32_t> ids,
                           ModelState& mtp_state, std::vector<float>& out,
                           std::vector<float>* logits) const {
    (void)hidden, (void)ids, (void)mtp_state, (void)out, (void)logits;
    fail("speculative", "this model has no MTP head (mtp.* weights)");
  }
  // Images (a Qwen3.5 checkpoint with its vision tower). image_ids encodes an image's pixels
  // (made with image_processor()) — or finds them encoded: the same pixels get the same ids —
  // and gives the ids that stand for its tokens in a sequence, one per token, at or above the
  // vocabulary, in the order the processor expands the image's <|image_pad|>: what forward()
  // then takes in that token's place, at M-RoPE positions (transformers' get_rope_index). A
  // sequence that holds an image runs on the CPU. vision_unavailable() says why a model reads no
  // images.
  virtual bool has_vision() const { return false; }
  virtual std::string vision_unavailable() const { return "the checkpoint has no vision tower"; }
  virtual const ImageProcessorConfig& image_processor() const {
    fail("image", vision_unavailable());
  }
  virtual std::vector<int32_t> image_ids(const PixelValues& pixels) const {
    (void)pixels;
    fail("image", vision_unavailable());
  }
  virtual bool is_image_id(int32_t id) const {
    (void)id;
    return false;
  }
  // The image image id `id` belongs to, for a saved state (throws Error when its features were
  // let go); adopt_image takes one such image and gives its first id in this model.
  virtual HeldImage held_image(int32_t id) const {
    (void)id;
    fail("image", vision_unavailable());
  }
  virtual int32_t adopt_image(const HeldImage& image) const {
    (void)image;
    fail("image", vision_unavailable());
  }
  // The tower's output for an image, [tokens, hidden], computed now and not kept (image_ids
  // keeps it): what `qhx bench --image` times.
  virtual std::vector<float> image_features(const PixelValues& pixels) const {
    (void)pixels;
    fail("image", vision_unavailable());
  }

  // Bytes of activations a forward call over n_tokens new tokens uses (its arenas, reserved from
  // its plan, and the logits): what memory admission counts per session for a prefill chunk.
  virtual int64_t activation_bytes(int64_t n_tokens) const = 0;

  // Devices (LoadOptions::devices): whether it has any, and whether forward passes use them.
  // set_devices_enabled(false) puts every later pass on the CPU alone: a device that failed its
  // check before use, or failed during a run. A pass that a device fails (Error kDeviceFailed)
  // is redone on the CPU from the state it started from, and the devices are disabled: callers
  // never see the failure, only device_failures().
  virtual bool has_devices() const { return false; }
  virtual bool devices_enabled() const { return false; }
  virtual void set_devices_enabled(bool) {}
  virtual int64_t device_failures() const { return 0; }
  // Why the devices were last disabled by a failure ("" if never).
  virtual std::string device_failure() const { return ""; }
  // Why the devices could not take the model as it loaded (no room for its weights): they stay
  // unused. Empty when they did.
  virtual std::string device_load_failure() const { return ""; }
  // Since load: the forward passes that ran partly on a device, and the activations they handed
  // between backends (the plans' copy nodes). Sequence states need no hand-off: they live in
  // memory every backend of the model reads (Backend::state_buffer_type).
  virtual DeviceTraffic device_traffic() const { return {}; }
  // The rows a device takes prompt work in multiples of (an NPU's static graphs), or 0: a
  // session cuts its prompt chunks to whole multiples so that the device takes them.
  virtual int64_t prompt_rows_multiple() const { return 0; }
};

struct LoadOptions {
  bool verify_sha256 = false;  // bundles: check every file's sha256 (sizes are always checked)
  bool check_target = true;    // bundles: refuse one built for another CPU
  // Where the model computes (models may share one; their forward passes then take turns).
  // Null: a context of its own, one thread, the kernels CpuKernels::from_environment() picks.
  std::shared_ptr<CpuContext> context = nullptr;
  // Backends besides the CPU that may run nodes of the model's plans (graph/schedule.h says
  // which): where a GPU or NPU backend plugs in.
  std::vector<std::shared_ptr<Backend>> devices = {};
  // The MTP head's draft vocabulary (io/draft_vocab.h: draft_vocab.json beside the weights):
  // its first mtp_vocab_size tokens, all of them when 0. kFullVocabulary, or no such file:
  // the head's logits cover every token.
  static constexpr int64_t kFullVocabulary = -1;
  int64_t mtp_vocab_size = 0;
  // How the KV caches hold keys and values (core/kv_layout.h): f32 is exact; f16, q8 and q4 hold
  // them in 2, ~1 and ~0.6 bytes an element, and their attention runs on the CPU.
  KvType kv_type = KvType::kF32;
};

// Opens a Hugging Face checkpoint directory (config.json + safetensors) or a qhx bundle
// (manifest.json + tensor files) of any supported family. Weights are mapped, not copied.
std::unique_ptr<Model> load_model(const std::filesystem::path& dir,
                                  const LoadOptions& options = {});

// A Hugging Face checkpoint the caller opened: the model's matrices point at its tensors' mapped
// data (TensorView::data), so what the caller sees of a matrix (forge's calibration) is named by
// the checkpoint's tensor names.
std::unique_ptr<Model> load_model(Checkpoint checkpoint, const LoadOptions& options = {});

}  // namespace qhx
