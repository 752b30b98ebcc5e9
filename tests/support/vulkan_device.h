// The Vulkan device the tests run on (the first the loader finds: lavapipe in CI), opened once
// per test binary so that its pipelines compile once. Null when there is none; a test then skips,
// unless QHX_REQUIRE_VULKAN is set (CI sets it), when it fails.
#pragma once

#if QHX_HAVE_VULKAN
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "backend/vulkan/vulkan_backend.h"

namespace qhx::test {

inline std::shared_ptr<VulkanDevice> vulkan_device(std::string* why) {
  static const std::pair<std::shared_ptr<VulkanDevice>, std::string> opened = [] {
    std::string reason;
    if (vulkan_devices(&reason).empty()) return std::pair{std::shared_ptr<VulkanDevice>(), reason};
    return std::pair{VulkanDevice::open(0), std::string()};
  }();
  *why = opened.second;
  return opened.first;
}

// In a test body: the device, or the test ends here (skipped, or failed under QHX_REQUIRE_VULKAN).
#define QHX_VULKAN_DEVICE_OR_SKIP(device)                                            \
  std::string qhx_vulkan_why;                                                        \
  const std::shared_ptr<VulkanDevice> device = test::vulkan_device(&qhx_vulkan_why); \
  if (device == nullptr) {                                                           \
    if (std::getenv("QHX_REQUIRE_VULKAN") != nullptr) {                              \
      FAIL() << "no Vulkan device: " << qhx_vulkan_why;                              \
    }                                                                                \
    GTEST_SKIP() << "no Vulkan device: " << qhx_vulkan_why;                          \
  }

}  // namespace qhx::test
#endif
