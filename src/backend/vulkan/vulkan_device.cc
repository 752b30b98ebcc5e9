#include "backend/vulkan/vulkan_device.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <span>

#include "backend/vulkan/vulkan_shaders.h"
#include "util/error.h"
#include "util/partial_path.h"
#include "util/sha256.h"

namespace qhx {
namespace {

std::string version_string(uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) +
         "." + std::to_string(VK_API_VERSION_PATCH(v));
}

const char* type_name(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "CPU";
    default:
      return "other";
  }
}

bool has_extension(VkPhysicalDevice device, const char* name) {
  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(device, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> extensions(n);
  vkEnumerateDeviceExtensionProperties(device, nullptr, &n, extensions.data());
  return std::any_of(extensions.begin(), extensions.end(), [&](const VkExtensionProperties& e) {
    return std::strcmp(e.extensionName, name) == 0;
  });
}

// An instance for compute only: no surfaces, no layers. Vulkan 1.1 is what the shaders need.
VkResult create_instance(VkInstance* instance) {
  auto app = vk_info<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "qhx";
  app.apiVersion = VK_API_VERSION_1_1;
  auto create = vk_info<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  create.pApplicationInfo = &app;
  return vkCreateInstance(&create, nullptr, instance);
}

// VK_KHR_cooperative_matrix's structures and values, spelled out: Debian 12's Vulkan headers
// (1.3.239) predate the extension (1.3.255).
constexpr char kCoopmatExtension[] = "VK_KHR_cooperative_matrix";
constexpr auto kCoopmatFeaturesType = static_cast<VkStructureType>(1000506000);
constexpr auto kCoopmatPropertiesType = static_cast<VkStructureType>(1000506001);
constexpr auto kCoopmatStagesType = static_cast<VkStructureType>(1000506002);
constexpr uint32_t kComponentFloat16 = 0, kComponentFloat32 = 1, kComponentSint8 = 3,
                   kComponentSint32 = 5, kScopeSubgroup = 3;
struct CoopmatFeatures {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix, cooperativeMatrixRobustBufferAccess;
};
struct CoopmatProperties {
  VkStructureType sType;
  void* pNext;
  uint32_t MSize, NSize, KSize;
  uint32_t AType, BType, CType, ResultType;  // VkComponentTypeKHR
  VkBool32 saturatingAccumulation;
  uint32_t scope;  // VkScopeKHR
};
struct CoopmatStages {
  VkStructureType sType;
  void* pNext;
  VkShaderStageFlags cooperativeMatrixSupportedStages;
};
using GetCoopmatProperties = VkResult(VKAPI_PTR*)(VkPhysicalDevice, uint32_t*, CoopmatProperties*);
// What matmul_coopmat.comp needs besides the matrices: int8 or f16 in shared memory and the
// Vulkan memory model (GL_KHR_cooperative_matrix implies it), as extensions of a Vulkan 1.1
// instance.
constexpr const char* kCoopmatExtensions[] = {kCoopmatExtension,
                                              VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME,
                                              VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME};
// The shader's shared arrays in each form: the blocks (int8: weights and tokens; f16: weights,
// tokens' hi and lo), the sums, two blocks' scales, and (f16) the BF16 rows' exponents.
constexpr uint32_t kInt8MatrixSharedBytes = 64 * 32 * 2 + 64 * 64 * 4 + 2 * 64 * 4 * 2;
constexpr uint32_t kF16MatrixSharedBytes = 64 * 32 * 2 * 3 + 64 * 64 * 4 + 2 * 64 * 4 * 2 + 128 * 4;

// The device's largest subgroup shape multiplying `element`s into `sum`s with M and N dividing
// 64 and K dividing 32 (matmul_coopmat.comp's tile and block), or none.
VulkanDeviceInfo::MatrixShape best_shape(std::span<const CoopmatProperties> shapes,
                                         uint32_t element, uint32_t sum) {
  VulkanDeviceInfo::MatrixShape best;
  for (const CoopmatProperties& s : shapes) {
    const bool fits = s.AType == element && s.BType == element && s.CType == sum &&
                      s.ResultType == sum && !s.saturatingAccumulation &&
                      s.scope == kScopeSubgroup && s.MSize > 0 && s.NSize > 0 && s.KSize > 0 &&
                      64 % s.MSize == 0 && 64 % s.NSize == 0 && 32 % s.KSize == 0;
    if (fits && s.MSize * s.NSize * s.KSize > best.m * best.n * best.k) {
      best = {s.MSize, s.NSize, s.KSize};
    }
  }
  return best;
}

// Sets info's int8_matrix and f16_matrix: the shapes matmul_coopmat.comp's int8 and f16 forms
// use, where the device has what each needs.
void find_matrix_shapes(VkInstance instance, VkPhysicalDevice device,
                        const VkPhysicalDeviceProperties& limits,
                        const VkPhysicalDeviceSubgroupProperties& subgroup,
                        VulkanDeviceInfo& info) {
  for (const char* e : kCoopmatExtensions) {
    if (!has_extension(device, e)) return;
  }
  auto coopmat = vk_info<CoopmatFeatures>(kCoopmatFeaturesType);
  auto memory_model = vk_info<VkPhysicalDeviceVulkanMemoryModelFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES);
  auto types = vk_info<VkPhysicalDeviceShaderFloat16Int8Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
  coopmat.pNext = &memory_model;
  memory_model.pNext = &types;
  auto features = vk_info<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  features.pNext = &coopmat;
  vkGetPhysicalDeviceFeatures2(device, &features);
  auto stages = vk_info<CoopmatStages>(kCoopmatStagesType);
  auto properties =
      vk_info<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
  properties.pNext = &stages;
  vkGetPhysicalDeviceProperties2(device, &properties);
  const auto list_shapes = reinterpret_cast<GetCoopmatProperties>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
  if (!coopmat.cooperativeMatrix || !memory_model.vulkanMemoryModel ||
      (stages.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) == 0 ||
      (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) == 0 ||
      (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) == 0 ||
      subgroup.subgroupSize == 0 || 128 % subgroup.subgroupSize != 0 || list_shapes == nullptr) {
    return;
  }
  uint32_t n = 0;
  list_shapes(device, &n, nullptr);
  std::vector<CoopmatProperties> shapes(n, vk_info<CoopmatProperties>(kCoopmatPropertiesType));
  list_shapes(device, &n, shapes.data());
  const uint32_t shared_bytes = limits.limits.maxComputeSharedMemorySize;
  if (types.shaderInt8 && shared_bytes >= kInt8MatrixSharedBytes) {
    info.int8_matrix = best_shape(shapes, kComponentSint8, kComponentSint32);
  }
  if (types.shaderFloat16 && shared_bytes >= kF16MatrixSharedBytes) {
    info.f16_matrix = best_shape(shapes, kComponentFloat16, kComponentFloat32);
  }
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance instance) {
  uint32_t n = 0;
  vkEnumeratePhysicalDevices(instance, &n, nullptr);
  std::vector<VkPhysicalDevice> devices(n);
  vkEnumeratePhysicalDevices(instance, &n, devices.data());
  devices.resize(n);
  return devices;
}

