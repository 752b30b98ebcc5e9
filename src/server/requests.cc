#include "server/requests.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <stdexcept>

#include "server/server.h"
#include "util/base64.h"
#include "util/bounded_json.h"
#include "util/error.h"
#include "util/image_pads.h"

namespace qhx::server {

ApiError wrong_type(const std::string& field, const char* expected) {
  return {400, "'" + field + "' must be " + expected, field, "invalid_type"};
}

ApiError bad_value(const std::string& field, const std::string& why) {
  return {400, "'" + field + "' " + why, field, "invalid_value"};
}

namespace {

Json nullable(const std::string& s) {
  return s.empty() ? Json(nullptr) : Json(s);
}

// Error messages from the library name files by their full path; a client learns only the file
// name (the log keeps the message whole).
std::string without_paths(const std::string& message) {
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    const bool starts_path =
        message[i] == '/' && (i == 0 || std::strchr(" '\"(=:", message[i - 1]) != nullptr);
    if (!starts_path) {
      out += message[i++];
      continue;
    }
    size_t end = i;
    while (end < message.size() && std::strchr(" '\":,)\n", message[end]) == nullptr) ++end;
    const std::string path = message.substr(i, end - i);
    const size_t slash = path.find_last_of('/');
    out += path.find('/', 1) == std::string::npos ? path : path.substr(slash + 1);
    i = end;
  }
  return out;
}

}  // namespace

// Generated text is valid UTF-8 by the C API's contract; should it not be, the answer still goes
// out (with U+FFFD) rather than the thread throwing while writing it.
std::string to_text(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.from_library ? without_paths(e.message) : e.message},
            {"type", e.type},
            {"param", nullable(e.param)},
            {"code", nullable(e.code)}}}};
}

ApiError api_failure(qhx_status status, const std::string& param, std::string message) {
  ApiError e = [&]() -> ApiError {
    switch (status) {
      case QHX_ERROR_INVALID_ARGUMENT:
      case QHX_ERROR_TEMPLATE:
        return {400, std::move(message), param, "invalid_value"};
      case QHX_ERROR_CONTEXT_FULL:
        return {400, std::move(message), param, "context_length_exceeded"};
      case QHX_ERROR_OUT_OF_MEMORY:
        return {503, std::move(message), "", "out_of_memory", "server_error"};
      default:
        return {500, std::move(message), "", "", "server_error"};
    }
  }();
  e.from_library = true;
  return e;
}

ApiError api_failure(qhx_status status, const std::string& param) {
  return api_failure(status, param, qhx_last_error());
}

namespace {

// A request field; absent and null are the same (OpenAI clients send explicit nulls).
const Json* field(const Json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number_field(const Json& body, const char* name, double lo, double hi) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) throw wrong_type(name, "a number");
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    throw bad_value(name, "must be between " + Json(lo).dump() + " and " + Json(hi).dump());
  }
  return x;
}

// Integers, also as floats with no fraction (10.0), within [lo, hi].
std::optional<int64_t> integer_field(const Json& body, const char* name, int64_t lo, int64_t hi) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  const auto out_of_range = [&] {
    return bad_value(name,
                     "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  };
  if (v->is_number_unsigned()) {
    const uint64_t x = v->get<uint64_t>();
    if (x > static_cast<uint64_t>(hi) || (lo > 0 && x < static_cast<uint64_t>(lo))) {
      throw out_of_range();
    }
    return static_cast<int64_t>(x);
  }
  if (v->is_number_integer()) {
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) throw out_of_range();
    return x;
  }
  if (v->is_number_float()) {
    const double x = v->get<double>();
    // In range (and not NaN) before converting: a double beyond int64's range converts to
    // nothing defined (hi as a double may round up to 2^63, hence the second bound).
    if (!(x >= static_cast<double>(lo) && x <= static_cast<double>(hi)) || x >= 0x1p63 ||
        x != std::trunc(x)) {
      throw out_of_range();
    }
    return static_cast<int64_t>(x);
  }
  throw wrong_type(name, "an integer");
}

std::optional<bool> bool_field(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) throw wrong_type(name, "true or false");
  return v->get<bool>();
}

