#include "server/server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_set>
#include <vector>

#include "server/chat_output.h"
#include "server/requests.h"

namespace qhx::server {
namespace {

using Clock = std::chrono::steady_clock;

// How often the connection watch looks for clients that left and requests past their deadline.
constexpr auto kWatchInterval = std::chrono::milliseconds(50);
// How long stop() lets the answers it ended go out before it closes every connection.
constexpr auto kDrainTime = std::chrono::seconds(3);
constexpr int kPreparers = 2;
// After a request body this large, the memory freed is handed back to the system once the
// server is idle (or a second later): malloc keeps freed memory in per-thread arenas otherwise,
// and RSS ratchets up request after request.
constexpr size_t kTrimAfterBytes = size_t{256} << 10;
constexpr auto kTrimAtLatest = std::chrono::seconds(1);

ApiError shutting_down() {
  return {503, "the server is shutting down", "", "server_shutdown", "server_error"};
}

const char* finish_reason(qhx_stop_reason reason) {
  return reason == QHX_STOP_LENGTH ? "length" : "stop";
}

double per_second(int64_t n, double ms) {
  return ms > 0 ? static_cast<double>(n) * 1e3 / ms : 0.0;
}

// What a slot's generation hands back.
struct Outcome {
  qhx_status status = QHX_OK;
  std::string error;
  qhx_generate_result result{};  // counts and timings; its text is moved into `text`
  std::string text;
  int slot = -1;
};

// An answer ready to go out whole.
struct Reply {
  int status = 200;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string note;  // for the log: the error message, paths and all
};

Reply error_reply(const ApiError& e) {
  return {e.status, to_text(error_body(e)), e.headers, e.message};
}

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

bool token_in(const char* header, const char* token) {
  if (header == nullptr) return false;
  std::string h = header;
  std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return std::tolower(c); });
  size_t start = 0;
  while (start <= h.size()) {
    size_t end = h.find(',', start);
    if (end == std::string::npos) end = h.size();
    size_t a = start, b = end;
    while (a < b && (h[a] == ' ' || h[a] == '\t')) ++a;
    while (b > a && (h[b - 1] == ' ' || h[b - 1] == '\t')) --b;
    if (h.compare(a, b - a, token) == 0) return true;
    start = end + 1;
  }
  return false;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// "name" of "name:port", "[::1]:port", "name".
std::string host_name_of(const std::string& host) {
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    return lower(host.substr(1, close == std::string::npos ? std::string::npos : close - 1));
  }
  const size_t colon = host.find(':');
  if (colon != std::string::npos && host.find(':', colon + 1) != std::string::npos) {
    return lower(host);  // a bare IPv6 address
  }
  return lower(host.substr(0, colon));
}

bool is_ip_literal(const std::string& name) {
  in6_addr v6;
  in_addr v4;
  return inet_pton(AF_INET, name.c_str(), &v4) == 1 || inet_pton(AF_INET6, name.c_str(), &v6) == 1;
}

