#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>
#include <unicode/utypes.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>

#include "tokenizer/tokenizer_json.h"
#include "util/error.h"
#include "util/json_file.h"
#include "util/mapped_file.h"
#include "util/utf8.h"

namespace qhx {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";
// What Hugging Face's ByteLevel pre-tokenizer splits with when use_regex is true (GPT-2's).
constexpr std::string_view kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------
// GPT-2 byte <-> character table (MODELS.md §4.2).

struct ByteTable {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // -1: not the image of any byte

  ByteTable() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool same = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      to_char[b] = same ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

// The vocabulary spelling of byte `b`: its table character in UTF-8 (all are below U+0800).
std::string byte_spelling(uint8_t b) {
  const char32_t c = byte_table().to_char[b];
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  return {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
}

// Length of the UTF-8 sequence led by `lead` in valid text.
size_t utf8_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Appends the raw bytes a vocabulary string stands for, through the byte table, to `out`;
// false (and `out` as it was) when a character is not in the table. `s` is valid UTF-8 (it
// came from JSON).
bool unmap_bytes(std::string_view s, std::string& out) {
  const ByteTable& table = byte_table();
  const size_t start = out.size();
  for (size_t i = 0; i < s.size();) {
    const auto lead = static_cast<uint8_t>(s[i]);
    const size_t len = utf8_length(lead);
    char32_t c = len == 1 ? lead : lead & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) c = (c << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    if (c >= table.to_byte.size() || table.to_byte[c] < 0) {
      out.resize(start);
      return false;
    }
    out += static_cast<char>(table.to_byte[c]);
    i += len;
  }
  return true;
}

// Bytes of one maximal subpart of an ill-formed sequence at the start of `s` (Unicode's
// "substitution of maximal subparts", which Python's errors="replace" follows): a lead byte
// plus the continuation bytes that could still have completed it; at least 1.
size_t invalid_subpart_length(std::string_view s) {
  const auto lead = static_cast<uint8_t>(s[0]);
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t len = 1;
  while (len < need && len < s.size()) {
    const auto b = static_cast<uint8_t>(s[len]);
    const bool ok = len == 1 ? (b >= lo && b <= hi) : (b & 0xC0) == 0x80;
    if (!ok) break;
    ++len;
  }
  return len;
}

// Appends `bytes` as UTF-8 with each maximal invalid subpart replaced by U+FFFD.
void append_lossy_utf8(std::string_view bytes, std::string& out) {
  while (!bytes.empty()) {
    const size_t bad = find_invalid_utf8(bytes);
    if (bad == std::string_view::npos) {
      out.append(bytes);
      return;
    }
    out.append(bytes.substr(0, bad));
    bytes.remove_prefix(bad);
    bytes.remove_prefix(invalid_subpart_length(bytes));
    out.append(kReplacementChar);
  }
}

// ---------------------------------------------------------------------------------------------
// JSON access with errors "<file>: <dotted.field>: <what>".

[[noreturn]] void fail_field(const std::string& file, std::string_view field,
                             std::string_view what) {
  fail(file + ": " + std::string(field), what);
}

std::string join_path(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : std::string(parent) + "." + std::string(key);
}

// The member `key` of `object` (named `parent`), or nullptr when absent or null.
const Json* optional_member(const Json& object, std::string_view parent, std::string_view key,
                            const std::string& file) {
  if (!object.is_object()) {
    if (parent.empty()) fail(file, "expected a JSON object");
    fail_field(file, parent, "expected a JSON object");
  }
  const auto it = object.find(key);
  return (it == object.end() || it->is_null()) ? nullptr : &*it;
}

const Json& member(const Json& object, std::string_view parent, std::string_view key,
                   const std::string& file) {
  const Json* value = optional_member(object, parent, key, file);
  if (value == nullptr) fail_field(file, join_path(parent, key), "missing");
  return *value;
}

std::string string_member(const Json& object, std::string_view parent, std::string_view key,
                          const std::string& file) {
  const Json& value = member(object, parent, key, file);
  if (!value.is_string()) fail_field(file, join_path(parent, key), "expected a string");
  return value.get<std::string>();
}

bool bool_member(const Json& object, std::string_view parent, std::string_view key,
                 const std::string& file, bool fallback) {
  const Json* value = optional_member(object, parent, key, file);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) fail_field(file, join_path(parent, key), "expected true or false");
  return value->get<bool>();
}

int32_t token_id(const Json& value, const std::string& field, const std::string& file) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
      value.get<int64_t>() >= kMaxTokenId) {
    fail_field(file, field,
               "expected a token id (integer 0.." + std::to_string(kMaxTokenId - 1) + ")");
  }
  return static_cast<int32_t>(value.get<int64_t>());
}

// log2 of the slots an open-addressing table of `count` entries gets: at most half full, so every
// probe ends at an empty slot.
int slot_bits(size_t count) {
  int bits = 4;
  while ((size_t{1} << bits) < 2 * count) ++bits;
  return bits;
}

