// The C API (include/qhx/qhx.h) over the C++ runtime: handles own the C++ objects, every entry
// point turns exceptions into a status and a per-thread message.
#include "qhx/qhx.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/devices.h"
#include "chat/chat_template.h"
#include "grammar/structured_output.h"
#include "io/bundle.h"
#include "io/pack.h"
#include "kernels/cpu_context.h"
#include "kernels/thread_pool.h"
#include "models/model.h"
#include "runtime/device_check.h"
#include "runtime/embedding.h"
#include "runtime/generation_config.h"
#include "runtime/memory.h"
#include "runtime/session.h"
#include "runtime/stop_strings.h"
#include "tokenizer/tokenizer.h"
#include "util/base64.h"
#include "util/error.h"
#include "util/image_pads.h"
#include "vision/image.h"
#include "vision/image_processor.h"

namespace fs = std::filesystem;

struct qhx_model {
  fs::path dir;
  std::string vision_note;  // qhx_model_info's
  std::string name, family;
  std::unique_ptr<qhx::Model> model;
  std::unique_ptr<qhx::Model> draft_model;  // speculative "draft"
  std::optional<qhx::Tokenizer> tokenizer;
  std::optional<qhx::ChatTemplate> chat_template;
  qhx::GenerationDefaults generation;
  std::vector<int32_t> eos_ids;
  std::unique_ptr<qhx::PrefixCache> prefix_cache;
  int64_t context_length = 0;
  int64_t memory_estimate = 0;
  int64_t device_weight_bytes = 0;  // the devices' copies of weights in the host's RAM
  std::string admission_note;
  std::string prefill_device = "cpu", decode_device = "cpu", device_note, model_note;
  // Made at the first structured reply: its tables cost a moment over a large vocabulary.
  std::once_flag structured_once;
  std::unique_ptr<qhx::StructuredOutput> structured;
  qhx::EmbeddingConfig embedding;  // its sentence-transformers files, if any
};

struct qhx_session {
  qhx_model* model = nullptr;
  std::unique_ptr<qhx::Session> session;
  std::atomic<bool> cancel{false};
  // The token the callback is being called for, with logprobs on; null outside such a call.
  const qhx::TokenLogprobs* logprobs = nullptr;
};