bool is_loopback_name(const std::string& name) {
  if (name == "localhost" || name == "::1") return true;
  in_addr v4;
  return inet_pton(AF_INET, name.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

bool is_wildcard_name(const std::string& name) {
  return name.empty() || name == "0.0.0.0" || name == "::" || name == "*";
}

bool same_secret(const std::string& a, const std::string& b) {
  // Constant time in the key's length: how much of a guess matched is not timed.
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < b.size(); ++i) diff |= a.size() > i ? (a[i] ^ b[i]) : 1;
  return diff == 0;
}

}  // namespace

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
  std::optional<Clock::time_point> trim_since;  // a large request came; memory not yet trimmed
  std::thread watcher;

  std::mutex stopped_mutex;
  std::condition_variable stopped_changed;
  bool stopped = false;
  std::mutex log_mutex;

  Impl(qhx_model* m, const ServerOptions& o);
  ~Impl();

  void log_line(const std::string& line);
  void log_request(Exchange& x);

  // The event loop.
  MHD_Result on_request(MHD_Connection* c, const char* url, const char* method, const char* version,
                        const char* upload, size_t* upload_size, void** context);
  std::optional<ApiError> refusal(MHD_Connection* c, Exchange& x, const char* method);
  MHD_Result respond(const std::shared_ptr<Exchange>& x);
  MHD_Result send(Exchange& x, const Reply& reply);
  MHD_Result send_stream(const std::shared_ptr<Exchange>& x);
  ssize_t read_stream(Exchange& x, char* buffer, size_t max);
  void on_completed(void** context, MHD_RequestTerminationCode code);
  void on_connection(MHD_Connection* c, void** socket_context, MHD_ConnectionNotificationCode code);
  Connection* connection_of(MHD_Connection* c);
  static void wake(Exchange& x);  // under x.mutex

  // Preparing requests; the watch.
  void prepare_loop();
  void prepare(const std::shared_ptr<Exchange>& x);
  void watch_loop();
  void leave(const std::shared_ptr<Exchange>& x);

  // Scheduling.
  std::optional<ApiError> submit(const std::shared_ptr<Exchange>& x);
  std::optional<ApiError> refused_now() const;  // under `mutex`
  std::optional<ApiError> admission_refusal();
  void dispatch();  // under `mutex`
  void work(Slot& slot);
  Outcome run(Slot& slot, Exchange& x);
  void abandon(const std::shared_ptr<Exchange>& x);
  void finish(Exchange& x, Outcome outcome);
  void on_token(Exchange& x, const char* text, size_t n);  // streams
  Json health();
  Json models() const;

  // Requests and answers.
  Json answer(const Exchange& x) const;
  Json chunk(const Exchange& x, Json choice) const;
  Json delta(const Exchange& x, Json d) const;
  void add_event(Exchange& x, const Json& data);  // under x.mutex
  void add_deltas(Exchange& x, const std::vector<OutputDelta>& deltas);
  Json usage(const Outcome& o) const;
  Json timings(const Outcome& o) const;
};

namespace {

MHD_Result request_callback(void* cls, MHD_Connection* c, const char* url, const char* method,
                            const char* version, const char* upload, size_t* upload_size,
                            void** context) {
  return static_cast<Server::Impl*>(cls)->on_request(c, url, method, version, upload, upload_size,
                                                     context);
}

void completed_callback(void* cls, MHD_Connection*, void** context,
                        MHD_RequestTerminationCode code) {
  static_cast<Server::Impl*>(cls)->on_completed(context, code);
}

void connection_callback(void* cls, MHD_Connection* c, void** socket_context,
                         MHD_ConnectionNotificationCode code) {
  static_cast<Server::Impl*>(cls)->on_connection(c, socket_context, code);
}

void mhd_logger(void* cls, const char* format, va_list args) {
  char buf[512];
  std::vsnprintf(buf, sizeof buf, format, args);
  std::string line = std::string("http: ") + buf;
  while (!line.empty() && line.back() == '\n') line.pop_back();
  static_cast<Server::Impl*>(cls)->log_line(line);
}

void add_cors_headers(MHD_Response* response, const Exchange& x) {
  if (x.allow_origin.empty()) return;
  MHD_add_response_header(response, "Access-Control-Allow-Origin", x.allow_origin.c_str());
  MHD_add_response_header(response, "Vary", "Origin");
}

struct StreamReader {
  Server::Impl* server;
  std::shared_ptr<Exchange> exchange;
};

ssize_t stream_callback(void* cls, uint64_t, char* buffer, size_t max) {
  auto* r = static_cast<StreamReader*>(cls);
  return r->server->read_stream(*r->exchange, buffer, max);
}

void stream_free(void* cls) {
  delete static_cast<StreamReader*>(cls);
}

}  // namespace

