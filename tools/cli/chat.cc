#include "chat.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "qhx/qhx.h"
#include "util/utf8.h"

namespace qhx::cli {
namespace {

using Json = nlohmann::json;

// Ctrl-C while a reply streams stops that reply; at the prompt it ends the program.
std::atomic<qhx_session*> replying{nullptr};

extern "C" void on_interrupt(int) {
  if (qhx_session* s = replying.load()) {
    qhx_session_cancel(s);
  } else {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}

class ChatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void check(qhx_status status) {
  if (status != QHX_OK) throw ChatError(qhx_last_error());
}

int print_piece(void*, int32_t, const char* text, size_t len) {
  std::fwrite(text, 1, len, stdout);
  std::fflush(stdout);
  return 0;
}

const char* const kHelp =
    "commands: /image FILE  /reset  /regen  /save FILE  /load FILE  /think on|off|default  "
    "/stats on|off  /exit\n";

class Chat {
 public:
  explicit Chat(const ChatArgs& args) : args_(args), thinking_(args.thinking) {
    qhx_model_options mo;
    qhx_model_options_default(&mo);
    mo.n_threads = args.threads;
    mo.context_length = args.context_length;
    mo.device = args.devices.device.c_str();
    mo.decode_device = args.devices.decode_or_null();
    mo.device_check = args.devices.device_check.c_str();
    mo.kv_type = args.devices.kv_type.c_str();
    if (!args.devices.qnn_lib.empty()) mo.qnn_lib = args.devices.qnn_lib.c_str();
    if (!args.devices.npu_pack.empty()) mo.npu_pack = args.devices.npu_pack.c_str();
    mo.draft_model = args.speculative.draft_model();
    mo.mtp_vocab_size = args.speculative.mtp_vocab;
    check(qhx_model_open(args.model.c_str(), &mo, &model_));
    qhx_model_info info;
    check(qhx_model_get_info(model_, &info));
    if (!info.has_chat_template) {
      throw ChatError(args.model + ": the tokenizer has no chat template");
    }
    if (*info.admission_note != '\0') std::fprintf(stderr, "qhx: %s\n", info.admission_note);
    if (*info.device_note != '\0') std::fprintf(stderr, "qhx: %s\n", info.device_note);
    print_model_note(info, "qhx: ");
    if (args.stats) {
      std::fprintf(stderr, "[%s | context %lld | threads %d]\n", info.name,
                   static_cast<long long>(info.context_length), info.n_threads);
    }
    check(qhx_session_create(model_, nullptr, &session_));
    check(qhx_generate_options_default(model_, &generate_));
    generate_.max_new_tokens = args.max_new_tokens;
    if (args.greedy) generate_.sampling.greedy = 1;
    generate_.speculative = args_.speculative.kind();
    generate_.draft_max = args.speculative.draft_max;
    generate_.sampling.seed = args.seed.value_or(std::random_device{}());
    start_over();
  }
  ~Chat() {
    qhx_session_destroy(session_);
    qhx_model_close(model_);
  }

  // Handles one line of input; false ends the chat.
  bool handle(const std::string& line) {
    if (line.empty()) return true;
    if (line[0] != '/') {
      if (const size_t bad = qhx::find_invalid_utf8(line); bad != std::string_view::npos) {
        throw ChatError("the line is not valid UTF-8 (byte " + std::to_string(bad + 1) +
                        "); nothing was sent");
      }
      const Json before = messages_;
      if (pending_images_.empty()) {
        messages_.push_back({{"role", "user"}, {"content", line}});
      } else {  // the images first, as content parts the template places
        Json parts = Json::array();
        for (const std::string& path : pending_images_) {
          parts.push_back({{"type", "image"}, {"path", path}});
        }
        parts.push_back({{"type", "text"}, {"text", line}});
        messages_.push_back({{"role", "user"}, {"content", parts}});
        pending_images_.clear();
      }
      reply(before);
      return true;
    }
    std::istringstream words(line);
    std::string command, argument;
    words >> command >> argument;
    if (command == "/exit" || command == "/quit") return false;
    if (command == "/image" && !argument.empty()) {
      // Read and encoded now (once: the same image keeps its ids), sent with the next message.
      size_t n = 0;
      const qhx_status status =
          qhx_image_tokens_from_file(model_, argument.c_str(), nullptr, 0, &n);
      if (status != QHX_OK && status != QHX_ERROR_BUFFER_TOO_SMALL) {
        throw ChatError(qhx_last_error());
      }
      pending_images_.push_back(argument);
      std::fprintf(stderr, "[image %s: %zu tokens, sent with your next message]\n",
                   argument.c_str(), n);
      return true;
    }
    if (command == "/reset") {
      start_over();
      check(qhx_session_reset(session_));
    } else if (command == "/regen") {
      if (messages_.empty() || messages_.back()["role"] != "assistant") {
        std::fprintf(stderr, "nothing to regenerate\n");
      } else {
        const Json before = messages_;
        messages_.erase(messages_.end() - 1);
        reply(before);
      }
    } else if (command == "/save" && !argument.empty()) {
      save(argument);
    } else if (command == "/load" && !argument.empty()) {
      load(argument);
    } else if (command == "/think" &&
               (argument == "on" || argument == "off" || argument == "default")) {
      thinking_ = argument == "default" ? std::nullopt : std::optional<bool>(argument == "on");
    } else if (command == "/stats" && (argument == "on" || argument == "off")) {
      stats_ = argument == "on";
    } else {
      std::fprintf(stderr, "%s", kHelp);
    }
    return true;
  }

 private:
  // Drops the oldest user turn and the replies to it; false if only the last message is left.
  bool drop_oldest_turn() {
    const auto role = [&](size_t i) { return messages_.at(i).value("role", std::string()); };
    const size_t first = !messages_.empty() && role(0) == "system" ? 1 : 0;
    if (messages_.size() <= first + 1) return false;
    const auto at_first = messages_.begin() + static_cast<std::ptrdiff_t>(first);
    messages_.erase(at_first);
    while (messages_.size() > first + 1 && role(first) != "user") {
      messages_.erase(messages_.begin() + static_cast<std::ptrdiff_t>(first));
    }
    return true;
  }

  void start_over() {
    messages_ = Json::array();
    if (!args_.system.empty()) messages_.push_back({{"role", "system"}, {"content", args_.system}});
  }

  // The state and the messages beside it; the messages are written first and renamed into place
  // last, so a failed save leaves neither half written.
  void save(const std::string& path) {
    const std::string messages_path = path + ".json";
    const std::string partial = messages_path + ".partial";
    {
      std::ofstream out(partial);
      out << Json{{"messages", messages_}}.dump(1) << "\n";
      if (!out.flush()) {
        const std::string why = std::strerror(errno);
        std::remove(partial.c_str());
        throw ChatError(messages_path + ": cannot write: " + why);
      }
    }
    if (qhx_session_save(session_, path.c_str()) != QHX_OK) {
      std::remove(partial.c_str());
      throw ChatError(qhx_last_error());
    }
    if (std::rename(partial.c_str(), messages_path.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      std::remove(partial.c_str());
      throw ChatError(messages_path + ": cannot write: " + why);
    }
    std::fprintf(stderr, "saved %s and %s\n", path.c_str(), messages_path.c_str());
  }

  void load(const std::string& path) {
    std::ifstream in(path + ".json");
    if (!in) throw ChatError(path + ".json: cannot open (a chat is saved as FILE and FILE.json)");
    Json saved = Json::parse(in, nullptr, false);
    if (saved.is_discarded() || !saved.contains("messages") || !saved["messages"].is_array()) {
      throw ChatError(path + ".json: not a saved chat (expected {\"messages\": [...]})");
    }
    check(qhx_session_load(session_, path.c_str()));
    messages_ = saved["messages"];
    std::fprintf(stderr, "loaded %zu messages\n", messages_.size());
  }

  // Generates the next assistant turn; if it fails the conversation is `before` again (turns
  // dropped for the context included).
  void reply(const Json& before) {
    qhx_template_options template_options;
    qhx_template_options_default(&template_options);
    if (thinking_) template_options.enable_thinking = *thinking_ ? 1 : 0;
    qhx_generate_result result{};
    qhx_status status;
    size_t dropped = 0;
    for (;;) {
      // The C API reads the messages' image parts ({"type": "image", "path": ...}).
      const std::string request = Json{{"messages", messages_}}.dump();
      replying = session_;
      status = qhx_session_chat(session_, request.c_str(), &template_options, &generate_,
                                print_piece, nullptr, &result);
      replying = nullptr;
      // A conversation that outgrew the context goes on without its oldest turns, as
      // llama.cpp's context shift does (the system prompt stays).
      if (status != QHX_ERROR_CONTEXT_FULL || !drop_oldest_turn()) break;
      ++dropped;
    }
    if (dropped > 0 && status == QHX_OK) {
      std::fprintf(stderr, "[context full: the %zu oldest turns were dropped]\n", dropped);
    }
    std::printf("\n");
    std::fflush(stdout);  // before the stats on stderr, also when stdout is a pipe
    if (status != QHX_OK) {
      messages_ = before;  // the turn did not happen
      if (status == QHX_ERROR_CONTEXT_FULL) {
        throw ChatError(std::string(qhx_last_error()) +
                        " (the message alone does not fit: send a shorter one, or /reset)");
      }
      throw ChatError(qhx_last_error());
    }
    messages_.push_back({{"role", "assistant"}, {"content", result.text}});
    if (result.stop_reason == QHX_STOP_CANCELLED) std::fprintf(stderr, "[stopped]\n");
    if (stats_) {
      const double decode_tps =
          result.n_generated > 1 ? (result.n_generated - 1) / (result.decode_ms / 1e3) : 0.0;
      std::string speculation;
      if (result.verify_passes > 0) {
        speculation = " | speculative: " + std::to_string(result.verify_passes) + " passes, " +
                      std::to_string(result.accepted) + " of " + std::to_string(result.drafted) +
                      " drafted accepted";
      }
      std::fprintf(stderr,
                   "[prompt %lld tokens: %lld reused, %lld processed in %.0f ms | reply %lld "
                   "tokens, %.1f tok/s | TTFT %.0f ms%s]\n",
                   static_cast<long long>(result.n_prompt), static_cast<long long>(result.n_reused),
                   static_cast<long long>(result.n_processed), result.prefill_ms,
                   static_cast<long long>(result.n_generated), decode_tps, result.ttft_ms,
                   speculation.c_str());
    }
    qhx_string_free(result.text);
  }

  ChatArgs args_;
  qhx_model* model_ = nullptr;
  qhx_session* session_ = nullptr;
  qhx_generate_options generate_{};
  std::optional<bool> thinking_;
  std::vector<std::string> pending_images_;  // /image: sent with the next message
  bool stats_ = args_.stats;
  Json messages_;
};

}  // namespace

int run_chat(const ChatArgs& args) {
  const bool interactive = isatty(STDIN_FILENO) != 0;
  bool failed = false;
  try {
    Chat chat(args);
    std::signal(SIGINT, on_interrupt);
    if (interactive) std::fprintf(stderr, "%s", kHelp);
    std::string line;
    while (true) {
      if (interactive) std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line)) break;
      try {
        if (!chat.handle(line)) break;
      } catch (const ChatError& e) {
        // A failed turn or command leaves the chat as it was; the next line may work. Read
        // from a script, the exit status still says that one failed.
        std::fprintf(stderr, "qhx: error: %s\n", e.what());
        failed = true;
      }
    }
  } catch (const ChatError& e) {
    std::fprintf(stderr, "qhx: error: %s\n", e.what());
    return 1;
  }
  return failed && !interactive ? 1 : 0;
}

}  // namespace qhx::cli
