// SHA-256 of files (OpenSSL), as lowercase hex.
#pragma once

#include <filesystem>
#include <string>

namespace qhx {

std::string sha256_file(const std::filesystem::path& path);  // throws Error naming the file

}  // namespace qhx
