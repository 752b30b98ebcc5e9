// SHA-256 (OpenSSL), as lowercase hex.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace qhx {

// Hashes bytes fed in pieces.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::span<const std::byte> bytes);
  void update(std::string_view text);
  std::string hex();  // the digest of everything fed so far; ends the hasher

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

std::string sha256_file(const std::filesystem::path& path);  // throws Error naming the file

}  // namespace qhx