VulkanDeviceInfo read_info(VkInstance instance, VkPhysicalDevice device, int index) {
  VulkanDeviceInfo info;
  info.index = index;
  auto subgroup = vk_info<VkPhysicalDeviceSubgroupProperties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
  auto driver = vk_info<VkPhysicalDeviceDriverProperties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES);
  const bool has_driver_properties = has_extension(device, VK_KHR_DRIVER_PROPERTIES_EXTENSION_NAME);
  auto host_import = vk_info<VkPhysicalDeviceExternalMemoryHostPropertiesEXT>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT);
  const bool has_host_import = has_extension(device, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  subgroup.pNext = has_driver_properties ? &driver : nullptr;
  if (has_host_import) {
    host_import.pNext = subgroup.pNext;
    subgroup.pNext = &host_import;
  }
  auto properties =
      vk_info<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
  properties.pNext = &subgroup;
  vkGetPhysicalDeviceProperties2(device, &properties);
  const VkPhysicalDeviceProperties& p = properties.properties;
  info.name = p.deviceName;
  info.type = type_name(p.deviceType);
  info.discrete = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
  info.api = version_string(p.apiVersion);
  info.driver = has_driver_properties ? std::string(driver.driverName) + " " + driver.driverInfo
                                      : "driver " + std::to_string(p.driverVersion);
  info.subgroup_size = subgroup.subgroupSize;
  info.max_storage_buffer_range = p.limits.maxStorageBufferRange;
  info.storage_offset_alignment = std::max<uint64_t>(p.limits.minStorageBufferOffsetAlignment, 4);
  if (has_host_import) {
    // Host allocations importable as the storage buffers the weights are read through.
    auto buffer = vk_info<VkPhysicalDeviceExternalBufferInfo>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO);
    buffer.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
    buffer.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
    auto external =
        vk_info<VkExternalBufferProperties>(VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES);
    vkGetPhysicalDeviceExternalBufferProperties(device, &buffer, &external);
    if ((external.externalMemoryProperties.externalMemoryFeatures &
         VK_EXTERNAL_MEMORY_FEATURE_IMPORTABLE_BIT) != 0) {
      info.host_import_alignment = host_import.minImportedHostPointerAlignment;
    }
  }

  info.subgroup_arithmetic =
      (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
      (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0;

  auto dot = vk_info<VkPhysicalDeviceShaderIntegerDotProductFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES);
  auto f16 = vk_info<VkPhysicalDeviceShaderFloat16Int8Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
  const bool has_dot = has_extension(device, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
  const bool has_f16 = has_extension(device, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME);
  auto features = vk_info<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  // Only the structures of extensions the device has (its instance is Vulkan 1.1).
  if (has_dot) {
    dot.pNext = features.pNext;
    features.pNext = &dot;
  }
  if (has_f16) {
    f16.pNext = features.pNext;
    features.pNext = &f16;
  }
  vkGetPhysicalDeviceFeatures2(device, &features);
  info.fp16 = f16.shaderFloat16 == VK_TRUE;
  info.int8_dot = has_dot && dot.shaderIntegerDotProduct == VK_TRUE;
  info.cooperative_matrix = has_extension(device, kCoopmatExtension);
  if (info.cooperative_matrix) {
    find_matrix_shapes(instance, device, properties.properties, subgroup, info);
  }

  // Timestamps on the compute queue (VulkanDevice::open takes the first family with compute).
  uint32_t n_families = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(device, &n_families, nullptr);
  std::vector<VkQueueFamilyProperties> families(n_families);
  vkGetPhysicalDeviceQueueFamilyProperties(device, &n_families, families.data());
  for (const VkQueueFamilyProperties& f : families) {
    if ((f.queueFlags & VK_QUEUE_COMPUTE_BIT) == 0) continue;
    info.timestamp_bits = f.timestampValidBits;
    info.timestamp_period_ns = properties.properties.limits.timestampPeriod;
    break;
  }

  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(device, &memory);
  for (uint32_t h = 0; h < memory.memoryHeapCount; ++h) {
    if (memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      info.memory_bytes = std::max<uint64_t>(info.memory_bytes, memory.memoryHeaps[h].size);
    }
  }
  return info;
}

}  // namespace

