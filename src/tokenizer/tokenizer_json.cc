#include "tokenizer/tokenizer_json.h"

#include <limits>

#include "util/error.h"
#include "util/mapped_file.h"

namespace qhx {
namespace {

constexpr std::string_view kMergeForms = "expected [\"left\", \"right\"] or \"left right\"";

// nlohmann's SAX events, turned into TokenizerJson: a tree for everything but the two tables.
class Reader {
 public:
  using string_t = Json::string_t;
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using binary_t = Json::binary_t;

  Reader(TokenizerJson& out, const std::string& where) : out_(out), where_(where) {}

  bool null() { return scalar(nullptr); }
  bool boolean(bool v) { return scalar(v); }
  bool number_integer(number_integer_t v) {
    if (in(Role::kVocab)) return vocab_id(v >= 0 ? static_cast<int64_t>(v) : -1);
    return scalar(v);
  }
  bool number_unsigned(number_unsigned_t v) {
    if (in(Role::kVocab)) {
      return vocab_id(v < static_cast<uint64_t>(kMaxTokenId) ? static_cast<int64_t>(v) : -1);
    }
    return scalar(v);
  }
  bool number_float(number_float_t v, const string_t&) { return scalar(v); }
  bool binary(binary_t&) { return scalar(nullptr); }

  bool string(string_t& v) {
    if (in(Role::kMerges)) {
      const size_t space = v.find(' ');
      if (space == string_t::npos || v.find(' ', space + 1) != string_t::npos) {
        fail_merge("expected \"left right\"");
      }
      add_merge(std::string_view(v).substr(0, space), std::string_view(v).substr(space + 1));
      return true;
    }
    if (in(Role::kMergePair)) {
      if (pair_.size() == 2) fail_merge(kMergeForms);
      pair_.push_back(std::move(v));
      return true;
    }
    return scalar(std::move(v));
  }

  bool start_object(size_t) {
    if (stack_.empty()) {
      out_.rest = Json::object();
      stack_.push_back({Role::kTree, &out_.rest, true});
      return true;
    }
    if (model_table("vocab")) {
      start_table(Role::kVocab);
      return true;
    }
    if (!in(Role::kTree)) return scalar(nullptr);
    const bool is_model = stack_.back().is_root && key_ == "model";
    if (is_model) {  // "model" given twice: its last value counts
      clear_vocab();
      clear_merges();
    }
    Json* node = slot();
    *node = Json::object();
    stack_.push_back({Role::kTree, node, false, is_model});
    return true;
  }

  bool start_array(size_t) {
    if (stack_.empty()) fail(where_, "expected a JSON object");
    if (model_table("merges")) {
      start_table(Role::kMerges);
      return true;
    }
    if (in(Role::kMerges)) {
      pair_.clear();
      stack_.push_back({Role::kMergePair, nullptr, false});
      return true;
    }
    if (!in(Role::kTree)) return scalar(nullptr);
    Json* node = slot();
    *node = Json::array();
    stack_.push_back({Role::kTree, node, false});
    return true;
  }

  bool key(string_t& k) {
    key_ = std::move(k);
    return true;
  }

  bool end_object() {
    stack_.pop_back();
    return true;
  }

  bool end_array() {
    if (in(Role::kMergePair)) {
      if (pair_.size() != 2) fail_merge(kMergeForms);
      stack_.pop_back();
      add_merge(pair_[0], pair_[1]);
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& e) {
    error_ = "invalid JSON at byte " + std::to_string(position) + ": " + e.what();
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  enum class Role { kTree, kVocab, kMerges, kMergePair };
  struct Frame {
    Role role;
    Json* node;  // kTree: the object or array being filled
    bool is_root;
    bool is_model = false;
  };

  // A key given twice keeps its last value, as a JSON tree would: a table starts empty.
  void start_table(Role table) {
    if (table == Role::kVocab) {
      clear_vocab();
      out_.has_vocab = true;
    } else {
      clear_merges();
      out_.has_merges = true;
    }
    stack_.push_back({table, nullptr, false});
  }
  void clear_vocab() {
    out_.has_vocab = false;
    out_.vocab.clear();
    out_.vocab_text.clear();
  }
  void clear_merges() {
    out_.has_merges = false;
    out_.merges.clear();
    out_.merge_text.clear();
  }

  bool in(Role role) const { return !stack_.empty() && stack_.back().role == role; }

  // Whether the value about to start is model.<name>. A model.vocab that is not an object, or
  // model.merges that is not an array, goes into the tree instead, for the loader to name after
  // it has checked model.type (a Unigram model's vocab is an array).
  bool model_table(std::string_view name) const {
    return in(Role::kTree) && stack_.back().is_model && key_ == name;
  }

  [[noreturn]] void fail_field(const std::string& field, std::string_view what) const {
    fail(where_ + ": " + field, what);
  }
  [[noreturn]] void fail_merge(std::string_view what) const {
    fail_field("model.merges[" + std::to_string(out_.merges.size()) + "]", what);
  }

  // Where the next value of the tree goes.
  Json* slot() {
    Json* parent = stack_.back().node;
    if (parent->is_object()) return &(*parent)[key_];
    parent->push_back(nullptr);
    return &parent->back();
  }

  template <typename T>
  bool scalar(T&& value) {
    if (stack_.empty()) fail(where_, "expected a JSON object");
    switch (stack_.back().role) {
      case Role::kTree:
        *slot() = std::forward<T>(value);
        return true;
      case Role::kVocab:
        return vocab_id(-1);
      case Role::kMerges:
      case Role::kMergePair:
        fail_merge(kMergeForms);
    }
    return true;
  }

  bool vocab_id(int64_t id) {
    if (id < 0 || id >= kMaxTokenId) {
      fail_field("model.vocab." + key_,
                 "expected a token id (integer 0.." + std::to_string(kMaxTokenId - 1) + ")");
    }
    out_.vocab.push_back({append(out_.vocab_text, key_), static_cast<int32_t>(id)});
    return true;
  }

  void add_merge(std::string_view left, std::string_view right) {
    const TokenizerJson::Span l = append(out_.merge_text, left);
    out_.merges.push_back({l, append(out_.merge_text, right)});
  }

  static TokenizerJson::Span append(std::string& text, std::string_view s) {
    const TokenizerJson::Span span{static_cast<uint32_t>(text.size()),
                                   static_cast<uint32_t>(s.size())};
    text.append(s);
    return span;
  }

  TokenizerJson& out_;
  const std::string& where_;
  std::vector<Frame> stack_;
  std::string key_;
  std::vector<std::string> pair_;
  std::string error_;
};

// Parses text that came from `where`.
TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& where) {
  // Spans are 32-bit: no table can outgrow the file.
  if (text.size() >= std::numeric_limits<uint32_t>::max()) fail(where, "larger than 4 GiB");
  TokenizerJson out;
  Reader reader(out, where);
  if (!Json::sax_parse(text.begin(), text.end(), &reader)) fail(where, reader.error());
  return out;
}

}  // namespace

TokenizerJson read_tokenizer_json(const std::filesystem::path& path) {
  const MappedFile file(path);
  const auto bytes = file.bytes();
  return parse_tokenizer_json(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path.string());
}

}  // namespace qhx
