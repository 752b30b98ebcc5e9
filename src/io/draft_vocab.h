// draft_vocab.json (docs/speculative.md): the tokens a drafter proposes from, most frequent
// first. Beside a checkpoint or in a bundle, it narrows the MTP head's lm_head to those rows: on
// a small model with a large vocabulary the full lm_head is most of a draft step's cost, and a
// draft outside the tokens a text uses is rarely kept anyway.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

namespace qhx {

inline constexpr const char* kDraftVocabFile = "draft_vocab.json";

// The ids of `text` (draft_vocab.json's contents, from `where`) for a model of vocab_size
// tokens: {"format": "qhx-draft-vocab", "version": 1, "vocab_size": N, "ids": [...]}. Throws
// Error naming `where` and the field on anything else: a wrong format or version, a vocab_size
// other than the model's, an empty list, an id outside [0, vocab_size) or listed twice.
std::vector<int32_t> parse_draft_vocab(std::string_view text, std::string_view where,
                                       int64_t vocab_size);
std::vector<int32_t> read_draft_vocab(const std::filesystem::path& file, int64_t vocab_size);

}  // namespace qhx
