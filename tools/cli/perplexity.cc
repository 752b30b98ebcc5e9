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

// Reads a text file, scores it with the model and prints the perplexity (see perplexity.h).
int run_perplexity(const PerplexityArgs& args) {
  fs::path dir(args.model);
  if (qhx::is_pack(dir)) dir = qhx::select_pack_bundle(dir);
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
  const auto model =
      qhx::load_model(dir, {.context = cpu_context(args.threads), .devices = devices.backends});
  check_devices(*model, devices, args.devices, dir);
  const auto start = qhx::Clock::now();
  const qhx::PerplexityResult r =
      qhx::perplexity(*model, ids, args.window, [](int64_t done, int64_t total) {
        std::fprintf(stderr, "\rwindow %lld/%lld", static_cast<long long>(done),
                     static_cast<long long>(total));
      });
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