namespace {

thread_local std::string last_error;

qhx_status failed(qhx_status status, std::string message) {
  last_error = std::move(message);
  return status;
}

// Runs `body`; an exception becomes `status` (or what its kind says) and the message.
template <typename Body>
qhx_status guarded(qhx_status status, Body&& body) {
  try {
    body();
    return QHX_OK;
  } catch (const qhx::Error& e) {
    switch (e.kind()) {
      case qhx::ErrorKind::kContextFull:
        return failed(QHX_ERROR_CONTEXT_FULL, e.what());
      case qhx::ErrorKind::kOutOfMemory:
        return failed(QHX_ERROR_OUT_OF_MEMORY, e.what());
      case qhx::ErrorKind::kInvalidInput:
      case qhx::ErrorKind::kDeviceFailed:
        return failed(status, e.what());
    }
    return failed(status, e.what());
  } catch (const std::bad_alloc&) {
    return failed(QHX_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return failed(QHX_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  }
}

#define QHX_REQUIRE(pointer, function)                                              \
  do {                                                                              \
    if ((pointer) == nullptr) {                                                     \
      return failed(QHX_ERROR_INVALID_ARGUMENT, function ": " #pointer " is NULL"); \
    }                                                                               \
  } while (false)

// A buffer may be NULL only when its size is 0.
#define QHX_REQUIRE_BUFFER(pointer, size, function)                            \
  do {                                                                         \
    if ((pointer) == nullptr && (size) > 0) {                                  \
      return failed(QHX_ERROR_INVALID_ARGUMENT,                                \
                    function ": " #pointer " is NULL but " #size " is not 0"); \
    }                                                                          \
  } while (false)

const qhx::Tokenizer& tokenizer_of(const qhx_model* model) {
  if (!model->tokenizer) qhx::fail(model->dir.string(), "no tokenizer.json: text is unavailable");
  return *model->tokenizer;
}

char* copy_string(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, text.data(), text.size() + 1);
  return out;
}

qhx::SamplingParams sampling_params(const qhx_sampling& s) {
  if (s.n_logit_bias > 0 && (s.logit_bias_ids == nullptr || s.logit_bias_values == nullptr)) {
    qhx::fail("sampling: logit_bias", "ids or values are NULL");
  }
  qhx::SamplingParams p;
  p.greedy = s.greedy != 0;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.min_p = s.min_p;
  p.repetition_penalty = s.repetition_penalty;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  for (size_t i = 0; i < s.n_logit_bias; ++i) {
    p.logit_bias.emplace_back(s.logit_bias_ids[i], s.logit_bias_values[i]);
  }
  p.seed = s.seed;
  return p;
}

std::vector<std::string> stop_strings(const qhx_generate_options& o) {
  if (o.n_stop_strings > 0 && o.stop_strings == nullptr) {
    qhx::fail("generate options", "stop_strings is NULL");
  }
  std::vector<std::string> stops;
  for (size_t i = 0; i < o.n_stop_strings; ++i) {
    if (o.stop_strings[i] == nullptr) qhx::fail("generate options", "a stop string is NULL");
    stops.emplace_back(o.stop_strings[i]);
  }
  return stops;
}

qhx::SpeculativeOptions speculative_options(const qhx_model& model, const qhx_generate_options& o) {
  qhx::SpeculativeOptions s;
  if (o.speculative != nullptr) s.kind = qhx::parse_draft_kind(o.speculative, "speculative");
  s.draft_model = model.draft_model.get();
  if (s.kind == qhx::DraftKind::kModel && s.draft_model == nullptr) {
    qhx::fail("speculative", "'draft' needs a model opened with a draft_model");
  }
  if (s.kind == qhx::DraftKind::kMtp) qhx::require_mtp_head(*model.model);
  if (o.draft_max < 0 || o.draft_max > 32) {
    qhx::fail("draft_max", std::to_string(o.draft_max) + " is outside 0..32 (0: 4)");
  }
  if (o.draft_max > 0) s.draft_max = o.draft_max;
  return s;
}

const qhx::StructuredOutput& structured_output(const qhx_model& model) {
  const qhx::Tokenizer& tokenizer = tokenizer_of(&model);
  auto& m = const_cast<qhx_model&>(model);  // made once, then only read
  std::call_once(m.structured_once, [&] {
    m.structured =
        std::make_unique<qhx::StructuredOutput>(tokenizer, model.model->config().vocab_size,
                                                qhx::tool_call_style(tokenizer.chat_template()));
  });
  return *model.structured;
}

bool has_response_format(const qhx_generate_options& o) {
  return o.response_format != nullptr && o.response_format[0] != '\0';
}

// The turn's stop ids: the options' and, with stop_at_eos, the model's eos ids.
std::vector<int32_t> turn_stop_ids(const qhx_model& model, const qhx_generate_options& o) {
  std::set<int32_t> stops(o.stop_ids, o.stop_ids + o.n_stop_ids);
  if (o.stop_at_eos) stops.insert(model.eos_ids.begin(), model.eos_ids.end());
  return {stops.begin(), stops.end()};
}

// Everything generation refuses about its options, before any work (qhx_generate_options_check).
void check_generate_options(const qhx_model& model, const qhx_generate_options& o) {
  if (o.n_stop_ids > 0 && o.stop_ids == nullptr) qhx::fail("generate options", "stop_ids is NULL");
  qhx::check_sampling_params(sampling_params(o.sampling), model.model->config().vocab_size);
  const std::vector<std::string> stops = stop_strings(o);
  if (!model.tokenizer && !stops.empty()) {
    qhx::fail(model.dir.string(), "no tokenizer.json: stop strings need text");
  }
  qhx::StopStringMatcher{stops};  // refuses empty and invalid UTF-8 stop strings
  if (o.logprobs != 0 && o.logprobs != 1) qhx::fail("logprobs", "must be 0 or 1");
  if (o.top_logprobs < 0 || o.top_logprobs > 20) {
    qhx::fail("top_logprobs", std::to_string(o.top_logprobs) + " is outside 0..20");
  }
  speculative_options(model, o);
  if (has_response_format(o)) {  // compiled now (and cached), so a bad format fails up front
    structured_output(model).constraint(o.response_format, qhx::ReplyStart::kAnswer,
                                        turn_stop_ids(model, o));
  }
}

// The draft model for speculative "draft": same vocabulary and, where both have one, the same
// tokenizer (every token's bytes), computing in the model's context (their passes take turns).
std::unique_ptr<qhx::Model> open_draft_model(const char* path, const qhx_model& model,
                                             std::shared_ptr<qhx::CpuContext> context,
                                             bool verify_sha256) {
  fs::path dir(path);
  if (qhx::is_pack(dir)) dir = qhx::select_pack_bundle(dir);
  auto draft =
      qhx::load_model(dir, {.verify_sha256 = verify_sha256, .context = std::move(context)});
  const int64_t vocab = model.model->config().vocab_size;
  if (draft->config().vocab_size != vocab) {
    qhx::fail(dir.string() + ": vocab_size",
              "the draft model's " + std::to_string(draft->config().vocab_size) +
                  " tokens are not the model's " + std::to_string(vocab));
  }
  if (model.tokenizer && fs::exists(dir / "tokenizer.json")) {
    const qhx::Tokenizer theirs = qhx::Tokenizer::load(dir);
    const auto bytes_of = [](const qhx::Tokenizer& t, int32_t id) -> std::optional<std::string> {
      try {
        return t.token_bytes(id);
      } catch (const qhx::Error&) {
        return std::nullopt;  // an id the tokenizer leaves unassigned
      }
    };
    bool same = theirs.size() == model.tokenizer->size();
    for (int32_t id = 0; same && id < theirs.size(); ++id) {
      same = bytes_of(theirs, id) == bytes_of(*model.tokenizer, id);
    }
    if (!same) qhx::fail((dir / "tokenizer.json").string(), "not the model's tokenizer");
  }
  return draft;
}

qhx_status run_generation(qhx_session* session, std::span<const int32_t> tokens,
                          std::vector<int64_t> checkpoint_at, bool chat,
                          const qhx_generate_options* options, qhx_token_callback callback,
                          void* user_data, qhx_generate_result* result) {
  if (result != nullptr) *result = {};
  qhx_generate_options defaults;
  if (options == nullptr) {
    if (qhx_status s = qhx_generate_options_default(session->model, &defaults); s != QHX_OK) {
      return s;
    }
    options = &defaults;
  }
  session->cancel.store(false);
  const qhx_status status = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    check_generate_options(*session->model, *options);
    qhx::TurnOptions turn;
    turn.max_new_tokens = options->max_new_tokens;
    turn.sampling = sampling_params(options->sampling);
    turn.cancel = &session->cancel;
    turn.checkpoint_at = std::move(checkpoint_at);
    turn.speculative = speculative_options(*session->model, *options);
    turn.stop_ids = turn_stop_ids(*session->model, *options);
    const std::set<int32_t> stops(turn.stop_ids.begin(), turn.stop_ids.end());
    std::unique_ptr<qhx::GrammarConstraint> constraint;
    if (has_response_format(*options)) {
      const qhx::StructuredOutput& structured = structured_output(*session->model);
      qhx::ReplyStart start = qhx::ReplyStart::kAnswer;
      if (chat) {  // where the rendered prompt leaves the reply: in, before or past a <think>
        const size_t tail = std::min<size_t>(tokens.size(), 8);
        start = qhx::chat_reply_start(tokenizer_of(session->model).decode(tokens.last(tail)));
      }
      constraint = structured.constraint(options->response_format, start, turn.stop_ids);
      turn.constraint = constraint.get();
    }

    const qhx::Tokenizer* tokenizer =
        session->model->tokenizer ? &*session->model->tokenizer : nullptr;
    qhx::StopStringMatcher stop_text(stop_strings(*options));
    std::optional<qhx::StreamingDecoder> decoder;
    if (tokenizer != nullptr) decoder.emplace(*tokenizer);
    std::string text;
    // The text each token completes, with anything that could begin a stop string held back.
    const auto emit = [&](int32_t id, const std::string& piece) {
      const qhx::StopStringMatcher::Piece shown = stop_text.push(piece);
      text += shown.text;
      const bool go_on = callback == nullptr ||
                         callback(user_data, id, shown.text.c_str(), shown.text.size()) == 0;
      return go_on && !shown.stopped;
    };
    const int64_t failures_before = session->model->model->device_failures();
    const int64_t device_tokens_before = session->model->model->device_traffic().tokens;
    int64_t prompt_device_tokens = -1;  // set when the prompt is read: at the first token
    qhx::TokenLogprobs logprobs;
    if (options->logprobs != 0) {
      turn.top_logprobs = options->top_logprobs;
      turn.on_logprobs = [&](const qhx::TokenLogprobs& entry) { logprobs = entry; };
    }
    struct Reporting {  // the token's log-probabilities, readable during its callback only
      qhx_session* session;
      ~Reporting() { session->logprobs = nullptr; }
    } reporting{session};
    const qhx::TurnStats stats = session->session->generate(tokens, turn, [&](int32_t id) {
      if (options->logprobs != 0) session->logprobs = &logprobs;
      if (prompt_device_tokens < 0) {
        prompt_device_tokens =
            session->model->model->device_traffic().tokens - device_tokens_before;
      }
      // An eos or stop id adds no text of its own but ends what was held.
      const bool is_stop = stops.count(id) > 0;
      const std::string piece = !decoder ? "" : is_stop ? decoder->flush() : decoder->push(id);
      return emit(id, piece);
    });
    session->logprobs = nullptr;  // the text held to the end belongs to no token
    if (decoder && !stop_text.stopped()) {
      std::string rest = decoder->flush();  // "" after a stop id, which flushed it
      rest = stop_text.push(rest).text;
      if (!stop_text.stopped()) rest += stop_text.flush();
      if (!rest.empty()) {
        text += rest;
        if (callback != nullptr) callback(user_data, -1, rest.c_str(), rest.size());
      }
    }
    if (result != nullptr) {
      switch (stats.stop) {
        case qhx::StopReason::kStopId:
          result->stop_reason = QHX_STOP_EOS;
          break;
        case qhx::StopReason::kCallback:
          result->stop_reason = stop_text.stopped() ? QHX_STOP_STRING : QHX_STOP_CALLBACK;
          break;
        case qhx::StopReason::kCancelled:
          result->stop_reason = QHX_STOP_CANCELLED;
          break;
        default:
          result->stop_reason = QHX_STOP_LENGTH;
      }
      result->n_prompt = stats.n_prompt;
      result->n_reused = stats.n_reused;
      result->n_processed = stats.n_processed;
      result->n_generated = stats.n_generated;
      result->prefill_ms = stats.prefill_seconds * 1e3;
      result->ttft_ms = stats.ttft_seconds * 1e3;
      result->decode_ms = stats.decode_seconds * 1e3;
      result->device_failures = session->model->model->device_failures() - failures_before;
      result->device_tokens =
          prompt_device_tokens >= 0
              ? prompt_device_tokens
              : session->model->model->device_traffic().tokens - device_tokens_before;
      result->verify_passes = stats.verify_passes;
      result->drafted = stats.drafted;
      result->accepted = stats.accepted;
      result->constraint_ms = stats.constraint_seconds * 1e3;
      result->text = copy_string(text);
    }
  });
  return status;
}

}  // namespace

extern "C" {

const char* qhx_version(void) {
  return QHX_VERSION_STRING;
}

const char* qhx_last_error(void) {
  return last_error.c_str();
}

void qhx_string_free(char* text) {
  std::free(text);
}

void qhx_model_options_default(qhx_model_options* options) {
  if (options == nullptr) return;
  *options = {};
  options->max_sessions = 1;
  options->check_memory = 1;
}

qhx_status qhx_model_open(const char* path, const qhx_model_options* options, qhx_model** model) {
  QHX_REQUIRE(path, "qhx_model_open");
  QHX_REQUIRE(model, "qhx_model_open");
  *model = nullptr;
  qhx_model_options defaults;
  if (options == nullptr) {
    qhx_model_options_default(&defaults);
    options = &defaults;
  }
  if (options->n_threads < 0 || options->max_sessions < 1 || options->context_length < 0 ||
      options->prefix_cache_bytes < 0) {
    return failed(QHX_ERROR_INVALID_ARGUMENT,
                  "qhx_model_open: n_threads, context_length and prefix_cache_bytes must be >= 0, "
                  "max_sessions >= 1");
  }
  qhx::KvType kv_type = qhx::KvType::kF32;
  if (options->kv_type != nullptr) {
    const qhx_status parsed = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
      kv_type = qhx::parse_kv_type(options->kv_type, "qhx_model_open: kv_type");
    });
    if (parsed != QHX_OK) return parsed;
  }
  auto opened = std::make_unique<qhx_model>();
  const int64_t resident_before = qhx::resident_memory_bytes();
  int64_t tokenizer_bytes = 0;
  const qhx_status status = guarded(QHX_ERROR_MODEL, [&] {
    fs::path dir(path);
    if (qhx::is_pack(dir)) dir = qhx::select_pack_bundle(dir);
    opened->dir = dir;
    opened->name = fs::path(path).filename().string();
    if (opened->name.empty()) opened->name = fs::path(path).parent_path().filename().string();
    const int n_threads = options->n_threads > 0 ? options->n_threads : qhx::hardware_threads();
    std::vector<int32_t> bundle_stop_ids;
    if (qhx::is_bundle(dir)) {
      bundle_stop_ids =
          qhx::open_bundle_manifest(dir, {}).stop_ids;  // load_model verifies the files
    }
    qhx::DeviceChoice choice;
    if (options->device != nullptr) {
      choice.prefill = qhx::parse_device_name(options->device, "device");
    }
    if (options->decode_device != nullptr) {
      choice.decode = qhx::parse_device_name(options->decode_device, "decode_device");
    }
    if (options->qnn_lib != nullptr) choice.settings["qnn_lib"] = options->qnn_lib;
    if (options->npu_pack != nullptr) {
      if (choice.prefill.kind != "hexagon") {
        qhx::fail("npu_pack", "an NPU pack needs the NPU as the device (hexagon:vNN)");
      }
      choice.settings["npu_pack"] = options->npu_pack;
    }
    choice.settings["model"] = dir.string();
    qhx::DeviceCheckOptions check;
    if (options->device_check != nullptr) {
      const auto mode = qhx::parse_device_check_mode(options->device_check);
      if (!mode) {
        qhx::fail("device_check",
                  std::string(options->device_check) + " is not one of always, once, never");
      }
      check.mode = *mode;
    }
    qhx::OpenedDevices devices = qhx::open_devices(choice);
    const std::string device_name = qhx::devices_name(devices);
    opened->prefill_device = devices.prefill.text();
    opened->decode_device = devices.decode.text();
    opened->device_note = devices.note;
    // A context of the model's own: models opened with other thread counts compute side by side.
    const auto context =
        std::make_shared<qhx::CpuContext>(n_threads, qhx::CpuKernels::from_environment());
    opened->model = qhx::load_model(dir, {.verify_sha256 = options->verify_sha256 != 0,
                                          .context = context,
                                          .devices = devices.backends,
                                          .mtp_vocab_size = options->mtp_vocab_size,
                                          .kv_type = kv_type});
    if (const std::string why = opened->model->mtp_unavailable(); !why.empty()) {
      opened->model_note = dir.string() + ": " + why + "; it runs as a text model";
    }
    const qhx::ModelConfig& config = opened->model->config();
    opened->family = config.family == qhx::Family::kQwen3 ? "qwen3" : "qwen3_5";
    opened->generation = qhx::load_generation_config(dir, config);
    opened->embedding = qhx::read_embedding_config(dir);
    opened->vision_note = opened->model->has_vision() ? "" : opened->model->vision_unavailable();
    if (fs::exists(dir / "tokenizer.json")) {
      const int64_t before_tokenizer = qhx::resident_memory_bytes();
      opened->tokenizer = qhx::Tokenizer::load(dir);
      tokenizer_bytes = std::max<int64_t>(qhx::resident_memory_bytes() - before_tokenizer, 0);
      if (!opened->tokenizer->chat_template().empty()) {
        opened->chat_template =
            qhx::ChatTemplate::from_tokenizer(*opened->tokenizer, (dir / "chat_template").string());
      }
    }
    if (options->draft_model != nullptr) {
      opened->draft_model =
          open_draft_model(options->draft_model, *opened, context, options->verify_sha256 != 0);
    }
    opened->eos_ids =
        qhx::default_stop_ids(opened->generation, bundle_stop_ids,
                              opened->tokenizer ? opened->tokenizer->eos_id() : std::nullopt);
    // transformers takes such an id too; it never matches a generated token.
    for (const int32_t id : opened->eos_ids) {
      if (id < config.vocab_size) continue;
      opened->model_note += (opened->model_note.empty() ? dir.string() + ": " : "; ") +
                            std::string("eos token id ") + std::to_string(id) +
                            " is outside the vocabulary (" + std::to_string(config.vocab_size) +
                            " tokens): generation never stops on it";
    }
    if (opened->model->has_devices()) {
      check.weights = qhx::check_weights_for(dir, devices.backends);
      check.cache_dir = qhx::default_cache_dir();
      const qhx::DeviceCheckResult checked = qhx::check_devices(
          *opened->model, device_name, opened->tokenizer ? &*opened->tokenizer : nullptr, check);
      if (!checked.passed) opened->prefill_device = opened->decode_device = "cpu";
      const std::string weights = checked.passed ? qhx::describe_weight_memory(devices) : "";
      if (checked.passed) {
        opened->device_weight_bytes = qhx::weight_memory(devices).host_copied_bytes;
      }
      for (const std::string& part : {checked.summary, weights}) {
        if (!part.empty()) {
          opened->device_note += (opened->device_note.empty() ? "" : "; ") + part;
        }
      }
    }
  });
  if (status != QHX_OK) return status;
  // What the caller asked for, rather than the model files, is at fault from here on.
  const qhx_status admitted = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    const qhx::ModelConfig& config = opened->model->config();
    opened->context_length =
        options->context_length > 0 ? options->context_length : config.max_position_embeddings;
    if (options->check_memory) {
      qhx::MemoryRequest request;
      request.weights_bytes = opened->model->weights_bytes();
      if (opened->draft_model) request.weights_bytes += opened->draft_model->weights_bytes();
      request.weights_bytes += opened->device_weight_bytes;  // an NPU's graphs, a UMA GPU's copies
      request.sessions = options->max_sessions;
      request.kv_type = kv_type;
      request.prefix_cache_bytes = options->prefix_cache_bytes;
      request.resident_bytes = resident_before + tokenizer_bytes;
      request.activation_bytes =
          opened->model->activation_bytes(qhx::SessionOptions{}.prefill_chunk);
      opened->context_length =
          qhx::admit_context(config, request, options->context_length,
                             qhx::available_memory_bytes(), &opened->admission_note);
      request.context_length = opened->context_length;
      opened->memory_estimate = qhx::plan_memory(config, request).total();
    } else if (opened->context_length > config.max_position_embeddings) {
      qhx::fail("context_length", "exceeds the model's max_position_embeddings");
    }
    if (options->prefix_cache_bytes > 0) {
      opened->prefix_cache = std::make_unique<qhx::PrefixCache>(options->prefix_cache_bytes);
    }
  });
  if (admitted == QHX_OK) *model = opened.release();
  return admitted;
}

