// qhx serve: an OpenAI-compatible HTTP server (chat and text completions, streaming or not) on one
// model. It is a client of the C API (qhx/qhx.h) only. Requests take turns on `parallel` sessions
// ("slots"); a request prefers the idle slot whose state already holds the longest prefix of its
// tokens, so a client that resends its whole conversation pays only for the new turn. Requests
// that find every slot busy wait in a bounded FIFO queue; past it they get 429.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "qhx/qhx.h"

namespace qhx::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (start() returns it)
  int parallel = 2;
  int queue = 8;
  size_t max_request_bytes = size_t{4} << 20;
  std::string alias;  // the model id clients see; empty: the model directory's name
  bool log = true;    // one line per request on stderr
};

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
  // must not kill the server).
  int start();
  // Blocks until stop() (from another thread) has stopped the server.
  void wait();
  // Ends queued and running requests, then stops listening. Any thread; idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qhx::server
