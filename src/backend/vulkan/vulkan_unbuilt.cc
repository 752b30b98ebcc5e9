// Builds without Vulkan (QHX_VULKAN=OFF, or no libvulkan-dev and glslc): its names are accepted
// and say why they run on the CPU.
#include "backend/device_factory.h"

namespace qhx {

std::unique_ptr<DeviceFactory> make_vulkan_factory() {
  return unbuilt_device_factory(
      "vulkan", "vulkan or vulkan:N",
      "qhx was built without Vulkan (QHX_VULKAN=OFF, or no libvulkan-dev and glslc)");
}

}  // namespace qhx
