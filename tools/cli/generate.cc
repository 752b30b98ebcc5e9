// qhx generate: one prompt's continuation, sampled with the checkpoint's own defaults
// (generation_config.json) beneath the flags, and the speed it went at.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "common.h"
#include "io/bundle.h"
#include "io/hf_config.h"
#include "io/pack.h"
#include "qhx/qhx.h"
#include "runtime/generation_config.h"
#include "util/error.h"
#include "util/image_pads.h"
#include "util/mapped_file.h"

namespace qhx::cli {

namespace fs = std::filesystem;

namespace {

// --logit-bias ID=BIAS: a token id and the number added to its logit ("-inf" bans it).
std::pair<int32_t, float> parse_logit_bias(const std::string& item) {
  const size_t eq = item.find('=');
  if (eq == std::string::npos) qhx::fail("--logit-bias", "'" + item + "' is not ID=BIAS");
  const int32_t id = parse_id_list(item.substr(0, eq), "--logit-bias").at(0);
  size_t used = 0;
  float bias = 0.0f;
  try {
    bias = std::stof(item.substr(eq + 1), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != item.size() - eq - 1) {
    qhx::fail("--logit-bias", "'" + item.substr(eq + 1) + "' is not a number");
  }
  return {id, bias};
}

// A flag's value: its text, or the contents of FILE for @FILE.
std::string text_or_file(const std::string& value, const char* flag) {
  if (!value.starts_with('@')) return value;
  try {
    return qhx::read_regular_file(value.substr(1));
  } catch (const qhx::Error& e) {
    qhx::fail(flag, e.what());
  }
}

// --json-schema, --grammar or --response-format as one response_format (JSON text); "" for none.
std::string response_format(const GenerateArgs& args) {
  if (!args.json_schema.empty()) {
    const std::string schema = text_or_file(args.json_schema, "--json-schema");
    return R"({"type": "json_schema", "json_schema": {"name": "cli", "schema": )" + schema + "}}";
  }
  if (!args.grammar.empty()) {
    nlohmann::json format = {{"type", "grammar"},
                             {"grammar", text_or_file(args.grammar, "--grammar")}};
    return format.dump();
  }
  return text_or_file(args.response_format, "--response-format");
}

void check(qhx_status status) {
  if (status != QHX_OK) qhx::fail("generate", qhx_last_error());
}

// --prompt with --image on a model with a chat template: one user turn with the images before
// the text, where the template places them (as llama.cpp's mtmd-cli does).
std::vector<int32_t> chat_with_images(const qhx_model* model, const std::string& text,
                                      const std::vector<std::string>& images) {
  nlohmann::json parts = nlohmann::json::array();
  for (const std::string& path : images) parts.push_back({{"type", "image"}, {"path", path}});
  parts.push_back({{"type", "text"}, {"text", text}});
  const std::string request =
      nlohmann::json{{"messages", {{{"role", "user"}, {"content", parts}}}}}.dump();
  std::vector<int32_t> ids;
  size_t n = 0;
  qhx_status status = qhx_chat_tokens(model, request.c_str(), nullptr, nullptr, 0, &n);
  if (status == QHX_ERROR_BUFFER_TOO_SMALL) {
    ids.resize(n);
    status = qhx_chat_tokens(model, request.c_str(), nullptr, ids.data(), n, &n);
  }
  if (status != QHX_OK) qhx::fail("--image", qhx_last_error());
  return ids;
}

// --prompt-ids (or a --prompt that places its own <|image_pad|>) with --image: each image's ids
// in place of its <|image_pad|>, in order; a text prompt without any gets
// <|vision_start|><|image_pad|><|vision_end|> per image in front when `may_prepend`.
std::vector<int32_t> with_images(const qhx_model* model, const qhx::ModelConfig& config,
                                 std::vector<int32_t> prompt,
                                 const std::vector<std::string>& images, bool may_prepend) {
  if (!config.vision) {
    qhx::fail("--image", "this model reads no images: " + (config.vision_unavailable.empty()
                                                               ? std::string("no vision_config")
                                                               : config.vision_unavailable));
  }
  const int32_t pad = config.image_token_id;
  if (std::count(prompt.begin(), prompt.end(), pad) == 0 && may_prepend) {
    std::vector<int32_t> front;
    for (size_t i = 0; i < images.size(); ++i) {
      front.insert(front.end(), {config.vision_start_token_id, pad, config.vision_end_token_id});
    }
    prompt.insert(prompt.begin(), front.begin(), front.end());
  }
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& path : images) {
    size_t n = 0;
    qhx_status status = qhx_image_tokens_from_file(model, path.c_str(), nullptr, 0, &n);
    std::vector<int32_t>& image = ids.emplace_back(n);
    if (status == QHX_ERROR_BUFFER_TOO_SMALL) {
      status = qhx_image_tokens_from_file(model, path.c_str(), image.data(), n, &n);
    }
    if (status != QHX_OK) qhx::fail("--image", qhx_last_error());
  }
  return qhx::expand_image_pads(prompt, pad, ids, "--image");
}

}  // namespace

// Through the C API, as chat and serve: the same sampling, stop ids and stop strings.
int run_generate(const GenerateArgs& args) {
  fs::path dir(args.model);
  if (qhx::is_pack(dir)) {
    dir = qhx::select_pack_bundle(dir);
    std::fprintf(stderr, "pack: using %s\n", dir.c_str());
  }
  if (!fs::exists(dir / "tokenizer.json") && (!args.prompt.empty() || !args.print_ids)) {
    qhx::fail(dir.string(), "no tokenizer.json: use --prompt-ids and --print-ids");
  }
  if (!args.stop.empty() && args.print_ids) {
    qhx::fail("--stop", "needs text output, not --print-ids");
  }
  qhx_model_options model_options;
  qhx_model_options_default(&model_options);
  model_options.n_threads = args.threads;
  model_options.verify_sha256 = args.verify ? 1 : 0;
  model_options.device = args.devices.device.c_str();
  model_options.decode_device = args.devices.decode_or_null();
  model_options.device_check = args.devices.device_check.c_str();
  model_options.kv_type = args.devices.kv_type.c_str();
  if (!args.devices.qnn_lib.empty()) model_options.qnn_lib = args.devices.qnn_lib.c_str();
  if (!args.devices.npu_pack.empty()) model_options.npu_pack = args.devices.npu_pack.c_str();
  model_options.draft_model = args.speculative.draft_model();
  model_options.mtp_vocab_size = args.speculative.mtp_vocab;
  OpenedModel m;
  if (qhx_model_open(dir.c_str(), &model_options, &m.model) != QHX_OK) {
    qhx::fail(dir.string(), qhx_last_error());
  }
  qhx_model_info info;
  check(qhx_model_get_info(m.model, &info));
  if (info.admission_note[0] != '\0') std::fprintf(stderr, "%s\n", info.admission_note);
  if (info.device_note[0] != '\0') std::fprintf(stderr, "qhx: %s\n", info.device_note);
  print_model_note(info, "qhx: ");
  // The model's own configuration, for generation_config.json's max_new_tokens; a bundle's
  // provenance on stderr (its files were checked as the model opened).
  qhx::ModelConfig config;
  if (qhx::is_bundle(dir)) {
    const qhx::BundleManifest manifest = qhx::open_bundle_manifest(dir, {});
    std::fprintf(stderr, "%s\n", describe_bundle(manifest).c_str());
    config = manifest.config;
  } else {
    config = qhx::load_model_config(dir / "config.json");
  }

  // A --prompt with images goes through the chat template, unless its text places them itself.
  const bool templated_images = !args.images.empty() && args.prompt_ids.empty() &&
                                info.has_chat_template &&
                                args.prompt.find("<|image_pad|>") == std::string::npos;
  std::vector<int32_t> prompt;
  if (templated_images) {
    prompt = chat_with_images(m.model, args.prompt, args.images);
  } else if (args.prompt_ids.empty()) {
    size_t n = 0;
    qhx_status status =
        qhx_tokenize(m.model, args.prompt.data(), args.prompt.size(), nullptr, 0, &n);
    if (status == QHX_ERROR_BUFFER_TOO_SMALL) {
      prompt.resize(n);
      status = qhx_tokenize(m.model, args.prompt.data(), args.prompt.size(), prompt.data(), n, &n);
    }
    if (status != QHX_OK) qhx::fail("--prompt", qhx_last_error());
  } else {
    prompt = parse_id_list(args.prompt_ids, "--prompt-ids");
  }
  if (!args.images.empty() && !templated_images) {
    prompt = with_images(m.model, config, std::move(prompt), args.images, !args.prompt.empty());
  }

  // The checkpoint's defaults, as transformers' generate() would use them; a sampling flag turns
  // sampling on (with the file's other values), --greedy turns it off.
  qhx_generate_options options;
  check(qhx_generate_options_default(m.model, &options));
  options.max_new_tokens =
      args.n.value_or(qhx::load_generation_config(dir, config).max_new_tokens.value_or(64));
  qhx_sampling& s = options.sampling;
  if (args.greedy) {
    s.greedy = 1;
  } else if (args.temperature || args.top_k || args.top_p || args.min_p) {
    s.greedy = 0;
  }
  s.temperature = args.temperature.value_or(s.temperature);
  s.top_k = static_cast<int32_t>(args.top_k.value_or(s.top_k));
  s.top_p = args.top_p.value_or(s.top_p);
  s.min_p = args.min_p.value_or(s.min_p);
  s.repetition_penalty = args.repeat_penalty.value_or(s.repetition_penalty);
  s.presence_penalty = args.presence_penalty.value_or(s.presence_penalty);
  s.frequency_penalty = args.frequency_penalty.value_or(s.frequency_penalty);
  std::vector<int32_t> bias_ids;
  std::vector<float> bias_values;
  for (const std::string& item : args.logit_bias) {
    const auto [id, bias] = parse_logit_bias(item);
    bias_ids.push_back(id);
    bias_values.push_back(bias);
  }
  s.logit_bias_ids = bias_ids.data();
  s.logit_bias_values = bias_values.data();
  s.n_logit_bias = bias_ids.size();
  s.seed = args.seed.value_or(std::random_device{}());
  options.stop_at_eos = args.ignore_eos ? 0 : 1;
  std::vector<const char*> stops;
  for (const std::string& stop : args.stop) stops.push_back(stop.c_str());
  options.stop_strings = stops.data();
  options.n_stop_strings = stops.size();
  const std::string format = response_format(args);
  options.response_format = format.empty() ? nullptr : format.c_str();
  options.speculative = args.speculative.kind();
  options.draft_max = args.speculative.draft_max;
  check(qhx_generate_options_check(m.model, &options));

  struct Output {
    bool ids;
    std::vector<int32_t> generated;
  } out{args.print_ids, {}};
  const auto on_token = [](void* user, int32_t token, const char* text, size_t len) {
    auto* o = static_cast<Output*>(user);
    if (token >= 0) o->generated.push_back(token);
    if (!o->ids) std::cout.write(text, static_cast<std::streamsize>(len)).flush();
    return 0;
  };
  check(qhx_session_create(m.model, nullptr, &m.session));
  qhx_generate_result result;
  check(qhx_session_generate(m.session, prompt.data(), prompt.size(), &options, on_token, &out,
                             &result));
  qhx_string_free(result.text);
  if (args.print_ids) {
    for (size_t i = 0; i < out.generated.size(); ++i)
      std::cout << (i ? "," : "") << out.generated[i];
  }
  std::cout << "\n";
  std::cout.flush();

  std::string speculation;
  if (result.verify_passes > 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf, " | speculative %s: %lld passes, %lld of %lld drafted accepted",
                  args.speculative.kind(), static_cast<long long>(result.verify_passes),
                  static_cast<long long>(result.accepted), static_cast<long long>(result.drafted));
    speculation = buf;
  }
  std::string constraint;
  if (!format.empty()) {
    char buf[96];
    std::snprintf(
        buf, sizeof buf, " | constraint %.1f ms (%.0f µs/token)", result.constraint_ms,
        result.constraint_ms * 1e3 / static_cast<double>(std::max<int64_t>(1, result.n_generated)));
    constraint = buf;
  }
  std::string device;
  if (result.device_tokens > 0) {
    qhx_model_info info;
    check(qhx_model_get_info(m.model, &info));
    const std::string decoder = info.decode_device;
    const bool both = decoder != "cpu" && !decoder.empty() && decoder != info.prefill_device;
    device = " | " + std::to_string(result.device_tokens) + " prompt tokens on " +
             info.prefill_device + (both ? " + " + decoder : "");
  }
  const double prefill_tps = result.n_prompt / std::max(result.prefill_ms * 1e-3, 1e-9);
  const double decode_tps = result.n_generated > 1
                                ? (result.n_generated - 1) / std::max(result.decode_ms * 1e-3, 1e-9)
                                : 0;
  std::fprintf(stderr,
               "prefill: %lld tokens, %.1f tok/s | decode: %lld tokens, %.1f tok/s | "
               "TTFT %.1f ms | peak RSS %.1f MB | %s%s%s%s\n",
               static_cast<long long>(result.n_prompt), prefill_tps,
               static_cast<long long>(result.n_generated), decode_tps, result.ttft_ms,
               peak_rss_mb(),
               s.greedy ? "greedy" : ("sampled, seed " + std::to_string(s.seed)).c_str(),
               speculation.c_str(), constraint.c_str(), device.c_str());
  return 0;
}

}  // namespace qhx::cli
