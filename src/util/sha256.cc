#include "util/sha256.h"

#include <openssl/evp.h>

#include <unistd.h>

#include <cerrno>
#include <vector>

#include "util/error.h"
#include "util/mapped_file.h"

namespace qhx {

struct Sha256::Context {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx{EVP_MD_CTX_new(), EVP_MD_CTX_free};
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  if (!context_->ctx || EVP_DigestInit_ex(context_->ctx.get(), EVP_sha256(), nullptr) != 1) {
    fail("sha256", "cannot start SHA-256");
  }
}

Sha256::~Sha256() = default;

void Sha256::update(std::span<const std::byte> bytes) {
  EVP_DigestUpdate(context_->ctx.get(), bytes.data(), bytes.size());
}

void Sha256::update(std::string_view text) {
  EVP_DigestUpdate(context_->ctx.get(), text.data(), text.size());
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context_->ctx.get(), digest, &length);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

std::string sha256_file(const std::filesystem::path& path) {
  const int fd = open_regular_file(path);
  Sha256 hash;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      fail(path.string(), "read error");
    }
    if (n == 0) break;
    hash.update(std::string_view(buffer.data(), static_cast<size_t>(n)));
  }
  ::close(fd);
  return hash.hex();
}

}  // namespace qhx
