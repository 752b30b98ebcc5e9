// Asserts that a call throws qhx::Error with a one-line message containing given parts.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/error.h"

namespace qhx::test {

template <typename F>
void expect_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

}  // namespace qhx::test
