// Byte-level BPE tokenizer for Qwen3 / Qwen3.5 read from Hugging Face tokenizer.json files
// (MODELS.md §4): added tokens, NFC, regex split, GPT-2 byte mapping, rank-based BPE.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qhx {

// Immutable once loaded; copies share the tables and every method is safe to call from
// several threads at once.
class Tokenizer {
 public:
  // Loads <dir>/tokenizer.json (required), <dir>/tokenizer_config.json (optional: special token
  // names, add_bos_token, chat_template) and <dir>/chat_template.jinja (optional; it takes
  // precedence over the config's template, as in transformers). Errors name the file and field.
  static Tokenizer load(const std::filesystem::path& dir);

  // Encodes UTF-8 text; added tokens in the text become their ids. No BOS/EOS is added.
  // Invalid UTF-8 throws Error "<where>: invalid UTF-8 at byte N".
  std::vector<int32_t> encode(std::string_view text, std::string_view where = "prompt") const;
  // What Hugging Face's tokenizer(text) gives (add_special_tokens=True): encode()'s ids within
  // those tokenizer.json's post_processor puts around one sequence (its TemplateProcessing;
  // Qwen3-Embedding's appends <|endoftext|>, the Qwen3 and Qwen3.5 tokenizers add nothing).
  // max_length > 0: cut as tokenizer(text, truncation=True, max_length=...) does, the text's ids
  // first (the special tokens stay), and *truncated (if given) says whether it was.
  std::vector<int32_t> encode_with_special_tokens(std::string_view text,
                                                  std::string_view where = "prompt",
                                                  size_t max_length = 0,
                                                  bool* truncated = nullptr) const;

  // Joins the tokens' bytes and replaces invalid UTF-8 with U+FFFD, one per maximal invalid
  // subpart (as Python's errors="replace"). Ids no token has are skipped, as Hugging Face does.
  // skip_special drops added tokens marked special.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The raw bytes a token stands for (an added token: its content). Unknown id throws Error.
  std::string token_bytes(int32_t id) const;
  // Id of a vocabulary entry (in its byte-level spelling, e.g. "Ġthe") or an added token.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // 1 + the highest id known (vocabulary and added tokens).
  int32_t size() const;
  bool is_special(int32_t id) const;

  const std::string& chat_template() const;  // empty if none
  std::optional<int32_t> eos_id() const;     // tokenizer_config eos_token
  std::optional<int32_t> pad_id() const;     // tokenizer_config pad_token
  std::optional<int32_t> bos_id() const;     // tokenizer_config bos_token
  bool add_bos_token() const;                // tokenizer_config add_bos_token (default false)
  // tokenizer_config's named special tokens that are set (bos_token, eos_token, unk_token,
  // sep_token, pad_token, cls_token, mask_token, in that order) with their text.
  const std::vector<std::pair<std::string, std::string>>& special_token_strings() const;

 private:
  friend class StreamingDecoder;
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

// Decoding for generation: push ids one at a time and get back only complete UTF-8 text;
// an unfinished multi-byte sequence is held until its last byte arrives. The pushes plus
// flush() concatenate to exactly Tokenizer::decode of the same ids.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(int32_t id);
  // Returns what is held (invalid bytes replaced) and starts over.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace qhx
