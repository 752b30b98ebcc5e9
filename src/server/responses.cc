// What the server answers, as OpenAI's (and llama.cpp's) JSON: errors, /health, /v1/models,
// completions whole or as stream chunks, usage and timings.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/server_impl.h"

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

}  // namespace qhx::server