// ---------------------------------------------------------------------------------------------
// Merge table: (left id, right id) -> (rank, merged id), open addressing for fast lookups.

struct Merge {
  int32_t rank;
  int32_t merged;
};

class MergeTable {
 public:
  void reserve(size_t count) {
    const int bits = slot_bits(count);
    slots_.assign(size_t{1} << bits, Slot{kEmpty, {}});
    mask_ = slots_.size() - 1;
    shift_ = 64 - bits;
  }

  // A pair listed twice keeps its later rank, as Hugging Face's merge map does.
  void insert(int32_t left, int32_t right, Merge merge) {
    const uint64_t k = key(left, right);
    for (size_t i = hash(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == k) {
        slots_[i] = Slot{k, merge};
        return;
      }
    }
  }

  const Merge* find(int32_t left, int32_t right) const {
    const uint64_t k = key(left, right);
    for (size_t i = hash(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are below 2^24, so never a real key
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static uint64_t key(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }
  // Fibonacci hashing: the top bits of the product mix every bit of the key.
  size_t hash(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> shift_; }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
};

// ---------------------------------------------------------------------------------------------
// Added-token search: leftmost match first, the longest token at that position (Hugging Face
// uses a leftmost-longest Aho-Corasick automaton; there are only a few dozen tokens).

class AddedTokenMatcher {
 public:
  struct Match {
    size_t pos;  // npos when there is none
    size_t len;
    int32_t id;
  };

  void add(std::string content, int32_t id) {
    auto& bucket = by_first_byte_[static_cast<uint8_t>(content[0])];
    bucket.emplace_back(std::move(content), id);
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    empty_ = false;
  }

  bool empty() const { return empty_; }

  Match find(std::string_view text, size_t from) const {
    for (size_t i = from; i < text.size(); ++i) {
      for (const auto& [content, id] : by_first_byte_[static_cast<uint8_t>(text[i])]) {
        if (text.compare(i, content.size(), content) == 0) return Match{i, content.size(), id};
      }
    }
    return Match{std::string_view::npos, 0, 0};
  }

 private:
  std::array<std::vector<std::pair<std::string, int32_t>>, 256> by_first_byte_;
  bool empty_ = true;
};

// ---------------------------------------------------------------------------------------------

struct RegexDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
using Regex = std::unique_ptr<pcre2_code, RegexDeleter>;

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(code, buffer.data(), buffer.size());
  return reinterpret_cast<const char*>(buffer.data());
}

// Compiles a Hugging Face split pattern. Hugging Face's regex engine takes \s as Unicode
// White_Space, while PCRE2's \s also matches U+180E, so \s and \S are spelled as the property.
Regex compile_regex(std::string_view pattern, const std::string& file, std::string_view field) {
  std::string translated;
  std::vector<size_t> source_offset;  // per byte of `translated`, its offset in `pattern`
  const auto emit = [&](std::string_view text, size_t from) {
    translated += text;
    source_offset.insert(source_offset.end(), text.size(), from);
  };
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      emit(next == 's'   ? "\\p{White_Space}"
           : next == 'S' ? "\\P{White_Space}"
                         : pattern.substr(i, 2),
           i);
      ++i;
    } else {
      emit(pattern.substr(i, 1), i);
    }
  }
  int code = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* regex =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
  if (regex == nullptr) {
    const size_t at = offset < source_offset.size() ? source_offset[offset] : pattern.size();
    fail_field(file, field,
               "bad regex at offset " + std::to_string(at) + ": " + pcre2_message(code));
  }
  // Without JIT support pcre2_match falls back to the interpreter, so failure here is fine.
  pcre2_jit_compile(regex, PCRE2_JIT_COMPLETE);
  return Regex(regex);
}

// NFC as Hugging Face tokenizers computes it. Its tables (the unicode-normalization-alignments
// crate) are Unicode 9.0.0's; ICU's are newer. A code point assigned after 9.0 is unknown to
// them: it neither decomposes nor composes, and its combining class is 0. Normalizing only the
// code points of Unicode 9.0, with every other one a boundary left as it is, therefore gives
// exactly Hugging Face's NFC (Unicode's stability policy keeps the older code points' data
// unchanged). tests/fixtures/tokenizer/nfc pins this against tokenizers itself.
class HuggingFaceNfc {
 public:
  HuggingFaceNfc() {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status)) fail("ICU", std::string("NFC normalizer: ") + u_errorName(status));
    unicode_9_0_.applyPattern(icu::UnicodeString("[:age=9.0:]", -1, US_INV), status);
    if (U_FAILURE(status)) fail("ICU", std::string("Unicode 9.0 set: ") + u_errorName(status));
    unicode_9_0_.freeze();
    filtered_ = std::make_unique<icu::FilteredNormalizer2>(*nfc, unicode_9_0_);
  }
  const icu::Normalizer2& get() const { return *filtered_; }

 private:
  icu::UnicodeSet unicode_9_0_;
  std::unique_ptr<icu::FilteredNormalizer2> filtered_;
};