void qhx_model_close(qhx_model* model) {
  delete model;
}

qhx_status qhx_model_get_info(const qhx_model* model, qhx_model_info* info) {
  QHX_REQUIRE(model, "qhx_model_get_info");
  QHX_REQUIRE(info, "qhx_model_get_info");
  *info = {};
  info->name = model->name.c_str();
  info->family = model->family.c_str();
  info->vocab_size = model->model->config().vocab_size;
  info->context_length = model->context_length;
  info->memory_estimate = model->memory_estimate;
  info->admission_note = model->admission_note.c_str();
  info->eos_ids = model->eos_ids.data();
  info->n_eos_ids = model->eos_ids.size();
  info->has_chat_template = model->chat_template.has_value();
  info->n_threads = model->model->context().threads();
  // After a device failed, everything runs on the CPU.
  const bool on_cpu = model->model->has_devices() && !model->model->devices_enabled();
  info->prefill_device = on_cpu ? "cpu" : model->prefill_device.c_str();
  info->decode_device = on_cpu ? "cpu" : model->decode_device.c_str();
  info->device_note = model->device_note.c_str();
  info->model_note = model->model_note.c_str();
  info->embedding_size = model->model->config().hidden_size;
  info->pooling = model->embedding.pooling ? qhx::pooling_name(*model->embedding.pooling) : "";
  info->reads_images = model->model->has_vision() ? 1 : 0;
  info->vision_note = model->vision_note.c_str();
  return QHX_OK;
}

