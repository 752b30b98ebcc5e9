// Server::Impl and what its threads share: the event loop (http.cc), the preparers and the slots'
// workers (scheduler.cc), the answers they build (responses.cc). Internal to qhx_server: the
// installed interface is server.h.
#pragma once

#include <microhttpd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "qhx/qhx.h"
#include "server/chat_output.h"
#include "server/requests.h"
#include "server/server.h"

namespace qhx::server {

using Clock = std::chrono::steady_clock;

// What a slot's generation hands back.
struct Outcome {
  qhx_status status = QHX_OK;
  std::string error;
  qhx_generate_result result{};  // counts and timings; its text is moved into `text`
  std::string text;
  int slot = -1;
  // An embeddings request's vectors, one after the other, and their counts.
  std::vector<float> vectors;
  qhx_embed_result embedded{};
};

// An answer ready to go out whole.
struct Reply {
  int status = 200;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string note;  // for the log: the error message, paths and all
};

// An ApiError as the answer that carries it (responses.cc).
Reply error_reply(const ApiError& e);
// A text completion's finish_reason: "length" or "stop" (responses.cc).
const char* finish_reason(qhx_stop_reason reason);

// Host header names, as the Host check and the listening address read them (http.cc).
std::string lower(std::string s);
// "name" of "name:port", "[::1]:port", "name".
std::string host_name_of(const std::string& host);
bool is_loopback_name(const std::string& name);
bool is_wildcard_name(const std::string& name);

struct Slot;

// One HTTP request, from its headers to its answer. The event loop, a preparer and a slot's
// worker share it.
struct Exchange {
  // Set by the event loop when the headers are in; constant afterwards.
  MHD_Connection* connection = nullptr;
  std::string method, path;
  std::string allow_origin;  // the Access-Control-Allow-Origin answered, or ""
  Clock::time_point start = Clock::now();

  // The event loop's alone.
  std::string body;
  bool body_too_large = false;
  bool handed_off = false;  // the body went to a preparer
  int status = 0;           // the answer's status, for the log

  // Set by the preparer before the request is queued; constant afterwards.
  Completion request;
  Embeddings embeddings;  // POST /v1/embeddings (then `request` is unused)
  std::string id;
  int64_t created = 0;

  std::atomic<bool> abandoned{false};  // stop generating: the client left, or the server stops
  Slot* slot = nullptr;                // set by the scheduler (under its mutex)

  std::mutex mutex;             // guards the fields below
  bool connection_open = true;  // until the event loop reports the request over
  bool suspended = false;       // the connection waits for wake()
  bool client_gone = false;
  bool shutdown = false;       // ended by stop()
  std::optional<Reply> reply;  // the whole answer, once known
  std::string events;          // a stream's server-sent events not yet taken by the event loop
  size_t events_taken = 0;
  bool stream_started = false;  // events exist: the status is 200 from here on
  bool stream_over = false;     // the last event is in `events`
  bool done = false;            // the generation is over (or never ran)
  Outcome outcome;
  std::string note;  // for the log
  // The stream's parsing (the slot's worker alone).
  std::optional<OutputParser> parser;
  size_t n_calls = 0;
  // With logprobs: an entry per generated token (OpenAI's chat shape), and how many a stream has
  // sent; the text's length in characters before each, for completions' text_offset.
  std::vector<Json> logprobs;
  std::vector<int64_t> text_offsets;
  int64_t text_chars = 0;
  size_t logprobs_sent = 0;
};

struct Slot {
  int index = 0;
  qhx_session* session = nullptr;
  std::thread worker;
  std::condition_variable wake;        // under the scheduler's mutex
  std::shared_ptr<Exchange> exchange;  // assigned, under the scheduler's mutex
  uint64_t last_used = 0;

  // Cancelling is only sent while the slot's generation is in prefill: from the first token on,
  // the token callback stops it, which cannot leak a cancel into the slot's next request.
  std::mutex cancel_mutex;
  const Exchange* running = nullptr;
  bool in_prefill = false;
};

// What the connection watch knows of one open connection.
struct Connection {
  int fd = -1;
  Clock::time_point since;  // reading a request since (or idle since)
  bool serving = false;     // a request is in, its answer not yet out
  // The request came from an HTTP/1.0 client that will send nothing more: the end of its input
  // is a half-close, not a hang-up.
  bool may_half_close = false;
  bool cut = false;  // shut down for its deadline
  std::weak_ptr<Exchange> exchange;
};

struct Server::Impl {
  ServerOptions options;
  RequestRules rules;
  int64_t started_at = 0;
  std::vector<std::string> host_names;  // Host header names answered (lowercase)
  bool any_host = false;
  bool any_ip_host = false;

