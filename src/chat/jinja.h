// A Jinja2 template engine for the subset Hugging Face chat templates use, matching jinja2 as
// transformers configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loop controls; docs/chat_template.md lists what is supported).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace qhx::jinja {

struct Stmt;

// Bounds on one render, so that a hostile template fails with an error instead of hanging or
// exhausting memory.
struct Limits {
  size_t max_output_bytes = size_t{64} << 20;
  int64_t max_steps = 50'000'000;            // expressions evaluated and statements run
  size_t max_alloc_bytes = size_t{1} << 30;  // all strings and lists built, cumulative
  size_t max_items = size_t{1} << 20;        // length of one list (range, repetition)
  int max_depth = 400;                       // nested evaluation, macro calls included
};

// Parsed once; render() may be called from several threads at once.
class Template {
 public:
  // Throws qhx::Error "<origin>:<line>: <message>" on a syntax error.
  Template(std::string_view source, std::string origin);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `vars` as the template's variables. Errors (raise_exception, undefined values
  // used, type errors, limits) throw qhx::Error "<origin>:<line>: <message>".
  std::string render(const std::vector<std::pair<std::string, Value>>& vars,
                     const Limits& limits = {}) const;

  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  std::unique_ptr<std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace qhx::jinja
