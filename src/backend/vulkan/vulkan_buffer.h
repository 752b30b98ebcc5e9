// Vulkan memory as qhx buffers (core/buffer.h). Two buffer types per device: device-local
// memory (weights and activation arenas; the host maps it too where the device shares memory
// with the host, as phones, integrated GPUs and lavapipe do), and host-visible memory (the
// states of sequences whose prompt runs on the device and whose reply runs on the CPU: both
// address them, so the hand-off copies nothing). Bytes reach memory the host cannot map through
// a staging buffer. And host memory the device imports (a mapped weight file on a device that
// shares the host's memory): buffers over it read the file's pages in place, with no copy.
#pragma once

#include <vulkan/vulkan.h>

#include <atomic>
#include <memory>
#include <string>

#include "backend/vulkan/vulkan_device.h"
#include "core/buffer.h"

namespace qhx {

// Host memory imported once (VK_EXT_external_memory_host): [data, data + bytes) widened to the
// device's import alignment. The memory stays its owner's; it must outlive the import.
class VulkanHostImport {
 public:
  // Null when the device cannot import it (no extension, or a driver that refuses this memory).
  static std::shared_ptr<const VulkanHostImport> create(std::shared_ptr<VulkanDevice> device,
                                                        const void* data, size_t bytes);
  ~VulkanHostImport();
  VulkanHostImport(const VulkanHostImport&) = delete;
  VulkanHostImport& operator=(const VulkanHostImport&) = delete;

  const std::byte* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  VkDeviceMemory memory() const { return memory_; }
  uint32_t memory_type() const { return type_; }

 private:
  VulkanHostImport() = default;
  std::shared_ptr<VulkanDevice> device_;
  const std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  uint32_t type_ = 0;
};

class VulkanBuffer final : public Buffer {
 public:
  VulkanBuffer(std::shared_ptr<VulkanDevice> device, const BufferType* type, size_t bytes,
               bool host_visible);
  // A read-only buffer over [data, data + bytes) of imported memory, or null when the device
  // cannot bind one there. It starts at or up to the device's buffer alignment before `data`:
  // `lead` gets the bytes before it.
  static std::unique_ptr<VulkanBuffer> over(std::shared_ptr<const VulkanHostImport> import,
                                            std::shared_ptr<VulkanDevice> device, const void* data,
                                            size_t bytes, size_t& lead);
  ~VulkanBuffer() override;

  VkBuffer handle() const { return buffer_; }
  const VulkanDevice& device() const { return *device_; }
  void write(size_t offset, const void* from, size_t n) override;
  void read(size_t offset, void* to, size_t n) const override;

 private:
  // Copies through a host-visible staging buffer, one chunk at a time.
  void staged(size_t offset, void* host, size_t n, bool to_device) const;

  VulkanBuffer(std::shared_ptr<VulkanDevice> device, const void* data, size_t bytes);

  std::shared_ptr<VulkanDevice> device_;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;          // its own, or null over an import
  std::shared_ptr<const VulkanHostImport> import_;  // the memory it is bound to, if imported
};

class VulkanBufferType final : public BufferType {
 public:
  enum Memory { kDeviceLocal, kHostVisible };
  // fail_allocation: a test switch, the N-th allocation fails as a device out of memory would
  // (0: none).
  VulkanBufferType(std::shared_ptr<VulkanDevice> device, Memory memory, int64_t fail_allocation = 0)
      : device_(std::move(device)), memory_(memory), fail_allocation_(fail_allocation) {}
  std::string name() const override;
  BufferKind kind() const override {
    return memory_ == kHostVisible ? BufferKind::kHostVisibleDevice : BufferKind::kDevice;
  }
  std::unique_ptr<Buffer> allocate(size_t bytes) const override;
  int64_t allocations() const { return allocations_.load(); }  // attempted so far

 private:
  std::shared_ptr<VulkanDevice> device_;
  Memory memory_;
  int64_t fail_allocation_;
  mutable std::atomic<int64_t> allocations_{0};
};

// The Vulkan buffer of `buffer` when it is one of `device`'s, else null.
const VulkanBuffer* as_vulkan(const Buffer* buffer, const VulkanDevice& device);

}  // namespace qhx
