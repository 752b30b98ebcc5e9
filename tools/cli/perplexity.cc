// qhx perplexity: a text file scored over windows, with the progress on stderr.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "io/bundle.h"
#include "io/pack.h"
#include "models/model.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/json_file.h"

namespace qhx::cli {

namespace fs = std::filesystem;

namespace {

fs::path model_dir(const std::string& path) {
  fs::path dir(path);
  if (qhx::is_pack(dir)) dir = qhx::select_pack_bundle(dir);
  return dir;
}

void progress(int64_t done, int64_t total) {
  std::fprintf(stderr, "\rwindow %lld/%lld", static_cast<long long>(done),
               static_cast<long long>(total));
}

// The divergence from the base, as llama-perplexity --kl-divergence prints it.
int report_divergence(const PerplexityArgs& args, const qhx::DivergenceResult& r, double seconds) {
  const double base = r.base.perplexity(), ppl = r.model.perplexity();
  if (args.json) {
    const qhx::Json out = {{"model", args.model},
                           {"base", args.kl_base},
                           {"file", args.file},
                           {"perplexity", ppl},
                           {"base_perplexity", base},
                           {"ppl_delta", r.ppl_delta()},
                           {"ppl_delta_error", r.ppl_delta_error()},
                           {"ppl_delta_percent", 100 * r.ppl_delta() / base},
                           {"log_ppl_ratio", r.log_ppl_ratio()},
                           {"log_ppl_ratio_error", r.log_ppl_ratio_error()},
                           {"kl_mean", r.kl_mean()},
                           {"kl_mean_error", r.kl_mean_error()},
                           {"kl_median", r.kl_quantile(0.5)},
                           {"kl_p99", r.kl_quantile(0.99)},
                           {"kl_max", r.kl_quantile(1)},
                           {"top1_agreement", r.top1_agreement()},
                           {"rms_p_gap", r.rms_p_gap()},
                           {"tokens", r.model.scored},
                           {"windows", r.model.windows},
                           {"window", args.window},
                           {"second_half", args.second_half},
                           {"seconds", seconds}};
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::printf("perplexity %.4f, base %.4f over %lld tokens (%lld windows of %lld, %.1f s)\n", ppl,
              base, static_cast<long long>(r.model.scored), static_cast<long long>(r.model.windows),
              static_cast<long long>(args.window), seconds);
  std::printf("PPL - PPL(base)       %+.4f ± %.4f (%+.3f%%)\n", r.ppl_delta(), r.ppl_delta_error(),
              100 * r.ppl_delta() / base);
  std::printf("ln(PPL / PPL(base))   %+.6f ± %.6f\n", r.log_ppl_ratio(), r.log_ppl_ratio_error());
  std::printf("KL divergence         mean %.6f ± %.6f, median %.6f, 99%% %.6f, max %.6f\n",
              r.kl_mean(), r.kl_mean_error(), r.kl_quantile(0.5), r.kl_quantile(0.99),
              r.kl_quantile(1));
  std::printf("same top-1            %.3f%%\n", 100 * r.top1_agreement());
  std::printf("RMS delta p           %.3f%%\n", 100 * r.rms_p_gap());
  return 0;
}

}  // namespace

// Reads a text file, scores it with the model and prints the perplexity (see perplexity.h).
int run_perplexity(const PerplexityArgs& args) {
  const fs::path dir = model_dir(args.model);
  const qhx::Tokenizer tokenizer = qhx::Tokenizer::load(dir);
  std::ifstream in(args.file, std::ios::binary);
  if (!in) qhx::fail(args.file, "cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> ids = tokenizer.encode(text, args.file);
  if (args.max_tokens > 0 && static_cast<int64_t>(ids.size()) > args.max_tokens) {
    ids.resize(args.max_tokens);
  }
  if (qhx::is_bundle(dir)) {
    std::fprintf(stderr, "%s\n", describe_bundle(qhx::open_bundle_manifest(dir, {})).c_str());
  }
  const qhx::OpenedDevices devices = open_devices(args.devices, dir);
  const auto context = cpu_context(args.threads);
  const auto model =
      qhx::load_model(dir, {.context = context,
                            .devices = devices.backends,
                            .kv_type = qhx::parse_kv_type(args.devices.kv_type, "--kv-type")});
  check_devices(*model, devices, args.devices, dir);
  const qhx::PerplexityWindows windows{.window = args.window, .second_half = args.second_half};
  const auto start = qhx::Clock::now();
  if (!args.kl_base.empty()) {
    // The base runs on the CPU, on the same threads (its passes and the model's take turns).
    const auto base = qhx::load_model(model_dir(args.kl_base), {.context = context});
    const qhx::DivergenceResult r = qhx::kl_divergence(*base, *model, ids, windows, progress);
    std::fprintf(stderr, "\n");
    return report_divergence(args, r, qhx::seconds_since(start));
  }
  const qhx::PerplexityResult r = qhx::perplexity(*model, ids, windows, progress);
  const double seconds = qhx::seconds_since(start);
  std::fprintf(stderr, "\n");
  if (args.json) {
    const qhx::Json out = {{"model", args.model},          {"file", args.file},
                           {"perplexity", r.perplexity()}, {"nll_mean", r.nll_sum / r.scored},
                           {"tokens", r.scored},           {"windows", r.windows},
                           {"window", args.window},        {"seconds", seconds}};
    std::cout << out.dump() << "\n";
  } else {
    std::printf("perplexity %.4f over %lld tokens (%lld windows of %lld, %.1f s)\n", r.perplexity(),
                static_cast<long long>(r.scored), static_cast<long long>(r.windows),
                static_cast<long long>(args.window), seconds);
  }
  return 0;
}

}  // namespace qhx::cli