const icu::Normalizer2& nfc_normalizer() {
  // Never destroyed, as ICU's own singletons: a thread may still encode while the process exits.
  static const HuggingFaceNfc* nfc = new HuggingFaceNfc;
  return nfc->get();
}

enum class Kind : uint8_t { kUnknown, kVocab, kAdded, kSpecial };

// One BPE symbol in a doubly linked list over the piece's bytes.
struct Symbol {
  int32_t id;  // -1 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

// A candidate merge of the symbol at `pos` with its right neighbour.
struct Candidate {
  int32_t rank;
  int32_t pos;
  // Heap order: lowest rank first, then leftmost (Hugging Face's order).
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

// State of one encode call: scratch buffers, and the ids of pieces already merged, since
// long texts repeat the same words over and over.
struct Workspace {
  static constexpr size_t kMaxCachedPieces = size_t{1} << 16;
  static constexpr size_t kMaxCachedPieceBytes = 64;

  std::string_view where;
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match;
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string normalized;
  // Piece -> (offset, count) of its ids in cached_ids.
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> cached_ids;
};

// The vocabulary's spellings -> ids: open addressing over ids, the spellings kept in the one
// buffer read from tokenizer.json (a map of strings costs ~70 bytes more per token). Each slot
// keeps 32 bits of its spelling's hash, so a probe reads a spelling only when those match.
class SpellingIndex {
 public:
  void init(std::string text, size_t count) {
    text_ = std::move(text);
    const int bits = slot_bits(count);
    slots_.assign(size_t{1} << bits, Slot{});
    mask_ = slots_.size() - 1;
  }

