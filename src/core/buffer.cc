#include "core/buffer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "util/error.h"

namespace qhx {
namespace {

constexpr size_t kAlignment = 64;  // a cache line: any SIMD load of a row start is aligned

class HostBuffer final : public Buffer {
 public:
  HostBuffer(const BufferType* type, std::byte* data, size_t bytes)
      : Buffer(BufferKind::kHost, type, data, bytes, true) {}
  ~HostBuffer() override { std::free(host()); }
};

}  // namespace

const char* buffer_kind_name(BufferKind kind) {
  switch (kind) {
    case BufferKind::kMappedFile:
      return "mapped file";
    case BufferKind::kHost:
      return "host";
    case BufferKind::kDevice:
      return "device";
    case BufferKind::kHostVisibleDevice:
      return "host-visible device";
  }
  return "?";
}

void Buffer::check_range(size_t offset, size_t n, const char* what) const {
  if (offset > bytes_ || n > bytes_ - offset) {
    fail(std::string(buffer_kind_name(kind_)) + " buffer",
         std::string(what) + " of " + std::to_string(n) + " bytes at " + std::to_string(offset) +
             " is outside its " + std::to_string(bytes_) + " bytes");
  }
}

void Buffer::write(size_t offset, const void* from, size_t n) {
  check_range(offset, n, "write");
  if (!writable_) fail(std::string(buffer_kind_name(kind_)) + " buffer", "is read-only");
  if (host_ == nullptr) fail(std::string(buffer_kind_name(kind_)) + " buffer", "has no host copy");
  if (n > 0) std::memcpy(host_ + offset, from, n);
}

void Buffer::read(size_t offset, void* to, size_t n) const {
  check_range(offset, n, "read");
  if (host_ == nullptr) fail(std::string(buffer_kind_name(kind_)) + " buffer", "has no host copy");
  if (n > 0) std::memcpy(to, host_ + offset, n);
}

void copy_bytes(const Buffer& from, size_t from_offset, Buffer& to, size_t to_offset, size_t n) {
  if (from.host() != nullptr) return to.write(to_offset, from.host() + from_offset, n);
  if (to.host() != nullptr) return from.read(from_offset, to.host() + to_offset, n);
  std::vector<std::byte> staging(n);  // device to device across backends: through the host
  from.read(from_offset, staging.data(), n);
  to.write(to_offset, staging.data(), n);
}

std::unique_ptr<Buffer> HostBufferType::allocate(size_t bytes) const {
  // aligned_alloc wants a multiple of the alignment; at least one block, so data is never null.
  const size_t rounded = std::max<size_t>(1, (bytes + kAlignment - 1) / kAlignment) * kAlignment;
  auto* data = static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded));
  if (data == nullptr) {
    fail("host buffer", "no memory for " + std::to_string(bytes) + " bytes",
         ErrorKind::kOutOfMemory);
  }
  std::memset(data, 0, rounded);
  return std::make_unique<HostBuffer>(this, data, bytes);
}

}  // namespace qhx