void vk_check(VkResult result, const char* what) {
  if (result == VK_SUCCESS) return;
  const std::string where = std::string("vulkan: ") + what;
  switch (result) {
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
      fail(where, "out of device memory", ErrorKind::kOutOfMemory);
    case VK_ERROR_OUT_OF_HOST_MEMORY:
      fail(where, "out of host memory", ErrorKind::kOutOfMemory);
    case VK_ERROR_DEVICE_LOST:
      fail(where, "the device was lost", ErrorKind::kDeviceFailed);
    case VK_TIMEOUT:
      fail(where, "timed out", ErrorKind::kDeviceFailed);
    default:
      fail(where, "failed (VkResult " + std::to_string(static_cast<int>(result)) + ")",
           ErrorKind::kDeviceFailed);
  }
}

std::string VulkanDeviceInfo::describe() const {
  char memory[32];
  std::snprintf(memory, sizeof memory, "%.1f GiB", static_cast<double>(memory_bytes) / (1 << 30));
  std::string features = "subgroup " + std::to_string(subgroup_size);
  if (fp16) features += ", fp16";
  if (int8_dot) features += ", int8-dot";
  if (subgroup_arithmetic) features += ", subgroup-arithmetic";
  if (cooperative_matrix) features += ", cooperative-matrix";
  std::string shapes;
  for (const auto& [type, shape] : {std::pair{"int8", int8_matrix}, std::pair{"f16", f16_matrix}}) {
    if (shape.k == 0) continue;
    shapes += (shapes.empty() ? "" : ", ") + std::string(type) + " " + std::to_string(shape.m) +
              "x" + std::to_string(shape.n) + "x" + std::to_string(shape.k);
  }
  if (!shapes.empty()) features += " (" + shapes + ")";
  if (host_import_alignment > 0) features += ", host-import";
  return name + " · " + type + " · " + memory + " · " + driver + " · Vulkan " + api + " · " +
         features;
}