qhx_status qhx_tokenize(const qhx_model* model, const char* text, size_t text_len, int32_t* ids,
                        size_t capacity, size_t* n_ids) {
  QHX_REQUIRE(model, "qhx_tokenize");
  QHX_REQUIRE(n_ids, "qhx_tokenize");
  QHX_REQUIRE_BUFFER(text, text_len, "qhx_tokenize");
  QHX_REQUIRE_BUFFER(ids, capacity, "qhx_tokenize");
  std::vector<int32_t> encoded;
  const qhx_status status = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    encoded =
        tokenizer_of(model).encode(std::string_view(text == nullptr ? "" : text, text_len), "text");
  });
  if (status != QHX_OK) return status;
  *n_ids = encoded.size();
  if (encoded.size() > capacity) {
    return failed(QHX_ERROR_BUFFER_TOO_SMALL, "qhx_tokenize: " + std::to_string(encoded.size()) +
                                                  " ids do not fit in " + std::to_string(capacity));
  }
  std::copy(encoded.begin(), encoded.end(), ids);
  return QHX_OK;
}

namespace {

// The ids that stand for an image's tokens: preprocessed as the checkpoint's processor says and
// encoded by the tower (or found encoded).
std::vector<int32_t> ids_of_image(const qhx_model* model, const qhx::RgbImage& image,
                                  const std::string& name) {
  return model->model->image_ids(
      qhx::preprocess_image(image, model->model->image_processor(), name));
}

qhx_status image_tokens(const qhx_model* model, const std::function<qhx::RgbImage()>& read,
                        const std::string& name, int32_t* ids, size_t capacity, size_t* n_ids,
                        const char* function) {
  if (!model->model->has_vision()) {
    return failed(QHX_ERROR_MODEL, std::string(function) + ": " + model->dir.string() +
                                       " reads no images: " + model->model->vision_unavailable());
  }
  std::vector<int32_t> image;
  const qhx_status status =
      guarded(QHX_ERROR_INVALID_ARGUMENT, [&] { image = ids_of_image(model, read(), name); });
  if (status != QHX_OK) return status;
  *n_ids = image.size();
  if (image.size() > capacity) {
    return failed(QHX_ERROR_BUFFER_TOO_SMALL, std::string(function) + ": " +
                                                  std::to_string(image.size()) +
                                                  " ids do not fit in " + std::to_string(capacity));
  }
  std::copy(image.begin(), image.end(), ids);
  return QHX_OK;
}

}  // namespace

