// Builds without the Hexagon backend (QHX_HEXAGON=OFF, or not 64-bit Linux): its names are
// accepted and say why they run on the CPU.
#include "backend/device_factory.h"

namespace qhx {

std::unique_ptr<DeviceFactory> make_hexagon_factory() {
  return unbuilt_device_factory("hexagon", "hexagon or hexagon:vNN",
                                "qhx was built without the Hexagon backend (QHX_HEXAGON=OFF)");
}

}  // namespace qhx
