// The QNN libraries the Hexagon tests run on (onnxruntime-qnn's simulator in CI, found as qhx
// finds them: QHX_QNN_LIB, beside qhx, an installed onnxruntime_qnn), loaded once per test
// binary. Null when there are none; a test then skips, unless QHX_REQUIRE_HEXAGON is set (CI sets
// it), when it fails.
#pragma once

#if QHX_HAVE_HEXAGON
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "backend/qnn/hexagon_backend.h"
#include "util/error.h"

namespace qhx::test {

inline std::shared_ptr<const QnnLibrary> qnn_library(std::string* why) {
  static const std::pair<std::shared_ptr<const QnnLibrary>, std::string> loaded = [] {
    try {
      return std::pair{QnnLibrary::load(), std::string()};
    } catch (const Error& e) {
      return std::pair{std::shared_ptr<const QnnLibrary>(), std::string(e.what())};
    }
  }();
  *why = loaded.second;
  return loaded.first;
}

#define QHX_QNN_LIBRARY_OR_SKIP(library)                                             \
  std::string qhx_qnn_why;                                                           \
  const std::shared_ptr<const QnnLibrary> library = test::qnn_library(&qhx_qnn_why); \
  if (library == nullptr) {                                                          \
    if (std::getenv("QHX_REQUIRE_HEXAGON") != nullptr) {                             \
      FAIL() << "no QNN library: " << qhx_qnn_why;                                   \
    }                                                                                \
    GTEST_SKIP() << "no QNN library: " << qhx_qnn_why;                               \
  }

}  // namespace qhx::test
#endif