qhx_status qhx_image_tokens(const qhx_model* model, const void* bytes, size_t n_bytes,
                            const char* name, int32_t* ids, size_t capacity, size_t* n_ids) {
  QHX_REQUIRE(model, "qhx_image_tokens");
  QHX_REQUIRE(n_ids, "qhx_image_tokens");
  QHX_REQUIRE_BUFFER(ids, capacity, "qhx_image_tokens");
  QHX_REQUIRE_BUFFER(bytes, n_bytes, "qhx_image_tokens");
  const std::string where = name != nullptr ? name : "image";
  return image_tokens(
      model,
      [&] {
        return qhx::decode_image(
            std::span(static_cast<const std::byte*>(bytes), bytes == nullptr ? 0 : n_bytes), where);
      },
      where, ids, capacity, n_ids, "qhx_image_tokens");
}

qhx_status qhx_image_tokens_from_file(const qhx_model* model, const char* path, int32_t* ids,
                                      size_t capacity, size_t* n_ids) {
  QHX_REQUIRE(model, "qhx_image_tokens_from_file");
  QHX_REQUIRE(n_ids, "qhx_image_tokens_from_file");
  QHX_REQUIRE_BUFFER(ids, capacity, "qhx_image_tokens_from_file");
  QHX_REQUIRE(path, "qhx_image_tokens_from_file");
  return image_tokens(
      model, [&] { return qhx::read_image(path); }, path, ids, capacity, n_ids,
      "qhx_image_tokens_from_file");
}

namespace {

// A buffer-filling call's ending: the size always, the bytes when they fit (else
// QHX_ERROR_BUFFER_TOO_SMALL saying how many are needed).
qhx_status copy_bytes_out(const std::string& bytes, char* out, size_t capacity, size_t* size,
                          const char* function) {
  *size = bytes.size();
  if (bytes.size() > capacity) {
    return failed(QHX_ERROR_BUFFER_TOO_SMALL,
                  std::string(function) + ": " + std::to_string(bytes.size()) +
                      " bytes do not fit in " + std::to_string(capacity));
  }
  std::memcpy(out, bytes.data(), bytes.size());
  return QHX_OK;
}

}  // namespace

qhx_status qhx_token_bytes(const qhx_model* model, int32_t id, char* bytes, size_t capacity,
                           size_t* n_bytes) {
  QHX_REQUIRE(model, "qhx_token_bytes");
  QHX_REQUIRE(n_bytes, "qhx_token_bytes");
  QHX_REQUIRE_BUFFER(bytes, capacity, "qhx_token_bytes");
  std::string piece;
  const qhx_status status = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    const int64_t vocab = model->model->config().vocab_size;
    if (id < 0 || id >= vocab) {
      qhx::fail("qhx_token_bytes", "id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                       std::to_string(vocab) + ")");
    }
    const qhx::Tokenizer& tokenizer = tokenizer_of(model);
    if (id < tokenizer.size()) {
      try {
        piece = tokenizer.token_bytes(id);
      } catch (const qhx::Error&) {
        // a hole in the ids: no bytes
      }
    }
  });
  if (status != QHX_OK) return status;
  return copy_bytes_out(piece, bytes, capacity, n_bytes, "qhx_token_bytes");
}

qhx_status qhx_detokenize(const qhx_model* model, const int32_t* ids, size_t n_ids,
                          int32_t skip_special, char* text, size_t capacity, size_t* text_len) {
  QHX_REQUIRE(model, "qhx_detokenize");
  QHX_REQUIRE(text_len, "qhx_detokenize");
  QHX_REQUIRE_BUFFER(ids, n_ids, "qhx_detokenize");
  QHX_REQUIRE_BUFFER(text, capacity, "qhx_detokenize");
  std::string decoded;
  const qhx_status status = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    // Ids the model can produce but the tokenizer has no text for decode to nothing (as in
    // transformers); ids the model cannot produce are a caller's mistake.
    const int64_t vocab = model->model->config().vocab_size;
    for (size_t i = 0; i < n_ids; ++i) {
      if (ids[i] < 0 || ids[i] >= vocab) {
        qhx::fail("qhx_detokenize", "ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                        " is outside the vocabulary [0, " + std::to_string(vocab) +
                                        ")");
      }
    }
    decoded = tokenizer_of(model).decode(std::span<const int32_t>(ids, n_ids), skip_special != 0);
  });
  if (status != QHX_OK) return status;
  const qhx_status copied = copy_bytes_out(decoded, text, capacity, text_len, "qhx_detokenize");
  if (copied == QHX_OK && decoded.size() < capacity) text[decoded.size()] = '\0';
  return copied;
}

void qhx_template_options_default(qhx_template_options* options) {
  if (options == nullptr) return;
  options->add_generation_prompt = 1;
  options->enable_thinking = -1;
}

namespace {

// Renders a chat request: a malformed request is the caller's error, a failing template the
// template's.
qhx_status parse_chat(const qhx_model* model, const char* request_json,
                      const qhx_template_options* options, qhx::ChatTemplateInputs& inputs) {
  qhx_template_options defaults;
  if (options == nullptr) {
    qhx_template_options_default(&defaults);
    options = &defaults;
  }
  const qhx_status parsed = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    if (!model->chat_template) qhx::fail(model->dir.string(), "the tokenizer has no chat template");
    inputs = qhx::parse_chat_request(request_json, "chat request");
  });
  if (parsed != QHX_OK) return parsed;
  // The options, where they differ from their defaults, win over the request's kwargs.
  if (options->add_generation_prompt == 0) inputs.add_generation_prompt = false;
  if (options->enable_thinking >= 0) inputs.set_enable_thinking(options->enable_thinking != 0);
  return QHX_OK;
}

qhx_status render_inputs(const qhx_model* model, const qhx::ChatTemplateInputs& inputs,
                         std::string& text) {
  return guarded(QHX_ERROR_TEMPLATE, [&] { text = model->chat_template->render(inputs); });
}

qhx_status render_chat(const qhx_model* model, const char* request_json,
                       const qhx_template_options* options, std::string& text) {
  qhx::ChatTemplateInputs inputs;
  if (qhx_status s = parse_chat(model, request_json, options, inputs); s != QHX_OK) return s;
  return render_inputs(model, inputs, text);
}

// Whether a content part is an image, by the test Qwen3.5's template applies.
bool is_image_part(const nlohmann::ordered_json& part) {
  return part.is_object() && (part.contains("image") || part.contains("image_url") ||
                              part.value("type", "") == "image");
}

