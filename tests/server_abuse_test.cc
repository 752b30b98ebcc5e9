// The server against clients that misbehave, on loopback: budgets hold before any work (body
// limits for every transfer encoding, a parse linear in the body, deadlines and a connection cap
// that keep /health answering), errors are honest (a 400 before any 200, a stream ended by
// shutdown says so), only the clients allowed get in, and HTTP/1.0, half-closed and pipelining
// clients are served. Each case is one of the issue's reproducers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "support/server_fixture.h"

namespace qhx::server {
namespace {

using Clock = std::chrono::steady_clock;

// A client that writes raw bytes and reads whatever comes back.
class RawClient {
 public:
  // `from`: the loopback address to connect from (all of 127/8 is loopback on Linux), so that
  // one machine can be several clients.
  explicit RawClient(int port, const char* from = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (from != nullptr) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, from, &local.sin_addr);
      bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  bool bound() const { return bound_; }  // to the address asked for, if one was
  // False once the server stopped taking bytes (it answered and closed).
  bool send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  void half_close() { ::shutdown(fd_, SHUT_WR); }
  // Everything until the server closes the connection, `until` appears, or `limit` passes.
  std::string read(std::chrono::milliseconds limit, const std::string& until = "") {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (!until.empty() && received_.find(until) != std::string::npos) break;
      pollfd p{fd_, POLLIN, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1))) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      received_.append(buf, static_cast<size_t>(n));
    }
    return received_;
  }
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool bound_ = true;
  bool closed_ = false;
  std::string received_;
};

int status_of(const std::string& response) {
  return response.rfind("HTTP/1.", 0) == 0 && response.size() > 12
             ? std::stoi(response.substr(9, 3))
             : -1;
}

