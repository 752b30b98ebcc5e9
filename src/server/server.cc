#include "server/server.h"

#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "server/chat_output.h"

namespace qhx::server {
namespace {

using Json = nlohmann::ordered_json;  // key order kept: templates render tools as sent
using Clock = std::chrono::steady_clock;

// How often a waiting HTTP thread checks that its client is still there.
constexpr auto kPollInterval = std::chrono::milliseconds(50);
// Request bodies nested deeper than this are refused before parsing (nested JSON is processed
// recursively further on: dump, templates).
constexpr int kMaxJsonDepth = 64;

// A request answered with OpenAI's error body.
struct ApiError {
  ApiError(int status_, std::string message_, std::string param_ = "", std::string code_ = "",
           std::string type_ = "invalid_request_error")
      : status(status_),
        message(std::move(message_)),
        param(std::move(param_)),
        code(std::move(code_)),
        type(std::move(type_)) {}
  int status;
  std::string message;
  std::string param;  // "" → null
  std::string code;   // "" → null
  std::string type;
};

ApiError wrong_type(const std::string& field, const char* expected) {
  return {400, "'" + field + "' must be " + expected, field, "invalid_type"};
}

ApiError bad_value(const std::string& field, const std::string& why) {
  return {400, "'" + field + "' " + why, field, "invalid_value"};
}

Json nullable(const std::string& s) {
  return s.empty() ? Json(nullptr) : Json(s);
}

// Generated text is valid UTF-8 by the C API's contract; should it not be, the answer still goes
// out (with U+FFFD) rather than the thread throwing while writing it.
std::string to_text(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", nullable(e.param)},
            {"code", nullable(e.code)}}}};
}

// A failed C API call as an HTTP error: what the request caused is 400, the rest is the server's.
ApiError api_failure(qhx_status status, const std::string& param) {
  std::string message = qhx_last_error();
  switch (status) {
    case QHX_ERROR_INVALID_ARGUMENT:
    case QHX_ERROR_TEMPLATE:
      return {400, message, param, "invalid_value"};
    case QHX_ERROR_CONTEXT_FULL:
      return {400, message, param, "context_length_exceeded"};
    case QHX_ERROR_OUT_OF_MEMORY:
      return {503, message, "", "out_of_memory", "server_error"};
    default:
      return {500, message, "", "", "server_error"};
  }
}

// The deepest nesting of arrays and objects in `text` (strings skipped), without parsing it.
int json_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

Json parse_body(const std::string& body) {
  if (json_depth(body) > kMaxJsonDepth) {
    throw ApiError{400, "request body is nested deeper than " + std::to_string(kMaxJsonDepth)};
  }
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) throw ApiError{400, "request body is not valid JSON"};
  if (!parsed.is_object()) throw ApiError{400, "request body must be a JSON object"};
  return parsed;
}

// A request field; absent and null are the same (OpenAI clients send explicit nulls).
const Json* field(const Json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number_field(const Json& body, const char* name, double lo, double hi) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) throw wrong_type(name, "a number");
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    throw bad_value(name, "must be between " + Json(lo).dump() + " and " + Json(hi).dump());
  }
  return x;
}

// Integers, also as floats with no fraction (10.0), within [lo, hi].
std::optional<int64_t> integer_field(const Json& body, const char* name, int64_t lo, int64_t hi) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  const auto out_of_range = [&] {
    return bad_value(name,
                     "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  };
  if (v->is_number_unsigned()) {
    const uint64_t x = v->get<uint64_t>();
    if (x > static_cast<uint64_t>(hi) || (lo > 0 && x < static_cast<uint64_t>(lo))) {
      throw out_of_range();
    }
    return static_cast<int64_t>(x);
  }
  if (v->is_number_integer()) {
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) throw out_of_range();
    return x;
  }
  if (v->is_number_float()) {
    const double x = v->get<double>();
    if (x != static_cast<double>(static_cast<int64_t>(x)) || x < static_cast<double>(lo) ||
        x > static_cast<double>(hi)) {
      throw out_of_range();
    }
    return static_cast<int64_t>(x);
  }
  throw wrong_type(name, "an integer");
}

std::optional<bool> bool_field(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) throw wrong_type(name, "true or false");
  return v->get<bool>();
}

// qhx_tokenize into a vector, growing the buffer when the first guess is short.
std::vector<int32_t> tokenize(const qhx_model* model, const std::string& text,
                              const std::string& param) {
  std::vector<int32_t> ids(text.size() + 16);
  size_t n = 0;
  qhx_status status = qhx_tokenize(model, text.data(), text.size(), ids.data(), ids.size(), &n);
  if (status == QHX_ERROR_BUFFER_TOO_SMALL) {
    ids.resize(n);
    status = qhx_tokenize(model, text.data(), text.size(), ids.data(), ids.size(), &n);
  }
  if (status != QHX_OK) throw api_failure(status, param);
  ids.resize(n);
  return ids;
}