  // False when `spelling` is listed already.
  bool insert(TokenizerJson::Span spelling, int32_t id) {
    if (static_cast<size_t>(id) >= spellings_.size()) spellings_.resize(id + 1);
    spellings_[id] = spelling;
    const std::string_view key = text(spelling);
    const uint64_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].id < 0) {
        slots_[i] = Slot{static_cast<uint32_t>(h >> 32), id};
        return true;
      }
      if (matches(slots_[i], h, key)) return false;
    }
  }

  std::optional<int32_t> find(std::string_view spelling) const {
    if (slots_.empty()) return std::nullopt;
    const uint64_t h = hash(spelling);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].id < 0) return std::nullopt;
      if (matches(slots_[i], h, spelling)) return slots_[i].id;
    }
  }

  std::string_view text(TokenizerJson::Span s) const {
    return std::string_view(text_).substr(s.begin, s.size);
  }

 private:
  struct Slot {
    uint32_t tag = 0;  // the hash's upper half
    int32_t id = -1;   // -1: empty
  };
  static uint64_t hash(std::string_view s) { return std::hash<std::string_view>()(s); }
  bool matches(Slot slot, uint64_t h, std::string_view key) const {
    return slot.tag == static_cast<uint32_t>(h >> 32) && text(spellings_[slot.id]) == key;
  }

  std::string text_;
  std::vector<TokenizerJson::Span> spellings_;  // by id
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string token_text;                          // every token's bytes, one after the other
  std::vector<TokenizerJson::Span> token_span;     // by id, in token_text
  std::vector<Kind> kinds;                         // by id
  SpellingIndex vocab;                             // byte-level spelling -> id
  std::unordered_map<std::string, int32_t> added;  // content -> id
  std::array<int32_t, 256> byte_ids{};
  MergeTable merges;
  AddedTokenMatcher raw_tokens;         // matched on the raw text
  AddedTokenMatcher normalized_tokens;  // matched after normalization ("normalized": true)
  const icu::Normalizer2* nfc = nullptr;
  Regex split;
  std::string chat_template;
  std::optional<int32_t> eos, pad, bos;
  bool add_bos = false;
  // What the post_processor puts before and after one sequence (add_special_tokens=True).
  std::vector<int32_t> template_prefix, template_suffix;
  std::string post_processor_error;  // why it cannot be followed, if so
  std::vector<std::pair<std::string, std::string>> special_token_strings;

  // Records token `id` as the bytes appended to token_text since `begin`.
  void set_token(int32_t id, size_t begin, Kind kind) {
    if (static_cast<size_t>(id) >= kinds.size()) {
      token_span.resize(id + 1);
      kinds.resize(id + 1, Kind::kUnknown);
    }
    token_span[id] = {static_cast<uint32_t>(begin),
                      static_cast<uint32_t>(token_text.size() - begin)};
    kinds[id] = kind;
  }

  // The bytes decode emits for `id`; nullopt when it emits nothing.
  std::optional<std::string_view> decoded_bytes(int32_t id, bool skip_special) const {
    if (id < 0 || static_cast<size_t>(id) >= kinds.size()) return std::nullopt;
    const Kind kind = kinds[id];
    if (kind == Kind::kUnknown || (skip_special && kind == Kind::kSpecial)) return std::nullopt;
    return std::string_view(token_text).substr(token_span[id].begin, token_span[id].size);
  }

  std::optional<int32_t> lookup(std::string_view token) const {
    if (auto it = added.find(std::string(token)); it != added.end()) return it->second;
    return vocab.find(token);
  }

  void load_model(const Json& root, TokenizerJson& tables, const std::string& file);
  void load_normalizer(const Json& root, const std::string& file);
  void load_added_tokens(const Json& root, const std::string& file);
  // One added token: `token` is an entry of added_tokens (tokenizer.json) or of
  // added_tokens_decoder (tokenizer_config.json), named `field` in `file`.
  void add_token(int32_t id, const Json& token, const std::string& field, const std::string& file);
  void load_pre_tokenizer(const Json& root, const std::string& file);
  void load_post_processor(const Json& root, const std::string& file);
  void load_template(const Json& processor, const std::string& path, const std::string& file);
  void load_added_tokens_decoder(const Json& config, const std::string& file);
  void load_config(const std::filesystem::path& dir);

  void encode_segment(std::string_view text, Workspace& ws, std::vector<int32_t>& out) const;
  void encode_pieces(std::string_view text, Workspace& ws, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::load_model(const Json& root, TokenizerJson& tables, const std::string& file) {
  const Json& model = member(root, "", "model", file);
  const std::string type = string_member(model, "model", "type", file);
  if (type != "BPE") fail_field(file, "model.type", "unsupported '" + type + "', expected BPE");
  if (const Json* dropout = optional_member(model, "model", "dropout", file)) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0) {
      fail_field(file, "model.dropout", "unsupported (expected null)");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* affix = optional_member(model, "model", key, file)) {
      if (!affix->is_string() || !affix->get<std::string>().empty()) {
        fail_field(file, join_path("model", key), "unsupported (expected null or \"\")");
      }
    }
  }
  if (bool_member(model, "model", "ignore_merges", file, false)) {
    fail_field(file, "model.ignore_merges", "unsupported true");
  }

  if (!tables.has_vocab) {
    member(model, "model", "vocab", file);  // "missing" when absent or null
    fail_field(file, "model.vocab", "expected a JSON object");
  }
  int32_t max_id = -1;
  for (const TokenizerJson::VocabEntry& e : tables.vocab) max_id = std::max(max_id, e.id);
  kinds.reserve(max_id + 1);
  token_span.reserve(max_id + 1);
  token_text.reserve(tables.vocab_text.size());
  vocab.init(std::move(tables.vocab_text), tables.vocab.size());
  for (const TokenizerJson::VocabEntry& e : tables.vocab) {
    const std::string_view spelling = vocab.text(e.spelling);
    if (static_cast<size_t>(e.id) < kinds.size() && kinds[e.id] != Kind::kUnknown) {
      fail_field(file, "model.vocab." + std::string(spelling),
                 "id " + std::to_string(e.id) + " used twice");
    }
    // Like Hugging Face's ByteLevel decoder, a spelling outside the byte table stands for
    // its own UTF-8 bytes.
    const size_t begin = token_text.size();
    if (!unmap_bytes(spelling, token_text)) token_text.append(spelling);
    set_token(e.id, begin, Kind::kVocab);
    if (!vocab.insert(e.spelling, e.id)) {
      fail_field(file, "model.vocab." + std::string(spelling), "listed twice");
    }
  }
  token_text.shrink_to_fit();
  // Every byte needs a token, so BPE can start from single bytes and never needs unk_token.
  for (int b = 0; b < 256; ++b) {
    const std::string spelling = byte_spelling(static_cast<uint8_t>(b));
    const std::optional<int32_t> id = vocab.find(spelling);
    if (!id) {
      fail_field(file, "model.vocab",
                 "no token for byte " + std::to_string(b) + " ('" + spelling +
                     "'), not a byte-level vocabulary");
    }
    byte_ids[b] = *id;
  }

  if (!tables.has_merges) {
    member(model, "model", "merges", file);
    fail_field(file, "model.merges", "expected an array");
  }
  merges.reserve(tables.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < tables.merges.size(); ++rank) {
    const std::string_view left = tables.merge_text_of(tables.merges[rank].left);
    const std::string_view right = tables.merge_text_of(tables.merges[rank].right);
    joined.assign(left).append(right);
    const auto l = vocab.find(left), r = vocab.find(right), m = vocab.find(joined);
    if (!l || !r || !m) {
      fail_field(
          file, "model.merges[" + std::to_string(rank) + "]",
          "'" + std::string(left) + "' + '" + std::string(right) + "': token not in model.vocab");
    }
    merges.insert(*l, *r, Merge{static_cast<int32_t>(rank), *m});
  }
}