std::string body_of(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

std::string post_request(const std::string& body, const std::string& version = "HTTP/1.1",
                         const std::string& extra_headers = "") {
  return "POST /v1/completions " + version + "\r\nHost: 127.0.0.1\r\nContent-Type: " +
         "application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
         extra_headers + "\r\n" + body;
}

class ServerAbuseTest : public ServerTest {
 protected:
  // GET with headers; (status, body, the response's headers).
  httplib::Result get_with(const std::string& path, const httplib::Headers& headers) const {
    auto c = client();
    return c.Get(path.c_str(), headers);
  }
  std::pair<int, Json> post_with(const std::string& path, const Json& body,
                                 const httplib::Headers& headers) const {
    auto c = client();
    const auto r = c.Post(path.c_str(), headers, body.dump(), "application/json");
    if (!r) return {-1, Json()};
    return {r->status, Json::parse(r->body, nullptr, false)};
  }
};

// D1: the body limit holds for chunked bodies as for sized ones, and what is over it is dropped
// as it arrives (the server keeps at most the limit).
TEST_F(ServerAbuseTest, BodyLimitHoldsForEveryTransferEncoding) {
  start(1, 8, 64 << 10);
  const std::string small = Json{{"prompt", "And"}, {"max_tokens", 1}}.dump();
  const auto chunked = [&](const std::string& body, size_t repeat) {
    RawClient c(port_);
    c.send(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n");
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", body.size());
    for (size_t i = 0; i < repeat; ++i) {
      if (!c.send(size + body + "\r\n")) break;
    }
    c.send("0\r\n\r\n");
    return c.read(20s, "}");
  };
  const std::string ok = chunked(small, 1);
  EXPECT_EQ(status_of(ok), 200) << ok;
  // 8 MiB in 64 KiB chunks, against a 64 KiB limit.
  const std::string big = chunked(std::string(64 << 10, ' '), 128);
  EXPECT_EQ(status_of(big), 413) << big.substr(0, 200);
  EXPECT_EQ(Json::parse(body_of(big), nullptr, false)["error"]["code"], "request_too_large");
  // With a Content-Length over the limit the answer comes before the body is read.
  RawClient sized(port_);
  sized.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 9000000\r\n\r\n");
  const std::string early = sized.read(5s, "}");
  EXPECT_EQ(status_of(early), 413) << early;
  EXPECT_EQ(post("/v1/completions", Json{{"prompt", "And"}, {"max_tokens", 1}}).first, 200);
}

// D2: 200,000 keys in an ignored field, and a logit_bias over the whole vocabulary, are answered
// within a second (quadratic parsing took 12 s and 11 s; the bound scales for sanitizer builds).
TEST_F(ServerAbuseTest, ManyKeysAreAnsweredQuickly) {
  start(1, 8, 4 << 20);
  std::string body = R"({"prompt": "And", "max_tokens": 1, "x": {)";
  for (int i = 0; i < 200000; ++i) body += (i ? ",\"" : "\"") + std::to_string(i) + "\":0";
  body += "}}";
  auto started = Clock::now();
  EXPECT_EQ(post("/v1/completions", body).first, 200);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - started).count(),
            1.0 * test::kBuildSlowdown);

  // As many keys in a message that has reasoning (copied to "thinking" and back).
  std::string reasoning = R"({"messages": [{"role": "user", "content": "And"}, )"
                          R"({"role": "assistant", "content": "a", "reasoning_content": "r", )";
  for (int i = 0; i < 200000; ++i) reasoning += "\"k" + std::to_string(i) + "\":0,";
  reasoning += R"("x": 0}, {"role": "user", "content": "And"}], "max_tokens": 1})";
  started = Clock::now();
  EXPECT_EQ(post("/v1/chat/completions", reasoning).first, 200);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - started).count(),
            1.0 * test::kBuildSlowdown);

  // A2: as many template keyword arguments (each a template variable).
  std::string chat = R"({"messages": [{"role": "user", "content": "And"}], "max_tokens": 1, )"
                     R"("chat_template_kwargs": {)";
  for (int i = 0; i < 200000; ++i) chat += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  chat += "}}";
  started = Clock::now();
  EXPECT_EQ(post("/v1/chat/completions", chat).first, 200);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - started).count(),
            1.0 * test::kBuildSlowdown);

  qhx_model_info info{};
  qhx_model_get_info(model_, &info);
  Json bias = Json::object();
  for (int64_t id = 0; id < info.vocab_size; ++id) bias[std::to_string(id)] = 0;
  const std::string biased =
      Json{{"prompt", "And"}, {"max_tokens", 1}, {"logit_bias", bias}}.dump();
  started = Clock::now();
  EXPECT_EQ(post("/v1/completions", biased).first, 200);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - started).count(),
            1.0 * test::kBuildSlowdown);
}

// D3: 32 connections that send a header and stall, while both slots generate, leave /health
// answering within 100 ms; a client that dribbles a byte at a time is cut off at its deadline.
TEST_F(ServerAbuseTest, SlowClientsDoNotStarveOthers) {
  ServerOptions o;
  o.parallel = 2;
  o.timeout_seconds = 2;
  start(o);
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < 32; ++i) {
    slow.push_back(std::make_unique<RawClient>(port_));
    slow.back()->send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  }
  std::atomic<bool> hang_up{false};
  const auto until_hang_up = [&](size_t) { return !hang_up.load(); };
  std::thread a([&] { stream("/v1/completions", endless("And God said"), until_hang_up); });
  std::thread b([&] { stream("/v1/completions", endless("Thus saith"), until_hang_up); });
  ASSERT_TRUE(wait_for_health([](const Json& h) { return h["slots_processing"] == 2; }, 10s));
  double worst = 0;
  for (int i = 0; i < 20; ++i) {
    const auto started = Clock::now();
    const Json h = health();
    worst = std::max(worst, std::chrono::duration<double>(Clock::now() - started).count());
    EXPECT_EQ(h["status"], "ok");
  }
  EXPECT_LT(worst, 0.1 * test::kBuildSlowdown);
  hang_up = true;
  a.join();
  b.join();

  RawClient dribbler(port_);
  const std::string request = post_request(Json{{"prompt", "And"}}.dump());
  const auto started = Clock::now();
  for (size_t i = 0; i < request.size() && dribbler.send(request.substr(i, 1)); ++i) {
    if (Clock::now() - started > 6s) break;
    std::this_thread::sleep_for(100ms);
  }
  dribbler.read(1s);
  EXPECT_TRUE(dribbler.closed());
  EXPECT_LT(Clock::now() - started, 5s);
  // The stalled connections were cut off too.
  for (auto& c : slow) {
    c->read(1s);
    EXPECT_TRUE(c->closed());
  }
}

