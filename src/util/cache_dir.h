// Where qhx keeps what it may recompute but would rather not: device checks that passed,
// compiled GPU pipelines.
#pragma once

#include <filesystem>

namespace qhx {

// $QHX_CACHE_DIR, else $XDG_CACHE_HOME/qhx, else $HOME/.cache/qhx; empty when none is set.
std::filesystem::path default_cache_dir();

}  // namespace qhx
