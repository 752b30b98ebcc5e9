#include "forge/draft_vocab.h"

#include <algorithm>
#include <fstream>
#include <map>

#include "io/draft_vocab.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/json_file.h"
#include "util/partial_path.h"

namespace qhx {

DraftVocab rank_draft_vocab(const Tokenizer& tokenizer, std::span<const std::string> texts,
                            const DraftVocabOptions& options) {
  if (!(options.coverage > 0.0 && options.coverage <= 1.0)) {
    fail("--coverage", "expected a share in (0, 1]");
  }
  if (options.max_tokens < 0) fail("--max-tokens", "expected a count, 0 for no bound");
  std::map<int32_t, int64_t> counts;
  DraftVocab out;
  for (const std::string& text : texts) {
    for (const int32_t id : tokenizer.encode(text, "text")) ++counts[id];
  }
  for (const auto& [id, n] : counts) out.text_tokens += n;
  if (out.text_tokens == 0) fail("draft vocabulary", "the text holds no token");
  std::vector<std::pair<int32_t, int64_t>> ranked(counts.begin(), counts.end());
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  int64_t covered = 0;
  for (const auto& [id, n] : ranked) {
    if (static_cast<double>(covered) >= options.coverage * static_cast<double>(out.text_tokens)) {
      break;
    }
    if (options.max_tokens > 0 && static_cast<int64_t>(out.ids.size()) == options.max_tokens) {
      break;
    }
    out.ids.push_back(id);
    covered += n;
  }
  out.coverage = static_cast<double>(covered) / static_cast<double>(out.text_tokens);
  return out;
}

void write_draft_vocab(const std::filesystem::path& file, const DraftVocab& vocab,
                       int64_t vocab_size, const std::string& source) {
  const Json doc = {{"format", "qhx-draft-vocab"},
                    {"version", 1},
                    {"vocab_size", vocab_size},
                    {"source", source},
                    {"text_tokens", vocab.text_tokens},
                    {"coverage", vocab.coverage},
                    {"ids", vocab.ids}};
  const std::string text = doc.dump() + "\n";
  parse_draft_vocab(text, file.string(), vocab_size);  // what a loader will check
  // Whole or not at all: a half-written list beside a checkpoint would stop it from loading.
  const std::filesystem::path partial = partial_sibling(file);
  PartialGuard guard(partial);
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) fail(file.string(), "cannot be written");
  }
  std::error_code ec;
  std::filesystem::rename(partial, file, ec);
  if (ec) fail(file.string(), "cannot be written: " + ec.message());
  guard.release();
}

}  // namespace qhx