void Tokenizer::Impl::load_normalizer(const Json& root, const std::string& file) {
  const Json* normalizer = optional_member(root, "", "normalizer", file);
  if (normalizer == nullptr) return;
  const std::string type = string_member(*normalizer, "normalizer", "type", file);
  if (type != "NFC") {
    fail_field(file, "normalizer.type", "unsupported '" + type + "', expected NFC or null");
  }
  nfc = &nfc_normalizer();
}

void Tokenizer::Impl::load_added_tokens(const Json& root, const std::string& file) {
  const Json* tokens = optional_member(root, "", "added_tokens", file);
  if (tokens == nullptr) return;
  if (!tokens->is_array()) fail_field(file, "added_tokens", "expected an array");
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& token = (*tokens)[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    add_token(token_id(member(token, field, "id", file), field + ".id", file), token, field, file);
  }
}

void Tokenizer::Impl::add_token(int32_t id, const Json& token, const std::string& field,
                                const std::string& file) {
  std::string content = string_member(token, field, "content", file);
  if (content.empty()) fail_field(file, field + ".content", "empty");
  for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
    if (bool_member(token, field, flag, file, false)) {
      fail_field(file, join_path(field, flag), "unsupported true");
    }
  }
  const bool special = bool_member(token, field, "special", file, false);
  const bool normalized = bool_member(token, field, "normalized", file, !special);
  const size_t begin = token_text.size();
  token_text.append(content);
  set_token(id, begin, special ? Kind::kSpecial : Kind::kAdded);
  added[content] = id;
  if (normalized && nfc != nullptr) {
    // Such a token is looked for in normalized text, so it is normalized too.
    UErrorCode status = U_ZERO_ERROR;
    std::string normal;
    icu::StringByteSink<std::string> sink(&normal);
    nfc->normalizeUTF8(0, icu::StringPiece(content.data(), static_cast<int32_t>(content.size())),
                       sink, nullptr, status);
    if (U_FAILURE(status)) fail_field(file, field + ".content", u_errorName(status));
    normalized_tokens.add(std::move(normal), id);
  } else {
    (normalized ? normalized_tokens : raw_tokens).add(std::move(content), id);
  }
}

void Tokenizer::Impl::load_pre_tokenizer(const Json& root, const std::string& file) {
  const Json& pre = member(root, "", "pre_tokenizer", file);
  const std::string type = string_member(pre, "pre_tokenizer", "type", file);
  // A ByteLevel step must not add a prefix space; `regex` says whether it splits too.
  const auto check_byte_level = [&](const Json& step, const std::string& path, bool regex) {
    const std::string step_type = string_member(step, path, "type", file);
    if (step_type != "ByteLevel") {
      fail_field(file, path + ".type", "unsupported '" + step_type + "', expected ByteLevel");
    }
    if (bool_member(step, path, "add_prefix_space", file, true)) {
      fail_field(file, path + ".add_prefix_space", "unsupported true");
    }
    if (bool_member(step, path, "use_regex", file, true) != regex) {
      fail_field(file, path + ".use_regex", regex ? "unsupported false" : "unsupported true");
    }
  };

  if (type == "ByteLevel") {
    check_byte_level(pre, "pre_tokenizer", true);
    split = compile_regex(kByteLevelPattern, file, "pre_tokenizer");
    return;
  }
  if (type != "Sequence") {
    fail_field(file, "pre_tokenizer.type",
               "unsupported '" + type + "', expected Sequence [Split, ByteLevel] or ByteLevel");
  }
  const Json& steps = member(pre, "pre_tokenizer", "pretokenizers", file);
  if (!steps.is_array() || steps.size() != 2) {
    fail_field(file, "pre_tokenizer.pretokenizers", "unsupported, expected [Split, ByteLevel]");
  }
  const std::string path = "pre_tokenizer.pretokenizers[0]";
  const Json& step = steps[0];
  const std::string step_type = string_member(step, path, "type", file);
  if (step_type != "Split") {
    fail_field(file, path + ".type", "unsupported '" + step_type + "', expected Split");
  }
  const std::string behavior = string_member(step, path, "behavior", file);
  if (behavior != "Isolated") {
    fail_field(file, path + ".behavior", "unsupported '" + behavior + "', expected Isolated");
  }
  if (bool_member(step, path, "invert", file, false)) {
    fail_field(file, path + ".invert", "unsupported true");
  }
  const Json& pattern = member(step, path, "pattern", file);
  if (!pattern.is_object() || !pattern.contains("Regex")) {
    fail_field(file, path + ".pattern", "unsupported, expected {\"Regex\": ...}");
  }
  split = compile_regex(string_member(pattern, path + ".pattern", "Regex", file), file,
                        path + ".pattern.Regex");
  check_byte_level(steps[1], "pre_tokenizer.pretokenizers[1]", false);
}