Server::Impl::Impl(qhx_model* m, const ServerOptions& o) : options(o), rules(m, o.alias) {
  if (options.parallel < 1) throw std::runtime_error("--parallel must be at least 1");
  if (options.queue < 0) throw std::runtime_error("--queue must be at least 0");
  if (options.max_connections < 1) throw std::runtime_error("--max-connections must be at least 1");
  if (options.timeout_seconds < 1) throw std::runtime_error("--timeout must be at least 1");
  started_at = static_cast<int64_t>(std::time(nullptr));
  std::random_device entropy;
  id_salt = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();

  // The Host names answered: those `host` stands for (any address of this machine for a wildcard:
  // IP literals cannot be rebound by DNS), and the ones allowed by name.
  const std::string bound = lower(options.host);
  if (is_loopback_name(bound)) {
    host_names = {"localhost", "127.0.0.1", "::1"};
  } else if (is_wildcard_name(bound)) {
    any_ip_host = true;
    host_names = {"localhost"};
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) == 0) host_names.push_back(lower(name));
  }
  host_names.push_back(bound);
  for (const std::string& h : options.allowed_hosts) {
    if (h == "*") any_host = true;
    host_names.push_back(host_name_of(h));
  }

  qhx_session_options session_options;
  qhx_session_options_default(&session_options);
  for (int i = 0; i < options.parallel; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->index = i;
    if (qhx_session_create(rules.model, &session_options, &slot->session) != QHX_OK) {
      const std::string message = qhx_last_error();
      for (auto& s : slots) qhx_session_destroy(s->session);
      throw std::runtime_error(message);
    }
    slots.push_back(std::move(slot));
  }
  for (auto& slot : slots) slot->worker = std::thread([this, s = slot.get()] { work(*s); });
  for (int i = 0; i < kPreparers; ++i) preparers.emplace_back([this] { prepare_loop(); });
  watcher = std::thread([this] { watch_loop(); });
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
  {
    std::lock_guard lock(prepare_mutex);
    preparers_stop = true;
  }
  prepare_wake.notify_all();
  for (auto& t : preparers) t.join();
  {
    std::lock_guard lock(watch_mutex);
    watch_stop = true;
  }
  watch_wake.notify_all();
  watcher.join();
}

void Server::Impl::log_line(const std::string& line) {
  if (!options.log) return;
  std::lock_guard lock(log_mutex);
  std::fprintf(stderr, "%s\n", line.c_str());
}

void Server::Impl::log_request(Exchange& x) {
  if (!options.log) return;
  std::lock_guard lock(x.mutex);  // a slot's worker may still be finishing it
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - x.start).count();
  char buf[256];
  if (x.done && x.outcome.slot >= 0) {
    const Outcome& o = x.outcome;
    std::snprintf(buf, sizeof buf,
                  "%s %s %d | prompt %lld (reused %lld) | completion %lld | slot %d | %.1f ms",
                  x.method.c_str(), x.path.c_str(), x.status,
                  static_cast<long long>(o.result.n_prompt),
                  static_cast<long long>(o.result.n_reused),
                  static_cast<long long>(o.result.n_generated), o.slot, ms);
  } else {
    std::snprintf(buf, sizeof buf, "%s %s %d | %.1f ms", x.method.c_str(), x.path.c_str(), x.status,
                  ms);
  }
  std::string line = buf;
  if (x.client_gone) line += " | client gone";
  if (x.shutdown) line += " | ended by shutdown";
  if (!x.note.empty()) line += " | " + x.note;
  log_line(line);
}

// ---- The event loop ---------------------------------------------------------------------------

void Server::Impl::wake(Exchange& x) {
  if (x.suspended && x.connection_open) {
    x.suspended = false;
    MHD_resume_connection(x.connection);
  }
}

Connection* Server::Impl::connection_of(MHD_Connection* c) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info != nullptr ? static_cast<Connection*>(info->socket_context) : nullptr;
}

void Server::Impl::on_connection(MHD_Connection* c, void** socket_context,
                                 MHD_ConnectionNotificationCode code) {
  std::lock_guard lock(watch_mutex);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    auto* conn = new Connection;
    const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    conn->fd = info != nullptr ? info->connect_fd : -1;
    conn->since = Clock::now();
    connections.insert(conn);
    *socket_context = conn;
  } else if (*socket_context != nullptr) {
    auto* conn = static_cast<Connection*>(*socket_context);
    connections.erase(conn);
    delete conn;
    *socket_context = nullptr;
  }
}

