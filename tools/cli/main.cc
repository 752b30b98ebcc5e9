// qhx command line: generate text from a checkpoint, tokenize text.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "io/hf_config.h"
#include "models/model.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

namespace fs = std::filesystem;

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 0 || value > INT32_MAX) {
      qhx::fail("--prompt-ids", "'" + item + "' is not a token id");
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  if (ids.empty()) qhx::fail("--prompt-ids", "no ids given");
  return ids;
}

std::optional<qhx::Tokenizer> load_tokenizer_if_present(const fs::path& dir) {
  if (!fs::exists(dir / "tokenizer.json")) return std::nullopt;
  return qhx::Tokenizer::load(dir);
}

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  int64_t n = 64;
  bool greedy = false;
  std::optional<float> temperature;
  std::optional<int64_t> top_k;
  std::optional<float> top_p;
  std::optional<uint64_t> seed;
  bool print_ids = false;
  bool ignore_eos = false;
};

int run_generate(const GenerateArgs& args) {
  const fs::path dir(args.model);
  const auto tokenizer = load_tokenizer_if_present(dir);
  if (!tokenizer && (!args.prompt.empty() || !args.print_ids)) {
    qhx::fail(dir.string(), "no tokenizer.json: use --prompt-ids and --print-ids");
  }
  const std::vector<int32_t> prompt =
      args.prompt_ids.empty() ? tokenizer->encode(args.prompt, "--prompt")
                              : parse_id_list(args.prompt_ids);

  const auto model = qhx::load_model(dir);
  const qhx::GenerationDefaults defaults =
      qhx::load_generation_defaults(dir / "generation_config.json");

  qhx::GenerateOptions options;
  options.max_new_tokens = args.n;
  qhx::SamplingParams& s = options.sampling;
  s.greedy = args.greedy || (!defaults.do_sample.value_or(false) && !args.temperature &&
                             !args.top_k && !args.top_p);
  s.temperature = args.temperature.value_or(static_cast<float>(defaults.temperature.value_or(1.0)));
  s.top_k = args.top_k.value_or(defaults.top_k.value_or(0));
  s.top_p = args.top_p.value_or(static_cast<float>(defaults.top_p.value_or(1.0)));
  s.seed = args.seed.value_or(std::random_device{}());
  if (!args.ignore_eos) {
    std::set<int32_t> stops(defaults.eos_token_ids.begin(), defaults.eos_token_ids.end());
    stops.insert(model->config().eos_token_ids.begin(), model->config().eos_token_ids.end());
    if (tokenizer && tokenizer->eos_id()) stops.insert(*tokenizer->eos_id());
    options.stop_ids.assign(stops.begin(), stops.end());
  }

  std::vector<int32_t> generated;
  std::optional<qhx::StreamingDecoder> text_out;
  if (!args.print_ids) text_out.emplace(*tokenizer);
  const auto state = model->new_state();
  const qhx::GenerateStats stats =
      qhx::generate(*model, *state, prompt, options, [&](int32_t id) {
        generated.push_back(id);
        if (text_out) {
          std::cout << text_out->push(id) << std::flush;
        }
      });
  if (args.print_ids) {
    for (size_t i = 0; i < generated.size(); ++i) std::cout << (i ? "," : "") << generated[i];
    std::cout << "\n";
  } else {
    std::cout << text_out->flush() << "\n";
  }
  std::cout.flush();

  const double prefill_tps = stats.n_prompt / std::max(stats.prefill_seconds, 1e-9);
  const double decode_tps =
      stats.n_generated > 1 ? (stats.n_generated - 1) / std::max(stats.decode_seconds, 1e-9) : 0;
  std::fprintf(stderr,
               "prefill: %lld tokens, %.1f tok/s | decode: %lld tokens, %.1f tok/s | "
               "TTFT %.1f ms | peak RSS %.1f MB | %s\n",
               static_cast<long long>(stats.n_prompt), prefill_tps,
               static_cast<long long>(stats.n_generated), decode_tps, stats.ttft_seconds * 1e3,
               peak_rss_mb(),
               s.greedy ? "greedy"
                        : ("sampled, seed " + std::to_string(s.seed)).c_str());
  return 0;
}

int run_tokenize(const std::string& model_dir) {
  const qhx::Tokenizer tokenizer = qhx::Tokenizer::load(model_dir);
  const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = tokenizer.encode(text, "stdin");
  std::cout << "[";
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
  std::cout << "]\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qhx: on-device runtime for Qwen3 models"};
  app.require_subcommand(1);

  GenerateArgs gen;
  CLI::App* generate = app.add_subcommand("generate", "Generate a continuation of a prompt");
  generate->add_option("--model,-m", gen.model, "Hugging Face checkpoint directory")->required();
  auto* prompt_opt = generate->add_option("--prompt,-p", gen.prompt, "Prompt text (UTF-8)");
  auto* ids_opt = generate->add_option("--prompt-ids", gen.prompt_ids,
                                       "Prompt as comma-separated token ids");
  prompt_opt->excludes(ids_opt);
  generate->add_option("-n,--n-predict", gen.n, "Tokens to generate")
      ->check(CLI::NonNegativeNumber);
  generate->add_flag("--greedy", gen.greedy, "Pick the most likely token (no sampling)");
  generate->add_option("--temperature", gen.temperature, "Sampling temperature");
  generate->add_option("--top-k", gen.top_k, "Sample from the k most likely tokens (0: all)");
  generate->add_option("--top-p", gen.top_p, "Sample from the smallest set with this mass");
  generate->add_option("--seed", gen.seed, "Random seed (default: random, printed)");
  generate->add_flag("--print-ids", gen.print_ids,
                     "Print the generated ids, comma-separated, on one line instead of text");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "Do not stop at the end-of-sequence ids");

  std::string tokenize_model;
  CLI::App* tokenize =
      app.add_subcommand("tokenize", "Read UTF-8 text on stdin, print its token ids as JSON");
  tokenize->add_option("--model,-m", tokenize_model, "Directory with tokenizer.json")->required();

  CLI11_PARSE(app, argc, argv);
  try {
    if (generate->parsed()) {
      if (gen.prompt.empty() && gen.prompt_ids.empty()) {
        qhx::fail("generate", "give --prompt or --prompt-ids");
      }
      return run_generate(gen);
    }
    return run_tokenize(tokenize_model);
  } catch (const qhx::Error& e) {
    std::cout.flush();
    std::fprintf(stderr, "qhx: error: %s\n", e.what());
    return 1;
  }
}
