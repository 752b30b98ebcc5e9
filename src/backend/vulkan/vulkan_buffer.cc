#include "backend/vulkan/vulkan_buffer.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace qhx {
namespace {

struct Allocation {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  std::byte* host = nullptr;  // mapped, when the memory is host-visible
};

// A buffer of `bytes` (at least 4: Vulkan has no empty buffers) for storage and copies, bound to
// memory of its own. Host-visible memory is coherent (no flushes), cached where the device has
// it (the CPU reads states back); device-local memory is host-visible too where that costs
// nothing (unified memory).
Allocation allocate_memory(const VulkanDevice& d, size_t bytes, bool host_visible) {
  Allocation a;
  auto create = vk_info<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  create.size = std::max<size_t>(bytes, 4);
  create.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  create.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  vk_check(vkCreateBuffer(d.device(), &create, nullptr, &a.buffer), "creating a buffer");
  VkMemoryRequirements needs;
  vkGetBufferMemoryRequirements(d.device(), a.buffer, &needs);
  const VkMemoryPropertyFlags visible =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int type = -1;
  if (host_visible) {
    type = d.memory_type(needs.memoryTypeBits, visible, VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  } else {
    // Mapped too where the device shares the host's memory; a discrete GPU's small mappable
    // window is left alone.
    type = d.memory_type(needs.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                         d.info().discrete ? 0 : visible);
    if (type < 0) type = d.memory_type(needs.memoryTypeBits, 0, 0);
  }
  if (type < 0) {
    vkDestroyBuffer(d.device(), a.buffer, nullptr);
    fail("vulkan", "no memory type for a buffer of " + std::to_string(bytes) + " bytes");
  }
  auto info = vk_info<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  info.allocationSize = needs.size;
  info.memoryTypeIndex = static_cast<uint32_t>(type);
  if (const VkResult r = vkAllocateMemory(d.device(), &info, nullptr, &a.memory); r != VK_SUCCESS) {
    vkDestroyBuffer(d.device(), a.buffer, nullptr);
    vk_check(r, ("allocating " + std::to_string(bytes) + " bytes").c_str());
  }
  vk_check(vkBindBufferMemory(d.device(), a.buffer, a.memory, 0), "binding memory");
  const VkMemoryPropertyFlags flags = d.memory_flags(type);
  if ((flags & visible) == visible) {
    void* mapped = nullptr;
    vk_check(vkMapMemory(d.device(), a.memory, 0, VK_WHOLE_SIZE, 0, &mapped), "mapping memory");
    a.host = static_cast<std::byte*>(mapped);
  }
  return a;
}

// One-shot command buffers for staging copies and fills.
template <typename Record>
void run_once(const VulkanDevice& d, const char* what, Record record) {
  VkDevice device = d.device();
  auto pool_info = vk_info<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pool_info.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  pool_info.queueFamilyIndex = d.queue_family();
  VkCommandPool pool = VK_NULL_HANDLE;
  vk_check(vkCreateCommandPool(device, &pool_info, nullptr, &pool), what);
  auto alloc = vk_info<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  alloc.commandPool = pool;
  alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  alloc.commandBufferCount = 1;
  VkCommandBuffer commands = VK_NULL_HANDLE;
  auto fence_info = vk_info<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  VkFence fence = VK_NULL_HANDLE;
  try {
    vk_check(vkAllocateCommandBuffers(device, &alloc, &commands), what);
    vk_check(vkCreateFence(device, &fence_info, nullptr, &fence), what);
    auto begin = vk_info<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vkBeginCommandBuffer(commands, &begin);
    record(commands);
    vk_check(vkEndCommandBuffer(commands), what);
    d.submit_and_wait(commands, fence, UINT64_MAX, what);
  } catch (...) {
    if (fence != VK_NULL_HANDLE) vkDestroyFence(device, fence, nullptr);
    vkDestroyCommandPool(device, pool, nullptr);
    throw;
  }
  vkDestroyFence(device, fence, nullptr);
  vkDestroyCommandPool(device, pool, nullptr);
}

}  // namespace

VulkanBuffer::VulkanBuffer(std::shared_ptr<VulkanDevice> device, const BufferType* type,
                           size_t bytes, bool host_visible)
    : Buffer(host_visible ? BufferKind::kHostVisibleDevice : BufferKind::kDevice, type, nullptr,
             bytes, true),
      device_(std::move(device)) {
  const Allocation a = allocate_memory(*device_, bytes, host_visible);
  buffer_ = a.buffer;
  memory_ = a.memory;
  map_host(a.host);
  if (a.host != nullptr) {
    std::memset(a.host, 0, bytes);
  } else {
    run_once(*device_, "zeroing a buffer",
             [&](VkCommandBuffer c) { vkCmdFillBuffer(c, buffer_, 0, VK_WHOLE_SIZE, 0); });
  }
}

VulkanBuffer::~VulkanBuffer() {
  vkDestroyBuffer(device_->device(), buffer_, nullptr);
  vkFreeMemory(device_->device(), memory_, nullptr);
}

void VulkanBuffer::write(size_t offset, const void* from, size_t n) {
  if (host() != nullptr) return Buffer::write(offset, from, n);
  check_range(offset, n, "write");
  staged(offset, const_cast<void*>(from), n, /*to_device=*/true);
}

void VulkanBuffer::read(size_t offset, void* to, size_t n) const {
  if (host() != nullptr) return Buffer::read(offset, to, n);
  check_range(offset, n, "read");
  staged(offset, to, n, /*to_device=*/false);
}

void VulkanBuffer::staged(size_t offset, void* host_bytes, size_t n, bool to_device) const {
  constexpr size_t kChunk = size_t{64} << 20;
  const Allocation staging = allocate_memory(*device_, std::min(n, kChunk), true);
  auto* bytes = static_cast<std::byte*>(host_bytes);
  try {
    for (size_t done = 0; done < n;) {
      const size_t part = std::min(kChunk, n - done);
      if (to_device) std::memcpy(staging.host, bytes + done, part);
      run_once(*device_, to_device ? "uploading" : "downloading", [&](VkCommandBuffer c) {
        const VkBufferCopy region{to_device ? 0 : offset + done, to_device ? offset + done : 0,
                                  part};
        vkCmdCopyBuffer(c, to_device ? staging.buffer : buffer_,
                        to_device ? buffer_ : staging.buffer, 1, &region);
      });
      if (!to_device) std::memcpy(bytes + done, staging.host, part);
      done += part;
    }
  } catch (...) {
    vkDestroyBuffer(device_->device(), staging.buffer, nullptr);
    vkFreeMemory(device_->device(), staging.memory, nullptr);
    throw;
  }
  vkDestroyBuffer(device_->device(), staging.buffer, nullptr);
  vkFreeMemory(device_->device(), staging.memory, nullptr);
}

std::string VulkanBufferType::name() const {
  return "vulkan:" + std::to_string(device_->info().index) +
         (memory_ == kHostVisible ? " host-visible" : " device");
}

std::unique_ptr<Buffer> VulkanBufferType::allocate(size_t bytes) const {
  return std::make_unique<VulkanBuffer>(device_, this, bytes, memory_ == kHostVisible);
}

const VulkanBuffer* as_vulkan(const Buffer* buffer, const VulkanDevice& device) {
  const auto* v = dynamic_cast<const VulkanBuffer*>(buffer);
  return v != nullptr && &v->device() == &device ? v : nullptr;
}

}  // namespace qhx
