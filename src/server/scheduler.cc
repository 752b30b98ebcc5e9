// From a request's body to its outcome: preparers parse and tokenize it, the queue admits it or
// refuses it (429, 503), idle slots take it (the one whose state reuses most of its prompt), and
// a slot's worker generates, streaming tokens as events, then leaves the answer for the event loop.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "server/server_impl.h"

namespace qhx::server {
namespace {

ApiError shutting_down() {
  return {503, "the server is shutting down", "", "server_shutdown", "server_error"};
}

}  // namespace

// ---- Preparing requests -----------------------------------------------------------------------

void Server::Impl::prepare_loop() {
  for (;;) {
    std::shared_ptr<Exchange> x;
    {
      std::unique_lock lock(prepare_mutex);
      prepare_wake.wait(lock, [&] { return preparers_stop || !to_prepare.empty(); });
      if (to_prepare.empty()) return;
      x = std::move(to_prepare.front());
      to_prepare.pop_front();
    }
    prepare(x);
  }
}

// Parses, checks and tokenizes a request, then queues it for a slot. For a completion, everything
// the C API would refuse is refused here, so a 200 is only ever followed by an answer (or, in a
// stream that already began, an error event); an embeddings request (never streamed) is checked
// here for its shape, and by the C API for the model's options before any input runs.
void Server::Impl::prepare(const std::shared_ptr<Exchange>& x) {
  std::optional<ApiError> error;
  try {
    const Json body = parse_body(x->body);
    std::string().swap(x->body);
    const char* kind = "cmpl";
    if (x->path == "/v1/embeddings") {
      rules.parse_embeddings(body, x->embeddings);
      kind = "embd";
    } else {
      x->request.chat = x->path == "/v1/chat/completions";
      rules.parse_completion(body, x->request);
      if (x->request.chat) kind = "chatcmpl";
    }
    char id[40];
    std::snprintf(id, sizeof id, "%s-%016llx", kind,
                  static_cast<unsigned long long>(id_salt ^ (next_id++ * 0x9e3779b97f4a7c15ull)));
    x->id = id;
    x->created = static_cast<int64_t>(std::time(nullptr));
    if (x->request.stream && x->request.chat) x->parser.emplace(x->request.output);
    error = submit(x);
  } catch (const ApiError& e) {
    error = e;
  } catch (const std::exception& e) {
    error = ApiError{500, std::string("internal error: ") + e.what(), "", "", "server_error"};
    error->from_library = true;  // it may name the server's files
  }
  if (error) {
    std::lock_guard lock(x->mutex);
    x->done = true;
    x->reply = error_reply(*error);
    wake(*x);
  }
}

// ---- Scheduling -------------------------------------------------------------------------------

// Why a request would not be queued now (429: queue full, 503: stopping), under `mutex`.
std::optional<ApiError> Server::Impl::refused_now() const {
  if (stopping) return shutting_down();
  // The queue only holds requests while no slot is idle (dispatch empties it otherwise).
  if (queue.size() >= static_cast<size_t>(options.queue) &&
      std::none_of(slots.begin(), slots.end(),
                   [](const auto& s) { return s->exchange == nullptr; })) {
    ApiError e{429, "every slot is busy and the queue is full; retry later", "",
               "rate_limit_exceeded", "rate_limit_error"};
    e.headers.emplace_back("Retry-After", "1");
    return e;
  }
  return std::nullopt;
}

std::optional<ApiError> Server::Impl::admission_refusal() {
  std::lock_guard lock(mutex);
  return refused_now();
}

// Admits a request to the queue, or says why not.
std::optional<ApiError> Server::Impl::submit(const std::shared_ptr<Exchange>& x) {
  std::lock_guard lock(mutex);
  if (std::optional<ApiError> refused = refused_now()) return refused;
  if (x->abandoned) return ApiError{499, "the client left", "", "", "server_error"};
  queue.push_back(x);
  dispatch();
  return std::nullopt;
}

// Hands queued requests, oldest first, to idle slots: the one whose state reuses the most of the
// request's tokens, the least recently used of equals (it holds the conversation least likely to
// come back).
void Server::Impl::dispatch() {
  while (!queue.empty()) {
    Slot* best = nullptr;
    int64_t best_reuse = -1;
    const auto& tokens = queue.front()->request.prompt;
    for (auto& s : slots) {
      if (s->exchange != nullptr) continue;
      const int64_t reuse = qhx_session_reusable(s->session, tokens.data(), tokens.size());
      if (reuse > best_reuse || (reuse == best_reuse && s->last_used < best->last_used)) {
        best = s.get();
        best_reuse = reuse;
      }
    }
    if (best == nullptr) return;
    best->exchange = std::move(queue.front());
    queue.pop_front();
    best->exchange->slot = best;
    best->wake.notify_one();
  }
}

void Server::Impl::work(Slot& slot) {
  std::unique_lock lock(mutex);
  for (;;) {
    slot.wake.wait(lock, [&] { return stopping || slot.exchange != nullptr; });
    if (slot.exchange == nullptr) return;  // stopping
    const std::shared_ptr<Exchange> x = slot.exchange;
    lock.unlock();
    Outcome outcome = run(slot, *x);
    lock.lock();
    slot.exchange = nullptr;
    slot.last_used = ++clock;
    dispatch();
    // The slot is idle before the client hears the answer: its next request finds it free.
    lock.unlock();
    finish(*x, std::move(outcome));
    lock.lock();
  }
}

namespace {

struct TokenSink {
  Server::Impl* server;
  Slot* slot;
  Exchange* exchange;
  bool first = true;
};

int token_callback(void* user_data, int32_t token, const char* text, size_t text_len) {
  auto& sink = *static_cast<TokenSink*>(user_data);
  try {
    sink.server->add_logprobs(*sink.exchange, sink.slot->session, token);
  } catch (const std::exception&) {
    return 1;  // nothing may be thrown through the C API's frames
  }
  if (sink.first) {
    std::lock_guard lock(sink.slot->cancel_mutex);
    sink.slot->in_prefill = false;
    sink.first = false;
  }
  if (sink.exchange->request.stream) {
    // Nothing may be thrown through the C API's frames: a failure here ends the generation.
    try {
      sink.server->on_token(*sink.exchange, text, text_len);
    } catch (const std::exception&) {
      return 1;
    }
  }
  return sink.exchange->abandoned ? 1 : 0;
}

}  // namespace

Outcome Server::Impl::run(Slot& slot, Exchange& x) {
  {
    std::lock_guard lock(slot.cancel_mutex);
    slot.running = &x;
    slot.in_prefill = true;
  }
  Outcome outcome;
  outcome.slot = slot.index;
  if (x.abandoned) {
    outcome.result.stop_reason = QHX_STOP_CANCELLED;
  } else if (x.embeddings.requested) {
    // One input per call, the request's state checked between them: a cancel sent while a call
    // starts could be cleared by it, and an embeddings call has no token callback to notice.
    const Embeddings& e = x.embeddings;
    const size_t dims =
        static_cast<size_t>(e.options.dimensions > 0 ? e.options.dimensions : rules.embedding_size);
    outcome.vectors.resize(e.inputs() * dims);
    outcome.embedded.dimensions = static_cast<int64_t>(dims);
    for (size_t i = 0; i < e.inputs() && outcome.status == QHX_OK; ++i) {
      if (x.abandoned) {
        outcome.status = QHX_ERROR_CANCELLED;
        break;
      }
      qhx_embed_result one{};
      float* out = outcome.vectors.data() + i * dims;
      if (e.texts.empty()) {
        const size_t offsets[] = {0, e.offsets[i + 1] - e.offsets[i]};
        outcome.status = qhx_embed_tokens(slot.session, e.ids.data() + e.offsets[i], offsets, 1,
                                          &e.options, out, dims, &one);
      } else {
        const char* text = e.texts[i].data();
        const size_t len = e.texts[i].size();
        outcome.status = qhx_embed(slot.session, &text, &len, 1, &e.options, out, dims, &one);
      }
      if (outcome.status != QHX_OK) {
        // The call's one input is the request's i-th.
        outcome.error = qhx_last_error();
        const std::string one_input = "input[0]: ";
        if (outcome.error.starts_with(one_input)) {
          outcome.error.replace(0, one_input.size(), "input[" + std::to_string(i) + "]: ");
        }
      }
      outcome.embedded.n_tokens += one.n_tokens;
      outcome.embedded.ms += one.ms;
    }
  } else {
    TokenSink sink{this, &slot, &x};
    const Completion& c = x.request;
    qhx_generate_result& result = outcome.result;
    const auto generate = c.chat ? qhx_session_chat_tokens : qhx_session_generate;
    outcome.status = generate(slot.session, c.prompt.data(), c.prompt.size(), &c.options,
                              token_callback, &sink, &result);
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

// A stream's first token begins it (so an error before it can still be an HTTP status): the role
// delta, then the token's text, split by the chat parser.
void Server::Impl::on_token(Exchange& x, const char* text, size_t n) {
  std::lock_guard lock(x.mutex);
  if (x.client_gone) return;
  if (!x.stream_started) {
    x.stream_started = true;
    if (x.request.chat) add_event(x, chunk(x, delta(x, {{"role", "assistant"}, {"content", ""}})));
  }
  if (n > 0) {
    if (x.request.chat) {
      add_deltas(x, x.parser->push(std::string_view(text, n)));
    } else {
      Json choice = delta(x, {{"content", std::string(text, n)}});
      if (x.logprobs_sent < x.logprobs.size()) choice["logprobs"] = pending_logprobs(x);
      add_event(x, chunk(x, std::move(choice)));
    }
  }
  wake(x);
}

// The generation is over: the answer (or the error) for the event loop to send.
void Server::Impl::finish(Exchange& x, Outcome outcome) {
  std::lock_guard lock(x.mutex);
  x.done = true;
  x.outcome = std::move(outcome);
  const Outcome& o = x.outcome;
  std::optional<ApiError> error;
  if (x.shutdown) {
    error = shutting_down();
  } else if (o.status != QHX_OK) {
    error = api_failure(o.status, "", o.error);
  }
  if (x.client_gone) {
    // Nobody to answer.
  } else if (!x.request.stream || (!x.stream_started && error)) {
    x.reply = error                    ? error_reply(*error)
              : x.embeddings.requested ? Reply{200, to_text(embeddings_answer(x)), {}, ""}
                                       : Reply{200, to_text(answer(x)), {}, ""};
  } else {
    if (!x.stream_started) {
      x.stream_started = true;
      if (x.request.chat) {
        add_event(x, chunk(x, delta(x, {{"role", "assistant"}, {"content", ""}})));
      }
    }
    if (error) {
      // The status went out with the first token: the error travels as an event, which the
      // openai client raises.
      add_event(x, error_body(*error));
      x.note = error->message;
    } else {
      if (x.request.chat) add_deltas(x, x.parser->finish());
      Json last = delta(x, Json::object());
      if (x.logprobs_sent < x.logprobs.size()) last["logprobs"] = pending_logprobs(x);
      last["finish_reason"] =
          x.request.chat ? chat_finish_reason(o.result.stop_reason == QHX_STOP_LENGTH, x.n_calls)
                         : finish_reason(o.result.stop_reason);
      add_event(x, chunk(x, std::move(last)));
      if (x.request.include_usage) {
        Json u = chunk(x, nullptr);
        u["usage"] = usage(o);
        u["timings"] = timings(o);
        add_event(x, u);
      }
    }
    x.events += "data: [DONE]\n\n";
    x.stream_over = true;
  }
  wake(x);
}

// The request is no longer wanted: a queued one leaves the queue; a running one stops at its
// next token or prefill chunk. Other slots are not touched.
void Server::Impl::abandon(const std::shared_ptr<Exchange>& x) {
  x->abandoned = true;
  Slot* slot = nullptr;
  {
    std::lock_guard lock(mutex);
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (*it == x) {
        queue.erase(it);
        return;
      }
    }
    slot = x->slot;
  }
  if (slot == nullptr) return;
  std::lock_guard lock(slot->cancel_mutex);
  if (slot->running == x.get() && slot->in_prefill) qhx_session_cancel(slot->session);
}

}  // namespace qhx::server