// An image part's picture: {"type": "image", "image"|"path"|"url": a file's path or a data: URL}
// (transformers' names) or OpenAI's {"type": "image_url", "image_url": {"url": a data: URL}}.
qhx::RgbImage read_image_part(const nlohmann::ordered_json& part, const std::string& where) {
  const nlohmann::ordered_json* source = nullptr;
  std::string field;
  for (const char* key : {"image_url", "image", "path", "url"}) {
    if (!part.contains(key)) continue;
    source = &part[key];
    field = where + "." + key;
    if (source->is_object() && source->contains("url")) {
      source = &(*source)["url"];
      field += ".url";
    }
    break;
  }
  if (source == nullptr || !source->is_string()) {
    qhx::fail(field.empty() ? where : field, "an image part needs a file path or a data: URL");
  }
  const std::string& text = source->get_ref<const std::string&>();
  const qhx::DataUrl data = qhx::decode_data_url(text);
  switch (data.status) {
    case qhx::DataUrl::kOk:
      return qhx::decode_image(data.bytes, field);
    case qhx::DataUrl::kNotBase64:
      qhx::fail(field, "must be a base64 data: URL (data:<type>;base64,...)");
    case qhx::DataUrl::kBadBase64:
      qhx::fail(field, "holds no valid base64");
    case qhx::DataUrl::kNotADataUrl:
      break;
  }
  if (text.find("://") != std::string::npos) {
    qhx::fail(field, "is a URL; qhx fetches nothing: give a file's path or a data: URL");
  }
  return qhx::read_image(text);
}

// The conversation as the model reads it: rendered, tokenized, and each image part's tokens (the
// tower's encoding) in place of the <|image_pad|> the template wrote for it.
qhx_status chat_prompt(const qhx_model* model, const char* request_json,
                       const qhx_template_options* options, std::vector<int32_t>& prompt) {
  qhx::ChatTemplateInputs inputs;
  if (qhx_status s = parse_chat(model, request_json, options, inputs); s != QHX_OK) return s;
  std::vector<std::vector<int32_t>> images;
  for (size_t i = 0; i < inputs.messages.size(); ++i) {
    // Looked up, not indexed: a message without content must reach the template without one.
    nlohmann::ordered_json& message = inputs.messages[i];
    const auto found = message.is_object() ? message.find("content") : message.end();
    if (!message.is_object() || found == message.end() || !found->is_array()) continue;
    nlohmann::ordered_json& content = *found;
    for (size_t j = 0; j < content.size(); ++j) {
      const std::string where =
          "messages[" + std::to_string(i) + "].content[" + std::to_string(j) + "]";
      const nlohmann::ordered_json& part = content[j];
      if (part.is_object() && (part.contains("video") || part.value("type", "") == "video")) {
        return failed(QHX_ERROR_INVALID_ARGUMENT,
                      where + ": a video; qhx reads images, not videos (send frames as images)");
      }
      if (!is_image_part(part)) continue;
      if (!model->model->has_vision()) {
        return failed(QHX_ERROR_MODEL,
                      where + " is an image; " + model->dir.string() +
                          " reads no images: " + model->model->vision_unavailable());
      }
      const qhx_status read = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
        images.push_back(ids_of_image(model, read_image_part(part, where), where));
      });
      if (read != QHX_OK) return read;
      content[j] = {{"type", "image"}};  // read: the template needs only to see an image
    }
  }
  std::string text;
  if (qhx_status s = render_inputs(model, inputs, text); s != QHX_OK) return s;
  return guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    const std::vector<int32_t> ids = tokenizer_of(model).encode(text, "rendered chat");
    // Without images the ids are the text's (a literal <|image_pad|> in it is its own token).
    prompt = images.empty() ? ids
                            : qhx::expand_image_pads(ids, model->model->config().image_token_id,
                                                     images, "chat request");
  });
}

}  // namespace

qhx_status qhx_apply_chat_template(const qhx_model* model, const char* request_json,
                                   const qhx_template_options* options, char** text) {
  QHX_REQUIRE(model, "qhx_apply_chat_template");
  QHX_REQUIRE(request_json, "qhx_apply_chat_template");
  QHX_REQUIRE(text, "qhx_apply_chat_template");
  *text = nullptr;
  std::string rendered;
  if (qhx_status s = render_chat(model, request_json, options, rendered); s != QHX_OK) return s;
  return guarded(QHX_ERROR_INTERNAL, [&] { *text = copy_string(rendered); });
}

qhx_status qhx_chat_tokens(const qhx_model* model, const char* request_json,
                           const qhx_template_options* options, int32_t* ids, size_t capacity,
                           size_t* n_ids) {
  QHX_REQUIRE(model, "qhx_chat_tokens");
  QHX_REQUIRE(request_json, "qhx_chat_tokens");
  QHX_REQUIRE(n_ids, "qhx_chat_tokens");
  QHX_REQUIRE_BUFFER(ids, capacity, "qhx_chat_tokens");
  std::vector<int32_t> prompt;
  if (qhx_status s = chat_prompt(model, request_json, options, prompt); s != QHX_OK) return s;
  *n_ids = prompt.size();
  if (prompt.size() > capacity) {
    return failed(QHX_ERROR_BUFFER_TOO_SMALL, "qhx_chat_tokens: " + std::to_string(prompt.size()) +
                                                  " ids do not fit in " + std::to_string(capacity));
  }
  std::copy(prompt.begin(), prompt.end(), ids);
  return QHX_OK;
}

qhx_status qhx_generate_options_default(const qhx_model* model, qhx_generate_options* options) {
  QHX_REQUIRE(model, "qhx_generate_options_default");
  QHX_REQUIRE(options, "qhx_generate_options_default");
  *options = {};
  const qhx::GenerationDefaults& g = model->generation;
  options->max_new_tokens = g.max_new_tokens.value_or(256);
  options->stop_at_eos = 1;
  qhx_sampling& s = options->sampling;
  s.greedy = g.sampling.greedy;
  s.temperature = g.sampling.temperature;
  s.top_k = static_cast<int32_t>(g.sampling.top_k);
  s.top_p = g.sampling.top_p;
  s.min_p = g.sampling.min_p;
  s.repetition_penalty = g.sampling.repetition_penalty;
  s.presence_penalty = g.sampling.presence_penalty;
  s.frequency_penalty = g.sampling.frequency_penalty;
  s.seed = g.sampling.seed;
  return QHX_OK;
}

qhx_status qhx_generate_options_check(const qhx_model* model, const qhx_generate_options* options) {
  QHX_REQUIRE(model, "qhx_generate_options_check");
  QHX_REQUIRE(options, "qhx_generate_options_check");
  return guarded(QHX_ERROR_INVALID_ARGUMENT, [&] { check_generate_options(*model, *options); });
}

void qhx_session_options_default(qhx_session_options* options) {
  if (options == nullptr) return;
  const qhx::SessionOptions defaults;
  options->context_length = 0;
  options->prefill_chunk = defaults.prefill_chunk;
  options->max_checkpoints = static_cast<int32_t>(defaults.max_checkpoints);
}

