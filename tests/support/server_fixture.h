// The server test fixture: a model opened once per suite, a server started per test on a free
// port, and an OpenAI client's view of it (cpp-httplib's client).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <cstdlib>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "qhx/qhx.h"
#include "server/chat_output.h"
#include "server/server.h"
#include "support/fixtures.h"

namespace qhx::server {

using Json = nlohmann::json;
using namespace std::chrono_literals;

inline const std::string kModelDir = (test::source_dir() / "models/qwen3.5-kjv").string();
// The model's whole context: a generation that is not cancelled takes ~4000 tokens to end.
constexpr int64_t kContext = 4096;

// One model for the whole suite, with no shared prefix cache: reuse then comes only from a
// slot's own state, which is what the slot choice is tested on.
class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { open_model(kModelDir); }
  static void open_model(const std::string& dir, int64_t context = kContext) {
    qhx_model_options options;
    qhx_model_options_default(&options);
    options.context_length = context;
    options.max_sessions = 3;
    // QHX_TEST_DEVICE=vulkan runs the same tests with prompts on the GPU (tests/CMakeLists.txt).
    options.device = std::getenv("QHX_TEST_DEVICE");
    ASSERT_EQ(qhx_model_open(dir.c_str(), &options, &model_), QHX_OK) << qhx_last_error();
    if (options.device != nullptr) {
      qhx_model_info info;
      ASSERT_EQ(qhx_model_get_info(model_, &info), QHX_OK);
      ASSERT_STRNE(info.prefill_device, "cpu") << info.device_note;
    }
  }
  static void TearDownTestSuite() {
    qhx_model_close(model_);
    model_ = nullptr;
  }
  void TearDown() override {
    if (server_) server_->stop();
    server_.reset();
  }