const char* finish_reason(qhx_stop_reason reason) {
  return reason == QHX_STOP_LENGTH ? "length" : "stop";
}

double per_second(int64_t n, double ms) {
  return ms > 0 ? static_cast<double>(n) * 1e3 / ms : 0.0;
}

// The history as the chat templates expect it. OpenAI clients send back an assistant turn that
// called tools with `content: null` and the calls' arguments as JSON text; the templates test
// the content as a string and print arguments as an object (vLLM and llama.cpp convert alike).
Json template_messages(const Json& messages) {
  Json out = messages;
  for (Json& m : out) {
    if (m["role"] != "assistant") continue;
    if (m.contains("content") && m["content"].is_null()) m["content"] = "";
    if (!m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (Json& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
        continue;
      }
      Json& arguments = call["function"]["arguments"];
      if (!arguments.is_string()) continue;
      Json parsed = Json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object()) arguments = std::move(parsed);
    }
  }
  return out;
}

// A completion request, parsed and checked: the prompt as tokens and the C API's options. The
// options point into the vectors here, so it stays where it was made.
struct Completion {
  Completion() = default;
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;

  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  OutputFormat output;  // chat: how the answer's text is split
  std::vector<int32_t> prompt;
  qhx_generate_options options{};
  std::vector<int32_t> bias_ids;
  std::vector<float> bias_values;
  std::vector<std::string> stops;
  std::vector<const char*> stop_pointers;
};

// What a slot's generation hands back to the HTTP thread that waits for it.
struct Outcome {
  qhx_status status = QHX_OK;
  std::string error;
  qhx_generate_result result{};  // counts and timings; its text is moved into `text`
  std::string text;
  int slot = -1;
};

struct Slot;

// One request from admission to its answer. The HTTP thread and the slot's worker share it.
struct Job {
  Completion request;
  std::string id;
  int64_t created = 0;

  std::atomic<bool> abandoned{false};  // the client went away, or the server is stopping
  Slot* slot = nullptr;                // set by the scheduler (under its mutex)

  std::mutex mutex;  // guards the fields below
  std::condition_variable changed;
  std::string pending;  // streamed text not yet sent
  bool done = false;
  Outcome outcome;
};

struct Slot {
  int index = 0;
  qhx_session* session = nullptr;
  std::thread worker;
  std::condition_variable wake;  // under the scheduler's mutex
  std::shared_ptr<Job> job;      // assigned, under the scheduler's mutex
  uint64_t last_used = 0;

  // Cancelling is only sent while the slot's generation is in prefill: from the first token on,
  // the token callback stops it, which cannot leak a cancel into the slot's next request.
  std::mutex cancel_mutex;
  const Job* running = nullptr;
  bool in_prefill = false;
};

// Per-request log line, printed once when the request is over.
struct RequestLog {
  RequestLog(std::string method_, std::string path_)
      : method(std::move(method_)), path(std::move(path_)) {}
  std::string method, path;
  Clock::time_point start = Clock::now();
  int status = 0;
  std::shared_ptr<Job> job;

  std::string line() const {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    char buf[256];
    std::unique_lock<std::mutex> lock;
    if (job != nullptr) lock = std::unique_lock(job->mutex);
    if (job != nullptr && job->done) {
      const Outcome& o = job->outcome;
      std::snprintf(buf, sizeof buf,
                    "%s %s %d | prompt %lld (reused %lld) | completion %lld | slot %d | %.1f ms",
                    method.c_str(), path.c_str(), status, static_cast<long long>(o.result.n_prompt),
                    static_cast<long long>(o.result.n_reused),
                    static_cast<long long>(o.result.n_generated), o.slot, ms);
    } else {
      std::snprintf(buf, sizeof buf, "%s %s %d%s | %.1f ms", method.c_str(), path.c_str(), status,
                    job != nullptr ? " | client gone" : "", ms);
    }
    return buf;
  }
};

}  // namespace

struct Server::Impl {
  qhx_model* model = nullptr;
  ServerOptions options;
  std::string model_id;
  int64_t context_length = 0;
  int64_t vocab_size = 0;
  qhx_generate_options defaults{};
  int64_t started_at = 0;

  httplib::Server http;
  std::thread listener;