qhx_status qhx_session_create(qhx_model* model, const qhx_session_options* options,
                              qhx_session** session) {
  QHX_REQUIRE(model, "qhx_session_create");
  QHX_REQUIRE(session, "qhx_session_create");
  *session = nullptr;
  qhx_session_options defaults;
  if (options == nullptr) {
    qhx_session_options_default(&defaults);
    options = &defaults;
  }
  if (options->context_length > model->context_length) {
    return failed(QHX_ERROR_INVALID_ARGUMENT,
                  "qhx_session_create: context_length " + std::to_string(options->context_length) +
                      " exceeds the model's " + std::to_string(model->context_length));
  }
  auto created = std::make_unique<qhx_session>();
  created->model = model;
  const qhx_status status = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    qhx::SessionOptions o;
    o.context_length =
        options->context_length > 0 ? options->context_length : model->context_length;
    o.prefill_chunk = options->prefill_chunk;
    o.max_checkpoints = options->max_checkpoints;
    created->session = std::make_unique<qhx::Session>(*model->model, o, model->prefix_cache.get());
  });
  if (status == QHX_OK) *session = created.release();
  return status;
}

void qhx_session_destroy(qhx_session* session) {
  delete session;
}

qhx_status qhx_session_generate(qhx_session* session, const int32_t* tokens, size_t n_tokens,
                                const qhx_generate_options* options, qhx_token_callback callback,
                                void* user_data, qhx_generate_result* result) {
  QHX_REQUIRE(session, "qhx_session_generate");
  QHX_REQUIRE_BUFFER(tokens, n_tokens, "qhx_session_generate");
  return run_generation(session, std::span<const int32_t>(tokens, n_tokens), {}, false, options,
                        callback, user_data, result);
}

qhx_status qhx_session_chat(qhx_session* session, const char* request_json,
                            const qhx_template_options* template_options,
                            const qhx_generate_options* options, qhx_token_callback callback,
                            void* user_data, qhx_generate_result* result) {
  QHX_REQUIRE(session, "qhx_session_chat");
  QHX_REQUIRE(request_json, "qhx_session_chat");
  std::vector<int32_t> tokens;
  if (qhx_status s = chat_prompt(session->model, request_json, template_options, tokens);
      s != QHX_OK) {
    return s;
  }
  return qhx_session_chat_tokens(session, tokens.data(), tokens.size(), options, callback,
                                 user_data, result);
}

qhx_status qhx_session_chat_tokens(qhx_session* session, const int32_t* tokens, size_t n_tokens,
                                   const qhx_generate_options* options, qhx_token_callback callback,
                                   void* user_data, qhx_generate_result* result) {
  QHX_REQUIRE(session, "qhx_session_chat_tokens");
  QHX_REQUIRE_BUFFER(tokens, n_tokens, "qhx_session_chat_tokens");
  const std::span<const int32_t> prompt(tokens, n_tokens);
  // Chat templates re-render earlier replies, often differently from how the model saw them
  // (Qwen3 and Qwen3.5 drop their thinking): the next turn then differs right after this
  // reply's header, so a model with recurrent state needs a checkpoint at its start.
  std::vector<int64_t> checkpoint_at;
  if (session->model->tokenizer) {
    if (const auto header = session->model->tokenizer->token_to_id("<|im_start|>")) {
      const auto last = std::find(prompt.rbegin(), prompt.rend(), *header);
      if (last != prompt.rend()) checkpoint_at.push_back(prompt.rend() - last - 1);
    }
  }
  return run_generation(session, prompt, checkpoint_at, true, options, callback, user_data, result);
}

void qhx_session_cancel(qhx_session* session) {
  if (session != nullptr) session->cancel.store(true);
}

void qhx_embed_options_default(qhx_embed_options* options) {
  if (options == nullptr) return;
  *options = {};
  options->normalize = -1;
}

namespace {

// The options against the model: pooling, normalization and the cut (EmbedParams), the prompt.
struct EmbedRequest {
  qhx::EmbedParams params;
  std::string prompt;
};

EmbedRequest embed_request(const qhx_model& model, const qhx_embed_options& o) {
  const qhx::EmbeddingConfig& config = model.embedding;
  EmbedRequest r;
  if (o.pooling != nullptr) {
    r.params.pooling = qhx::parse_pooling(o.pooling, "pooling");
  } else if (config.pooling) {
    r.params.pooling = *config.pooling;
  } else {
    qhx::fail("pooling", model.dir.string() +
                             " is not an embedding checkpoint (no modules.json or "
                             "1_Pooling/config.json): say which pooling (last, mean, cls)");
  }
  if (o.normalize < -1 || o.normalize > 1) qhx::fail("normalize", "must be -1, 0 or 1");
  r.params.normalize =
      o.normalize == -1 ? (config.pooling ? config.normalize : true) : o.normalize == 1;
  qhx::check_dimensions(o.dimensions, model.model->config().hidden_size);
  r.params.dimensions = o.dimensions;
  if (o.prompt != nullptr && o.prompt_name != nullptr) {
    qhx::fail("prompt", "give prompt or prompt_name, not both");
  }
  if (o.prompt != nullptr) {
    r.prompt = o.prompt;
  } else if (o.prompt_name != nullptr) {
    r.prompt = config.prompt(o.prompt_name);
  } else if (!config.default_prompt_name.empty()) {
    r.prompt = config.prompt(config.default_prompt_name);
  }
  return r;
}

// The inputs as token ids, and how many of them were cut to the model's max_seq_length.
using EmbedInputs =
    std::function<std::vector<std::vector<int32_t>>(const EmbedRequest&, int64_t& truncated)>;

// Embeds each input of `inputs` into `out`, after the checks that need no work; `function` names
// the call in its messages.
qhx_status run_embedding(qhx_session* session, const char* function,
                         const qhx_embed_options* options, const EmbedInputs& inputs,
                         size_t n_inputs, float* out, size_t capacity, qhx_embed_result* result) {
  if (result != nullptr) *result = {};
  qhx_embed_options defaults;
  if (options == nullptr) {
    qhx_embed_options_default(&defaults);
    options = &defaults;
  }
  session->cancel.store(false);
  EmbedRequest request;
  int64_t dims = 0;
  qhx_status status = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    request = embed_request(*session->model, *options);
    dims =
        options->dimensions > 0 ? options->dimensions : session->model->model->config().hidden_size;
  });
  if (status != QHX_OK) return status;
  if (result != nullptr) result->dimensions = dims;
  if (n_inputs > SIZE_MAX / sizeof(float) / static_cast<size_t>(dims)) {
    return failed(QHX_ERROR_INVALID_ARGUMENT, std::string(function) + ": too many inputs");
  }
  const size_t needed = n_inputs * static_cast<size_t>(dims);
  if (needed > capacity) {
    return failed(QHX_ERROR_BUFFER_TOO_SMALL,
                  std::string(function) + ": " + std::to_string(n_inputs) + " vectors of " +
                      std::to_string(dims) + " floats do not fit in " + std::to_string(capacity));
  }
  const auto start = std::chrono::steady_clock::now();
  int64_t n_tokens = 0, truncated = 0;
  bool cancelled = false;
  status = guarded(QHX_ERROR_INVALID_ARGUMENT, [&] {
    const std::vector<std::vector<int32_t>> ids = inputs(request, truncated);
    // Every input fits, or none runs.
    const int64_t context = session->session->context_length();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (static_cast<int64_t>(ids[i].size()) > context) {
        qhx::fail("input[" + std::to_string(i) + "]: context",
                  std::to_string(ids[i].size()) + " tokens exceed the context length (" +
                      std::to_string(context) + ")",
                  qhx::ErrorKind::kContextFull);
      }
    }
    request.params.cancel = &session->cancel;
    for (size_t i = 0; i < ids.size() && !cancelled; ++i) {
      try {
        const std::optional<std::vector<float>> v = session->session->embed(ids[i], request.params);
        if (!v) {
          cancelled = true;
          break;
        }
        std::copy(v->begin(), v->end(), out + i * dims);
      } catch (const qhx::Error& e) {
        throw qhx::Error("input[" + std::to_string(i) + "]: " + e.what(), e.kind());
      }
      n_tokens += static_cast<int64_t>(ids[i].size());
    }
  });
  if (status != QHX_OK) return status;
  if (cancelled) return failed(QHX_ERROR_CANCELLED, std::string(function) + ": cancelled");
  if (result != nullptr) {
    result->n_tokens = n_tokens;
    result->n_truncated = truncated;
    result->ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  return QHX_OK;
}

}  // namespace

