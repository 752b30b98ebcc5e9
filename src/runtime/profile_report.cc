#include "runtime/profile_report.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace qhx {

Json peaks_json(const DevicePeaks& peaks) {
  Json ops = Json::object();
  for (const auto& [arithmetic, rate] : peaks.ops_per_s) ops[arithmetic] = rate;
  return {{"read_gb_s", peaks.read_bytes_per_s * 1e-9}, {"ops_per_s", ops}};
}

Json profile_json(const DeviceProfile& profile, const DevicePeaks& peaks, int64_t passes) {
  const double per = 1.0 / static_cast<double>(std::max<int64_t>(passes, 1));
  std::vector<const OpTime*> ops;
  for (const OpTime& op : profile.ops) ops.push_back(&op);
  std::stable_sort(ops.begin(), ops.end(),
                   [](const OpTime* a, const OpTime* b) { return a->seconds > b->seconds; });
  Json rows = Json::array();
  for (const OpTime* op : ops) {
    const std::string arithmetic = op->arithmetic();
    const auto peak = peaks.ops_per_s.find(arithmetic);
    const double bytes_per_s = op->seconds > 0 ? op->cost.bytes / op->seconds : 0.0;
    const double ops_per_s = op->seconds > 0 ? op->cost.flops / op->seconds : 0.0;
    Json kernels = Json::object();
    for (const auto& [name, k] : op->kernels) kernels[name] = k.seconds * per * 1e3;
    rows.push_back(
        {{"op", op->op},
         {"weights", op->weights},
         {"rows", op->rows},
         {"nodes", static_cast<double>(op->nodes) * per},
         {"ms", op->seconds * per * 1e3},
         {"share", profile.seconds > 0 ? op->seconds / profile.seconds : 0.0},
         {"mb", op->cost.bytes * per * 1e-6},
         {"gflop", op->cost.flops * per * 1e-9},
         {"gb_s", bytes_per_s * 1e-9},
         {"bandwidth_fraction",
          peaks.read_bytes_per_s > 0 ? Json(bytes_per_s / peaks.read_bytes_per_s) : Json()},
         {"gops", ops_per_s * 1e-9},
         {"arithmetic", arithmetic},
         {"compute_fraction",
          peak != peaks.ops_per_s.end() && peak->second > 0 && op->cost.flops > 0
              ? Json(ops_per_s / peak->second)
              : Json()},
         {"kernels_ms", kernels}});
  }
  return {{"passes", passes},
          {"device_ms", profile.seconds * per * 1e3},
          {"submissions", static_cast<double>(profile.submissions) * per},
          {"ops", rows}};
}

std::string profile_table(const std::string& title, const Json& profile) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%s: %.3f ms on the device a pass, %.1f submissions\n",
                title.c_str(), profile["device_ms"].get<double>(),
                profile["submissions"].get<double>());
  out += line;
  std::snprintf(line, sizeof line, "  %-16s %-7s %5s %6s %9s %6s %9s %8s %9s %8s  %-11s %s\n", "op",
                "weights", "rows", "nodes", "ms", "share", "GB/s", "of peak", "Gop/s", "of peak",
                "arithmetic", "kernels (ms)");
  out += line;
  const auto fraction = [](const Json& f) {
    char cell[16];
    if (f.is_null()) return std::string("-");
    std::snprintf(cell, sizeof cell, "%.1f%%", 100 * f.get<double>());
    return std::string(cell);
  };
  for (const Json& op : profile["ops"]) {
    std::string kernels;
    std::vector<std::pair<double, std::string>> by_time;
    for (const auto& [name, ms] : op["kernels_ms"].items()) {
      by_time.emplace_back(ms.get<double>(), name);
    }
    std::sort(by_time.rbegin(), by_time.rend());
    for (const auto& [ms, name] : by_time) {
      char cell[96];
      std::snprintf(cell, sizeof cell, "%s%s %.3f", kernels.empty() ? "" : ", ", name.c_str(), ms);
      kernels += cell;
    }
    const std::string weights = op["weights"].get<std::string>();
    std::snprintf(
        line, sizeof line, "  %-16s %-7s %5lld %6.1f %9.3f %5.1f%% %9.2f %8s %9.2f %8s  %-11s ",
        op["op"].get<std::string>().c_str(), weights.empty() ? "-" : weights.c_str(),
        op["rows"].get<long long>(), op["nodes"].get<double>(), op["ms"].get<double>(),
        100 * op["share"].get<double>(), op["gb_s"].get<double>(),
        fraction(op["bandwidth_fraction"]).c_str(), op["gops"].get<double>(),
        fraction(op["compute_fraction"]).c_str(), op["arithmetic"].get<std::string>().c_str());
    out += line + kernels + "\n";
  }
  return out;
}

}  // namespace qhx