// qhx_tokenize into a vector, growing the buffer when the first guess is short.
std::vector<int32_t> tokenize(const qhx_model* model, const std::string& text,
                              const std::string& param) {
  std::vector<int32_t> ids(text.size() + 16);
  size_t n = 0;
  qhx_status status = qhx_tokenize(model, text.data(), text.size(), ids.data(), ids.size(), &n);
  if (status == QHX_ERROR_BUFFER_TOO_SMALL) {
    ids.resize(n);
    status = qhx_tokenize(model, text.data(), text.size(), ids.data(), ids.size(), &n);
  }
  if (status != QHX_OK) throw api_failure(status, param);
  ids.resize(n);
  return ids;
}

bool reads_images(const qhx_model* model) {
  qhx_model_info info;
  return qhx_model_get_info(model, &info) == QHX_OK && info.reads_images != 0;
}

// An image_url part's image (a data: URL: the server fetches nothing) as the ids of its tokens.
std::vector<int32_t> image_of_part(const qhx_model* model, const Json& p, const std::string& part) {
  const Json* url = p.contains("image_url") ? &p["image_url"] : nullptr;
  if (url != nullptr && url->is_object() && url->contains("url")) url = &(*url)["url"];
  if (url == nullptr || !url->is_string()) throw wrong_type(part + ".image_url.url", "a string");
  const DataUrl data = decode_data_url(url->get_ref<const std::string&>());
  if (data.status == DataUrl::kNotADataUrl) {
    throw ApiError{400,
                   "'" + part +
                       ".image_url.url' is not a data: URL; qhx serve fetches nothing: "
                       "send the image inline, as data:image/png;base64,...",
                   part + ".image_url.url", "invalid_value"};
  }
  if (data.status == DataUrl::kNotBase64) {
    throw bad_value(part + ".image_url.url", "must be a base64 data: URL (data:<type>;base64,...)");
  }
  if (data.status == DataUrl::kBadBase64) {
    throw bad_value(part + ".image_url.url", "holds no valid base64");
  }
  std::vector<int32_t> ids;
  size_t n = 0;
  qhx_status status =
      qhx_image_tokens(model, data.bytes.data(), data.bytes.size(), part.c_str(), nullptr, 0, &n);
  if (status == QHX_ERROR_BUFFER_TOO_SMALL) {
    ids.resize(n);
    status = qhx_image_tokens(model, data.bytes.data(), data.bytes.size(), part.c_str(), ids.data(),
                              n, &n);
  }
  if (status == QHX_ERROR_MODEL) {
    throw ApiError{400, "'" + part + "' is an image; " + qhx_last_error(), part,
                   "unsupported_content"};
  }
  if (status != QHX_OK) throw api_failure(status, part);
  return ids;
}

// The prompt with each <|image_pad|> the template wrote in place of its image's ids, in order.
std::vector<int32_t> with_images(const qhx_model* model, const std::vector<int32_t>& prompt,
                                 const std::vector<std::vector<int32_t>>& images) {
  const std::vector<int32_t> pad = tokenize(model, "<|image_pad|>", "messages");
  if (pad.size() != 1) throw bad_value("messages", "the tokenizer has no <|image_pad|> token");
  try {
    return qhx::expand_image_pads(prompt, pad[0], images, "the rendered conversation");
  } catch (const qhx::Error& e) {
    throw bad_value("messages", e.what());
  }
}

// A message's content given as OpenAI content parts. Text parts are joined as vLLM joins them for
// a template that wants a string; a template that renders parts itself (Qwen3.5's) gets them as
// they are, its image_url parts' images read into `images` in order (the template puts an
// <|image_pad|> where each was). Other parts (audio, video) are refused.
Json content_of_parts(const Json& parts, const std::string& where, bool template_takes_parts,
                      const qhx_model* model, std::vector<std::vector<int32_t>>& images) {
  std::string joined;
  Json kept = parts;
  for (size_t j = 0; j < parts.size(); ++j) {
    const std::string part = where + "[" + std::to_string(j) + "]";
    const Json& p = parts[j];
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
      throw wrong_type(part, "an object with a string 'type'");
    }
    const std::string type = p["type"].get<std::string>();
    if (type == "image_url" && template_takes_parts && reads_images(model)) {
      images.push_back(image_of_part(model, p, part));
      kept[j] = {{"type", "image_url"}, {"image_url", {{"url", ""}}}};  // the bytes are read
      continue;
    }
    if (type != "text") {
      throw ApiError{400, "'" + part + "' is a '" + type + "' part; this model reads text only",
                     part, "unsupported_content"};
    }
    if (!p.contains("text") || !p["text"].is_string()) throw wrong_type(part + ".text", "a string");
    if (j > 0) joined += '\n';
    joined += p["text"].get<std::string>();
  }
  if (template_takes_parts) return kept;
  return joined;
}

