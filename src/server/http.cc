// The HTTP layer, on libmicrohttpd's event loop: who may ask (Host, Origin, API key, sizes),
// answers whole or streamed, connections watched for clients that left or stalled, and the
// listening socket from start() to stop(). It never waits on a model: requests go to a preparer.
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
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "server/server_impl.h"

namespace qhx::server {
namespace {

// How often the connection watch looks for clients that left and requests past their deadline.
constexpr auto kWatchInterval = std::chrono::milliseconds(50);
// How long stop() lets the answers it ended go out before it closes every connection.
constexpr auto kDrainTime = std::chrono::seconds(3);
// After a request, the memory it freed is handed back to the system once the server is idle (or
// a second later while it is busy): malloc keeps freed memory in its per-thread arenas otherwise,
// and RSS ratchets up request after request (request bodies, states the prefix cache evicted,
// a turn's sampler and logits).
constexpr auto kTrimAtLatest = std::chrono::seconds(1);

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

bool is_ip_literal(const std::string& name) {
  in6_addr v6;
  in_addr v4;
  return inet_pton(AF_INET, name.c_str(), &v4) == 1 || inet_pton(AF_INET6, name.c_str(), &v6) == 1;
}

bool same_secret(const std::string& a, const std::string& b) {
  // Constant time in the key's length: how much of a guess matched is not timed.
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < b.size(); ++i) diff |= a.size() > i ? (a[i] ^ b[i]) : 1;
  return diff == 0;
}

}  // namespace

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

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