qhx_status qhx_embed(qhx_session* session, const char* const* texts, const size_t* text_lens,
                     size_t n_texts, const qhx_embed_options* options, float* embeddings,
                     size_t capacity, qhx_embed_result* result) {
  QHX_REQUIRE(session, "qhx_embed");
  QHX_REQUIRE_BUFFER(texts, n_texts, "qhx_embed");
  QHX_REQUIRE_BUFFER(embeddings, capacity, "qhx_embed");
  for (size_t i = 0; i < n_texts; ++i) {
    if (texts[i] == nullptr && (text_lens == nullptr || text_lens[i] > 0)) {
      return failed(QHX_ERROR_INVALID_ARGUMENT,
                    "qhx_embed: texts[" + std::to_string(i) + "] is NULL");
    }
  }
  const auto tokenize = [&](const EmbedRequest& request, int64_t& truncated) {
    const qhx::Tokenizer& tokenizer = tokenizer_of(session->model);
    const auto max_length = static_cast<size_t>(session->model->embedding.max_seq_length);
    std::vector<std::vector<int32_t>> ids(n_texts);
    for (size_t i = 0; i < n_texts; ++i) {
      const char* text = texts[i] == nullptr ? "" : texts[i];
      const size_t len = text_lens != nullptr ? text_lens[i] : std::strlen(text);
      bool cut = false;
      ids[i] = tokenizer.encode_with_special_tokens(request.prompt + std::string(text, len),
                                                    "input[" + std::to_string(i) + "]", max_length,
                                                    &cut);
      truncated += cut;
    }
    return ids;
  };
  return run_embedding(session, "qhx_embed", options, tokenize, n_texts, embeddings, capacity,
                       result);
}

qhx_status qhx_embed_tokens(qhx_session* session, const int32_t* ids, const size_t* offsets,
                            size_t n_inputs, const qhx_embed_options* options, float* embeddings,
                            size_t capacity, qhx_embed_result* result) {
  QHX_REQUIRE(session, "qhx_embed_tokens");
  QHX_REQUIRE(offsets, "qhx_embed_tokens");
  QHX_REQUIRE_BUFFER(ids, offsets[n_inputs], "qhx_embed_tokens");
  QHX_REQUIRE_BUFFER(embeddings, capacity, "qhx_embed_tokens");
  for (size_t i = 0; i < n_inputs; ++i) {
    if (offsets[i] > offsets[i + 1]) {
      return failed(QHX_ERROR_INVALID_ARGUMENT, "qhx_embed_tokens: offsets[" +
                                                    std::to_string(i + 1) + "] < offsets[" +
                                                    std::to_string(i) + "]");
    }
  }
  const auto split = [&](const EmbedRequest&, int64_t&) {
    std::vector<std::vector<int32_t>> inputs(n_inputs);
    for (size_t i = 0; i < n_inputs; ++i) inputs[i].assign(ids + offsets[i], ids + offsets[i + 1]);
    return inputs;
  };
  return run_embedding(session, "qhx_embed_tokens", options, split, n_inputs, embeddings, capacity,
                       result);
}

int64_t qhx_session_reusable(const qhx_session* session, const int32_t* tokens, size_t n_tokens) {
  if (session == nullptr || (tokens == nullptr && n_tokens > 0)) return 0;
  return session->session->reusable(std::span<const int32_t>(tokens, n_tokens));
}

qhx_status qhx_session_token_logprobs(const qhx_session* session, qhx_token_logprobs* out) {
  QHX_REQUIRE(session, "qhx_session_token_logprobs");
  QHX_REQUIRE(out, "qhx_session_token_logprobs");
  const qhx::TokenLogprobs* entry = session->logprobs;
  if (entry == nullptr) {
    return failed(QHX_ERROR_INVALID_ARGUMENT,
                  "qhx_session_token_logprobs: only during a token's callback, with logprobs = 1");
  }
  *out = {entry->token, entry->logprob, static_cast<int32_t>(entry->top_ids.size()),
          entry->top_ids.data(), entry->top_logprobs.data()};
  return QHX_OK;
}

qhx_status qhx_session_tokens(const qhx_session* session, const int32_t** tokens,
                              size_t* n_tokens) {
  QHX_REQUIRE(session, "qhx_session_tokens");
  QHX_REQUIRE(tokens, "qhx_session_tokens");
  QHX_REQUIRE(n_tokens, "qhx_session_tokens");
  const auto held = session->session->tokens();
  *tokens = held.data();
  *n_tokens = held.size();
  return QHX_OK;
}

qhx_status qhx_session_reset(qhx_session* session) {
  QHX_REQUIRE(session, "qhx_session_reset");
  session->session->reset();
  return QHX_OK;
}

qhx_status qhx_session_save(const qhx_session* session, const char* path) {
  QHX_REQUIRE(session, "qhx_session_save");
  QHX_REQUIRE(path, "qhx_session_save");
  return guarded(QHX_ERROR_STATE_FILE, [&] { session->session->save(path); });
}

qhx_status qhx_session_load(qhx_session* session, const char* path) {
  QHX_REQUIRE(session, "qhx_session_load");
  QHX_REQUIRE(path, "qhx_session_load");
  return guarded(QHX_ERROR_STATE_FILE, [&] { session->session->load(path); });
}

}  // extern "C"