  std::mutex mutex;  // the scheduler: slots' assignments, the queue
  std::vector<std::unique_ptr<Slot>> slots;
  std::deque<std::shared_ptr<Job>> queue;
  uint64_t clock = 0;
  bool stopping = false;
  std::atomic<uint64_t> next_id{0};
  uint64_t id_salt = 0;
  std::mutex log_mutex;

  Impl(qhx_model* m, const ServerOptions& o);
  ~Impl();

  void routes();
  void log(const RequestLog& entry);

  // Scheduling.
  int submit(const std::shared_ptr<Job>& job);
  void dispatch();  // under `mutex`
  void work(Slot& slot);
  Outcome run(Slot& slot, Job& job);
  void abandon(const std::shared_ptr<Job>& job);
  void finish(Job& job, Outcome outcome);
  Json health();

  // Requests.
  void parse_completion(const Json& body, Completion& c) const;
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  bool stream_answer(Job& job, httplib::DataSink& sink);
  bool whole_answer(Job& job, httplib::DataSink& sink);
  Json answer(const Job& job) const;
  Json chunk(const Job& job, Json choice) const;
  Json usage(const Outcome& o) const;
  Json timings(const Outcome& o) const;
};

Server::Impl::Impl(qhx_model* m, const ServerOptions& o) : model(m), options(o) {
  if (options.parallel < 1) throw std::runtime_error("--parallel must be at least 1");
  if (options.queue < 0) throw std::runtime_error("--queue must be at least 0");
  qhx_model_info info{};
  if (qhx_model_get_info(model, &info) != QHX_OK) throw std::runtime_error(qhx_last_error());
  model_id = options.alias.empty() ? info.name : options.alias;
  context_length = info.context_length;
  vocab_size = info.vocab_size;
  if (qhx_generate_options_default(model, &defaults) != QHX_OK) {
    throw std::runtime_error(qhx_last_error());
  }
  started_at = static_cast<int64_t>(std::time(nullptr));
  std::random_device entropy;
  id_salt = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();

  qhx_session_options session_options;
  qhx_session_options_default(&session_options);
  for (int i = 0; i < options.parallel; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->index = i;
    if (qhx_session_create(model, &session_options, &slot->session) != QHX_OK) {
      const std::string message = qhx_last_error();
      for (auto& s : slots) qhx_session_destroy(s->session);
      throw std::runtime_error(message);
    }
    slots.push_back(std::move(slot));
  }
  for (auto& slot : slots) slot->worker = std::thread([this, s = slot.get()] { work(*s); });
  routes();
}

Server::Impl::~Impl() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  for (auto& slot : slots) slot->wake.notify_all();
  for (auto& slot : slots) {
    if (slot->worker.joinable()) slot->worker.join();
    qhx_session_destroy(slot->session);
  }
}

void Server::Impl::log(const RequestLog& entry) {
  if (!options.log) return;
  const std::string line = entry.line();
  std::lock_guard lock(log_mutex);
  std::fprintf(stderr, "%s\n", line.c_str());
}

// ---- Scheduling -------------------------------------------------------------------------------

// Admits a job: 0, or the HTTP status that refuses it (429: queue full, 503: stopping).
int Server::Impl::submit(const std::shared_ptr<Job>& job) {
  std::lock_guard lock(mutex);
  if (stopping) return 503;
  // The queue only holds jobs while no slot is idle (dispatch empties it otherwise).
  if (queue.size() >= static_cast<size_t>(options.queue) &&
      std::none_of(slots.begin(), slots.end(), [](const auto& s) { return s->job == nullptr; })) {
    return 429;
  }
  queue.push_back(job);
  dispatch();
  return 0;
}

// Hands queued jobs, oldest first, to idle slots: the one whose state reuses the most of the
// job's tokens, the least recently used of equals (it holds the conversation least likely to
// come back).
void Server::Impl::dispatch() {
  while (!queue.empty()) {
    Slot* best = nullptr;
    int64_t best_reuse = -1;
    const auto& tokens = queue.front()->request.prompt;
    for (auto& s : slots) {
      if (s->job != nullptr) continue;
      const int64_t reuse = qhx_session_reusable(s->session, tokens.data(), tokens.size());
      if (reuse > best_reuse || (reuse == best_reuse && s->last_used < best->last_used)) {
        best = s.get();
        best_reuse = reuse;
      }
    }
    if (best == nullptr) return;
    best->job = std::move(queue.front());
    queue.pop_front();
    best->job->slot = best;
    best->wake.notify_one();
  }
}

