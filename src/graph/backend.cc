#include "graph/backend.h"

#include <algorithm>

namespace qhx {

std::string OpTime::arithmetic() const {
  const Kernel* longest = nullptr;
  for (const auto& [name, k] : kernels) {
    if (!k.arithmetic.empty() && (longest == nullptr || k.seconds > longest->seconds)) longest = &k;
  }
  return longest != nullptr ? longest->arithmetic : "";
}

DeviceProfile& DeviceProfile::operator+=(const DeviceProfile& o) {
  for (const OpTime& t : o.ops) {
    const auto same = [&](const OpTime& e) {
      return e.op == t.op && e.weights == t.weights && e.rows == t.rows;
    };
    const auto it = std::find_if(ops.begin(), ops.end(), same);
    if (it == ops.end()) {
      ops.push_back(t);
      continue;
    }
    it->nodes += t.nodes;
    it->seconds += t.seconds;
    it->cost += t.cost;
    for (const auto& [name, kernel] : t.kernels) {
      OpTime::Kernel& k = it->kernels[name];
      k.seconds += kernel.seconds;
      k.arithmetic = kernel.arithmetic;
    }
  }
  submissions += o.submissions;
  seconds += o.seconds;
  return *this;
}

DevicePeaks Backend::measure_peaks() {
  fail(name(), "this backend does not profile (qhx bench --profile takes a Vulkan device)");
}

}  // namespace qhx
