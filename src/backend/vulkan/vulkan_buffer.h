// Vulkan memory as qhx buffers (core/buffer.h). Two buffer types per device: device-local
// memory (weights and activation arenas; the host maps it too where the device shares memory
// with the host, as phones, integrated GPUs and lavapipe do), and host-visible memory (the
// states of sequences whose prompt runs on the device and whose reply runs on the CPU: both
// address them, so the hand-off copies nothing). Bytes reach memory the host cannot map through
// a staging buffer.
#pragma once

#include <vulkan/vulkan.h>

#include <memory>
#include <string>

#include "backend/vulkan/vulkan_device.h"
#include "core/buffer.h"

namespace qhx {

class VulkanBuffer final : public Buffer {
 public:
  VulkanBuffer(std::shared_ptr<VulkanDevice> device, const BufferType* type, size_t bytes,
               bool host_visible);
  ~VulkanBuffer() override;

  VkBuffer handle() const { return buffer_; }
  const VulkanDevice& device() const { return *device_; }
  void write(size_t offset, const void* from, size_t n) override;
  void read(size_t offset, void* to, size_t n) const override;

 private:
  // Copies through a host-visible staging buffer, one chunk at a time.
  void staged(size_t offset, void* host, size_t n, bool to_device) const;

  std::shared_ptr<VulkanDevice> device_;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
};

class VulkanBufferType final : public BufferType {
 public:
  enum Memory { kDeviceLocal, kHostVisible };
  VulkanBufferType(std::shared_ptr<VulkanDevice> device, Memory memory)
      : device_(std::move(device)), memory_(memory) {}
  std::string name() const override;
  BufferKind kind() const override {
    return memory_ == kHostVisible ? BufferKind::kHostVisibleDevice : BufferKind::kDevice;
  }
  std::unique_ptr<Buffer> allocate(size_t bytes) const override;

 private:
  std::shared_ptr<VulkanDevice> device_;
  Memory memory_;
};

// The Vulkan buffer of `buffer` when it is one of `device`'s, else null.
const VulkanBuffer* as_vulkan(const Buffer* buffer, const VulkanDevice& device);

}  // namespace qhx