void Server::Impl::work(Slot& slot) {
  std::unique_lock lock(mutex);
  for (;;) {
    slot.wake.wait(lock, [&] { return stopping || slot.job != nullptr; });
    if (slot.job == nullptr) return;  // stopping
    const std::shared_ptr<Job> job = slot.job;
    lock.unlock();
    Outcome outcome = run(slot, *job);
    lock.lock();
    slot.job = nullptr;
    slot.last_used = ++clock;
    dispatch();
    // The slot is idle before the client hears the answer: its next request finds it free.
    lock.unlock();
    finish(*job, std::move(outcome));
    lock.lock();
  }
}

struct TokenSink {
  Slot* slot;
  Job* job;
  bool first = true;
};

int on_token(void* user_data, int32_t /*token*/, const char* text, size_t text_len) {
  auto& ctx = *static_cast<TokenSink*>(user_data);
  if (ctx.first) {
    std::lock_guard lock(ctx.slot->cancel_mutex);
    ctx.slot->in_prefill = false;
    ctx.first = false;
  }
  if (ctx.job->request.stream && text_len > 0) {
    std::lock_guard lock(ctx.job->mutex);
    ctx.job->pending.append(text, text_len);
    ctx.job->changed.notify_all();
  }
  return ctx.job->abandoned ? 1 : 0;
}

Outcome Server::Impl::run(Slot& slot, Job& job) {
  {
    std::lock_guard lock(slot.cancel_mutex);
    slot.running = &job;
    slot.in_prefill = true;
  }
  Outcome outcome;
  outcome.slot = slot.index;
  if (job.abandoned) {
    outcome.result.stop_reason = QHX_STOP_CANCELLED;
  } else {
    TokenSink sink{&slot, &job};
    const Completion& c = job.request;
    qhx_generate_result& result = outcome.result;
    const auto generate = c.chat ? qhx_session_chat_tokens : qhx_session_generate;
    outcome.status = generate(slot.session, c.prompt.data(), c.prompt.size(), &c.options, on_token,
                              &sink, &result);
    if (outcome.status != QHX_OK) outcome.error = qhx_last_error();
    if (result.text != nullptr) outcome.text = result.text;
    qhx_string_free(result.text);
    result.text = nullptr;
  }
  {
    std::lock_guard lock(slot.cancel_mutex);
    slot.running = nullptr;
    slot.in_prefill = false;
  }
  return outcome;
}

void Server::Impl::finish(Job& job, Outcome outcome) {
  std::lock_guard lock(job.mutex);
  job.outcome = std::move(outcome);
  job.done = true;
  job.changed.notify_all();
}

// The client is gone: a queued job leaves the queue; a running one stops at its next token or
// prefill chunk. Other slots are not touched.
void Server::Impl::abandon(const std::shared_ptr<Job>& job) {
  job->abandoned = true;
  Slot* slot = nullptr;
  {
    std::lock_guard lock(mutex);
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (*it == job) {
        queue.erase(it);
        return;
      }
    }
    slot = job->slot;
  }
  if (slot == nullptr) return;
  std::lock_guard lock(slot->cancel_mutex);
  if (slot->running == job.get() && slot->in_prefill) qhx_session_cancel(slot->session);
}

Json Server::Impl::health() {
  std::lock_guard lock(mutex);
  int busy = 0;
  Json slot_list = Json::array();
  for (const auto& s : slots) {
    busy += s->job != nullptr;
    slot_list.push_back({{"id", s->index}, {"state", s->job != nullptr ? "processing" : "idle"}});
  }
  return {{"status", "ok"},
          {"slots_idle", static_cast<int>(slots.size()) - busy},
          {"slots_processing", busy},
          {"queue_length", queue.size()},
          {"queue_max", options.queue},
          {"slots", slot_list}};
}

// ---- Requests ---------------------------------------------------------------------------------