// D4: what the C API would refuse is a 400 with an OpenAI error body, before any 200 — streams
// included; min_p 1 (only the most likely tokens) is a valid value.
TEST_F(ServerAbuseTest, ValuesTheCApiRefusesAre400) {
  start(1);
  const auto with = [](Json extra, bool stream) {
    Json j = {{"prompt", "And"}, {"max_tokens", 2}, {"stream", stream}};
    j.update(extra);
    return j;
  };
  for (const bool stream : {false, true}) {
    expect_error(post("/v1/completions", with({{"temperature", 1e-300}}, stream)), 400,
                 "temperature");
    expect_error(post("/v1/completions", with({{"top_p", 1e-300}}, stream)), 400, "top_p");
    expect_error(post("/v1/completions", with({{"repetition_penalty", 1e-300}}, stream)), 400,
                 "repetition_penalty");
    expect_error(post("/v1/completions", with({{"stop", std::string("\0", 1)}}, stream)), 400,
                 "stop");
    // Not UTF-8: the JSON parser refuses it.
    expect_error(post("/v1/completions", std::string(R"({"prompt": "And", "stop": ")") + "\xff\"}"),
                 400);
  }
  EXPECT_EQ(post("/v1/completions", with({{"min_p", 1}}, false)).first, 200);
}

// D6 and D4's last case: stopping the server refuses what waits (503) and ends a stream that
// began with an error event, never a finish_reason.
// A stream running and a request queued when the server is told to stop: the queued one gets a
// 503, the stream ends with the server_shutdown error event and [DONE], and no chunk says the
// answer finished.
class ShutdownTest : public ServerAbuseTest {
 public:
  void expect_honest_shutdown(const std::function<void()>& stop) {
    std::vector<std::string> events;
    std::atomic<bool> streaming{false};
    std::thread running([&] {
      events = stream("/v1/completions", endless("And God said"), [&](size_t n) {
        if (n >= 2) streaming = true;
        return true;
      });
    });
    const auto deadline = Clock::now() + 60s;
    while (!streaming && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
    std::pair<int, Json> queued;
    std::thread waiting([&] {
      queued = post("/v1/completions", Json{{"prompt", "And"}, {"max_tokens", 4}});
    });
    const bool was_queued =
        streaming && wait_for_health([](const Json& h) { return h["queue_length"] == 1; }, 30s);
    stop();
    running.join();
    waiting.join();
    ASSERT_TRUE(streaming);
    ASSERT_TRUE(was_queued);
    expect_error(queued, 503, "", "server_shutdown");
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events.back(), "[DONE]");
    const Json last = Json::parse(events[events.size() - 2], nullptr, false);
    ASSERT_TRUE(last.contains("error")) << events[events.size() - 2];
    EXPECT_EQ(last["error"]["code"], "server_shutdown");
    for (const std::string& e : events) {
      const Json chunk = Json::parse(e, nullptr, false);
      if (!chunk.is_object() || !chunk.contains("choices")) continue;
      for (const Json& choice : chunk["choices"])
        EXPECT_TRUE(choice["finish_reason"].is_null()) << e;
    }
  }
};

TEST_F(ShutdownTest, ShutdownIsNotAFinishedAnswer) {
  start(1, 4);
  expect_honest_shutdown([&] { server_->stop(); });
}