  void start(int parallel = 2, int queue = 8, size_t max_request_bytes = 1 << 20,
             const std::string& alias = "") {
    ServerOptions o;
    o.parallel = parallel;
    o.queue = queue;
    o.max_request_bytes = max_request_bytes;
    o.alias = alias;
    start(o);
  }
  void start(ServerOptions o) {
    o.port = 0;
    server_ = std::make_unique<Server>(model_, o);
    port_ = server_->start();
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120s);
    return c;
  }

  // POST, answer parsed (status, body).
  std::pair<int, Json> post(const std::string& path, const std::string& body) const {
    auto c = client();
    const auto r = c.Post(path.c_str(), body, "application/json");
    if (!r) return {-1, Json()};
    return {r->status, Json::parse(r->body, nullptr, false)};
  }
  std::pair<int, Json> post(const std::string& path, const Json& body) const {
    return post(path, body.dump());
  }

  Json get(const std::string& path) const {
    auto c = client();
    const auto r = c.Get(path.c_str());
    EXPECT_TRUE(r && r->status == 200) << path;
    return r ? Json::parse(r->body, nullptr, false) : Json();
  }

  // A streamed request: the data of each event, in order. `keep_reading` may hang up early.
  std::vector<std::string> stream(
      const std::string& path, const Json& body,
      const std::function<bool(size_t events)>& keep_reading = nullptr) const {
    std::vector<std::string> events;
    std::string buffer;
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      buffer.append(data, n);
      for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
        const std::string event = buffer.substr(0, end);
        buffer.erase(0, end + 2);
        EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
        events.push_back(event.substr(6));
      }
      return !keep_reading || keep_reading(events.size());
    };
    auto c = client();
    c.send(req);
    return events;
  }

  // The C API's answer to a prompt on a fresh session: greedy, `max_new` tokens.
  static qhx_generate_result direct(const std::vector<int32_t>& prompt, int64_t max_new) {
    qhx_session* session = nullptr;
    EXPECT_EQ(qhx_session_create(model_, nullptr, &session), QHX_OK) << qhx_last_error();
    qhx_generate_options options;
    qhx_generate_options_default(model_, &options);
    options.max_new_tokens = max_new;
    options.sampling.greedy = 1;
    qhx_generate_result result{};
    EXPECT_EQ(qhx_session_generate(session, prompt.data(), prompt.size(), &options, nullptr,
                                   nullptr, &result),
              QHX_OK)
        << qhx_last_error();
    qhx_session_destroy(session);
    return result;
  }

  static std::vector<int32_t> tokenize(const std::string& text) {
    std::vector<int32_t> ids(text.size() + 16);
    size_t n = 0;
    EXPECT_EQ(qhx_tokenize(model_, text.data(), text.size(), ids.data(), ids.size(), &n), QHX_OK);
    ids.resize(n);
    return ids;
  }

  // The chat template rendered, or nothing if this build has no template engine.
  static std::optional<std::string> chat_text(const Json& messages, const Json& tools = nullptr) {
    char* text = nullptr;
    qhx_template_options t;
    qhx_template_options_default(&t);
    Json request = {{"messages", messages}};
    if (!tools.is_null()) request["tools"] = tools;
    if (qhx_apply_chat_template(model_, request.dump().c_str(), &t, &text) != QHX_OK) {
      return std::nullopt;
    }
    std::string rendered = text;
    qhx_string_free(text);
    return rendered;
  }
  static std::optional<std::vector<int32_t>> chat_tokens(const Json& messages) {
    const auto text = chat_text(messages);
    if (!text) return std::nullopt;
    return tokenize(*text);
  }

  // A tool call as the model `written` it, parsed as the server answers it (its arguments must
  // be `arguments`), sent back with the tool's `result`: the next turn must render through the
  // template with the call as an object and be what the server ran. Returns that rendering.
  std::string tool_round_trip(const Json& question, const Json& tools, const std::string& written,
                              const Json& arguments, const std::string& result) const {
    OutputFormat format;
    format.tool_calls = true;
    format.tools = tools;
    const Json call = assistant_message(parse_chat_output(written, format), "chatcmpl-7");
    EXPECT_TRUE(call["content"].is_null()) << call;
    if (!call.contains("tool_calls") || call["tool_calls"].size() != 1) {
      ADD_FAILURE() << "not one tool call: " << call;
      return "";
    }
    EXPECT_EQ(Json::parse(call["tool_calls"][0]["function"]["arguments"].get<std::string>()),
              arguments);
    const Json history = Json::array(
        {question,
         call,
         {{"role", "tool"}, {"tool_call_id", call["tool_calls"][0]["id"]}, {"content", result}}});
    const auto [status, body] =
        post("/v1/chat/completions",
             Json{{"messages", history}, {"tools", tools}, {"max_tokens", 4}, {"temperature", 0}});
    EXPECT_EQ(status, 200) << body;
    EXPECT_TRUE(body["choices"][0]["message"]["content"].is_string()) << body;
    // What the template should have seen: content "" and the arguments as an object.
    Json expected = history;
    expected[1]["content"] = "";
    expected[1]["tool_calls"][0]["function"]["arguments"] = arguments;
    const std::optional<std::string> rendered = chat_text(expected, tools);
    if (!rendered) {
      ADD_FAILURE() << qhx_last_error();
      return "";
    }
    EXPECT_NE(rendered->find("<tool_response>\n" + result + "\n</tool_response>"),
              std::string::npos)
        << *rendered;
    EXPECT_EQ(body["usage"]["prompt_tokens"], static_cast<int64_t>(tokenize(*rendered).size()));
    return *rendered;
  }

  static std::string text_of(const qhx_generate_result& r) { return r.text ? r.text : ""; }

  Json health() const { return get("/health"); }

  // Polls /health until `pred` holds or `limit` passes.
  bool wait_for_health(const std::function<bool(const Json&)>& pred,
                       std::chrono::milliseconds limit) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred(health())) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  static inline qhx_model* model_ = nullptr;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

// A long generation that only a hang-up ends early: eos ignored, the context's worth of tokens.
inline Json endless(const std::string& prompt) {
  return {{"prompt", prompt},
          {"max_tokens", kContext - 16},
          {"temperature", 0},
          {"ignore_eos", true},
          {"stream", true}};
}

inline void expect_usage(const Json& usage, int64_t prompt, int64_t completion) {
  ASSERT_TRUE(usage.is_object()) << usage;
  EXPECT_EQ(usage["prompt_tokens"], prompt);
  EXPECT_EQ(usage["completion_tokens"], completion);
  EXPECT_EQ(usage["total_tokens"], prompt + completion);
}

inline void expect_error(const std::pair<int, Json>& answer, int status,
                         const std::string& param = "", const std::string& code = "") {
  EXPECT_EQ(answer.first, status) << answer.second;
  const Json& body = answer.second;
  ASSERT_TRUE(body.is_object() && body.contains("error")) << body;
  const Json& e = body["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << e;
  EXPECT_TRUE(e["type"].is_string()) << e;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << e;
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << e;
  }
  if (!code.empty()) {
    EXPECT_EQ(e["code"], code) << e;
  }
}

}  // namespace qhx::server
