#include "runtime/speculative.h"

#include <algorithm>

#include "models/model.h"
#include "util/error.h"

namespace qhx {

DraftKind parse_draft_kind(const std::string& name, const std::string& where) {
  if (name == "none") return DraftKind::kNone;
  if (name == "ngram") return DraftKind::kNgram;
  if (name == "draft") return DraftKind::kModel;
  if (name == "mtp") return DraftKind::kMtp;
  fail(where, "unknown speculative draft '" + name + "' (none, ngram, draft or mtp)");
}

void require_mtp_head(const Model& model) {
  if (model.has_mtp()) return;
  const std::string why = model.mtp_unavailable();
  fail("speculative", "'mtp' needs a model with an MTP head (mtp.* weights)" +
                          (why.empty() ? std::string() : "; " + why));
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> context, int64_t ngram_max,
                                 int64_t ngram_min, int64_t max_tokens) {
  const int64_t size = static_cast<int64_t>(context.size());
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min(ngram_max, size - 1); n >= std::max<int64_t>(ngram_min, 1); --n) {
    const std::span<const int32_t> suffix = context.subspan(size - n);
    // The most recent occurrence that ends before the suffix does, so a continuation follows.
    for (int64_t at = size - n - 1; at >= 0; --at) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + at)) continue;
      const int64_t from = at + n, count = std::min(max_tokens, size - from);
      return {context.begin() + from, context.begin() + from + count};
    }
  }
  return {};
}

}  // namespace qhx