// `qhx serve` as systemd and Ctrl-C stop it: SIGTERM or SIGINT to the process, whose model has
// compute threads (and, on Vulkan, the driver's) started before any request. It must end as
// Server::stop() does and exit 0, never by the signal's default action.
class ServeProcess {
 public:
  explicit ServeProcess(const std::string& extra_args, const std::string& environment = "") {
    const std::string command = environment + "exec " + QHX_CLI_PATH + " serve --model " +
                                kModelDir + " --port 0 --parallel 1 --queue 4 -c 4096 " +
                                extra_args + " 2>" + (log_.path() / "err").string();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~ServeProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // The port it listens on (0 if it did not say within the time).
  int port() const {
    const auto deadline = Clock::now() + 120s;
    const std::string mark = "listening on http://127.0.0.1:";
    while (Clock::now() < deadline) {
      const std::string err = log();
      if (const size_t at = err.find(mark); at != std::string::npos) {
        return std::atoi(err.c_str() + at + mark.size());
      }
      std::this_thread::sleep_for(20ms);
    }
    return 0;
  }
  void signal(int number) const { ::kill(pid_, number); }
  // The exit status as the shell's $? gives it (128 + N for signal N).
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string log() const { return test::read_file(log_.path() / "err"); }

 private:
  test::TempDir log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

void expect_clean_stop(ShutdownTest& test, const std::string& args, int signal_number, int& port) {
  ServeProcess serve(args);
  port = serve.port();
  ASSERT_NE(port, 0) << serve.log();
  test.expect_honest_shutdown([&] { serve.signal(signal_number); });
  EXPECT_EQ(serve.wait(), 0) << serve.log();
  EXPECT_NE(serve.log().find("stopping (signal " + std::to_string(signal_number) + ")"),
            std::string::npos)
      << serve.log();
}

TEST_F(ShutdownTest, StopSignalsEndTheServeProcessCleanly) {
  for (const int signal_number : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(signal_number);
    expect_clean_stop(*this, "-t 2", signal_number, port_);
  }
}

// The Vulkan driver starts threads of its own as the device opens, even with -t 1. (Lavapipe's
// JIT keeps allocations to exit, so a sanitizer build's leak check is off for this process.)
TEST_F(ShutdownTest, StopSignalsEndTheServeProcessCleanlyOnVulkan) {
  ServeProcess serve("-t 1 --device vulkan", "ASAN_OPTIONS=detect_leaks=0 ");
  port_ = serve.port();
  ASSERT_NE(port_, 0) << serve.log();
  if (serve.log().find("prompts on vulkan") == std::string::npos) {
    if (std::getenv("QHX_REQUIRE_VULKAN") != nullptr) FAIL() << serve.log();
    GTEST_SKIP() << "no Vulkan device: " << serve.log();
  }
  expect_honest_shutdown([&] { serve.signal(SIGTERM); });
  EXPECT_EQ(serve.wait(), 0) << serve.log();
}

// D8: an API key as OpenAI clients send it; /health stays open for load balancers.
TEST_F(ServerAbuseTest, ApiKeyIsChecked) {
  ServerOptions o;
  o.api_key = "sekrit";
  start(o);
  const Json request = {{"prompt", "And"}, {"max_tokens", 1}};
  expect_error(post("/v1/completions", request), 401, "", "invalid_api_key");
  expect_error(post_with("/v1/completions", request, {{"Authorization", "Bearer wrong"}}), 401, "",
               "invalid_api_key");
  EXPECT_EQ(post_with("/v1/completions", request, {{"Authorization", "Bearer sekrit"}}).first, 200);
  const auto models = get_with("/v1/models", {});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  EXPECT_EQ(models->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(get_with("/health", {})->status, 200);
}

// The chat page: served at / without the key (it asks for it), as HTML that loads nothing from
// elsewhere; its own requests carry their origin and pass; a page elsewhere's still do not, nor
// does a rebound domain claiming to be the page.
TEST_F(ServerAbuseTest, ChatPageIsServedAndOnlyItsOwnOriginPasses) {
  ServerOptions o;
  o.api_key = "sekrit";
  start(o);
  const std::string port = std::to_string(port_);
  const auto page = get_with("/", {});
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("connect-src 'self'"),
            std::string::npos);
  EXPECT_EQ(page->body, test::read_file(test::source_dir() / "src/server/chat_page.html"));
  auto c = client();
  const auto post_page = c.Post("/", "{}", "application/json");
  ASSERT_TRUE(post_page);
  EXPECT_EQ(post_page->status, 405);
  const Json request = {{"prompt", "And"}, {"max_tokens", 1}};
  const httplib::Headers own = {{"Host", "127.0.0.1:" + port},
                                {"Origin", "http://127.0.0.1:" + port},
                                {"Authorization", "Bearer sekrit"}};
  EXPECT_EQ(post_with("/v1/completions", request, own).first, 200);
  expect_error(post_with("/v1/completions", request,
                         {{"Origin", "http://evil.example"}, {"Authorization", "Bearer sekrit"}}),
               403, "", "origin_not_allowed");
  // A rebound domain's page sends its own name as Host and Origin alike: the Host check stops it.
  expect_error(post_with("/v1/completions", request,
                         {{"Host", "rebound.example:" + port},
                          {"Origin", "http://rebound.example:" + port},
                          {"Authorization", "Bearer sekrit"}}),
               403, "", "host_not_allowed");
}

// With every Host answered (--allowed-host '*'), a name in Host and Origin proves nothing: only an
// IP address's page counts as the chat page's own.
TEST_F(ServerAbuseTest, AnyHostLeavesOnlyIpOriginsTheirOwn) {
  ServerOptions o;
  o.allowed_hosts = {"*"};
  start(o);
  const std::string port = std::to_string(port_);
  const Json request = {{"prompt", "And"}, {"max_tokens", 1}};
  expect_error(post_with("/v1/completions", request,
                         {{"Host", "rebound.example:" + port},
                          {"Origin", "http://rebound.example:" + port}}),
               403, "", "origin_not_allowed");
  EXPECT_EQ(post_with("/v1/completions", request,
                      {{"Host", "127.0.0.1:" + port}, {"Origin", "http://127.0.0.1:" + port}})
                .first,
            200);
}

// D8: a page on another site (or a rebound domain) cannot use the server; an allowed origin can,
// preflight included.
TEST_F(ServerAbuseTest, HostAndOriginAreChecked) {
  ServerOptions o;
  o.cors_origins = {"http://app.example"};
  start(o);
  const std::string port = std::to_string(port_);
  EXPECT_EQ(get_with("/v1/models", {{"Host", "rebound.example:" + port}})->status, 403);
  EXPECT_EQ(get_with("/v1/models", {{"Host", "localhost:" + port}})->status, 200);
  EXPECT_EQ(get_with("/v1/models", {{"Host", "127.0.0.1:" + port}})->status, 200);
  const Json request = {{"prompt", "And"}, {"max_tokens", 1}};
  expect_error(post_with("/v1/completions", request, {{"Origin", "http://evil.example"}}), 403, "",
               "origin_not_allowed");
  auto c = client();
  const auto allowed = c.Post("/v1/completions", {{"Origin", "http://app.example"}}, request.dump(),
                              "application/json");
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->status, 200);
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  const auto preflight = c.Options("/v1/completions", {{"Origin", "http://app.example"},
                                                       {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 204);
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Headers").find("Authorization"),
            std::string::npos);
  // A5: the headers a page asks for (OpenAI's JavaScript SDK sends x-stainless-*), if they are
  // header names; anything else gets the default list.
  const std::string asked = "authorization,content-type,x-stainless-os,x-stainless-retry-count";
  const auto sdk = c.Options("/v1/chat/completions", {{"Origin", "http://app.example"},
                                                      {"Access-Control-Request-Method", "POST"},
                                                      {"Access-Control-Request-Headers", asked}});
  ASSERT_TRUE(sdk);
  EXPECT_EQ(sdk->status, 204);
  EXPECT_EQ(sdk->get_header_value("Access-Control-Allow-Headers"), asked);
  const auto odd = c.Options("/v1/chat/completions", {{"Origin", "http://app.example"},
                                                      {"Access-Control-Request-Headers", "a(b)"}});
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->get_header_value("Access-Control-Allow-Headers"), "Authorization, Content-Type");
  // A8: what the client sent is quoted whole (only the library's file paths are shortened).
  const auto evil = post_with("/v1/completions", request, {{"Origin", "https://evil.example"}});
  EXPECT_NE(evil.second["error"]["message"].get<std::string>().find("https://evil.example"),
            std::string::npos)
      << evil.second;
  const auto slash = post("/v1/completions/", request);
  EXPECT_EQ(slash.first, 404);
  EXPECT_EQ(slash.second["error"]["message"], "no such endpoint: POST /v1/completions/");
  const auto wrong_method = get_with("/v1/completions", {});
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(Json::parse(wrong_method->body)["error"]["message"],
            "GET is not allowed on /v1/completions");
}

// A3: past --max-connections a connection is closed as it comes, never left waiting; one client
// address holds at most 7/8 of them, so a client holding idle sockets does not lock others out.
TEST_F(ServerAbuseTest, ConnectionsPastTheCapAreClosedAtOnce) {
  ServerOptions o;
  o.max_connections = 16;
  start(o);
  const std::string health = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 14; ++i) idle.push_back(std::make_unique<RawClient>(port_, "127.0.0.1"));
  RawClient over_share(port_, "127.0.0.1");
  over_share.send(health);
  const auto started = Clock::now();
  over_share.read(5s);
  EXPECT_TRUE(over_share.closed());
  EXPECT_LT(Clock::now() - started, 2s);
  RawClient other(port_, "127.0.0.2");
  if (!other.bound()) GTEST_SKIP() << "no loopback address but 127.0.0.1 here";
  other.send(health);
  EXPECT_EQ(status_of(other.read(5s, "\r\n\r\n")), 200);
  std::this_thread::sleep_for(200ms);  // the probe's closed connection is counted out
  for (int i = 0; i < 2; ++i) idle.push_back(std::make_unique<RawClient>(port_, "127.0.0.3"));
  std::this_thread::sleep_for(200ms);  // and these are accepted: the cap is full
  RawClient over_cap(port_, "127.0.0.4");
  over_cap.send(health);
  const auto probed = Clock::now();
  const std::string refused = over_cap.read(5s);
  EXPECT_TRUE(over_cap.closed());
  EXPECT_EQ(status_of(refused), -1) << refused;
  EXPECT_LT(Clock::now() - probed, 2s);
  idle.pop_back();
  std::this_thread::sleep_for(200ms);
  RawClient after(port_, "127.0.0.4");
  after.send(health);
  EXPECT_EQ(status_of(after.read(5s, "\r\n\r\n")), 200);
}