void Server::Impl::parse_completion(const Json& body, Completion& c) const {
  if (const Json* m = field(body, "model")) {
    if (!m->is_string()) throw wrong_type("model", "a string");
    if (m->get<std::string>() != model_id) {
      throw ApiError{404,
                     "the model '" + m->get<std::string>() + "' does not exist (this server has '" +
                         model_id + "')",
                     "model", "model_not_found"};
    }
  }
  const auto n = integer_field(body, "n", INT64_MIN, INT64_MAX);
  if (n && *n != 1) throw bad_value("n", "must be 1 (one choice per request)");
  if (bool_field(body, "echo").value_or(false)) throw bad_value("echo", "is not supported");
  if (const Json* lp = field(body, "logprobs")) {
    if (!(lp->is_boolean() && !lp->get<bool>()) && !(lp->is_number() && lp->get<double>() == 0)) {
      throw bad_value("logprobs", "is not supported");
    }
  }

  if (c.chat) {
    const Json* messages = field(body, "messages");
    if (messages == nullptr) throw ApiError{400, "'messages' is required", "messages"};
    if (!messages->is_array() || messages->empty()) {
      throw wrong_type("messages", "a non-empty array of messages");
    }
    for (size_t i = 0; i < messages->size(); ++i) {
      const Json& m = (*messages)[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        throw wrong_type("messages[" + std::to_string(i) + "]", "an object with a string 'role'");
      }
    }
    Json request = {{"messages", template_messages(*messages)}};
    if (const Json* tools = field(body, "tools")) {
      if (!tools->is_array()) throw wrong_type("tools", "an array");
      request["tools"] = *tools;
      c.output.tool_calls = !tools->empty();
      c.output.tools = *tools;
    }
    // llama.cpp's field: "none" leaves <think> blocks in the content.
    if (const Json* format = field(body, "reasoning_format")) {
      if (!format->is_string()) throw wrong_type("reasoning_format", "a string");
      const std::string name = format->get<std::string>();
      if (name != "none" && name != "auto" && name != "deepseek") {
        throw bad_value("reasoning_format", "must be \"none\", \"auto\" or \"deepseek\"");
      }
      c.output.reasoning = name != "none";
    }
    qhx_template_options template_options;
    qhx_template_options_default(&template_options);
    if (const Json* kwargs = field(body, "chat_template_kwargs")) {
      // Passed to the template as apply_chat_template(**kwargs) would pass them.
      if (!kwargs->is_object()) throw wrong_type("chat_template_kwargs", "an object");
      bool_field(*kwargs, "enable_thinking");  // a 400 naming it unless absent or a bool
      request["chat_template_kwargs"] = *kwargs;
    }
    char* text = nullptr;
    const qhx_status status =
        qhx_apply_chat_template(model, request.dump().c_str(), &template_options, &text);
    if (status != QHX_OK) throw api_failure(status, "messages");
    const std::string rendered = text;
    qhx_string_free(text);
    c.output.think_open = prompt_opens_think(rendered);
    c.prompt = tokenize(model, rendered, "messages");
  } else {
    const Json* prompt = field(body, "prompt");
    if (prompt == nullptr) throw ApiError{400, "'prompt' is required", "prompt"};
    // A batch of one prompt is that prompt; larger batches are n > 1 in disguise.
    const Json* one = prompt;
    if (prompt->is_array() && prompt->size() == 1 &&
        ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
      one = &(*prompt)[0];
    }
    if (one->is_string()) {
      c.prompt = tokenize(model, one->get<std::string>(), "prompt");
    } else if (one->is_array()) {
      for (const Json& id : *one) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
          throw bad_value("prompt", "token ids must be integers from 0 to " +
                                        std::to_string(vocab_size - 1) +
                                        " (one prompt per request)");
        }
        c.prompt.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    } else {
      throw wrong_type("prompt", "a string or an array of token ids");
    }
  }
  const char* prompt_param = c.chat ? "messages" : "prompt";
  if (c.prompt.empty()) throw bad_value(prompt_param, "is empty");

  c.options = defaults;
  const int64_t room = context_length - static_cast<int64_t>(c.prompt.size());
  std::optional<int64_t> max_tokens = integer_field(body, "max_completion_tokens", 1, INT64_MAX);
  if (!max_tokens) max_tokens = integer_field(body, "max_tokens", 1, INT64_MAX);
  if (room < 1 || (max_tokens && *max_tokens > room)) {
    throw ApiError{400,
                   "the prompt is " + std::to_string(c.prompt.size()) + " tokens and " +
                       (max_tokens ? std::to_string(*max_tokens) : std::string("at least 1")) +
                       " more were asked for; the context holds " + std::to_string(context_length),
                   prompt_param, "context_length_exceeded"};
  }
  // Without a limit, a completion may run to the end of the context (as OpenAI's).
  c.options.max_new_tokens = max_tokens.value_or(room);

  qhx_sampling& s = c.options.sampling;
  const auto temperature = number_field(body, "temperature", 0, 100);
  const auto top_p = number_field(body, "top_p", 0, 1);
  const auto top_k = integer_field(body, "top_k", 0, INT32_MAX);
  const auto min_p = number_field(body, "min_p", 0, 1);
  if (top_p && *top_p == 0) throw bad_value("top_p", "must be above 0");
  // Asking for a sampling parameter asks for sampling; temperature 0 asks for greedy.
  if (temperature || top_p || top_k || min_p) s.greedy = 0;
  if (temperature) {
    s.greedy = *temperature == 0;
    if (*temperature > 0) s.temperature = static_cast<float>(*temperature);
  }
  if (top_p) s.top_p = static_cast<float>(*top_p);
  if (top_k) s.top_k = static_cast<int32_t>(*top_k);
  if (min_p) s.min_p = static_cast<float>(*min_p);
  if (const auto v = number_field(body, "presence_penalty", -2, 2)) {
    s.presence_penalty = static_cast<float>(*v);
  }
  if (const auto v = number_field(body, "frequency_penalty", -2, 2)) {
    s.frequency_penalty = static_cast<float>(*v);
  }
  if (const auto v = number_field(body, "repetition_penalty", 0, 10)) {
    if (*v == 0) throw bad_value("repetition_penalty", "must be above 0");
    s.repetition_penalty = static_cast<float>(*v);
  }
  // Any integer seeds; without one every request draws its own.
  if (const Json* seed = field(body, "seed")) {
    if (seed->is_number_unsigned()) {
      s.seed = seed->get<uint64_t>();
    } else if (seed->is_number_integer()) {
      s.seed = static_cast<uint64_t>(seed->get<int64_t>());
    } else {
      throw wrong_type("seed", "an integer");
    }
  } else {
    s.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }

  if (const Json* bias = field(body, "logit_bias")) {
    if (!bias->is_object()) throw wrong_type("logit_bias", "an object of token id → bias");
    for (const auto& [key, value] : bias->items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != key.size() || id < 0 || id >= vocab_size) {
        throw bad_value("logit_bias", "key '" + key + "' is not a token id");
      }
      if (!value.is_number() || value.get<double>() < -100 || value.get<double>() > 100) {
        throw bad_value("logit_bias", "values must be numbers from -100 to 100");
      }
      c.bias_ids.push_back(static_cast<int32_t>(id));
      c.bias_values.push_back(value.get<float>());
    }
  }
  s.logit_bias_ids = c.bias_ids.data();
  s.logit_bias_values = c.bias_values.data();
  s.n_logit_bias = c.bias_ids.size();

  if (const Json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      c.stops.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const Json& item : *stop) {
        if (!item.is_string()) throw wrong_type("stop", "a string or an array of strings");
        c.stops.push_back(item.get<std::string>());
      }
    } else {
      throw wrong_type("stop", "a string or an array of strings");
    }
    for (const std::string& text : c.stops) {
      if (text.empty()) throw bad_value("stop", "holds an empty string");
      c.stop_pointers.push_back(text.c_str());
    }
  }
  c.options.stop_strings = c.stop_pointers.data();
  c.options.n_stop_strings = c.stop_pointers.size();

  // vLLM's and llama.cpp's extension: go on past the model's end-of-sequence tokens.
  if (bool_field(body, "ignore_eos").value_or(false)) c.options.stop_at_eos = 0;
  c.stream = bool_field(body, "stream").value_or(false);
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw wrong_type("stream_options", "an object");
    c.include_usage = bool_field(*so, "include_usage").value_or(false);
  }
}

