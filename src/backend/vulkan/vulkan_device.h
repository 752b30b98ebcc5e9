// One Vulkan device as qhx uses it: what it offers (VulkanDeviceInfo, for `qhx devices` and for
// choosing shader variants), a logical device with one compute queue, memory types, the compute
// pipelines (created on first use from the SPIR-V embedded at build time, kept in a pipeline
// cache on disk), and one-shot submissions for copies. Knows buffers and shaders, never ops or
// models.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace qhx {

struct VulkanDeviceInfo {
  int index = 0;
  std::string name;
  std::string type;                  // "discrete GPU", "integrated GPU", "CPU", ...
  std::string driver;                // driver name and version as the driver reports them
  std::string api;                   // Vulkan version, "1.3.238"
  uint64_t memory_bytes = 0;         // the largest device-local heap
  bool fp16 = false;                 // shaderFloat16
  bool int8_dot = false;             // shaderIntegerDotProduct (VK_KHR_shader_integer_dot_product)
  bool subgroup_arithmetic = false;  // subgroup reductions in compute shaders
  bool cooperative_matrix = false;   // VK_KHR_cooperative_matrix
  // The cooperative-matrix shapes of the prompt-sized matmuls (matmul_coopmat.comp: subgroup
  // scope, M and N dividing 64, K dividing 32, with the features that shader needs): int8 × int8
  // → int32 for int8 activations, f16 × f16 → f32 for float ones; all 0 where the device has
  // none.
  struct MatrixShape {
    uint32_t m = 0, n = 0, k = 0;
  };
  MatrixShape int8_matrix, f16_matrix;
  uint32_t subgroup_size = 0;
  uint64_t max_storage_buffer_range = 0;  // bytes one storage buffer binding may span
  uint64_t storage_offset_alignment = 4;  // minStorageBufferOffsetAlignment of a binding's start
  bool discrete = false;
  // Timestamps of its compute queue: valid bits (0: it writes none) and nanoseconds per tick.
  uint32_t timestamp_bits = 0;
  double timestamp_period_ns = 0;
  // VK_EXT_external_memory_host's minImportedHostPointerAlignment: host memory (a mapped weight
  // file) aligned so can be used by the device in place. 0: the device cannot import it.
  uint64_t host_import_alignment = 0;
  // "llvmpipe (LLVM 15.0.6, 256 bits) · CPU · 23.9 GiB · Mesa 22.3.6 · Vulkan 1.3.230 ·
  // subgroup 8, int8-dot", "..., cooperative-matrix (int8 16x16x32, f16 16x16x16)"
  std::string describe() const;
};

// The devices the Vulkan loader finds, in its order (their index is what vulkan:N names).
// Empty when there is no loader or no driver; `why` then says which.
std::vector<VulkanDeviceInfo> vulkan_devices(std::string* why = nullptr);

// Every compute pipeline has the same interface: kMaxBindings storage buffers in set 0 and
// kPushConstantBytes of push constants.
inline constexpr uint32_t kMaxBindings = 5;
inline constexpr uint32_t kPushConstantBytes = 64;

class VulkanDevice {
 public:
  // Opens device `index` (Error when there is none). Thread-safe to use from several backends.
  // With a `cache_dir`, compiled pipelines are read from a file of this device and driver there
  // (vulkan-pipelines/) and written back when the device closes.
  static std::shared_ptr<VulkanDevice> open(int index, const std::filesystem::path& cache_dir = {});
  ~VulkanDevice();
  VulkanDevice(const VulkanDevice&) = delete;
  VulkanDevice& operator=(const VulkanDevice&) = delete;

  const VulkanDeviceInfo& info() const { return info_; }
  VkDevice device() const { return device_; }
  VkPhysicalDevice physical() const { return physical_; }
  uint32_t queue_family() const { return queue_family_; }

  // A memory type index with all of `required`, preferring `preferred` too; -1 if none.
  int memory_type(uint32_t allowed_types, VkMemoryPropertyFlags required,
                  VkMemoryPropertyFlags preferred) const;
  VkMemoryPropertyFlags memory_flags(int type) const;
  // The memory types that can import host memory at `host` (VK_EXT_external_memory_host), 0 if
  // none or the device has no such import.
  uint32_t host_pointer_memory_types(const void* host) const;

  VkPipeline pipeline(std::string_view shader);
  // The shaders' specialization constant 0: threads per weight row of a matmul (64 / it rows per
  // workgroup). Constants 1-3 are info().int8_matrix's M, N and K, 4-6 f16_matrix's.
  uint32_t matmul_lanes() const { return info_.type == "CPU" ? 1 : 16; }
  VkPipelineLayout pipeline_layout() const { return pipeline_layout_; }
  VkDescriptorSetLayout set_layout() const { return set_layout_; }

  // Submits one command buffer on the queue and waits for it (timeout: Error). The queue is
  // shared by every backend on the device: submissions take a lock.
  void submit_and_wait(VkCommandBuffer commands, VkFence fence, uint64_t timeout_ns,
                       const char* what) const;

 private:
  VulkanDevice() = default;

  VulkanDeviceInfo info_;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkPhysicalDeviceMemoryProperties memory_{};
  PFN_vkGetMemoryHostPointerPropertiesEXT host_pointer_properties_ = nullptr;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout_ = VK_NULL_HANDLE;
  VkPipelineCache pipeline_cache_ = VK_NULL_HANDLE;
  std::filesystem::path pipeline_cache_file_;
  bool pipelines_added_ = false;  // since the cache was read: worth writing back
  mutable std::mutex mutex_;      // pipelines_ and the queue
  std::map<std::string, VkPipeline, std::less<>> pipelines_;
};

// A Vulkan info struct, zeroed but for its sType.
template <typename T>
T vk_info(VkStructureType type) {
  T info{};
  info.sType = type;
  return info;
}

// Throws Error naming `what` when a Vulkan call failed; device loss and memory exhaustion get
// their own kinds so callers can fall back.
void vk_check(VkResult result, const char* what);

}  // namespace qhx