  MHD_Daemon* daemon = nullptr;

  std::mutex mutex;  // the scheduler: slots' assignments, the queue; `stopping`
  std::vector<std::unique_ptr<Slot>> slots;
  std::deque<std::shared_ptr<Exchange>> queue;
  uint64_t clock = 0;
  bool stopping = false;
  std::atomic<uint64_t> next_id{0};
  uint64_t id_salt = 0;

  // Requests parsed and tokenized off the event loop.
  std::mutex prepare_mutex;
  std::condition_variable prepare_wake;
  std::deque<std::shared_ptr<Exchange>> to_prepare;
  bool preparers_stop = false;
  std::vector<std::thread> preparers;

  // The connection watch.
  std::mutex watch_mutex;
  std::condition_variable watch_wake;
  std::unordered_set<Connection*> connections;
  std::unordered_set<std::shared_ptr<Exchange>> live;  // exchanges whose request is not over
  bool watch_stop = false;
  std::optional<Clock::time_point> trim_since;  // a request ended; its memory not yet trimmed
  std::thread watcher;

  std::mutex stopped_mutex;
  std::condition_variable stopped_changed;
  bool stopped = false;
  std::mutex log_mutex;

  // Its lifetime and the log (server.cc).
  Impl(qhx_model* m, const ServerOptions& o);
  ~Impl();

  void log_line(const std::string& line);
  void log_request(Exchange& x);

  // The event loop (http.cc).
  MHD_Result on_request(MHD_Connection* c, const char* url, const char* method, const char* version,
                        const char* upload, size_t* upload_size, void** context);
  bool admits_connection();  // fewer than --max-connections are open
  std::optional<ApiError> refusal(MHD_Connection* c, Exchange& x, const char* method,
                                  const char* version);
  MHD_Result respond(const std::shared_ptr<Exchange>& x);
  MHD_Result send(Exchange& x, const Reply& reply);
  MHD_Result send_stream(const std::shared_ptr<Exchange>& x);
  ssize_t read_stream(Exchange& x, char* buffer, size_t max);
  void on_completed(void** context, MHD_RequestTerminationCode code);
  void on_connection(MHD_Connection* c, void** socket_context, MHD_ConnectionNotificationCode code);
  Connection* connection_of(MHD_Connection* c);
  static void wake(Exchange& x);  // under x.mutex

  // Preparing requests (scheduler.cc); the watch (http.cc).
  void prepare_loop();
  void prepare(const std::shared_ptr<Exchange>& x);
  void watch_loop();
  void leave(const std::shared_ptr<Exchange>& x);

  // Scheduling (scheduler.cc).
  std::optional<ApiError> submit(const std::shared_ptr<Exchange>& x);
  std::optional<ApiError> refused_now() const;  // under `mutex`
  std::optional<ApiError> admission_refusal();
  void dispatch();  // under `mutex`
  void work(Slot& slot);
  Outcome run(Slot& slot, Exchange& x);
  void abandon(const std::shared_ptr<Exchange>& x);
  void finish(Exchange& x, Outcome outcome);
  void on_token(Exchange& x, const char* text, size_t n);  // streams

  // Requests and answers (responses.cc).
  Json health();
  Json models() const;
  Json answer(const Exchange& x) const;
  Json embeddings_answer(const Exchange& x) const;
  Json chunk(const Exchange& x, Json choice) const;
  Json delta(const Exchange& x, Json d) const;
  void add_event(Exchange& x, const Json& data);  // under x.mutex
  void add_deltas(Exchange& x, const std::vector<OutputDelta>& deltas);
  void add_logprobs(Exchange& x, qhx_session* session, int32_t token);  // the slot's worker
  // The entries [from, to) in the request's shape: chat's {"content": [...]}, completions'
  // {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; null without logprobs.
  Json logprobs(const Exchange& x, size_t from, size_t to) const;
  Json pending_logprobs(Exchange& x) const;  // the entries a stream has not sent, marked sent
  Json usage(const Outcome& o) const;
  Json timings(const Outcome& o) const;
};

}  // namespace qhx::server