Json Server::Impl::usage(const Outcome& o) const {
  return {{"prompt_tokens", o.result.n_prompt},
          {"completion_tokens", o.result.n_generated},
          {"total_tokens", o.result.n_prompt + o.result.n_generated}};
}

// llama.cpp's names, so tools that read its timings read these.
Json Server::Impl::timings(const Outcome& o) const {
  return {{"cache_n", o.result.n_reused},
          {"prompt_n", o.result.n_processed},
          {"prompt_ms", o.result.prefill_ms},
          {"prompt_per_second", per_second(o.result.n_processed, o.result.prefill_ms)},
          {"predicted_n", o.result.n_generated},
          {"predicted_ms", o.result.decode_ms},
          {"predicted_per_second",
           per_second(std::max<int64_t>(o.result.n_generated - 1, 0), o.result.decode_ms)},
          {"ttft_ms", o.result.ttft_ms}};
}

Json Server::Impl::answer(const Job& job) const {
  const Outcome& o = job.outcome;
  Json choice = {
      {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason(o.result.stop_reason)}};
  if (job.request.chat) {
    const ChatOutput output = parse_chat_output(o.text, job.request.output);
    choice["message"] = assistant_message(output, job.id);
    choice["finish_reason"] =
        chat_finish_reason(o.result.stop_reason == QHX_STOP_LENGTH, output.tool_calls.size());
  } else {
    choice["text"] = o.text;
  }
  return {{"id", job.id},
          {"object", job.request.chat ? "chat.completion" : "text_completion"},
          {"created", job.created},
          {"model", model_id},
          {"choices", Json::array({choice})},
          {"usage", usage(o)},
          {"timings", timings(o)}};
}

