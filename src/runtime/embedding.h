// Sentence embeddings as sentence-transformers computes them from a checkpoint (Qwen3-Embedding:
// a Qwen3 model, its final-norm rows pooled at the last token, L2-normalised): the checkpoint's
// modules.json, 1_Pooling/config.json and config_sentence_transformers.json say how, a forward pass
// without logits gives the rows.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/model.h"
#include "util/json_file.h"

namespace qhx {

// Which rows make the vector: the last token's (Qwen3-Embedding; its tokenizer appends
// <|endoftext|>, whose row it is), the mean of every token's, or the first token's.
enum class Pooling { kLastToken, kMean, kCls };

// "last", "mean", "cls" (the names llama.cpp's --pooling uses); anything else is an Error naming
// `where`.
Pooling parse_pooling(std::string_view name, std::string_view where);
const char* pooling_name(Pooling pooling);

// Error naming "dimensions" unless 0 (all of them) or 1..hidden_size.
void check_dimensions(int64_t dimensions, int64_t hidden_size);

// What a checkpoint directory's sentence-transformers files say.
struct EmbeddingConfig {
  std::optional<Pooling> pooling;  // none: the directory has no pooling module (a generative model)
  bool normalize = false;          // a Normalize module follows the pooling
  // config_sentence_transformers.json's prompts (name, text put before the input), by name,
  // and default_prompt_name ("" for none).
  std::vector<std::pair<std::string, std::string>> prompts;
  std::string default_prompt_name;
  // sentence_bert_config.json's max_seq_length: inputs are cut to it (their text, not the special
  // tokens), as sentence-transformers cuts them; 0: no bound but the context.
  int64_t max_seq_length = 0;

  // The prompt called `name`; Error naming the names there are when it has none.
  const std::string& prompt(std::string_view name) const;
};

// Reads modules.json (else a bare 1_Pooling/config.json) and config_sentence_transformers.json in
// `dir`, or a bundle's manifest.json "embedding" (what forge convert took from them:
// embedding_json). A directory without them gives an EmbeddingConfig without pooling. Modules that
// would change the vector in ways not computed here (Dense, LayerNorm, several pooling modes at
// once, max or weighted-mean pooling, a prompt left out of mean pooling) are an Error naming the
// file and field, never vectors that differ from sentence-transformers'.
EmbeddingConfig read_embedding_config(const std::filesystem::path& dir);
// {"pooling", "normalize", "prompts", "default_prompt_name"}: a bundle manifest's "embedding".
nlohmann::json embedding_json(const EmbeddingConfig& config);

struct EmbedParams {
  Pooling pooling = Pooling::kLastToken;
  bool normalize = true;
  int64_t dimensions = 0;  // 0: every one; else the first N (Matryoshka), before normalizing
  int64_t chunk = 512;     // tokens per forward pass (bounds activation memory)
  const std::atomic<bool>* cancel = nullptr;  // checked between passes
};

// The vector of one input: `ids` run through `model` from an empty `state` (reset first), in
// chunks, without logits. nullopt when cancelled. Throws Error for no ids or a bad dimension.
std::optional<std::vector<float>> embed_tokens(const Model& model, ModelState& state,
                                               std::span<const int32_t> ids,
                                               const EmbedParams& params);

}  // namespace qhx