bool is_loopback_name(const std::string& name) {
  if (name == "localhost" || name == "::1") return true;
  in_addr v4;
  return inet_pton(AF_INET, name.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

bool is_wildcard_name(const std::string& name) {
  return name.empty() || name == "0.0.0.0" || name == "::" || name == "*";
}

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

// Past --max-connections a connection is closed as it comes (libmicrohttpd at its own limit
// would stop accepting, and connections would wait unanswered in the listen backlog).
MHD_Result accept_callback(void* cls, const sockaddr*, socklen_t) {
  return static_cast<Server::Impl*>(cls)->admits_connection() ? MHD_YES : MHD_NO;
}

void mhd_logger(void* cls, const char* format, va_list args) {
  char buf[512];
  std::vsnprintf(buf, sizeof buf, format, args);
  std::string line = std::string("http: ") + buf;
  while (!line.empty() && line.back() == '\n') line.pop_back();
  static_cast<Server::Impl*>(cls)->log_line(line);
}

// The chat page (server/chat_page.html, compiled in): its script and style are inline, and it
// talks to this server alone.
Reply chat_page() {
  static const std::string page =
#include "chat_page.inc"
      ;
  return {200,
          page,
          {{"Content-Type", "text/html; charset=utf-8"},
           {"Cache-Control", "no-cache"},
           {"X-Content-Type-Options", "nosniff"},
           {"Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'"}},
          ""};
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

bool Server::Impl::admits_connection() {
  std::lock_guard lock(watch_mutex);
  return connections.size() < static_cast<size_t>(options.max_connections);
}

// Checks made as soon as the headers are in: who asks, for what, with how much.
namespace {

// How many Host, Content-Length and Transfer-Encoding headers a request has.
struct Framing {
  int hosts = 0, lengths = 0, encodings = 0;
};

MHD_Result count_framing(void* cls, MHD_ValueKind, const char* key, const char*) {
  auto& f = *static_cast<Framing*>(cls);
  const std::string name = lower(key);
  f.hosts += name == "host";
  f.lengths += name == "content-length";
  f.encodings += name == "transfer-encoding";
  return MHD_YES;
}

// Header names as a CORS preflight lists them: RFC 9110 tokens, commas and blanks.
bool is_token_list(const char* s) {
  bool any = false;
  for (; *s != '\0'; ++s) {
    const auto ch = static_cast<unsigned char>(*s);
    if (std::isalnum(ch) || std::strchr("!#$%&'*+-.^_`|~", ch) != nullptr) {
      any = true;
    } else if (ch != ',' && ch != ' ' && ch != '\t') {
      return false;
    }
  }
  return any;
}

}  // namespace

std::optional<ApiError> Server::Impl::refusal(MHD_Connection* c, Exchange& x, const char* method,
                                              const char* version) {
  const auto header = [&](const char* name) {
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
  };
  // Framing a proxy in front could read otherwise than this server does (RFC 9112 §6.3) is
  // refused, and a refusal sent before the body closes the connection: nothing of the body is
  // read as a next request. HTTP/1.1 requires one Host (§3.2).
  Framing f;
  MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
  const bool http10 = std::strcmp(version, MHD_HTTP_VERSION_1_0) == 0;
  if (f.hosts > 1 || (f.hosts == 0 && !http10)) {
    return ApiError{400, f.hosts > 1 ? "more than one Host header" : "HTTP/1.1 needs a Host header",
                    "", "invalid_host"};
  }
  if (f.lengths > 1 || (f.lengths > 0 && f.encodings > 0) || (f.encodings > 0 && http10)) {
    return ApiError{400,
                    f.lengths > 1 ? "more than one Content-Length header"
                                  : "ambiguous framing: Transfer-Encoding with Content-Length or "
                                    "in HTTP/1.0",
                    "", "invalid_framing"};
  }
  if (f.encodings > 0 && (f.encodings > 1 || lower(header("Transfer-Encoding")) != "chunked")) {
    return ApiError{501, "only the chunked transfer coding is supported", "",
                    "unsupported_transfer_encoding"};
  }
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
  const char* origin = header("Origin");
  // The chat page's own requests: a browser sends Origin on a same-origin POST too. It is its
  // own only when the Host is one this server answers to (the check above ran) or an IP address:
  // a rebound domain's page would claim a name of its own. (Behind a TLS proxy the page's origin
  // is https://...: give it with --cors-origin.)
  const char* host = header("Host");
  const bool same_origin = origin != nullptr && host != nullptr &&
                           (!any_host || is_ip_literal(host_name_of(host))) &&
                           lower(origin) == "http://" + lower(host);
  if (origin != nullptr && !same_origin) {
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
  const bool wants_post =
      x.path == "/v1/completions" || x.path == "/v1/chat/completions" || x.path == "/v1/embeddings";
  const bool known = wants_post || x.path == "/" || x.path == "/health" || x.path == "/v1/models";
  if (!known) {
    return ApiError{404, "no such endpoint: " + x.method + " " + x.path, "", "not_found"};
  }
  if (std::strcmp(method, "OPTIONS") == 0) return std::nullopt;  // a preflight: answered later
  if (wants_post ? !is_post : !is_get) {
    ApiError e{405, x.method + " is not allowed on " + x.path, "", "method_not_allowed"};
    e.headers.emplace_back("Allow", wants_post ? "POST, OPTIONS" : "GET, OPTIONS");
    return e;
  }
  // The page carries no secret: it asks for the key, which its requests then carry.
  if (!options.api_key.empty() && x.path != "/health" && x.path != "/") {
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
    if (const std::optional<ApiError> refused = refusal(c, *x, method, version)) {
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
      // The headers a page may send grant it nothing (the API key still decides), so it gets
      // those it asks for: OpenAI's SDKs send x-stainless-* headers.
      const char* asked = MHD_lookup_connection_value(x.connection, MHD_HEADER_KIND,
                                                      "Access-Control-Request-Headers");
      const bool listed = asked != nullptr && is_token_list(asked);
      Reply preflight{204, "", {}, ""};
      preflight.headers = {
          {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
          {"Access-Control-Allow-Headers", listed ? asked : "Authorization, Content-Type"},
          {"Access-Control-Max-Age", "600"},
          {"Vary", "Access-Control-Request-Headers"}};
      return send(x, preflight);
    }
    if (x.path == "/") return send(x, chat_page());
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
  const bool typed = std::any_of(reply.headers.begin(), reply.headers.end(),
                                 [](const auto& h) { return h.first == "Content-Type"; });
  if (!reply.body.empty() && !typed) {
    MHD_add_response_header(response, "Content-Type", "application/json");
  }
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
    if (!trim_since && x->method == "POST") trim_since = Clock::now();  // not after probes
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

// ---- Watching connections ---------------------------------------------------------------------

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

// ---- Listening --------------------------------------------------------------------------------

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
  // From 16 connections on, one client address holds at most 7/8 of them, so that a client
  // holding idle sockets leaves room for a probe or another client from elsewhere (0: no limit;
  // a smaller cap is all one client's, who may need a stream and a probe at once).
  const int cap = s.options.max_connections;
  const auto per_client = static_cast<unsigned>(cap >= 16 ? cap - cap / 8 : 0);
  s.daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
      0, accept_callback, &s, request_callback, &s,
      // First, or libmicrohttpd says so on stderr at every start.
      MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, &s, MHD_OPTION_LISTEN_SOCKET, fd,
      // One over the cap keeps libmicrohttpd accepting, so that accept_callback closes the rest.
      MHD_OPTION_CONNECTION_LIMIT, static_cast<unsigned>(cap) + 1,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_client, MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned>(s.options.timeout_seconds), MHD_OPTION_NOTIFY_COMPLETED,
      completed_callback, &s, MHD_OPTION_NOTIFY_CONNECTION, connection_callback, &s,
      MHD_OPTION_END);
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