// The post-processors that change ids: none, ByteLevel (offsets only), TemplateProcessing (its
// "single" template: special tokens around the sequence $A) and a Sequence of those, applied in
// order. Anything else would change what Hugging Face gives, so it is refused.
void Tokenizer::Impl::load_post_processor(const Json& root, const std::string& file) {
  const Json* processor = optional_member(root, "", "post_processor", file);
  if (processor == nullptr) return;
  const std::string type = string_member(*processor, "post_processor", "type", file);
  if (type != "Sequence") return load_template(*processor, "post_processor", file);
  const Json& steps = member(*processor, "post_processor", "processors", file);
  if (!steps.is_array()) fail_field(file, "post_processor.processors", "expected an array");
  for (size_t i = 0; i < steps.size(); ++i) {
    load_template(steps[i], "post_processor.processors[" + std::to_string(i) + "]", file);
  }
}

void Tokenizer::Impl::load_template(const Json& processor, const std::string& path,
                                    const std::string& file) {
  const std::string type = string_member(processor, path, "type", file);
  if (type == "ByteLevel") return;
  if (type != "TemplateProcessing") {
    fail_field(file, path + ".type",
               "unsupported '" + type + "', expected ByteLevel, TemplateProcessing or Sequence");
  }
  const Json& single = member(processor, path, "single", file);
  if (!single.is_array()) fail_field(file, path + ".single", "expected an array");
  const Json* specials = optional_member(processor, path, "special_tokens", file);
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item = path + ".single[" + std::to_string(i) + "]";
    const Json& piece = single[i];
    if (piece.is_object() && piece.contains("Sequence")) {
      if (string_member(piece["Sequence"], item + ".Sequence", "id", file) != "A") {
        fail_field(file, item + ".Sequence.id", "expected \"A\" (one sequence)");
      }
      if (seen_sequence) fail_field(file, item, "the sequence appears twice");
      seen_sequence = true;
      continue;
    }
    if (!piece.is_object() || !piece.contains("SpecialToken")) {
      fail_field(file, item, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
    const std::string name =
        string_member(piece["SpecialToken"], item + ".SpecialToken", "id", file);
    const std::string entry = path + ".special_tokens." + name;
    if (specials == nullptr || !specials->contains(name)) fail_field(file, entry, "missing");
    const Json& ids = member((*specials)[name], entry, "ids", file);
    if (!ids.is_array()) fail_field(file, entry + ".ids", "expected an array");
    for (size_t k = 0; k < ids.size(); ++k) {
      const std::string field = entry + ".ids[" + std::to_string(k) + "]";
      const int32_t id = token_id(ids[k], field, file);
      if (static_cast<size_t>(id) >= kinds.size() || kinds[id] == Kind::kUnknown) {
        fail_field(file, field, "no token has id " + std::to_string(id));
      }
      (seen_sequence ? after : before).push_back(id);
    }
  }
  if (!seen_sequence) fail_field(file, path + ".single", "has no {\"Sequence\": {\"id\": \"A\"}}");
  template_prefix.insert(template_prefix.begin(), before.begin(), before.end());
  template_suffix.insert(template_suffix.end(), after.begin(), after.end());
}

// tokenizer_config.json's added_tokens_decoder ({"<id>": {"content": ..., "special": ...}}) can
// hold added tokens that tokenizer.json lacks (Qwen3.5 keeps its 7 audio tokens only there);
// transformers adds them, so they are added here too. One tokenizer.json has is checked to be
// the same token.
void Tokenizer::Impl::load_added_tokens_decoder(const Json& config, const std::string& file) {
  const Json* tokens = optional_member(config, "", "added_tokens_decoder", file);
  if (tokens == nullptr) return;
  if (!tokens->is_object()) fail_field(file, "added_tokens_decoder", "expected a JSON object");
  for (const auto& [key, token] : tokens->items()) {
    const std::string field = "added_tokens_decoder." + key;
    char* end = nullptr;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || id < 0 || id >= kMaxTokenId) {
      fail_field(file, field,
                 "expected a token id (integer 0.." + std::to_string(kMaxTokenId - 1) + ")");
    }
    const std::string content = string_member(token, field, "content", file);
    const auto known = added.find(content);
    if (known != added.end() && known->second == id) continue;
    if (known != added.end() || (static_cast<size_t>(id) < kinds.size() &&
                                 (kinds[id] == Kind::kAdded || kinds[id] == Kind::kSpecial))) {
      fail_field(file, field + ".content",
                 "'" + content + "' disagrees with tokenizer.json's added tokens");
    }
    add_token(static_cast<int32_t>(id), token, field, file);
  }
}

