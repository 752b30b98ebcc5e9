// qhx forge draft-vocab: the draft vocabulary (io/draft_vocab.h) of a model for the text it will
// see: the tokens of sample text, most frequent first, as many as cover a share of it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace qhx {

class Tokenizer;

struct DraftVocabOptions {
  double coverage = 0.999;  // share of the text's tokens the list covers, in (0, 1]
  int64_t max_tokens = 0;   // at most this many tokens (0: no bound)
};

struct DraftVocab {
  std::vector<int32_t> ids;  // most frequent first; ties: the smaller id first
  int64_t text_tokens = 0;   // tokens of the text
  double coverage = 0;       // share of them the ids cover
};

// The ids of `texts` (UTF-8, encoded without special tokens) ranked by frequency. Throws Error
// when the texts hold no token or the options are out of range.
DraftVocab rank_draft_vocab(const Tokenizer& tokenizer, std::span<const std::string> texts,
                            const DraftVocabOptions& options);

// Writes draft_vocab.json for a model of vocab_size tokens; `source` says where the list comes
// from. The file reads back with read_draft_vocab.
void write_draft_vocab(const std::filesystem::path& file, const DraftVocab& vocab,
                       int64_t vocab_size, const std::string& source);

}  // namespace qhx
