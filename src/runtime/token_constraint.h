// What a reply may say next, token by token: structured output (a JSON schema, a grammar) seen
// from the sampler. The runtime knows only this interface; grammar/ implements it.
#pragma once

#include <cstdint>
#include <span>

namespace qhx {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The tokens allowed next as bits, token i at bit i % 32 of words[i / 32] (1: allowed); words
  // holds (vocab_size + 31) / 32 entries. Returns false when every token is allowed (the words
  // need not be read then).
  virtual bool allowed_next(std::span<uint32_t> words) = 0;
  // Moves past `token`, which allowed_next() allowed; throws Error otherwise.
  virtual void accept(int32_t token) = 0;
  // The reply is complete: nothing may follow (a stop id, if any, was accepted last).
  virtual bool finished() const = 0;
};

}  // namespace qhx