// The history as the chat templates expect it. OpenAI clients send back an assistant turn that
// called tools with `content: null` and the calls' arguments as JSON text; the templates test
// the content as a string and print arguments as an object (vLLM and llama.cpp convert alike).
Json template_messages(const Json& messages, bool template_takes_parts, const qhx_model* model,
                       std::vector<std::vector<int32_t>>& images) {
  Json out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    Json& m = out[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      throw wrong_type(where, "an object with a string 'role'");
    }
    const std::string role = m["role"].get<std::string>();
    // OpenAI's newer name for the system turn.
    if (role == "developer") m["role"] = "system";
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" &&
        role != "tool") {
      throw bad_value(where + ".role", "is '" + role +
                                           "'; the roles are system, developer, user, "
                                           "assistant and tool");
    }
    if (m.contains("content") && m["content"].is_array()) {
      m["content"] =
          content_of_parts(m["content"], where + ".content", template_takes_parts, model, images);
    }
    if (role != "assistant") continue;
    if (m.contains("content") && m["content"].is_null()) m["content"] = "";
    if (!m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (Json& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
        continue;
      }
      Json& arguments = call["function"]["arguments"];
      if (!arguments.is_string()) continue;
      // Bounded like the body: this text is the client's too.
      std::optional<Json> parsed =
          parse_bounded_json(arguments.get<std::string>(), JsonBounds{}, nullptr);
      if (parsed && parsed->is_object()) arguments = std::move(*parsed);
    }
  }
  return out;
}

}  // namespace

RequestRules::RequestRules(qhx_model* m, const std::string& alias, const std::string& spec,
                           int draft_max)
    : model(m), speculative(spec) {
  qhx_model_info info{};
  if (qhx_model_get_info(model, &info) != QHX_OK) throw std::runtime_error(qhx_last_error());
  model_id = alias.empty() ? info.name : alias;
  context_length = info.context_length;
  vocab_size = info.vocab_size;
  embedding_size = info.embedding_size;
  eos_ids.assign(info.eos_ids, info.eos_ids + info.n_eos_ids);
  if (qhx_generate_options_default(model, &defaults) != QHX_OK) {
    throw std::runtime_error(qhx_last_error());
  }
  defaults.speculative = speculative.c_str();
  defaults.draft_max = draft_max;
  if (qhx_generate_options_check(model, &defaults) != QHX_OK) {
    throw std::runtime_error(qhx_last_error());
  }
  // Does the template render content parts itself? Qwen3.5's does; Qwen3's wants a string.
  const char* probe =
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "\u0001a"},)"
      R"( {"type": "text", "text": "\u0001b"}]}]})";
  char* text = nullptr;
  if (qhx_apply_chat_template(model, probe, nullptr, &text) == QHX_OK) {
    template_takes_parts = std::strstr(text,
                                       "\x01"
                                       "a\x01"
                                       "b") != nullptr;
    qhx_string_free(text);
  }
}

Json parse_body(std::string_view text) {
  std::string why;
  std::optional<Json> body = parse_bounded_json(text, JsonBounds{}, &why);
  if (!body) throw ApiError{400, "request body: " + why};
  if (!body->is_object()) throw ApiError{400, "request body must be a JSON object"};
  return std::move(*body);
}

int check_request(qhx_model* model, const std::string& path, std::string_view body,
                  std::string* error) {
  try {
    const RequestRules rules(model, "");
    Completion c;
    c.chat = path == "/v1/chat/completions";
    rules.parse_completion(parse_body(body), c);
    return 0;
  } catch (const ApiError& e) {
    if (error != nullptr) *error = e.message;
    return e.status;
  }
}