void Tokenizer::Impl::load_config(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    const std::string file = config_path.string();
    const Json config = read_json_file(config_path);
    load_added_tokens_decoder(config, file);
    // A special token is named by a string or by an object with "content".
    const auto special = [&](const char* key) -> std::optional<int32_t> {
      const Json* value = optional_member(config, "", key, file);
      if (value == nullptr) return std::nullopt;
      std::string name;
      if (value->is_string()) {
        name = value->get<std::string>();
      } else if (value->is_object()) {
        name = string_member(*value, key, "content", file);
      } else {
        fail_field(file, key, "expected a string");
      }
      const std::optional<int32_t> id = lookup(name);
      if (!id) fail_field(file, key, "unknown token '" + name + "'");
      return id;
    };
    // The named special tokens transformers hands to chat templates, in its order.
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                            "cls_token", "mask_token"}) {
      const Json* value = optional_member(config, "", key, file);
      if (value && value->is_string()) {
        special_token_strings.emplace_back(key, value->get<std::string>());
      } else if (value && value->is_object()) {
        special_token_strings.emplace_back(key, string_member(*value, key, "content", file));
      }
    }
    eos = special("eos_token");
    pad = special("pad_token");
    bos = special("bos_token");
    add_bos = bool_member(config, "", "add_bos_token", file, false);
    if (const Json* tmpl = optional_member(config, "", "chat_template", file)) {
      if (!tmpl->is_string()) fail_field(file, "chat_template", "expected a string");
      chat_template = tmpl->get<std::string>();
    }
  }
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) chat_template = read_regular_file(jinja_path);
}

// One stretch of text between raw-matched added tokens: normalize, then encode.
void Tokenizer::Impl::encode_segment(std::string_view text, Workspace& ws,
                                     std::vector<int32_t>& out) const {
  if (nfc != nullptr) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
    if (!nfc->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) {
      ws.normalized.clear();
      icu::StringByteSink<std::string> sink(&ws.normalized);
      nfc->normalizeUTF8(0, piece, sink, nullptr, status);
      text = ws.normalized;
    }
    if (U_FAILURE(status)) fail(ws.where, std::string("NFC failed: ") + u_errorName(status));
  }
  size_t pos = 0;
  if (!normalized_tokens.empty()) {
    for (auto m = normalized_tokens.find(text, 0); m.pos != std::string_view::npos;
         m = normalized_tokens.find(text, pos)) {
      encode_pieces(text.substr(pos, m.pos - pos), ws, out);
      out.push_back(m.id);
      pos = m.pos + m.len;
    }
  }
  encode_pieces(text.substr(pos), ws, out);
}

// Regex split with "Isolated" behaviour: every match and every gap between matches is a piece.
void Tokenizer::Impl::encode_pieces(std::string_view text, Workspace& ws,
                                    std::vector<int32_t>& out) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t done = 0;   // end of the last piece
  size_t start = 0;  // where the next search starts
  while (start < text.size()) {
    const int rc = pcre2_match(split.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                               ws.match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail(ws.where, "pre-tokenizer regex failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(ws.match.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end <= begin) {  // an empty match splits nothing: search again one character on
      if (begin >= text.size()) break;
      start = begin + utf8_length(static_cast<uint8_t>(text[begin]));
      continue;
    }
    if (begin > done) bpe(text.substr(done, begin - done), ws, out);
    bpe(text.substr(begin, end - begin), ws, out);
    done = start = end;
  }
  if (done < text.size()) bpe(text.substr(done), ws, out);
}

