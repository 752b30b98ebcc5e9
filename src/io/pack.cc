#include "io/pack.h"

#include <unistd.h>

#include <fstream>
#include <set>

#include "io/bundle.h"
#include "util/error.h"
#include "util/json_file.h"
#include "util/partial_path.h"
#include "util/sha256.h"

namespace qhx {
namespace fs = std::filesystem;
namespace {

// Most capable first: a machine runs the first of these its CPU supports.
const char* const kPreference[] = {"x86_64-avx512",   "x86_64-avx2", "x86_64",
                                   "aarch64-dotprod", "aarch64",     "generic"};

}  // namespace

bool is_pack(const fs::path& dir) {
  return fs::exists(dir / "MANIFEST.json");
}

fs::path select_pack_bundle(const fs::path& pack) {
  const fs::path manifest_path = pack / "MANIFEST.json";
  const std::string where = manifest_path.string();
  const Json m = read_json_file(manifest_path);
  if (require_string(m, "format", where) != "qhx-pack") fail(where + ": format", "not a qhx pack");
  if (require_int(m, "format_version", where) > kPackFormatVersion) {
    fail(where + ": format_version",
         "newer than this qhx reads (" + std::to_string(kPackFormatVersion) + ")");
  }
  const Json& bundles = require_field(m, "bundles", where);
  if (!bundles.is_array()) fail(where + ": bundles", "expected an array");
  std::string available;
  for (const char* preferred : kPreference) {
    if (!target_runs_here(preferred)) continue;
    for (size_t i = 0; i < bundles.size(); ++i) {
      const std::string bw = where + ": bundles[" + std::to_string(i) + "]";
      if (require_string(bundles[i], "target", bw) != preferred) continue;
      const std::string name = require_string(bundles[i], "folder", bw);
      if (name.empty() || name.find('/') != std::string::npos || name.starts_with(".")) {
        fail(bw + ": folder", "'" + name + "' is not a folder inside the pack");
      }
      const fs::path folder = pack / name;
      for (const Json& f : require_field(bundles[i], "files", bw)) {
        const fs::path file = folder / require_string(f, "path", bw);
        std::error_code ec;
        const auto size = fs::file_size(file, ec);
        if (ec) fail(file.string(), "missing (listed in MANIFEST.json)");
        if (static_cast<int64_t>(size) != require_int(f, "size", bw)) {
          fail(file.string(), "size differs from MANIFEST.json");
        }
        if (sha256_file(file) != require_string(f, "sha256", bw)) {
          fail(file.string(),
               "sha256 differs from MANIFEST.json: the file is corrupt or was changed");
        }
      }
      return folder;
    }
  }
  for (const Json& b : bundles) {
    const auto t = b.find("target");
    available += (available.empty() ? "" : ", ") +
                 (t != b.end() && t->is_string() ? t->get<std::string>() : "?");
  }
  fail(where, "no bundle for this machine ('" + host_target() + "'); the pack has: " + available);
}

void write_pack(const fs::path& out, const std::vector<fs::path>& bundles, bool overwrite) {
  if (bundles.empty()) fail("pack", "no bundles given");
  if (fs::exists(out) && !overwrite)
    fail(out.string(), "already exists (pass --force to replace it)");
  remove_stale_partials(out);
  const fs::path temp = partial_sibling(out);
  fs::remove_all(temp);
  fs::create_directories(temp);
  try {
    Json entries = Json::array();
    std::set<std::string> targets;
    for (const fs::path& b : bundles) {
      const BundleManifest m =
          open_bundle_manifest(b, {.verify_sha256 = true, .check_target = false});
      if (!targets.insert(m.target).second) {
        fail(b.string(), "a second bundle for target '" + m.target + "'");
      }
      fs::copy(b, temp / m.target, fs::copy_options::recursive);
      Json files = Json::array();
      for (const auto& e : fs::recursive_directory_iterator(temp / m.target)) {
        if (!e.is_regular_file()) continue;
        files.push_back({{"path", fs::relative(e.path(), temp / m.target).string()},
                         {"size", fs::file_size(e.path())},
                         {"sha256", sha256_file(e.path())}});
      }
      entries.push_back(
          {{"target", m.target}, {"folder", m.target}, {"family", m.family}, {"files", files}});
    }
    const Json manifest = {
        {"format", "qhx-pack"}, {"format_version", kPackFormatVersion}, {"bundles", entries}};
    std::ofstream(temp / "MANIFEST.json") << manifest.dump(2) << "\n";
    if (fs::exists(out)) fs::remove_all(out);
    fs::rename(temp, out);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    throw;
  }
}

}  // namespace qhx