// A4: framing that a proxy in front could read otherwise (RFC 9112 §6.3) is refused at once and
// the connection closed; HTTP/1.1 needs exactly one Host. Answered in JSON, never after a timeout.
TEST_F(ServerAbuseTest, AmbiguousFramingIsRefused) {
  start(1);
  const std::string body = Json{{"prompt", "And"}, {"max_tokens", 1}}.dump();
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  const std::string length = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  const std::string chunked = "5\r\nhello\r\n0\r\n\r\n";
  const struct {
    const char* what;
    std::string request;
    int status;
    const char* code;
  } cases[] = {
      {"two Content-Lengths",
       head + length + "Content-Length: " + std::to_string(body.size() + 5) + "\r\n\r\n" + body,
       400, "invalid_framing"},
      {"Transfer-Encoding and Content-Length",
       head + "Transfer-Encoding: chunked\r\n" + length + "\r\n" + chunked, 400, "invalid_framing"},
      {"unknown Transfer-Encoding", head + "Transfer-Encoding: gzip\r\n\r\n" + chunked, 501,
       "unsupported_transfer_encoding"},
      {"no Host", "GET /health HTTP/1.1\r\n\r\n", 400, "invalid_host"},
      {"two Hosts", "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n", 400,
       "invalid_host"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    RawClient client(port_);
    client.send(c.request);
    const auto started = Clock::now();
    const std::string answer = client.read(10s);
    EXPECT_LT(Clock::now() - started, 3s);
    EXPECT_EQ(status_of(answer), c.status) << answer;
    EXPECT_EQ(Json::parse(body_of(answer), nullptr, false)["error"]["code"], c.code) << answer;
    EXPECT_TRUE(client.closed());
  }
  RawClient http10(port_);  // HTTP/1.0 may leave Host out
  http10.send("GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(status_of(http10.read(5s)), 200);
}

// A7: libmicrohttpd's "EXTERNAL_LOGGER is not the first option" line is not printed at start.
TEST_F(ServerAbuseTest, StartsWithoutTheLibrarysWarning) {
  ::testing::internal::CaptureStderr();
  start(1);
  server_->stop();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("EXTERNAL_LOGGER"), std::string::npos) << err;
}

// D9: HTTP/1.0 gets a close-delimited stream (no chunked encoding it cannot read), also when it
// half-closes after sending; an HTTP/1.1 client's pipelined requests are answered in order,
// without a stall.
TEST_F(ServerAbuseTest, HttpAsClientsSpeakIt) {
  start(1);
  const std::string stream_body =
      Json{{"prompt", "And"}, {"max_tokens", 3}, {"temperature", 0}, {"stream", true}}.dump();
  for (const bool half_close : {false, true}) {
    RawClient c(port_);
    c.send(post_request(stream_body, "HTTP/1.0"));
    if (half_close) c.half_close();
    const std::string answer = c.read(20s);
    EXPECT_EQ(status_of(answer), 200) << answer;
    EXPECT_EQ(answer.find("chunked"), std::string::npos) << answer;
    EXPECT_NE(body_of(answer).rfind("data: [DONE]\n\n"), std::string::npos) << answer;
    EXPECT_TRUE(c.closed());
  }
  RawClient c(port_);
  const std::string body = Json{{"prompt", "And"}, {"max_tokens", 2}, {"temperature", 0}}.dump();
  const auto started = Clock::now();
  c.send(post_request(body) + post_request(body, "HTTP/1.1", "Connection: close\r\n"));
  const std::string answers = c.read(20s);
  EXPECT_LT(Clock::now() - started, 4s);
  size_t n_answers = 0;
  for (size_t at = 0; (at = answers.find("HTTP/1.1 200", at)) != std::string::npos; ++at)
    ++n_answers;
  EXPECT_EQ(n_answers, 2u) << answers;
}

// D11: content-part arrays are text as vLLM reads them; images and unknown roles are a 400.
TEST_F(ServerAbuseTest, ContentPartsAndRoles) {
  start(1);
  const auto ask = [&](const Json& content) {
    return post("/v1/chat/completions",
                Json{{"messages", {{{"role", "user"}, {"content", content}}}},
                     {"max_tokens", 4},
                     {"temperature", 0}});
  };
  const auto plain = ask("In the beginning");
  const auto parts = ask(Json::array({{{"type", "text"}, {"text", "In the beginning"}}}));
  ASSERT_EQ(plain.first, 200) << plain.second;
  ASSERT_EQ(parts.first, 200) << parts.second;
  EXPECT_EQ(parts.second["usage"], plain.second["usage"]);
  EXPECT_EQ(parts.second["choices"][0]["message"], plain.second["choices"][0]["message"]);
  expect_error(ask(Json::array({{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}})), 400,
               "messages[0].content[0]", "unsupported_content");
  expect_error(
      post("/v1/chat/completions", Json{{"messages", {{{"role", "wizard"}, {"content", "hi"}}}}}),
      400, "messages[0].role");
}

}  // namespace
}  // namespace qhx::server