namespace {

void set_format(Completion& c, const Json& format, const char* param) {
  if (!c.response_format.empty()) {
    throw bad_value(param,
                    "cannot be combined with " + c.format_param + " (both constrain the answer)");
  }
  c.response_format = format.dump();
  c.format_param = param;
}

}  // namespace

// tool_choice: "none" (no calls parsed), "auto" (the model's choice), "required" (one call or
// more, to the tools' schemas) or {"type": "function", "function": {"name"}} (that one, once).
void RequestRules::parse_tool_choice(const Json& body, Completion& c) const {
  const Json* choice = field(body, "tool_choice");
  const auto parallel = bool_field(body, "parallel_tool_calls");
  if (choice == nullptr) return;
  const Json* given = field(body, "tools");
  const Json tools = given != nullptr && given->is_array() ? *given : Json::array();
  if (choice->is_string()) {
    const std::string name = choice->get<std::string>();
    if (name == "none") {
      c.output.tool_calls = false;
      return;
    }
    if (name == "auto") return;
    if (name != "required") {
      throw bad_value("tool_choice", "must be \"none\", \"auto\", \"required\" or a function");
    }
    if (tools.empty()) throw bad_value("tool_choice", "\"required\" needs tools");
    set_format(c, {{"type", "tool_calls"}, {"tools", tools}, {"parallel", parallel.value_or(true)}},
               "tool_choice");
    return;
  }
  if (!choice->is_object()) throw wrong_type("tool_choice", "a string or an object");
  const Json* type = field(*choice, "type");
  const Json* function = field(*choice, "function");
  if (type == nullptr || *type != "function" || function == nullptr || !function->is_object() ||
      !function->contains("name") || !(*function)["name"].is_string()) {
    throw bad_value("tool_choice",
                    "must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  const std::string name = (*function)["name"].get<std::string>();
  for (const Json& tool : tools) {
    if (tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
        tool["function"].value("name", "") == name) {
      set_format(c, {{"type", "tool_calls"}, {"tools", Json::array({tool})}, {"parallel", false}},
                 "tool_choice");
      return;
    }
  }
  throw bad_value("tool_choice", "names the function '" + name + "', which tools do not hold");
}

// response_format (OpenAI's), or grammar (llama.cpp's: GBNF text), for the C API to compile.
void RequestRules::parse_response_format(const Json& body, Completion& c) const {
  if (const Json* format = field(body, "response_format")) {
    if (!format->is_object()) throw wrong_type("response_format", "an object");
    const Json* type = field(*format, "type");
    if (type == nullptr || !type->is_string()) throw wrong_type("response_format.type", "a string");
    if (*type != "text") set_format(c, *format, "response_format");
  }
  if (const Json* grammar = field(body, "grammar")) {
    if (!grammar->is_string()) throw wrong_type("grammar", "a string (GBNF)");
    if (!grammar->get<std::string>().empty()) {
      set_format(c, {{"type", "grammar"}, {"grammar", *grammar}}, "grammar");
    }
  }
  c.options.response_format = c.response_format.empty() ? nullptr : c.response_format.c_str();
}

void RequestRules::check_model(const Json& body) const {
  if (const Json* m = field(body, "model")) {
    if (!m->is_string()) throw wrong_type("model", "a string");
    if (m->get<std::string>() != model_id) {
      throw ApiError{404,
                     "the model '" + m->get<std::string>() + "' does not exist (this server has '" +
                         model_id + "')",
                     "model", "model_not_found"};
    }
  }
}

// OpenAI's input: a string, an array of strings, an array of token ids, or an array of such
// arrays; at most 2048 inputs (OpenAI's bound). qhx's own fields, as sentence-transformers names
// them: prompt_name (one of the model's prompts: Qwen3-Embedding's "query"), prompt (text put
// before each input), and pooling (last, mean, cls) and normalize for a model that has none.
void RequestRules::parse_embeddings(const Json& body, Embeddings& e) const {
  check_model(body);
  e.requested = true;
  qhx_embed_options_default(&e.options);
  const Json* input = field(body, "input");
  if (input == nullptr) throw ApiError{400, "'input' is required", "input", "missing_required"};
  constexpr size_t kMaxInputs = 2048;
  const auto add_ids = [&](const Json& list, const std::string& where) {
    if (list.empty()) throw bad_value(where, "is empty");
    for (const Json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
        throw bad_value(where, "must hold token ids from 0 to " + std::to_string(vocab_size - 1));
      }
      e.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    if (e.offsets.empty()) e.offsets.push_back(0);
    e.offsets.push_back(e.ids.size());
  };
  if (input->is_string()) {
    e.texts.push_back(input->get<std::string>());
  } else if (!input->is_array() || input->empty()) {
    throw wrong_type("input", "a string, or a non-empty array of strings or of token ids");
  } else if ((*input)[0].is_number()) {
    add_ids(*input, "input");  // one input of ids: the context bounds it
  } else if (input->size() > kMaxInputs) {
    throw bad_value("input", "has " + std::to_string(input->size()) + " inputs, more than " +
                                 std::to_string(kMaxInputs));
  } else {
    for (size_t i = 0; i < input->size(); ++i) {
      const Json& item = (*input)[i];
      const std::string where = "input[" + std::to_string(i) + "]";
      if (item.is_string() && e.ids.empty()) {
        e.texts.push_back(item.get<std::string>());
      } else if (item.is_array() && e.texts.empty()) {
        add_ids(item, where);
      } else {
        throw wrong_type(where, "of the same kind as input[0] (a string, or an array of ids)");
      }
    }
  }
  if (const Json* format = field(body, "encoding_format")) {
    if (!format->is_string() || (*format != "float" && *format != "base64")) {
      throw bad_value("encoding_format", "must be \"float\" or \"base64\"");
    }
    e.base64 = *format == "base64";
  }
  if (const auto dims = integer_field(body, "dimensions", 1, embedding_size)) {
    e.options.dimensions = *dims;
  }
  const auto string_option = [&](const char* name, std::string& out) {
    const Json* v = field(body, name);
    if (v == nullptr) return false;
    if (!v->is_string()) throw wrong_type(name, "a string");
    out = v->get<std::string>();
    return true;
  };
  if (string_option("pooling", e.pooling)) e.options.pooling = e.pooling.c_str();
  if (string_option("prompt_name", e.prompt_name)) e.options.prompt_name = e.prompt_name.c_str();
  if (string_option("prompt", e.prompt)) e.options.prompt = e.prompt.c_str();
  if (const auto normalize = bool_field(body, "normalize")) e.options.normalize = *normalize;
  if (!e.ids.empty() && (e.options.prompt != nullptr || e.options.prompt_name != nullptr)) {
    throw bad_value("prompt", "applies to text inputs, not to token ids");
  }
  for (size_t i = 0; i + 1 < e.offsets.size(); ++i) {
    if (static_cast<int64_t>(e.offsets[i + 1] - e.offsets[i]) > context_length) {
      throw ApiError{400,
                     "input[" + std::to_string(i) + "] has " +
                         std::to_string(e.offsets[i + 1] - e.offsets[i]) +
                         " tokens, more than the context length (" +
                         std::to_string(context_length) + ")",
                     "input", "context_length_exceeded"};
    }
  }
}

void RequestRules::parse_completion(const Json& body, Completion& c) const {
  check_model(body);
  const auto n = integer_field(body, "n", INT64_MIN, INT64_MAX);
  if (n && *n != 1) throw bad_value("n", "must be 1 (one choice per request)");
  if (bool_field(body, "echo").value_or(false)) throw bad_value("echo", "is not supported");
  // Log-probabilities, OpenAI's two shapes: chat's logprobs (bool) with top_logprobs (0..20);
  // completions' logprobs (the alternatives, 0..20; vLLM's bound, OpenAI's is 5).
  int32_t logprobs = 0, top_logprobs = 0;
  if (c.chat) {
    logprobs = bool_field(body, "logprobs").value_or(false) ? 1 : 0;
    if (const auto top = integer_field(body, "top_logprobs", 0, 20)) {
      if (logprobs == 0) throw bad_value("top_logprobs", "needs \"logprobs\": true");
      top_logprobs = static_cast<int32_t>(*top);
    }
  } else if (const auto top = integer_field(body, "logprobs", 0, 20)) {
    logprobs = 1;
    top_logprobs = static_cast<int32_t>(*top);
  }

  if (c.chat) {
    const Json* messages = field(body, "messages");
    // tool_choice needs the tools; they are checked below.

    if (messages == nullptr) throw ApiError{400, "'messages' is required", "messages"};
    if (!messages->is_array() || messages->empty()) {
      throw wrong_type("messages", "a non-empty array of messages");
    }
    std::vector<std::vector<int32_t>> images;
    Json request = {
        {"messages", template_messages(*messages, template_takes_parts, model, images)}};
    if (const Json* tools = field(body, "tools")) {
      if (!tools->is_array()) throw wrong_type("tools", "an array");
      request["tools"] = *tools;
      c.output.tool_calls = !tools->empty();
      c.output.tools = *tools;
    }
    parse_tool_choice(body, c);
    // llama.cpp's field: "none" leaves <think> blocks in the content.
    if (const Json* format = field(body, "reasoning_format")) {
      if (!format->is_string()) throw wrong_type("reasoning_format", "a string");
      const std::string name = format->get<std::string>();
      if (name != "none" && name != "auto" && name != "deepseek") {
        throw bad_value("reasoning_format", "must be \"none\", \"auto\" or \"deepseek\"");
      }
      c.output.reasoning = name != "none";
    }
    qhx_template_options template_options;
    qhx_template_options_default(&template_options);
    if (const Json* kwargs = field(body, "chat_template_kwargs")) {
      // Passed to the template as apply_chat_template(**kwargs) would pass them.
      if (!kwargs->is_object()) throw wrong_type("chat_template_kwargs", "an object");
      bool_field(*kwargs, "enable_thinking");  // a 400 naming it unless absent or a bool
      request["chat_template_kwargs"] = *kwargs;
    }
    char* text = nullptr;
    const qhx_status status =
        qhx_apply_chat_template(model, request.dump().c_str(), &template_options, &text);
    if (status != QHX_OK) throw api_failure(status, "messages");
    const std::string rendered = text;
    qhx_string_free(text);
    c.output.think_open = prompt_opens_think(rendered);
    c.prompt = tokenize(model, rendered, "messages");
    if (!images.empty()) c.prompt = with_images(model, c.prompt, images);
  } else {
    const Json* prompt = field(body, "prompt");
    if (prompt == nullptr) throw ApiError{400, "'prompt' is required", "prompt"};
    // A batch of one prompt is that prompt; larger batches are n > 1 in disguise.
    const Json* one = prompt;
    if (prompt->is_array() && prompt->size() == 1 &&
        ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
      one = &(*prompt)[0];
    }
    if (one->is_string()) {
      c.prompt = tokenize(model, one->get<std::string>(), "prompt");
    } else if (one->is_array()) {
      for (const Json& id : *one) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
          throw bad_value("prompt", "token ids must be integers from 0 to " +
                                        std::to_string(vocab_size - 1) +
                                        " (one prompt per request)");
        }
        c.prompt.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    } else {
      throw wrong_type("prompt", "a string or an array of token ids");
    }
  }
  const char* prompt_param = c.chat ? "messages" : "prompt";
  if (c.prompt.empty()) throw bad_value(prompt_param, "is empty");

  c.options = defaults;
  c.options.logprobs = logprobs;
  c.options.top_logprobs = top_logprobs;
  const int64_t room = context_length - static_cast<int64_t>(c.prompt.size());
  std::optional<int64_t> max_tokens = integer_field(body, "max_completion_tokens", 1, INT64_MAX);
  if (!max_tokens) max_tokens = integer_field(body, "max_tokens", 1, INT64_MAX);
  if (room < 1 || (max_tokens && *max_tokens > room)) {
    throw ApiError{400,
                   "the prompt is " + std::to_string(c.prompt.size()) + " tokens and " +
                       (max_tokens ? std::to_string(*max_tokens) : std::string("at least 1")) +
                       " more were asked for; the context holds " + std::to_string(context_length),
                   prompt_param, "context_length_exceeded"};
  }
  // Without a limit, a completion may run to the end of the context (as OpenAI's).
  c.options.max_new_tokens = max_tokens.value_or(room);

  qhx_sampling& s = c.options.sampling;
  const auto temperature = number_field(body, "temperature", 0, 100);
  const auto top_p = number_field(body, "top_p", 0, 1);
  const auto top_k = integer_field(body, "top_k", 0, INT32_MAX);
  const auto min_p = number_field(body, "min_p", 0, 1);
  if (top_p && *top_p == 0) throw bad_value("top_p", "must be above 0");
  // Asking for a sampling parameter asks for sampling; temperature 0 asks for greedy.
  if (temperature || top_p || top_k || min_p) s.greedy = 0;
  if (temperature) {
    s.greedy = *temperature == 0;
    if (*temperature > 0) s.temperature = static_cast<float>(*temperature);
  }
  if (top_p) s.top_p = static_cast<float>(*top_p);
  if (top_k) s.top_k = static_cast<int32_t>(*top_k);
  if (min_p) s.min_p = static_cast<float>(*min_p);
  if (const auto v = number_field(body, "presence_penalty", -2, 2)) {
    s.presence_penalty = static_cast<float>(*v);
  }
  if (const auto v = number_field(body, "frequency_penalty", -2, 2)) {
    s.frequency_penalty = static_cast<float>(*v);
  }
  if (const auto v = number_field(body, "repetition_penalty", 0, 10)) {
    if (*v == 0) throw bad_value("repetition_penalty", "must be above 0");
    s.repetition_penalty = static_cast<float>(*v);
  }
  // Any integer seeds; without one every request draws its own.
  if (const Json* seed = field(body, "seed")) {
    if (seed->is_number_unsigned()) {
      s.seed = seed->get<uint64_t>();
    } else if (seed->is_number_integer()) {
      s.seed = static_cast<uint64_t>(seed->get<int64_t>());
    } else {
      throw wrong_type("seed", "an integer");
    }
  } else {
    s.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }

  if (const Json* bias = field(body, "logit_bias")) {
    if (!bias->is_object()) throw wrong_type("logit_bias", "an object of token id → bias");
    for (const auto& [key, value] : bias->items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != key.size() || id < 0 || id >= vocab_size) {
        throw bad_value("logit_bias", "key '" + key + "' is not a token id");
      }
      if (!value.is_number() || value.get<double>() < -100 || value.get<double>() > 100) {
        throw bad_value("logit_bias", "values must be numbers from -100 to 100");
      }
      c.bias_ids.push_back(static_cast<int32_t>(id));
      c.bias_values.push_back(value.get<float>());
    }
  }
  s.logit_bias_ids = c.bias_ids.data();
  s.logit_bias_values = c.bias_values.data();
  s.n_logit_bias = c.bias_ids.size();

  if (const Json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      c.stops.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const Json& item : *stop) {
        if (!item.is_string()) throw wrong_type("stop", "a string or an array of strings");
        c.stops.push_back(item.get<std::string>());
      }
    } else {
      throw wrong_type("stop", "a string or an array of strings");
    }
    for (const std::string& text : c.stops) {
      if (text.empty()) throw bad_value("stop", "holds an empty string");
      // The C API takes stop strings as C strings.
      if (text.find('\0') != std::string::npos) throw bad_value("stop", "holds a NUL character");
      c.stop_pointers.push_back(text.c_str());
    }
  }
  c.options.stop_strings = c.stop_pointers.data();
  c.options.n_stop_strings = c.stop_pointers.size();

  parse_response_format(body, c);

  // vLLM's and llama.cpp's extension: go on past the model's end-of-sequence tokens.
  if (bool_field(body, "ignore_eos").value_or(false)) c.options.stop_at_eos = 0;
  c.stream = bool_field(body, "stream").value_or(false);
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw wrong_type("stream_options", "an object");
    c.include_usage = bool_field(*so, "include_usage").value_or(false);
  }
  // What the ranges above let through (a temperature that rounds to 0 as a float, ...) is
  // refused by the C API's own check, before any answer goes out.
  if (qhx_generate_options_check(model, &c.options) != QHX_OK) {
    const std::string message = qhx_last_error();
    std::string param;
    if (message.starts_with("response_format")) param = c.format_param;
    for (const char* name : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                             "presence_penalty", "frequency_penalty", "logit_bias", "stop"}) {
      if (!param.empty()) break;
      if (message.find(name) != std::string::npos) param = name;
    }
    ApiError e{400, message, param, "invalid_value"};
    e.from_library = true;
    throw e;
  }
}

}  // namespace qhx::server
