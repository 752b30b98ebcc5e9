// OpenAI request bodies checked against a model: the C API's prompt and options for a completion
// or chat request, or the error (status and OpenAI error body) the server answers instead. The
// server's request contract, apart from HTTP (qhx::server::check_request runs it alone).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qhx/qhx.h"
#include "server/chat_output.h"

namespace qhx::server {

using Json = nlohmann::ordered_json;  // key order kept: templates render tools as sent

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
  std::vector<std::pair<std::string, std::string>> headers;
  // The C library's message: it may name the server's files, so clients get their names only.
  // Messages of the server's own (they may quote the client's Origin or path) go out whole.
  bool from_library = false;
};

ApiError wrong_type(const std::string& field, const char* expected);
ApiError bad_value(const std::string& field, const std::string& why);
// A failed C API call as an HTTP error: what the request caused is 400, the rest is the server's.
ApiError api_failure(qhx_status status, const std::string& param, std::string message);
ApiError api_failure(qhx_status status, const std::string& param);  // qhx_last_error()

// {"error": {"message", "type", "param", "code"}}, the message without server paths.
Json error_body(const ApiError& e);
// JSON text; should generated text not be UTF-8, U+FFFD rather than an exception.
std::string to_text(const Json& j);

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
  std::string response_format;  // the C API's (JSON text), from response_format, grammar or
                                // tool_choice; "" for none
  std::string format_param;     // which of those it came from, for errors
};

// An embeddings request (POST /v1/embeddings), parsed and checked: its inputs as texts or as
// token ids, and the C API's options, which point into the strings here.
struct Embeddings {
  Embeddings() = default;
  Embeddings(const Embeddings&) = delete;
  Embeddings& operator=(const Embeddings&) = delete;

  bool requested = false;
  std::vector<std::string> texts;  // "input" as text, or
  std::vector<int32_t> ids;        // as token ids: input i is ids[offsets[i] .. offsets[i + 1])
  std::vector<size_t> offsets;
  bool base64 = false;  // encoding_format "base64": little-endian float32 bytes
  std::string pooling, prompt, prompt_name;
  qhx_embed_options options{};
  size_t inputs() const { return texts.empty() ? offsets.size() - 1 : texts.size(); }
};

// What a request is checked against: the model, its context and its defaults.
struct RequestRules {
  // Throws std::runtime_error. Speculative decoding: qhx_generate_options' values.
  RequestRules(qhx_model* model, const std::string& alias, const std::string& speculative = "none",
               int draft_max = 4);
  RequestRules(const RequestRules&) = delete;  // defaults.speculative points into this
  RequestRules& operator=(const RequestRules&) = delete;

  // Parses and checks a completion request (chat or not) into `c`; throws ApiError.
  void parse_completion(const Json& body, Completion& c) const;
  void parse_tool_choice(const Json& body, Completion& c) const;
  void parse_response_format(const Json& body, Completion& c) const;
  // Parses and checks an embeddings request into `e`; throws ApiError.
  void parse_embeddings(const Json& body, Embeddings& e) const;
  // The request's "model", if given, must be this server's; else ApiError 404.
  void check_model(const Json& body) const;

  qhx_model* model = nullptr;
  std::string model_id;
  int64_t context_length = 0;
  int64_t vocab_size = 0;
  int64_t embedding_size = 0;
  std::vector<int32_t> eos_ids;
  qhx_generate_options defaults{};
  std::string speculative;
  bool template_takes_parts = false;
};

// The request body as a JSON object (parsed within JsonBounds), else ApiError 400.
Json parse_body(std::string_view text);

}  // namespace qhx::server
