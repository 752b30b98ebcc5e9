// A device profile (graph/backend.h DeviceProfile) as qhx bench --profile reports it: per kind of
// work, its device time per pass (a prompt pass or a decode step), its share, the bandwidth and
// rate of computation it reached (from node_cost) and their fractions of the device's measured
// peaks, and its kernels' shares; as a JSON object and as a table drawn from that object.
#pragma once

#include <cstdint>
#include <string>

#include "graph/backend.h"
#include "util/json_file.h"

namespace qhx {

// The peaks as the report holds them: "read_gb_s", and "ops_per_s" by arithmetic.
Json peaks_json(const DevicePeaks& peaks);

// `profile` over `passes` passes (prompt passes or decode steps): {"passes", "device_ms",
// "submissions", "ops": [...]} with the ops by time, longest first, everything per pass.
Json profile_json(const DeviceProfile& profile, const DevicePeaks& peaks, int64_t passes);

// The table of profile_json's object under a line naming `title` and the device's time.
std::string profile_table(const std::string& title, const Json& profile);

}  // namespace qhx
