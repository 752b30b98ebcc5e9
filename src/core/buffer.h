// Memory that tensors live in. Each backend allocates from a buffer type of its own (the CPU:
// host memory; a GPU: device memory, and host-visible device memory for hand-off), and a weight
// file mapped read-only is a buffer too. Bytes move in and out through read and write, and
// between buffers through copy_bytes, so code that moves data never needs to know whether the
// host can address a buffer; only a backend's kernels use host() directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace qhx {

enum class BufferKind : uint8_t {
  kMappedFile,         // a file mapped read-only: host memory the OS pages in and out
  kHost,               // ordinary host memory
  kDevice,             // device memory the host cannot address
  kHostVisibleDevice,  // device memory the host maps (hand-off, unified memory)
};
const char* buffer_kind_name(BufferKind kind);

class BufferType;

class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  BufferKind kind() const { return kind_; }
  size_t bytes() const { return bytes_; }
  // The buffer type that allocated it; null for memory borrowed from its owner (a mapped file,
  // a caller's array).
  const BufferType* type() const { return type_; }
  // The bytes as the host addresses them, or null (device memory the host cannot map).
  std::byte* host() const { return host_; }

  // Copies n bytes between [offset, offset + n) of this buffer and host memory. The range is
  // checked (Error). Host-addressable buffers copy directly; device buffers override.
  virtual void write(size_t offset, const void* from, size_t n);
  virtual void read(size_t offset, void* to, size_t n) const;

 protected:
  Buffer(BufferKind kind, const BufferType* type, std::byte* host, size_t bytes, bool writable)
      : kind_(kind), type_(type), host_(host), bytes_(bytes), writable_(writable) {}
  void check_range(size_t offset, size_t n, const char* what) const;
  // For memory whose host mapping is known only once it is allocated: device memory the host
  // maps becomes host-visible.
  void map_host(std::byte* host) {
    host_ = host;
    if (host != nullptr && kind_ == BufferKind::kDevice) kind_ = BufferKind::kHostVisibleDevice;
  }

 private:
  BufferKind kind_;
  const BufferType* type_;
  std::byte* host_;
  size_t bytes_;
  bool writable_;
};

// Copies n bytes from one buffer to another, through host memory where neither side can do it
// directly.
void copy_bytes(const Buffer& from, size_t from_offset, Buffer& to, size_t to_offset, size_t n);

class BufferType {
 public:
  virtual ~BufferType() = default;
  virtual std::string name() const = 0;
  virtual BufferKind kind() const = 0;
  // `bytes` zeroed bytes, aligned for any kernel's vector loads. Throws Error (kOutOfMemory)
  // when the memory is not there.
  virtual std::unique_ptr<Buffer> allocate(size_t bytes) const = 0;
};

// Host memory, 64-byte aligned: the CPU backend's buffer type.
class HostBufferType final : public BufferType {
 public:
  std::string name() const override { return "host"; }
  BufferKind kind() const override { return BufferKind::kHost; }
  std::unique_ptr<Buffer> allocate(size_t bytes) const override;
};

// Host memory that its owner keeps alive (a mapped file's bytes, a caller's output array),
// presented as a buffer. It owns nothing and allocates nothing, so a caller can make one on the
// stack for a single run.
class BorrowedBuffer final : public Buffer {
 public:
  enum Access : bool { kReadOnly = false, kWritable = true };
  BorrowedBuffer(BufferKind kind, const void* data, size_t bytes, Access access)
      : Buffer(kind, nullptr, static_cast<std::byte*>(const_cast<void*>(data)), bytes, access) {}
};

}  // namespace qhx