// Checks made as soon as the headers are in: who asks, for what, with how much.
std::optional<ApiError> Server::Impl::refusal(MHD_Connection* c, Exchange& x, const char* method) {
  const auto header = [&](const char* name) {
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
  };
  if (!any_host) {
    // A page whose domain was rebound to this machine sends its own name as Host.
    if (const char* host = header("Host")) {
      const std::string name = host_name_of(host);
      const bool known = std::find(host_names.begin(), host_names.end(), name) != host_names.end();
      if (!known && !(any_ip_host && is_ip_literal(name))) {
        return ApiError{
            403,
            "this server does not answer to the host '" + name + "' (allow it with --allowed-host)",
            "", "host_not_allowed"};
      }
    }
  }
  if (const char* origin = header("Origin")) {
    const bool any = std::find(options.cors_origins.begin(), options.cors_origins.end(), "*") !=
                     options.cors_origins.end();
    const bool listed = std::find(options.cors_origins.begin(), options.cors_origins.end(),
                                  origin) != options.cors_origins.end();
    if (!any && !listed) {
      return ApiError{403,
                      std::string("requests from web pages at ") + origin +
                          " are refused (allow their origin with --cors-origin)",
                      "", "origin_not_allowed"};
    }
    x.allow_origin = any ? "*" : origin;
  }
  const bool is_get = std::strcmp(method, "GET") == 0;
  const bool is_post = std::strcmp(method, "POST") == 0;
  const bool known = x.path == "/health" || x.path == "/v1/models" || x.path == "/v1/completions" ||
                     x.path == "/v1/chat/completions";
  if (!known) {
    return ApiError{404, "no such endpoint: " + x.method + " " + x.path, "", "not_found"};
  }
  if (std::strcmp(method, "OPTIONS") == 0) return std::nullopt;  // a preflight: answered later
  const bool wants_post = x.path == "/v1/completions" || x.path == "/v1/chat/completions";
  if (wants_post ? !is_post : !is_get) {
    ApiError e{405, x.method + " is not allowed on " + x.path, "", "method_not_allowed"};
    e.headers.emplace_back("Allow", wants_post ? "POST, OPTIONS" : "GET, OPTIONS");
    return e;
  }
  if (!options.api_key.empty() && x.path != "/health") {
    const char* authorization = header("Authorization");
    const std::string given = authorization != nullptr ? authorization : "";
    const bool bearer = lower(given.substr(0, 7)) == "bearer ";
    if (!bearer || !same_secret(given.substr(7), options.api_key)) {
      ApiError e{401,
                 authorization == nullptr ? "an API key is required (Authorization: Bearer KEY)"
                                          : "incorrect API key provided",
                 "", "invalid_api_key"};
      e.headers.emplace_back("WWW-Authenticate", "Bearer");
      return e;
    }
  }
  if (const char* length = header("Content-Length")) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(length, &end, 10);
    if (end != length && n > options.max_request_bytes) {
      return ApiError{
          413, "request body is over " + std::to_string(options.max_request_bytes) + " bytes", "",
          "request_too_large"};
    }
  }
  return std::nullopt;
}

