// qhx serve: an OpenAI-compatible HTTP server (chat and text completions, streaming or not) on one
// model. It is a client of the C API (qhx/qhx.h) only. Requests take turns on `parallel` sessions
// ("slots"); a request prefers the idle slot whose state already holds the longest prefix of its
// tokens, so a client that resends its whole conversation pays only for the new turn. Requests
// that find every slot busy wait in a bounded FIFO queue; past it they get 429.
//
// HTTP is GNU libmicrohttpd on one event-loop thread: idle and slow connections cost no thread,
// and the loop itself never waits on a model. Request bodies are parsed and tokenized on
// `preparers` threads, generated on the slots' threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qhx/qhx.h"

namespace qhx::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (start() returns it)
  int parallel = 2;
  int queue = 8;
  size_t max_request_bytes = size_t{4} << 20;  // for every transfer encoding
  int max_connections = 256;  // open connections; past it new ones are closed at once
  // A request (headers and body) must arrive within this many seconds of its first byte (of the
  // connection's opening, or the end of its previous answer); a client that reads nothing of a
  // stream this long is dropped too.
  int timeout_seconds = 30;
  std::string api_key;  // non-empty: every endpoint but /health wants "Authorization: Bearer KEY"
  // Browser requests (those with an Origin header) are refused unless their origin is listed
  // here; "*" allows any.
  std::vector<std::string> cors_origins;
  // Host header values answered besides the names `host` stands for; "*" turns the check off.
  std::vector<std::string> allowed_hosts;
  std::string alias;  // the model id clients see; empty: the model directory's name
  // Speculative decoding of every request (qhx_generate_options.speculative, draft_max); the
  // timings report draft_n and draft_n_accepted.
  std::string speculative = "none";
  int draft_max = 4;
  bool log = true;  // one line per request on stderr
};

// Parses and checks `body` as a POST to `path` (/v1/completions or /v1/chat/completions) would,
// without generating: 0 if it would be served, else the HTTP status it would get, with `error`
// the message. The request contract, for fuzzing and tests.
int check_request(qhx_model* model, const std::string& path, std::string_view body,
                  std::string* error);

class Server {
 public:
  // Creates options.parallel sessions on `model`, which must outlive the server. Throws
  // std::runtime_error (with the C API's message) if the options are invalid or a session cannot
  // be created.
  Server(qhx_model* model, const ServerOptions& options);
  ~Server();  // stops, then destroys the sessions
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts serving on a thread of its own; returns the port. Throws std::runtime_error
  // if the address cannot be bound. Ignores SIGPIPE for the whole process (a client that hangs up
  // must not kill the server). Warns on stderr when it listens beyond loopback without a key.
  int start();
  // Blocks until stop() (from another thread) has stopped the server.
  void wait();
  // Refuses queued requests (503), ends running ones (a stream that began ends with an error
  // event), lets their answers go out, then stops listening. Any thread; idempotent.
  void stop();

  struct Impl;  // opaque: the event loop's C callbacks reach it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace qhx::server
