#include "io/draft_vocab.h"

#include <string>

#include "util/error.h"
#include "util/json_file.h"

namespace qhx {
namespace {

std::vector<int32_t> draft_vocab_of(const Json& doc, std::string_view where, int64_t vocab_size) {
  if (!doc.is_object()) fail(std::string(where), "expected a JSON object");
  if (require_string(doc, "format", where) != "qhx-draft-vocab") {
    fail(field(where, "format"), "expected \"qhx-draft-vocab\"");
  }
  if (require_int(doc, "version", where) != 1) {
    fail(field(where, "version"), "version 1 is the only one this build reads");
  }
  if (require_int(doc, "vocab_size", where) != vocab_size) {
    fail(field(where, "vocab_size"), "the list is for a vocabulary of " +
                                         std::to_string(require_int(doc, "vocab_size", where)) +
                                         " tokens, the model has " + std::to_string(vocab_size));
  }
  const Json& ids = require_field(doc, "ids", where);
  if (!ids.is_array() || ids.empty()) fail(field(where, "ids"), "expected a non-empty array");
  std::vector<bool> seen(vocab_size);
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string at = field(where, "ids[" + std::to_string(i) + "]");
    if (!ids[i].is_number_integer()) fail(at, "expected an integer token id");
    const int64_t id = ids[i].get<int64_t>();
    if (id < 0 || id >= vocab_size) {
      fail(at, std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                   ")");
    }
    if (seen[id]) fail(at, "token " + std::to_string(id) + " is listed twice");
    seen[id] = true;
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

}  // namespace

std::vector<int32_t> parse_draft_vocab(std::string_view text, std::string_view where,
                                       int64_t vocab_size) {
  return draft_vocab_of(parse_json(text, where), where, vocab_size);
}

std::vector<int32_t> read_draft_vocab(const std::filesystem::path& file, int64_t vocab_size) {
  return draft_vocab_of(read_json_file(file), file.string(), vocab_size);
}

}  // namespace qhx
