// What the server answers, as OpenAI's (and llama.cpp's) JSON: errors, /health, /v1/models,
// completions whole or as stream chunks, usage and timings, embeddings.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/server_impl.h"
#include "util/base64.h"
#include "util/utf8.h"

namespace qhx::server {
namespace {

double per_second(int64_t n, double ms) {
  return ms > 0 ? static_cast<double>(n) * 1e3 / ms : 0.0;
}

}  // namespace

Reply error_reply(const ApiError& e) {
  return {e.status, to_text(error_body(e)), e.headers, e.message};
}

const char* finish_reason(qhx_stop_reason reason) {
  return reason == QHX_STOP_LENGTH ? "length" : "stop";
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

// llama.cpp's names, so tools that read its timings read these (draft_n, draft_n_accepted:
// speculative decoding's draft tokens verified and kept); device_failures counts the device
// failures the CPU made up for during the request (the reply is the same).
Json Server::Impl::timings(const Outcome& o) const {
  return {{"cache_n", o.result.n_reused},
          {"prompt_n", o.result.n_processed},
          {"prompt_ms", o.result.prefill_ms},
          {"prompt_per_second", per_second(o.result.n_processed, o.result.prefill_ms)},
          {"predicted_n", o.result.n_generated},
          {"predicted_ms", o.result.decode_ms},
          {"predicted_per_second",
           per_second(std::max<int64_t>(o.result.n_generated - 1, 0), o.result.decode_ms)},
          {"ttft_ms", o.result.ttft_ms},
          {"draft_n", o.result.drafted},
          {"draft_n_accepted", o.result.accepted},
          {"device_failures", o.result.device_failures}};
}

namespace {

// A token's bytes as JSON text: a piece that ends inside a character gets U+FFFD for what is
// there of it, as transformers' decode of one token gives; `bytes` has them exactly.
std::string shown_token(std::string bytes) {
  for (size_t at = find_invalid_utf8(bytes); at != std::string::npos;
       at = find_invalid_utf8(bytes)) {
    bytes.replace(at, 1, "\xEF\xBF\xBD");
  }
  return bytes;
}

int64_t utf8_chars(std::string_view text) {
  int64_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// JSON has no -inf: OpenAI's convention for a token of no probability.
double json_logprob(float logprob) {
  return std::max<double>(logprob, -9999.0);
}

}  // namespace

void Server::Impl::add_logprobs(Exchange& x, qhx_session* session, int32_t token) {
  if (x.request.options.logprobs == 0 || token < 0) return;
  // The reply's end (an eos or stop id) is not part of its text.
  const auto& stops = x.request.options;
  if (std::find(stops.stop_ids, stops.stop_ids + stops.n_stop_ids, token) !=
          stops.stop_ids + stops.n_stop_ids ||
      (stops.stop_at_eos != 0 &&
       std::find(rules.eos_ids.begin(), rules.eos_ids.end(), token) != rules.eos_ids.end())) {
    return;
  }
  qhx_token_logprobs lp;
  if (qhx_session_token_logprobs(session, &lp) != QHX_OK) return;
  const auto described = [&](int32_t id, float logprob) {
    std::string bytes(64, '\0');
    size_t n = 0;
    if (qhx_token_bytes(rules.model, id, bytes.data(), bytes.size(), &n) ==
        QHX_ERROR_BUFFER_TOO_SMALL) {
      bytes.resize(n);
      qhx_token_bytes(rules.model, id, bytes.data(), bytes.size(), &n);
    }
    bytes.resize(n);
    Json byte_values = Json::array();
    for (const char c : bytes) byte_values.push_back(static_cast<unsigned char>(c));
    return Json{{"token", shown_token(bytes)},
                {"logprob", json_logprob(logprob)},
                {"bytes", std::move(byte_values)}};
  };
  Json entry = described(lp.token, lp.logprob);
  Json top = Json::array();
  for (int32_t i = 0; i < lp.n_top; ++i)
    top.push_back(described(lp.top_tokens[i], lp.top_logprobs[i]));
  entry["top_logprobs"] = std::move(top);
  x.text_offsets.push_back(x.text_chars);
  x.text_chars += utf8_chars(entry["token"].get<std::string>());
  x.logprobs.push_back(std::move(entry));
}

Json Server::Impl::logprobs(const Exchange& x, size_t from, size_t to) const {
  if (x.request.options.logprobs == 0) return nullptr;
  if (x.request.chat) {
    Json content = Json::array();
    for (size_t i = from; i < to; ++i) content.push_back(x.logprobs[i]);
    return {{"content", std::move(content)}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  for (size_t i = from; i < to; ++i) {
    const Json& e = x.logprobs[i];
    tokens.push_back(e["token"]);
    token_logprobs.push_back(e["logprob"]);
    Json alternatives = Json::object();
    for (const Json& t : e["top_logprobs"])
      alternatives[t["token"].get<std::string>()] = t["logprob"];
    top.push_back(std::move(alternatives));
    offsets.push_back(x.text_offsets[i]);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

Json Server::Impl::pending_logprobs(Exchange& x) const {
  Json out = logprobs(x, x.logprobs_sent, x.logprobs.size());
  x.logprobs_sent = x.logprobs.size();
  return out;
}

Json Server::Impl::answer(const Exchange& x) const {
  const Outcome& o = x.outcome;
  Json choice = {{"index", 0},
                 {"logprobs", logprobs(x, 0, x.logprobs.size())},
                 {"finish_reason", finish_reason(o.result.stop_reason)}};
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

namespace {

// RFC 4648 base64 of the vector's float32 bytes, little-endian (what the openai client decodes
// with numpy.frombuffer(..., dtype="float32"), and asks for by default).
std::string base64_floats(const float* v, size_t n) {
  static_assert(std::endian::native == std::endian::little, "float bytes go out little-endian");
  return base64_encode(std::as_bytes(std::span(v, n)));
}

}  // namespace

// OpenAI's embeddings list; timings as llama.cpp's prompt figures.
Json Server::Impl::embeddings_answer(const Exchange& x) const {
  const Outcome& o = x.outcome;
  const size_t dims = static_cast<size_t>(o.embedded.dimensions);
  Json data = Json::array();
  for (size_t i = 0; i < x.embeddings.inputs(); ++i) {
    const float* v = o.vectors.data() + i * dims;
    data.push_back({{"object", "embedding"},
                    {"index", i},
                    {"embedding", x.embeddings.base64 ? Json(base64_floats(v, dims))
                                                      : Json(std::vector<float>(v, v + dims))}});
  }
  return {
      {"object", "list"},
      {"data", std::move(data)},
      {"model", rules.model_id},
      {"usage", {{"prompt_tokens", o.embedded.n_tokens}, {"total_tokens", o.embedded.n_tokens}}},
      {"timings",
       {{"prompt_n", o.embedded.n_tokens},
        {"prompt_ms", o.embedded.ms},
        {"prompt_per_second", per_second(o.embedded.n_tokens, o.embedded.ms)}}}};
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
    Json choice = delta(x, delta_message(d, x.n_calls, x.id));
    if (x.logprobs_sent < x.logprobs.size()) choice["logprobs"] = pending_logprobs(x);
    add_event(x, chunk(x, std::move(choice)));
    x.n_calls += d.kind == OutputDelta::Kind::kToolCall;
  }
}

}  // namespace qhx::server