std::vector<VulkanDeviceInfo> vulkan_devices(std::string* why) {
  VkInstance instance = VK_NULL_HANDLE;
  if (const VkResult r = create_instance(&instance); r != VK_SUCCESS) {
    if (why != nullptr) {
      *why = r == VK_ERROR_INCOMPATIBLE_DRIVER ? "no Vulkan driver is installed"
                                               : "the Vulkan loader failed (VkResult " +
                                                     std::to_string(static_cast<int>(r)) + ")";
    }
    return {};
  }
  std::vector<VulkanDeviceInfo> out;
  int index = 0;
  for (VkPhysicalDevice d : physical_devices(instance))
    out.push_back(read_info(instance, d, index++));
  vkDestroyInstance(instance, nullptr);
  if (out.empty() && why != nullptr) *why = "the Vulkan driver reports no device";
  return out;
}

std::shared_ptr<VulkanDevice> VulkanDevice::open(int index,
                                                 const std::filesystem::path& cache_dir) {
  std::shared_ptr<VulkanDevice> d(new VulkanDevice());
  if (create_instance(&d->instance_) != VK_SUCCESS) {
    d->instance_ = VK_NULL_HANDLE;
    fail("vulkan:" + std::to_string(index), "no Vulkan driver is installed");
  }
  const std::vector<VkPhysicalDevice> devices = physical_devices(d->instance_);
  if (index < 0 || index >= static_cast<int>(devices.size())) {
    fail("vulkan:" + std::to_string(index),
         "no such device (" + std::to_string(devices.size()) + " found; `qhx devices` lists them)");
  }
  d->physical_ = devices[index];
  d->info_ = read_info(d->instance_, d->physical_, index);
  vkGetPhysicalDeviceMemoryProperties(d->physical_, &d->memory_);

  uint32_t n_families = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(d->physical_, &n_families, nullptr);
  std::vector<VkQueueFamilyProperties> families(n_families);
  vkGetPhysicalDeviceQueueFamilyProperties(d->physical_, &n_families, families.data());
  bool found = false;
  for (uint32_t f = 0; f < n_families && !found; ++f) {
    if (families[f].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      d->queue_family_ = f;
      found = true;
    }
  }
  if (!found) fail("vulkan:" + std::to_string(index), d->info_.name + " has no compute queue");

  const float priority = 1.0f;
  auto queue = vk_info<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  queue.queueFamilyIndex = d->queue_family_;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  auto create = vk_info<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  create.queueCreateInfoCount = 1;
  create.pQueueCreateInfos = &queue;
  // What the faster shader variants need (VulkanBackend picks them from info()).
  auto dot = vk_info<VkPhysicalDeviceShaderIntegerDotProductFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES);
  std::vector<const char*> extensions;
  if (d->info_.int8_dot) {
    dot.shaderIntegerDotProduct = VK_TRUE;
    dot.pNext = const_cast<void*>(create.pNext);
    create.pNext = &dot;
    extensions.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
  }
  auto coopmat = vk_info<CoopmatFeatures>(kCoopmatFeaturesType);
  auto memory_model = vk_info<VkPhysicalDeviceVulkanMemoryModelFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES);
  auto types = vk_info<VkPhysicalDeviceShaderFloat16Int8Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
  if (d->info_.int8_matrix.k > 0 || d->info_.f16_matrix.k > 0) {
    coopmat.cooperativeMatrix = VK_TRUE;
    memory_model.vulkanMemoryModel = VK_TRUE;
    types.shaderInt8 = d->info_.int8_matrix.k > 0;
    types.shaderFloat16 = d->info_.f16_matrix.k > 0;
    coopmat.pNext = &memory_model;
    memory_model.pNext = &types;
    types.pNext = const_cast<void*>(create.pNext);
    create.pNext = &coopmat;
    extensions.insert(extensions.end(), std::begin(kCoopmatExtensions),
                      std::end(kCoopmatExtensions));
  }
  // Weights used in place from their mapped files (VulkanBackend::matrix).
  if (d->info_.host_import_alignment > 0) {
    extensions.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  }
  create.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  create.ppEnabledExtensionNames = extensions.data();
  vk_check(vkCreateDevice(d->physical_, &create, nullptr, &d->device_), "creating the device");
  if (d->info_.host_import_alignment > 0) {
    d->host_pointer_properties_ = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        vkGetDeviceProcAddr(d->device_, "vkGetMemoryHostPointerPropertiesEXT"));
  }
  vkGetDeviceQueue(d->device_, d->queue_family_, 0, &d->queue_);

  VkDescriptorSetLayoutBinding bindings[kMaxBindings];
  for (uint32_t b = 0; b < kMaxBindings; ++b) {
    bindings[b] = {b, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  auto set =
      vk_info<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  set.bindingCount = kMaxBindings;
  set.pBindings = bindings;
  vk_check(vkCreateDescriptorSetLayout(d->device_, &set, nullptr, &d->set_layout_),
           "creating the descriptor set layout");
  const VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
  auto layout = vk_info<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  layout.setLayoutCount = 1;
  layout.pSetLayouts = &d->set_layout_;
  layout.pushConstantRangeCount = 1;
  layout.pPushConstantRanges = &push;
  vk_check(vkCreatePipelineLayout(d->device_, &layout, nullptr, &d->pipeline_layout_),
           "creating the pipeline layout");

  std::filesystem::path pipeline_cache;
  if (!cache_dir.empty()) {
    Sha256 driver;
    driver.update(d->info_.name + "\n" + d->info_.driver + "\n" + d->info_.api);
    pipeline_cache = cache_dir / "vulkan-pipelines" / (driver.hex().substr(0, 24) + ".bin");
  }
  std::vector<char> cached;
  if (!pipeline_cache.empty()) {
    std::ifstream in(pipeline_cache, std::ios::binary);
    cached.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto cache = vk_info<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
  cache.initialDataSize = cached.size();
  cache.pInitialData = cached.data();
  if (vkCreatePipelineCache(d->device_, &cache, nullptr, &d->pipeline_cache_) != VK_SUCCESS) {
    cache.initialDataSize = 0;  // unreadable data is no reason to fail: start empty
    vk_check(vkCreatePipelineCache(d->device_, &cache, nullptr, &d->pipeline_cache_),
             "creating the pipeline cache");
  }
  d->pipeline_cache_file_ = pipeline_cache;
  return d;
}

namespace {

// Writes the pipeline cache back (under a temporary name, then renamed): a failure costs only
// compiling again next time.
void save_pipeline_cache(VkDevice device, VkPipelineCache cache,
                         const std::filesystem::path& file) {
  size_t size = 0;
  if (vkGetPipelineCacheData(device, cache, &size, nullptr) != VK_SUCCESS || size == 0) return;
  std::vector<char> data(size);
  if (vkGetPipelineCacheData(device, cache, &size, data.data()) != VK_SUCCESS) return;
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  const std::filesystem::path partial = partial_sibling(file);
  {
    std::ofstream out(partial, std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(size));
    if (!out) return;
  }
  std::filesystem::rename(partial, file, ec);
  if (ec) std::filesystem::remove(partial, ec);
}

}  // namespace

VulkanDevice::~VulkanDevice() {
  if (device_ != VK_NULL_HANDLE) {
    vkDeviceWaitIdle(device_);
    if (pipeline_cache_ != VK_NULL_HANDLE) {
      if (pipelines_added_ && !pipeline_cache_file_.empty()) {
        save_pipeline_cache(device_, pipeline_cache_, pipeline_cache_file_);
      }
      vkDestroyPipelineCache(device_, pipeline_cache_, nullptr);
    }
    for (auto& [name, pipeline] : pipelines_) vkDestroyPipeline(device_, pipeline, nullptr);
    vkDestroyPipelineLayout(device_, pipeline_layout_, nullptr);
    vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
    vkDestroyDevice(device_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE) vkDestroyInstance(instance_, nullptr);
}

uint32_t VulkanDevice::host_pointer_memory_types(const void* host) const {
  if (host_pointer_properties_ == nullptr) return 0;
  auto properties = vk_info<VkMemoryHostPointerPropertiesEXT>(
      VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT);
  const VkResult r = host_pointer_properties_(
      device_, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, host, &properties);
  return r == VK_SUCCESS ? properties.memoryTypeBits : 0;
}

int VulkanDevice::memory_type(uint32_t allowed_types, VkMemoryPropertyFlags required,
                              VkMemoryPropertyFlags preferred) const {
  int fallback = -1;
  for (uint32_t t = 0; t < memory_.memoryTypeCount; ++t) {
    const VkMemoryPropertyFlags flags = memory_.memoryTypes[t].propertyFlags;
    if ((allowed_types & (1u << t)) == 0 || (flags & required) != required) continue;
    if ((flags & preferred) == preferred) return static_cast<int>(t);
    if (fallback < 0) fallback = static_cast<int>(t);
  }
  return fallback;
}

VkMemoryPropertyFlags VulkanDevice::memory_flags(int type) const {
  return memory_.memoryTypes[type].propertyFlags;
}

VkPipeline VulkanDevice::pipeline(std::string_view shader) {
  const std::lock_guard lock(mutex_);
  if (const auto it = pipelines_.find(shader); it != pipelines_.end()) return it->second;
  const ShaderCode* code = find_shader(shader);
  if (code == nullptr) fail("vulkan", "no shader named " + std::string(shader));
  auto module_info = vk_info<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  module_info.codeSize = code->words * sizeof(uint32_t);
  module_info.pCode = code->code;
  VkShaderModule module = VK_NULL_HANDLE;
  vk_check(vkCreateShaderModule(device_, &module_info, nullptr, &module), "creating a shader");
  auto create =
      vk_info<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  create.stage =
      vk_info<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
  create.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  create.stage.module = module;
  create.stage.pName = "main";
  // A shader ignores the constants it does not declare.
  const VulkanDeviceInfo::MatrixShape &q8 = info_.int8_matrix, &f16 = info_.f16_matrix;
  const uint32_t constants[] = {matmul_lanes(), q8.m, q8.n, q8.k, f16.m, f16.n, f16.k};
  VkSpecializationMapEntry entries[std::size(constants)];
  for (uint32_t i = 0; i < std::size(constants); ++i) {
    entries[i] = {i, i * 4, sizeof(uint32_t)};
  }
  // A shape of zeros is never read: no shader that declares it is used without the shape.
  const VkSpecializationInfo specialization{std::size(constants), entries, sizeof constants,
                                            constants};
  create.stage.pSpecializationInfo = &specialization;
  create.layout = pipeline_layout_;
  VkPipeline pipeline = VK_NULL_HANDLE;
  const VkResult r =
      vkCreateComputePipelines(device_, pipeline_cache_, 1, &create, nullptr, &pipeline);
  vkDestroyShaderModule(device_, module, nullptr);
  vk_check(r, "creating a compute pipeline");
  pipelines_.emplace(std::string(shader), pipeline);
  pipelines_added_ = true;
  return pipeline;
}

void VulkanDevice::submit_and_wait(VkCommandBuffer commands, VkFence fence, uint64_t timeout_ns,
                                   const char* what) const {
  auto submit = vk_info<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &commands;
  {
    const std::lock_guard lock(mutex_);
    vk_check(vkQueueSubmit(queue_, 1, &submit, fence), what);
  }
  vk_check(vkWaitForFences(device_, 1, &fence, VK_TRUE, timeout_ns), what);
  vk_check(vkResetFences(device_, 1, &fence), what);
}

}  // namespace qhx