Json Server::Impl::chunk(const Job& job, Json choice) const {
  Json c = {{"id", job.id},
            {"object", job.request.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", job.created},
            {"model", model_id},
            {"choices", choice.is_null() ? Json::array() : Json::array({std::move(choice)})}};
  if (job.request.include_usage) c["usage"] = nullptr;
  return c;
}

namespace {

bool send_event(httplib::DataSink& sink, const Json& data) {
  const std::string event = "data: " + to_text(data) + "\n\n";
  return sink.write(event.data(), event.size());
}

}  // namespace

// Server-sent events: a role delta first (chat), text deltas as tokens come (chat: split into
// reasoning, content and tool calls, each call once it closes), the finish reason, the usage when
// asked for, [DONE].
bool Server::Impl::stream_answer(Job& job, httplib::DataSink& sink) {
  const bool chat = job.request.chat;
  const auto delta = [&](Json d) {
    if (chat)
      return Json{
          {"index", 0}, {"delta", std::move(d)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    return Json{{"index", 0},
                {"text", d.value("content", "")},
                {"logprobs", nullptr},
                {"finish_reason", nullptr}};
  };
  if (chat && !send_event(sink, chunk(job, delta({{"role", "assistant"}, {"content", ""}})))) {
    return false;
  }
  OutputParser parser(job.request.output);
  size_t n_calls = 0;
  const auto send_deltas = [&](const std::vector<OutputDelta>& deltas) {
    for (const OutputDelta& d : deltas) {
      if (!send_event(sink, chunk(job, delta(delta_message(d, n_calls, job.id))))) return false;
      n_calls += d.kind == OutputDelta::Kind::kToolCall;
    }
    return true;
  };
  std::unique_lock lock(job.mutex);
  for (;;) {
    job.changed.wait_for(lock, kPollInterval, [&] { return job.done || !job.pending.empty(); });
    const std::string piece = std::move(job.pending);
    job.pending.clear();
    const bool done = job.done;
    lock.unlock();
    if (!piece.empty()) {
      if (chat ? !send_deltas(parser.push(piece))
               : !send_event(sink, chunk(job, delta({{"content", piece}})))) {
        return false;
      }
    } else if (!done && !sink.is_writable()) {
      return false;
    }
    if (done) break;
    lock.lock();
  }
  const Outcome& o = job.outcome;
  if (o.status != QHX_OK) {
    // The status line went out before the generation ran: the error travels as an event.
    ApiError e = api_failure(o.status, "");
    e.message = o.error;
    if (!send_event(sink, error_body(e))) return false;
  } else {
    if (chat && !send_deltas(parser.finish())) return false;
    Json last = delta(Json::object());
    last["finish_reason"] =
        chat ? chat_finish_reason(o.result.stop_reason == QHX_STOP_LENGTH, n_calls)
             : finish_reason(o.result.stop_reason);
    Json final_chunk = chunk(job, std::move(last));
    if (!send_event(sink, final_chunk)) return false;
    if (job.request.include_usage) {
      Json u = chunk(job, nullptr);
      u["usage"] = usage(o);
      u["timings"] = timings(o);
      if (!send_event(sink, u)) return false;
    }
  }
  static constexpr char kDone[] = "data: [DONE]\n\n";
  if (!sink.write(kDone, sizeof kDone - 1)) return false;
  sink.done();
  return true;
}

// One JSON object once the generation is over; meanwhile the client is watched so that one who
// hangs up frees the slot.
bool Server::Impl::whole_answer(Job& job, httplib::DataSink& sink) {
  std::unique_lock lock(job.mutex);
  while (!job.changed.wait_for(lock, kPollInterval, [&] { return job.done; })) {
    lock.unlock();
    if (!sink.is_writable()) return false;
    lock.lock();
  }
  lock.unlock();
  Json body;
  if (job.outcome.status != QHX_OK) {
    ApiError e = api_failure(job.outcome.status, "");
    e.message = job.outcome.error;
    body = error_body(e);
  } else {
    body = answer(job);
  }
  const std::string text = to_text(body);
  if (!sink.write(text.data(), text.size())) return false;
  sink.done();
  return true;
}

void Server::Impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto entry = std::make_shared<RequestLog>(req.method, req.path);
  try {
    const Json body = parse_body(req.body);
    auto job = std::make_shared<Job>();
    job->request.chat = chat;
    parse_completion(body, job->request);
    char id[40];
    std::snprintf(id, sizeof id, "%s-%016llx", chat ? "chatcmpl" : "cmpl",
                  static_cast<unsigned long long>(id_salt ^ (next_id++ * 0x9e3779b97f4a7c15ull)));
    job->id = id;
    job->created = static_cast<int64_t>(std::time(nullptr));
    if (const int refused = submit(job); refused == 429) {
      res.set_header("Retry-After", "1");
      throw ApiError{429, "every slot is busy and the queue is full; retry later", "",
                     "rate_limit_exceeded", "rate_limit_error"};
    } else if (refused != 0) {
      throw ApiError{refused, "the server is shutting down", "", "", "server_error"};
    }
    entry->job = job;
    entry->status = 200;
    // The answer is written by a content provider: only there can the server see the client
    // hang up, and so stop its generation.
    const bool stream = job->request.stream;
    res.set_chunked_content_provider(
        stream ? "text/event-stream" : "application/json",
        [this, job, stream](size_t, httplib::DataSink& sink) {
          return stream ? stream_answer(*job, sink) : whole_answer(*job, sink);
        },
        [this, job, entry](bool /*success*/) {
          bool done;
          {
            std::lock_guard lock(job->mutex);
            done = job->done;
          }
          if (!done) abandon(job);
          log(*entry);
        });
    if (stream) res.set_header("Cache-Control", "no-cache");
  } catch (const ApiError& e) {
    res.status = e.status;
    res.set_content(to_text(error_body(e)), "application/json");
    entry->status = e.status;
    log(*entry);
  }
}

void Server::Impl::routes() {
  http.new_task_queue = [n = options.parallel + options.queue + 8] {
    // Slots + queue hold a thread each while they wait; the rest answer health checks and 429s.
    return new httplib::ThreadPool(static_cast<size_t>(n));
  };
  http.set_payload_max_length(options.max_request_bytes);
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(health().dump(), "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const Json entry = {{"id", model_id},
                        {"object", "model"},
                        {"created", started_at},
                        {"owned_by", "qhx"},
                        {"context_length", context_length}};
    const Json models = {{"object", "list"}, {"data", Json::array({entry})}};
    res.set_content(to_text(models), "application/json");
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, true);
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, false);
  });
  // httplib's own refusals (unknown path, body too large) get an OpenAI error body too.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e{res.status, "", "", "", "invalid_request_error"};
    if (res.status == 413) {
      e.message = "request body is over " + std::to_string(options.max_request_bytes) + " bytes";
      e.code = "request_too_large";
    } else if (res.status == 404) {
      e.message = "no such endpoint: " + req.method + " " + req.path;
      e.code = "not_found";
    } else {
      e.message = "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path;
    }
    res.set_content(to_text(error_body(e)), "application/json");
    RequestLog entry{req.method, req.path};
    entry.status = res.status;
    log(entry);
  });
  http.set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        ApiError e{500, "internal error", "", "", "server_error"};
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          e.message = ex.what();
        } catch (...) {
        }
        res.status = 500;
        res.set_content(to_text(error_body(e)), "application/json");
        RequestLog entry{req.method, req.path};
        entry.status = 500;
        log(entry);
      });
}