MHD_Result Server::Impl::on_request(MHD_Connection* c, const char* url, const char* method,
                                    const char* version, const char* upload, size_t* upload_size,
                                    void** context) {
  auto* held = static_cast<std::shared_ptr<Exchange>*>(*context);
  if (held == nullptr) {
    auto x = std::make_shared<Exchange>();
    x->connection = c;
    x->method = method;
    x->path = url;
    held = new std::shared_ptr<Exchange>(x);
    *context = held;
    // An HTTP/1.0 request without keep-alive is its client's last: such clients (nc, ab, scripts)
    // may shut their side down once it is sent. From HTTP/1.1 clients, whose connections stay
    // open, the end of input means they left (as nginx and llama.cpp's server read it).
    const bool may_half_close =
        std::strcmp(version, MHD_HTTP_VERSION_1_0) == 0 &&
        !token_in(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Connection"), "keep-alive");
    {
      std::lock_guard lock(watch_mutex);
      live.insert(x);
      if (Connection* conn = connection_of(c)) {
        conn->since = Clock::now();  // the body's deadline
        conn->may_half_close = may_half_close;
        conn->exchange = x;
      }
    }
    if (const std::optional<ApiError> refused = refusal(c, *x, method)) {
      return send(*x, error_reply(*refused));
    }
    return MHD_YES;
  }
  Exchange& x = **held;
  if (*upload_size > 0) {
    // Past the limit the rest is read and dropped: only then can the 413 go out.
    if (!x.body_too_large && x.body.size() + *upload_size <= options.max_request_bytes) {
      x.body.append(upload, *upload_size);
    } else if (!x.body_too_large) {
      x.body_too_large = true;
      std::string().swap(x.body);
    }
    *upload_size = 0;
    return MHD_YES;
  }
  return respond(*held);
}

MHD_Result Server::Impl::respond(const std::shared_ptr<Exchange>& held) {
  Exchange& x = *held;
  if (!x.handed_off) {
    if (x.body_too_large) {
      return send(x, error_reply({413,
                                  "request body is over " +
                                      std::to_string(options.max_request_bytes) + " bytes",
                                  "", "request_too_large"}));
    }
    if (x.method == "OPTIONS") {
      Reply preflight{204, "", {}, ""};
      preflight.headers = {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                           {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
                           {"Access-Control-Max-Age", "600"}};
      return send(x, preflight);
    }
    if (x.path == "/health") return send(x, {200, to_text(health()), {}, ""});
    if (x.path == "/v1/models") return send(x, {200, to_text(models()), {}, ""});
    // Refused at once when it could not be queued anyway: a client retrying against a full
    // server costs no parse. (submit() decides again once the request is parsed.)
    if (std::optional<ApiError> busy = admission_refusal()) return send(x, error_reply(*busy));
    x.handed_off = true;
    {
      std::lock_guard lock(watch_mutex);
      if (Connection* conn = connection_of(x.connection)) conn->serving = true;
    }
    {
      std::lock_guard lock(x.mutex);
      x.suspended = true;
      MHD_suspend_connection(x.connection);
    }
    if (x.body.size() >= kTrimAfterBytes) {
      std::lock_guard lock(watch_mutex);
      if (!trim_since) trim_since = Clock::now();
    }
    {
      std::lock_guard lock(prepare_mutex);
      to_prepare.push_back(held);
    }
    prepare_wake.notify_one();
    return MHD_YES;
  }
  std::unique_lock lock(x.mutex);
  if (x.client_gone) return MHD_NO;  // closes the connection
  if (x.reply) {
    const Reply reply = std::move(*x.reply);
    x.reply.reset();
    lock.unlock();
    return send(x, reply);
  }
  if (x.stream_started) {
    lock.unlock();
    return send_stream(held);
  }
  x.suspended = true;
  MHD_suspend_connection(x.connection);
  return MHD_YES;
}

MHD_Result Server::Impl::send(Exchange& x, const Reply& reply) {
  MHD_Response* response = MHD_create_response_from_buffer(
      reply.body.size(), const_cast<char*>(reply.body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  if (!reply.body.empty()) MHD_add_response_header(response, "Content-Type", "application/json");
  for (const auto& [name, value] : reply.headers) {
    MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  add_cors_headers(response, x);
  x.status = reply.status;
  if (!reply.note.empty()) {
    std::lock_guard lock(x.mutex);
    x.note = reply.note;
  }
  const MHD_Result queued =
      MHD_queue_response(x.connection, static_cast<unsigned>(reply.status), response);
  MHD_destroy_response(response);
  return queued;
}

MHD_Result Server::Impl::send_stream(const std::shared_ptr<Exchange>& x) {
  auto* reader = new StreamReader{this, x};
  MHD_Response* response = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 << 10,
                                                             stream_callback, reader, stream_free);
  if (response == nullptr) {
    delete reader;
    return MHD_NO;
  }
  MHD_add_response_header(response, "Content-Type", "text/event-stream");
  MHD_add_response_header(response, "Cache-Control", "no-cache");
  add_cors_headers(response, *x);
  x->status = 200;
  const MHD_Result queued = MHD_queue_response(x->connection, 200, response);
  MHD_destroy_response(response);
  return queued;
}

// The event loop takes a stream's events as they come; with none waiting, the connection sleeps
// until the slot's worker wakes it.
ssize_t Server::Impl::read_stream(Exchange& x, char* buffer, size_t max) {
  std::lock_guard lock(x.mutex);
  const size_t waiting = x.events.size() - x.events_taken;
  if (waiting > 0) {
    const size_t n = std::min(waiting, max);
    std::memcpy(buffer, x.events.data() + x.events_taken, n);
    x.events_taken += n;
    if (x.events_taken == x.events.size()) {
      x.events.clear();
      x.events_taken = 0;
    }
    return static_cast<ssize_t>(n);
  }
  if (x.stream_over) return MHD_CONTENT_READER_END_OF_STREAM;
  if (x.client_gone) return MHD_CONTENT_READER_END_WITH_ERROR;
  x.suspended = true;
  MHD_suspend_connection(x.connection);
  return 0;
}

void Server::Impl::on_completed(void** context, MHD_RequestTerminationCode code) {
  auto* held = static_cast<std::shared_ptr<Exchange>*>(*context);
  if (held == nullptr) return;
  const std::shared_ptr<Exchange> x = *held;
  delete held;
  *context = nullptr;
  {
    std::lock_guard lock(watch_mutex);
    live.erase(x);
    if (Connection* conn = connection_of(x->connection)) {
      conn->serving = false;
      conn->since = Clock::now();  // the next request's deadline
      conn->exchange.reset();
    }
  }
  bool over;
  {
    std::lock_guard lock(x->mutex);
    x->connection_open = false;
    // The answer did not get out whole: the client left (or was dropped for its deadline).
    if (code != MHD_REQUEST_TERMINATED_COMPLETED_OK && !x->shutdown) x->client_gone = true;
    over = x->done || !x->handed_off;
  }
  if (!over) abandon(x);
  log_request(*x);
}

// ---- Preparing requests, watching connections --------------------------------------------------

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

// Parses, checks and tokenizes a request, then queues it for a slot. Everything the C API would
// refuse is refused here, so a 200 is only ever followed by an answer (or, in a stream that
// already began, an error event).
void Server::Impl::prepare(const std::shared_ptr<Exchange>& x) {
  std::optional<ApiError> error;
  try {
    const Json body = parse_body(x->body);
    std::string().swap(x->body);
    x->request.chat = x->path == "/v1/chat/completions";
    rules.parse_completion(body, x->request);
    char id[40];
    std::snprintf(id, sizeof id, "%s-%016llx", x->request.chat ? "chatcmpl" : "cmpl",
                  static_cast<unsigned long long>(id_salt ^ (next_id++ * 0x9e3779b97f4a7c15ull)));
    x->id = id;
    x->created = static_cast<int64_t>(std::time(nullptr));
    if (x->request.stream && x->request.chat) x->parser.emplace(x->request.output);
    error = submit(x);
  } catch (const ApiError& e) {
    error = e;
  } catch (const std::exception& e) {
    error = ApiError{500, std::string("internal error: ") + e.what(), "", "", "server_error"};
  }
  if (error) {
    std::lock_guard lock(x->mutex);
    x->done = true;
    x->reply = error_reply(*error);
    wake(*x);
  }
}

// Every 50 ms: a client that left while its request was served stops that request, and a
// request that has not arrived by its deadline is cut off.
void Server::Impl::watch_loop() {
  const auto deadline = std::chrono::seconds(options.timeout_seconds);
  std::unique_lock lock(watch_mutex);
  while (!watch_stop) {
    watch_wake.wait_for(lock, kWatchInterval);
    std::vector<std::shared_ptr<Exchange>> gone;
    const Clock::time_point now = Clock::now();
    for (Connection* conn : connections) {
      if (conn->fd < 0) continue;
      if (!conn->serving) {
        // MHD's own timeout counts from the last byte; this one from the request's first.
        if (!conn->cut && now - conn->since > deadline) {
          ::shutdown(conn->fd, SHUT_RDWR);
          conn->cut = true;
        }
        continue;
      }
      pollfd p{conn->fd, POLLRDHUP, 0};
      if (::poll(&p, 1, 0) != 1) continue;
      // The end of the client's input means it left, unless it may half-close; a reset or a
      // hang-up both ways always does.
      const bool reset = (p.revents & (POLLHUP | POLLERR)) != 0;
      if (reset || (!conn->may_half_close && (p.revents & POLLRDHUP) != 0)) {
        if (auto x = conn->exchange.lock()) gone.push_back(std::move(x));
        conn->exchange.reset();
      }
    }
    const bool trim = trim_since && (live.empty() || now - *trim_since > kTrimAtLatest);
    if (trim) trim_since.reset();
    lock.unlock();
    for (const auto& x : gone) leave(x);
#ifdef __GLIBC__
    if (trim) malloc_trim(0);
#endif
    lock.lock();
  }
}

// The client of `x` left: its request stops and the event loop closes the connection.
void Server::Impl::leave(const std::shared_ptr<Exchange>& x) {
  {
    std::lock_guard lock(x->mutex);
    if (x->client_gone || !x->connection_open) return;
    x->client_gone = true;
  }
  abandon(x);
  std::lock_guard lock(x->mutex);
  wake(*x);
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

struct TokenSink {
  Server::Impl* server;
  Slot* slot;
  Exchange* exchange;
  bool first = true;
};

int token_callback(void* user_data, int32_t /*token*/, const char* text, size_t text_len) {
  auto& sink = *static_cast<TokenSink*>(user_data);
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
      add_event(x, chunk(x, delta(x, {{"content", std::string(text, n)}})));
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
    x.reply = error ? error_reply(*error) : Reply{200, to_text(answer(x)), {}, ""};
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

Json Server::Impl::health() {
  std::lock_guard lock(mutex);
  int busy = 0;
  Json slot_list = Json::array();
  for (const auto& s : slots) {
    busy += s->exchange != nullptr;
    slot_list.push_back(
        {{"id", s->index}, {"state", s->exchange != nullptr ? "processing" : "idle"}});
  }
  return {{"status", stopping ? "stopping" : "ok"},
          {"slots_idle", static_cast<int>(slots.size()) - busy},
          {"slots_processing", busy},
          {"queue_length", queue.size()},
          {"queue_max", options.queue},
          {"slots", slot_list}};
}

Json Server::Impl::models() const {
  const Json entry = {{"id", rules.model_id},
                      {"object", "model"},
                      {"created", started_at},
                      {"owned_by", "qhx"},
                      {"context_length", rules.context_length}};
  return {{"object", "list"}, {"data", Json::array({entry})}};
}

// ---- Requests ---------------------------------------------------------------------------------

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

Json Server::Impl::answer(const Exchange& x) const {
  const Outcome& o = x.outcome;
  Json choice = {
      {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason(o.result.stop_reason)}};
  if (x.request.chat) {
    const ChatOutput output = parse_chat_output(o.text, x.request.output);
    choice["message"] = assistant_message(output, x.id);
    choice["finish_reason"] =
        chat_finish_reason(o.result.stop_reason == QHX_STOP_LENGTH, output.tool_calls.size());
  } else {
    choice["text"] = o.text;
  }
  return {{"id", x.id},
          {"object", x.request.chat ? "chat.completion" : "text_completion"},
          {"created", x.created},
          {"model", rules.model_id},
          {"choices", Json::array({choice})},
          {"usage", usage(o)},
          {"timings", timings(o)}};
}

Json Server::Impl::chunk(const Exchange& x, Json choice) const {
  Json c = {{"id", x.id},
            {"object", x.request.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", x.created},
            {"model", rules.model_id},
            {"choices", choice.is_null() ? Json::array() : Json::array({std::move(choice)})}};
  if (x.request.include_usage) c["usage"] = nullptr;
  return c;
}

Json Server::Impl::delta(const Exchange& x, Json d) const {
  if (x.request.chat) {
    return Json{
        {"index", 0}, {"delta", std::move(d)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  }
  return Json{{"index", 0},
              {"text", d.value("content", "")},
              {"logprobs", nullptr},
              {"finish_reason", nullptr}};
}

void Server::Impl::add_event(Exchange& x, const Json& data) {
  x.events += "data: ";
  x.events += to_text(data);
  x.events += "\n\n";
}

// Chat stream deltas: reasoning, content, and each tool call once it closes.
void Server::Impl::add_deltas(Exchange& x, const std::vector<OutputDelta>& deltas) {
  for (const OutputDelta& d : deltas) {
    add_event(x, chunk(x, delta(x, delta_message(d, x.n_calls, x.id))));
    x.n_calls += d.kind == OutputDelta::Kind::kToolCall;
  }
}

Server::Server(qhx_model* model, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {}

Server::~Server() {
  stop();
  wait();
}

namespace {

// A listening socket on host:port (port 0: any free one); returns it and the port it got.
std::pair<int, int> listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const char* node = is_wildcard_name(host) && host != "::" ? "0.0.0.0" : host.c_str();
  if (const int e = getaddrinfo(node, service.c_str(), &hints, &found); e != 0) {
    throw std::runtime_error("cannot listen on " + host + ": " + gai_strerror(e));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      sockaddr_storage bound{};
      socklen_t length = sizeof bound;
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
      const int got =
          ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      freeaddrinfo(found);
      return {fd, got};
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(found);
  throw std::runtime_error("cannot bind " + host + ":" + std::to_string(port) + ": " + why);
}

}  // namespace

int Server::start() {
  signal(SIGPIPE, SIG_IGN);
  Impl& s = *impl_;
  const auto [fd, port] = listen_on(s.options.host, s.options.port);
  s.daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
      0, nullptr, nullptr, request_callback, &s, MHD_OPTION_LISTEN_SOCKET, fd,
      MHD_OPTION_CONNECTION_LIMIT, static_cast<unsigned>(s.options.max_connections),
      MHD_OPTION_CONNECTION_TIMEOUT, static_cast<unsigned>(s.options.timeout_seconds),
      MHD_OPTION_NOTIFY_COMPLETED, completed_callback, &s, MHD_OPTION_NOTIFY_CONNECTION,
      connection_callback, &s, MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, &s, MHD_OPTION_END);
  if (s.daemon == nullptr) {
    ::close(fd);
    throw std::runtime_error("cannot start the HTTP server on " + s.options.host + ":" +
                             std::to_string(port));
  }
  const std::string bound = lower(s.options.host);
  if (!is_loopback_name(bound) && s.options.api_key.empty()) {
    std::fprintf(stderr,
                 "warning: listening on %s without an API key: anyone who can reach port %d can "
                 "use this model (set --api-key or QHX_API_KEY)\n",
                 s.options.host.c_str(), port);
  }
  return port;
}

void Server::wait() {
  Impl& s = *impl_;
  if (s.daemon == nullptr) return;
  std::unique_lock lock(s.stopped_mutex);
  s.stopped_changed.wait(lock, [&] { return s.stopped; });
}

void Server::stop() {
  Impl& s = *impl_;
  std::vector<std::shared_ptr<Exchange>> ended;
  {
    std::lock_guard lock(s.mutex);
    if (s.stopping) return;
    s.stopping = true;
    ended.assign(s.queue.begin(), s.queue.end());
    s.queue.clear();
    for (auto& slot : s.slots) {
      if (slot->exchange != nullptr) ended.push_back(slot->exchange);
    }
  }
  for (auto& slot : s.slots) slot->wake.notify_all();
  const auto end_by_shutdown = [](Exchange& x) {
    std::lock_guard lock(x.mutex);
    x.shutdown = true;
    x.abandoned = true;
  };
  for (const auto& x : ended) {
    if (x->slot == nullptr) {
      end_by_shutdown(*x);
      s.finish(*x, Outcome{});  // queued: a 503
      continue;
    }
    // Only a generation still running is ended; one that just finished keeps its answer.
    std::lock_guard lock(x->slot->cancel_mutex);
    if (x->slot->running != x.get()) continue;
    end_by_shutdown(*x);
    if (x->slot->in_prefill) qhx_session_cancel(x->slot->session);
  }
  if (s.daemon != nullptr) {
    // The answers just ended go out; then every connection still open is closed. A connection
    // must not sleep (suspended) when the daemon stops.
    const Clock::time_point until = Clock::now() + kDrainTime;
    for (;;) {
      size_t open;
      {
        std::lock_guard lock(s.watch_mutex);
        open = s.live.size();
      }
      if (open == 0 || Clock::now() > until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::vector<std::shared_ptr<Exchange>> left;
    {
      std::lock_guard lock(s.watch_mutex);
      left.assign(s.live.begin(), s.live.end());
    }
    for (const auto& x : left) s.leave(x);
    MHD_stop_daemon(s.daemon);
  }
  {
    std::lock_guard lock(s.stopped_mutex);
    s.stopped = true;
  }
  s.stopped_changed.notify_all();
}

}  // namespace qhx::server
