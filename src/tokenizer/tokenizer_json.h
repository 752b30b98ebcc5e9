// Reading a Hugging Face tokenizer.json in one streaming pass. Its two big tables, model.vocab
// (one entry per token) and model.merges, go straight into flat arrays of spans over one text
// buffer each; only the rest of the document (a few KB: normalizer, pre-tokenizer, added tokens,
// decoder, the model's flags) becomes a JSON tree. A tree of the whole file is what made loading
// slow and large: ~500k small heap objects for a 151k vocabulary, ~88 MB at its peak.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "util/json_file.h"

namespace qhx {

// Far above any real vocabulary; keeps a corrupt id from sizing a huge table.
inline constexpr int64_t kMaxTokenId = int64_t{1} << 24;

struct TokenizerJson {
  struct Span {
    uint32_t begin = 0;
    uint32_t size = 0;
  };
  struct VocabEntry {
    Span spelling;  // in vocab_text
    int32_t id;
  };
  struct MergeEntry {
    Span left, right;  // in merge_text
  };

  Json rest;  // the document without model.vocab and model.merges (unless they had another type)
  bool has_vocab = false, has_merges = false;  // read into the tables
  std::string vocab_text;                      // the spellings, one after the other
  std::vector<VocabEntry> vocab;
  std::string merge_text;
  std::vector<MergeEntry> merges;  // in rank order

  std::string_view merge_text_of(Span s) const {
    return std::string_view(merge_text).substr(s.begin, s.size);
  }
};

// Throws Error naming the file and the field: "<file>: model.vocab.<spelling>: ...",
// "<file>: model.merges[7]: ...", "<file>: invalid JSON at byte N: ...". A vocabulary id must be
// an integer in [0, kMaxTokenId); a merge is "left right" or ["left", "right"].
TokenizerJson read_tokenizer_json(const std::filesystem::path& path);

}  // namespace qhx