Server::Server(qhx_model* model, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {}

Server::~Server() {
  stop();
  wait();
}

int Server::start() {
  signal(SIGPIPE, SIG_IGN);
  Impl& s = *impl_;
  int port = s.options.port;
  if (port == 0) {
    port = s.http.bind_to_any_port(s.options.host);
    if (port < 0) throw std::runtime_error("cannot bind " + s.options.host + " to a free port");
  } else if (!s.http.bind_to_port(s.options.host, port)) {
    throw std::runtime_error("cannot bind " + s.options.host + ":" + std::to_string(port));
  }
  s.listener = std::thread([&s] { s.http.listen_after_bind(); });
  // stop() is only heard once the listener runs.
  while (!s.http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return port;
}

void Server::wait() {
  if (impl_->listener.joinable()) impl_->listener.join();
}

void Server::stop() {
  Impl& s = *impl_;
  std::vector<std::shared_ptr<Job>> ended;
  {
    std::lock_guard lock(s.mutex);
    if (s.stopping) return;
    s.stopping = true;
    ended.assign(s.queue.begin(), s.queue.end());
    s.queue.clear();
    for (auto& slot : s.slots) {
      if (slot->job != nullptr) ended.push_back(slot->job);
    }
  }
  for (auto& slot : s.slots) slot->wake.notify_all();
  for (const auto& job : ended) {
    job->abandoned = true;
    if (job->slot == nullptr) {
      Outcome outcome;
      outcome.status = QHX_ERROR_INTERNAL;
      outcome.error = "the server is shutting down";
      s.finish(*job, std::move(outcome));
    } else {
      std::lock_guard lock(job->slot->cancel_mutex);
      if (job->slot->running == job.get() && job->slot->in_prefill) {
        qhx_session_cancel(job->slot->session);
      }
    }
  }
  s.http.stop();
}

}  // namespace qhx::server