// Rank-based BPE over the piece's bytes: repeatedly merge the lowest-ranked adjacent pair,
// leftmost first, using a heap of candidates that are rechecked when popped.
void Tokenizer::Impl::bpe(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const {
  const auto n = static_cast<int32_t>(piece.size());
  if (n == 1) {
    out.push_back(byte_ids[static_cast<uint8_t>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= Workspace::kMaxCachedPieceBytes;
  if (cacheable) {
    if (const auto it = ws.cache.find(piece); it != ws.cache.end()) {
      const auto first = ws.cached_ids.begin() + it->second.first;
      out.insert(out.end(), first, first + it->second.second);
      return;
    }
  }
  std::vector<Symbol>& sym = ws.symbols;
  std::vector<Candidate>& heap = ws.heap;
  sym.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = Symbol{byte_ids[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = merges.find(sym[i].id, sym[i + 1].id)) heap.push_back({m->rank, i});
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = sym[c.pos];
    if (left.id < 0 || left.next < 0) continue;
    const Merge* m = merges.find(left.id, sym[left.next].id);
    if (m == nullptr || m->rank != c.rank) continue;  // stale: a neighbour changed since
    const int32_t right = left.next;
    left.id = m->merged;
    left.next = sym[right].next;
    sym[right].id = -1;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    if (left.prev >= 0) {
      if (const Merge* p = merges.find(sym[left.prev].id, left.id)) {
        heap.push_back({p->rank, left.prev});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (left.next >= 0) {
      if (const Merge* p = merges.find(left.id, sym[left.next].id)) {
        heap.push_back({p->rank, c.pos});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  const size_t first = out.size();
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
  if (cacheable && ws.cache.size() < Workspace::kMaxCachedPieces) {
    ws.cache.emplace(piece,
                     std::pair<uint32_t, uint32_t>(ws.cached_ids.size(), out.size() - first));
    ws.cached_ids.insert(ws.cached_ids.end(), out.begin() + first, out.end());
  }
}

// ---------------------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "tokenizer.json";
  const std::string file = path.string();
  TokenizerJson tables = read_tokenizer_json(path);
  const Json& root = tables.rest;
  if (!root.is_object()) fail(file, "expected a JSON object");
  auto impl = std::make_shared<Impl>();
  impl->load_model(root, tables, file);
  impl->load_normalizer(root, file);  // before added tokens: normalized ones get normalized
  impl->load_added_tokens(root, file);
  impl->load_pre_tokenizer(root, file);
  const Json& decoder = member(root, "", "decoder", file);
  const std::string decoder_type = string_member(decoder, "decoder", "type", file);
  if (decoder_type != "ByteLevel") {
    fail_field(file, "decoder.type", "unsupported '" + decoder_type + "', expected ByteLevel");
  }
  impl->load_config(dir);
  // After every added token is known. Generation never adds these tokens, so a post-processor
  // qhx cannot follow fails only the calls that would (embeddings), not the load.
  try {
    impl->load_post_processor(root, file);
  } catch (const Error& e) {
    impl->template_prefix.clear();
    impl->template_suffix.clear();
    impl->post_processor_error = e.what();
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, std::string_view where) const {
  if (const size_t bad = find_invalid_utf8(text); bad != std::string_view::npos) {
    fail(where, "invalid UTF-8 at byte " + std::to_string(bad));
  }
  if (text.size() > INT32_MAX) fail(where, "text longer than 2 GiB");
  Workspace ws;
  ws.where = where;
  ws.match.reset(pcre2_match_data_create_from_pattern(impl_->split.get(), nullptr));
  if (!ws.match) fail(where, "out of memory");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  size_t pos = 0;
  for (auto m = impl_->raw_tokens.find(text, 0); m.pos != std::string_view::npos;
       m = impl_->raw_tokens.find(text, pos)) {
    if (m.pos > pos) impl_->encode_segment(text.substr(pos, m.pos - pos), ws, out);
    out.push_back(m.id);
    pos = m.pos + m.len;
  }
  if (pos < text.size()) impl_->encode_segment(text.substr(pos), ws, out);
  return out;
}

std::vector<int32_t> Tokenizer::encode_with_special_tokens(std::string_view text,
                                                           std::string_view where,
                                                           size_t max_length,
                                                           bool* truncated) const {
  if (!impl_->post_processor_error.empty()) fail(where, impl_->post_processor_error);
  std::vector<int32_t> ids = impl_->template_prefix;
  std::vector<int32_t> body = encode(text, where);
  const size_t specials = impl_->template_prefix.size() + impl_->template_suffix.size();
  const bool cut = max_length > 0 && body.size() + specials > max_length;
  if (cut) body.resize(max_length > specials ? max_length - specials : 0);
  if (truncated != nullptr) *truncated = cut;
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), impl_->template_suffix.begin(), impl_->template_suffix.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (const int32_t id : ids) {
    if (const auto b = impl_->decoded_bytes(id, skip_special)) raw += *b;
  }
  std::string out;
  out.reserve(raw.size());
  append_lossy_utf8(raw, out);
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const auto b = impl_->decoded_bytes(id, false);
  if (!b) fail("tokenizer", "unknown token id " + std::to_string(id));
  return std::string(*b);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->lookup(token);
}

int32_t Tokenizer::size() const {
  return static_cast<int32_t>(impl_->kinds.size());
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->kinds.size() &&
         impl_->kinds[id] == Kind::kSpecial;
}

const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos;
}
std::optional<int32_t> Tokenizer::pad_id() const {
  return impl_->pad;
}
std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos;
}
bool Tokenizer::add_bos_token() const {
  return impl_->add_bos;
}
const std::vector<std::pair<std::string, std::string>>& Tokenizer::special_token_strings() const {
  return impl_->special_token_strings;
}

// ---------------------------------------------------------------------------------------------

StreamingDecoder::StreamingDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(&tok), skip_special_(skip_special) {}

// Held bytes always start at a lead byte, so what is emitted before them decodes the same
// whatever follows, and the concatenation equals a one-shot decode.
std::string StreamingDecoder::push(int32_t id) {
  if (const auto b = tok_->impl_->decoded_bytes(id, skip_special_)) pending_ += *b;
  const size_t ready = pending_.size() - incomplete_utf8_suffix(pending_);
  std::string out;
  append_lossy_utf8(std::string_view(pending_).substr(0, ready), out);
  pending_.erase(0, ready);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out;
  append_lossy_utf8(pending_, out);
  pending_.clear();
  return out;
}

}  // namespace qhx
