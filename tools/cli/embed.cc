// qhx embed: sentence embeddings of texts (Qwen3-Embedding checkpoints, or any model with
// --pooling), one JSON array per input on stdout, or OpenAI's embeddings object, or the cosine
// similarities between them; the speed on stderr.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "qhx/qhx.h"
#include "util/error.h"

namespace qhx::cli {
namespace {

// The inputs: each --prompt, then each non-empty line of --file ("-": stdin).
std::vector<std::string> read_inputs(const EmbedArgs& args) {
  std::vector<std::string> inputs = args.prompts;
  if (!args.file.empty()) {
    std::ifstream file;
    if (args.file != "-") {
      file.open(args.file, std::ios::binary);
      if (!file) qhx::fail(args.file, "cannot open");
    }
    std::istream& in = args.file == "-" ? std::cin : file;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) inputs.push_back(line);
    }
  }
  if (inputs.empty()) qhx::fail("embed", "no input: give --prompt or --file");
  return inputs;
}

}  // namespace

int run_embed(const EmbedArgs& args) {
  const std::vector<std::string> inputs = read_inputs(args);
  qhx_model_options model_options;
  qhx_model_options_default(&model_options);
  model_options.n_threads = args.threads;
  model_options.device = args.devices.device.c_str();
  model_options.device_check = args.devices.device_check.c_str();
  model_options.kv_type = args.devices.kv_type.c_str();
  if (!args.devices.qnn_lib.empty()) model_options.qnn_lib = args.devices.qnn_lib.c_str();
  OpenedModel m;
  if (qhx_model_open(args.model.c_str(), &model_options, &m.model) != QHX_OK) {
    qhx::fail(args.model, qhx_last_error());
  }
  qhx_model_info info;
  qhx_model_get_info(m.model, &info);
  if (info.device_note[0] != '\0') std::fprintf(stderr, "qhx: %s\n", info.device_note);
  print_model_note(info, "qhx: ");
  if (qhx_session_create(m.model, nullptr, &m.session) != QHX_OK) {
    qhx::fail("embed", qhx_last_error());
  }

  qhx_embed_options options;
  qhx_embed_options_default(&options);
  if (!args.pooling.empty()) options.pooling = args.pooling.c_str();
  if (args.no_normalize) options.normalize = 0;
  options.dimensions = args.dimensions;
  // --instruct: the form Qwen3-Embedding's model card gives its queries.
  const std::string prefix =
      args.instruct.empty() ? args.prefix : "Instruct: " + args.instruct + "\nQuery:";
  if (!args.instruct.empty() || !args.prefix.empty()) options.prompt = prefix.c_str();
  if (!args.prompt_name.empty()) options.prompt_name = args.prompt_name.c_str();

  std::vector<const char*> texts;
  std::vector<size_t> lens;
  for (const std::string& t : inputs) {
    texts.push_back(t.data());
    lens.push_back(t.size());
  }
  qhx_embed_result result;
  qhx_status status =
      qhx_embed(m.session, texts.data(), lens.data(), texts.size(), &options, nullptr, 0, &result);
  std::vector<float> vectors(texts.size() * static_cast<size_t>(result.dimensions));
  if (status == QHX_ERROR_BUFFER_TOO_SMALL) {
    status = qhx_embed(m.session, texts.data(), lens.data(), texts.size(), &options, vectors.data(),
                       vectors.size(), &result);
  }
  if (status != QHX_OK) qhx::fail("embed", qhx_last_error());

  const size_t dims = static_cast<size_t>(result.dimensions);
  const auto vector_of = [&](size_t i) {
    return std::vector<float>(vectors.begin() + i * dims, vectors.begin() + (i + 1) * dims);
  };
  if (args.format == "json") {
    for (size_t i = 0; i < inputs.size(); ++i) std::cout << nlohmann::json(vector_of(i)) << "\n";
  } else if (args.format == "openai") {
    nlohmann::ordered_json data = nlohmann::ordered_json::array();
    for (size_t i = 0; i < inputs.size(); ++i) {
      data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", vector_of(i)}});
    }
    std::cout << nlohmann::ordered_json{{"object", "list"},
                                        {"data", data},
                                        {"model", info.name},
                                        {"usage",
                                         {{"prompt_tokens", result.n_tokens},
                                          {"total_tokens", result.n_tokens}}}}
              << "\n";
  } else {
    // Cosine similarity, row i against column j (the dot product when the vectors are unit).
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (size_t j = 0; j < inputs.size(); ++j) {
        double dot = 0, ni = 0, nj = 0;
        for (size_t k = 0; k < dims; ++k) {
          dot += double{vectors[i * dims + k]} * vectors[j * dims + k];
          ni += double{vectors[i * dims + k]} * vectors[i * dims + k];
          nj += double{vectors[j * dims + k]} * vectors[j * dims + k];
        }
        std::printf("%s%.4f", j == 0 ? "" : " ", dot / std::max(std::sqrt(ni * nj), 1e-12));
      }
      std::printf("\n");
    }
  }
  if (result.n_truncated > 0) {
    std::fprintf(stderr,
                 "embed: %lld inputs cut to the model's max_seq_length "
                 "(sentence_bert_config.json), as sentence-transformers cuts them\n",
                 static_cast<long long>(result.n_truncated));
  }
  std::fprintf(stderr, "embed: %zu inputs, %lld tokens, %lld dimensions, %.1f ms (%.1f tokens/s)\n",
               inputs.size(), static_cast<long long>(result.n_tokens),
               static_cast<long long>(result.dimensions), result.ms,
               result.ms > 0 ? 1000.0 * static_cast<double>(result.n_tokens) / result.ms : 0.0);
  return 0;
}

}  // namespace qhx::cli
