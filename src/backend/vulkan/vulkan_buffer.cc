#include "backend/vulkan/vulkan_buffer.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "util/error.h"

namespace qhx {
namespace {

struct Allocation {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  std::byte* host = nullptr;  // mapped, when the memory is host-visible
};

// What allocate_memory made, given back (memory: none where the buffer has none of its own).
void release(VkDevice device, VkBuffer buffer, VkDeviceMemory memory) {
  vkDestroyBuffer(device, buffer, nullptr);
  if (memory != VK_NULL_HANDLE) vkFreeMemory(device, memory, nullptr);
}

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
    release(d.device(), a.buffer, VK_NULL_HANDLE);
    fail("vulkan", "no memory type for a buffer of " + std::to_string(bytes) + " bytes");
  }
  auto info = vk_info<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  info.allocationSize = needs.size;
  info.memoryTypeIndex = static_cast<uint32_t>(type);
  if (const VkResult r = vkAllocateMemory(d.device(), &info, nullptr, &a.memory); r != VK_SUCCESS) {
    release(d.device(), a.buffer, VK_NULL_HANDLE);
    vk_check(r, ("allocating " + std::to_string(bytes) + " bytes").c_str());
  }
  try {
    vk_check(vkBindBufferMemory(d.device(), a.buffer, a.memory, 0), "binding memory");
    const VkMemoryPropertyFlags flags = d.memory_flags(type);
    if ((flags & visible) == visible) {
      void* mapped = nullptr;
      vk_check(vkMapMemory(d.device(), a.memory, 0, VK_WHOLE_SIZE, 0, &mapped), "mapping memory");
      a.host = static_cast<std::byte*>(mapped);
    }
  } catch (...) {
    release(d.device(), a.buffer, a.memory);
    throw;
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
    try {
      run_once(*device_, "zeroing a buffer",
               [&](VkCommandBuffer c) { vkCmdFillBuffer(c, buffer_, 0, VK_WHOLE_SIZE, 0); });
    } catch (...) {  // no destructor runs for an object whose constructor throws
      release(device_->device(), buffer_, memory_);
      throw;
    }
  }
}

VulkanBuffer::VulkanBuffer(std::shared_ptr<VulkanDevice> device, const void* data, size_t bytes)
    : Buffer(BufferKind::kHostVisibleDevice, nullptr,
             static_cast<std::byte*>(const_cast<void*>(data)), bytes, /*writable=*/false),
      device_(std::move(device)) {}

VulkanBuffer::~VulkanBuffer() {
  release(device_->device(), buffer_, memory_);
}

namespace {

constexpr VkExternalMemoryHandleTypeFlagBits kHostAllocation =
    VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;

}  // namespace

std::shared_ptr<const VulkanHostImport> VulkanHostImport::create(
    std::shared_ptr<VulkanDevice> device, const void* data, size_t bytes) {
  const uint64_t alignment = device->info().host_import_alignment;
  if (alignment == 0 || data == nullptr || bytes == 0) return nullptr;
  // The aligned part of [data, data + bytes): an import may not reach past the memory it names
  // (what lies outside it is uploaded instead).
  const auto address = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (address + alignment - 1) / alignment * alignment;
  const uintptr_t end = (address + bytes) / alignment * alignment;
  if (end <= begin) return nullptr;
  const auto* base = reinterpret_cast<const std::byte*>(begin);
  const uint32_t types = device->host_pointer_memory_types(base);
  if (types == 0) return nullptr;
  // Device-local where one of the types is (unified memory), else the first.
  int type = device->memory_type(types, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
  if (type < 0) type = std::countr_zero(types);
  auto host = vk_info<VkImportMemoryHostPointerInfoEXT>(
      VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT);
  host.handleType = kHostAllocation;
  host.pHostPointer = const_cast<std::byte*>(base);
  auto info = vk_info<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  info.pNext = &host;
  info.allocationSize = end - begin;
  info.memoryTypeIndex = static_cast<uint32_t>(type);
  VkDeviceMemory memory = VK_NULL_HANDLE;
  if (vkAllocateMemory(device->device(), &info, nullptr, &memory) != VK_SUCCESS) return nullptr;
  std::shared_ptr<VulkanHostImport> import(new VulkanHostImport());
  import->device_ = std::move(device);
  import->base_ = base;
  import->bytes_ = end - begin;
  import->memory_ = memory;
  import->type_ = static_cast<uint32_t>(type);
  return import;
}

VulkanHostImport::~VulkanHostImport() {
  vkFreeMemory(device_->device(), memory_, nullptr);
}

std::unique_ptr<VulkanBuffer> VulkanBuffer::over(std::shared_ptr<const VulkanHostImport> import,
                                                 std::shared_ptr<VulkanDevice> device,
                                                 const void* data, size_t bytes, size_t& lead) {
  const auto* first = static_cast<const std::byte*>(data);
  if (first < import->base() || first + bytes > import->base() + import->bytes()) return nullptr;
  const VkDevice d = device->device();
  // The alignment a buffer's memory offset needs, from a buffer of this kind.
  auto external = vk_info<VkExternalMemoryBufferCreateInfo>(
      VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO);
  external.handleTypes = kHostAllocation;
  auto create = vk_info<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  create.pNext = &external;
  create.size = std::max<size_t>(bytes, 4);
  create.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
  create.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer probe = VK_NULL_HANDLE;
  if (vkCreateBuffer(d, &create, nullptr, &probe) != VK_SUCCESS) return nullptr;
  VkMemoryRequirements needs;
  vkGetBufferMemoryRequirements(d, probe, &needs);
  vkDestroyBuffer(d, probe, nullptr);
  if ((needs.memoryTypeBits >> import->memory_type() & 1) == 0 || needs.alignment == 0) {
    return nullptr;
  }
  const size_t at = static_cast<size_t>(first - import->base());
  const size_t offset = at / needs.alignment * needs.alignment;
  lead = at - offset;
  create.size = std::max<size_t>(lead + bytes, 4);
  std::unique_ptr<VulkanBuffer> b(
      new VulkanBuffer(std::move(device), first - lead, static_cast<size_t>(create.size)));
  if (vkCreateBuffer(d, &create, nullptr, &b->buffer_) != VK_SUCCESS) return nullptr;
  vkGetBufferMemoryRequirements(d, b->buffer_, &needs);
  if (offset + needs.size > import->bytes() ||
      vkBindBufferMemory(d, b->buffer_, import->memory(), offset) != VK_SUCCESS) {
    return nullptr;  // its destructor destroys the unbound buffer
  }
  b->import_ = std::move(import);
  return b;
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
  if (++allocations_ == fail_allocation_) {
    fail("vulkan: allocating " + std::to_string(bytes) + " bytes",
         "out of device memory (fault injected at allocation " + std::to_string(fail_allocation_) +
             ")",
         ErrorKind::kOutOfMemory);
  }
  return std::make_unique<VulkanBuffer>(device_, this, bytes, memory_ == kHostVisible);
}

const VulkanBuffer* as_vulkan(const Buffer* buffer, const VulkanDevice& device) {
  const auto* v = dynamic_cast<const VulkanBuffer*>(buffer);
  return v != nullptr && &v->device() == &device ? v : nullptr;
}

}  // namespace qhx
