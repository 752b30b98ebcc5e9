#include "backend/vulkan/vulkan_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <set>

#include "backend/vulkan/vulkan_shaders.h"
#include "core/dtype.h"
#include "graph/cost.h"
#include "kernels/kernels.h"
#include "util/error.h"

namespace qhx {
namespace {

constexpr uint32_t kSetsPerSubmission = 1024;  // descriptor sets: one per dispatch
constexpr uint32_t kTimestamps = 4096;         // per submission, when profiling
constexpr uint32_t kWorkgroup = 64;            // every shader's local size
constexpr uint32_t kMatmulTokens = 8;          // tokens per matmul workgroup (matmul*.comp)
// matmul_coopmat.comp: weight rows and tokens per workgroup, and the tokens from which matmuls
// run on cooperative matrices (fewer leave most of a workgroup's tile empty).
constexpr int64_t kMatrixTile = 64;
constexpr int64_t kMatrixMinTokens = 16;
constexpr int64_t kMaxHeadDim = 256;    // attention.comp
constexpr int64_t kMaxKDim = 128;       // delta_rule.comp, delta_chunk.comp
constexpr int64_t kMaxDeltaChunk = 64;  // delta_chunk.comp
constexpr int64_t kDeltaColumns = 16;   // value columns per delta_chunk_state workgroup
constexpr int64_t kMaxConvKernel = 8;   // conv_silu.comp
// Split-key attention (attention.comp PARTIAL/COMBINE): when fewer (query, head) pairs than this
// would each walk more than one split's keys alone, as a decode step over a long context does.
constexpr int64_t kKeysPerSplit = 256;
constexpr int64_t kSplitBelowItems = 256;

uint32_t u32(int64_t v) {
  if (v < 0 || v > UINT32_MAX)
    fail("vulkan", "a size of " + std::to_string(v) + " exceeds 32 bits");
  return static_cast<uint32_t>(v);
}
uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}
uint64_t groups_of(int64_t n) {
  return (static_cast<uint64_t>(n) + kWorkgroup - 1) / kWorkgroup;
}

// How dispatch lays out a grid of `groups` workgroups: wider than the 65535 every device allows
// along x, it wraps into y (common.glsl flat_group), and x · y may then exceed `groups`.
struct Grid {
  uint32_t x, y;
  uint64_t groups() const { return uint64_t{x} * y; }
};
Grid grid_of(uint64_t groups) {
  const uint64_t x = std::min<uint64_t>(groups, 65535);
  return {static_cast<uint32_t>(x), static_cast<uint32_t>((groups + x - 1) / x)};
}

// The shader name suffix of a weight type, or null where no shader reads it.
const char* weight_suffix(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kW8:
      return "w8";
    case DType::kW4:
      return "w4";
    default:
      return nullptr;
  }
}

// Runs `work`, for which memory running out (the device's, or the driver's on the host) is the
// device's failure (util/error.h): the CPU can redo a pass the device had no memory for, where
// asking for less would not help.
template <typename Work>
auto as_device_failure(Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kOutOfMemory) throw;
    throw Error(e.what(), ErrorKind::kDeviceFailed);
  }
}

// A buffer this backend allocated, as the Vulkan buffer it is.
const VulkanBuffer* as_device(const std::unique_ptr<Buffer>& b) {
  return static_cast<const VulkanBuffer*>(b.get());
}

// A matrix part's scales, or (unquantized: the shader reads none) any valid buffer.
const VulkanBuffer* scales_or(const std::unique_ptr<Buffer>& scales,
                              const VulkanBuffer& otherwise) {
  return scales ? as_device(scales) : &otherwise;
}

// The chunk of the device's chunked delta rule: the plan's, at most what the shader holds. Any
// chunk gives the same result up to rounding.
int64_t delta_chunk(const Node& node) {
  return std::clamp<int64_t>(node.chunk, 1, kMaxDeltaChunk);
}

// The chunked delta rule's scratch (delta_chunk.comp): per value head and chunk the cumulative
// decay, U, W and the state the chunk starts from.
int64_t delta_scratch_floats(const Node& node) {
  const DeltaRuleShape& h = node.heads;
  const int64_t c = delta_chunk(node), chunks = (node.rows + c - 1) / c;
  return h.n_v_heads * chunks * (c * (1 + h.v_dim + h.k_dim) + h.k_dim * h.v_dim);
}

}  // namespace

VulkanBackend::VulkanBackend(std::shared_ptr<VulkanDevice> device, VulkanBackendOptions options)
    : device_(std::move(device)),
      options_(options),
      device_memory_(device_, VulkanBufferType::kDeviceLocal, options_.fail_allocation),
      shared_memory_(device_, VulkanBufferType::kHostVisible) {
  subgroup_reductions_ = !options_.portable && device_->info().subgroup_arithmetic;
  int8_dot_ = !options_.portable && device_->info().int8_dot;
  // Built only where glslc knows GL_KHR_cooperative_matrix (cmake/embed_shaders.cmake).
  const bool matrices = !options_.portable && find_shader("matmul_q8_w8_coopmat") != nullptr;
  int8_matrices_ = matrices && device_->info().int8_matrix.k > 0;
  f16_matrices_ = matrices && device_->info().f16_matrix.k > 0;
  private_states_ = options_.decode && (device_->info().discrete || options_.private_states);
  VkDevice d = device_->device();
  auto pool = vk_info<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool.queueFamilyIndex = device_->queue_family();
  vk_check(vkCreateCommandPool(d, &pool, nullptr, &pool_), "creating a command pool");
  auto alloc = vk_info<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  alloc.commandPool = pool_;
  alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  alloc.commandBufferCount = 1;
  vk_check(vkAllocateCommandBuffers(d, &alloc, &commands_), "allocating a command buffer");
  auto fence = vk_info<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  vk_check(vkCreateFence(d, &fence, nullptr, &fence_), "creating a fence");
  const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                  kSetsPerSubmission * kMaxBindings};
  auto descriptors =
      vk_info<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
  descriptors.maxSets = kSetsPerSubmission;
  descriptors.poolSizeCount = 1;
  descriptors.pPoolSizes = &size;
  vk_check(vkCreateDescriptorPool(d, &descriptors, nullptr, &descriptors_),
           "creating a descriptor pool");
  sets_left_ = kSetsPerSubmission;
  ring_ = shared_memory_.allocate(size_t{1} << 20);
  if (options_.profile) {
    const VulkanDeviceInfo& i = device_->info();
    if (i.timestamp_bits == 0 || i.timestamp_period_ns <= 0) {
      vkDestroyDescriptorPool(d, descriptors_, nullptr);
      vkDestroyFence(d, fence_, nullptr);
      vkDestroyCommandPool(d, pool_, nullptr);
      fail("vulkan:" + std::to_string(i.index),
           i.name + " writes no timestamps on its compute queue: it cannot be profiled");
    }
    auto queries = vk_info<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
    queries.queryType = VK_QUERY_TYPE_TIMESTAMP;
    queries.queryCount = kTimestamps;
    vk_check(vkCreateQueryPool(d, &queries, nullptr, &timestamps_), "creating timestamp queries");
  }
}

VulkanBackend::~VulkanBackend() {
  VkDevice d = device_->device();
  vkDeviceWaitIdle(d);
  if (timestamps_ != VK_NULL_HANDLE) vkDestroyQueryPool(d, timestamps_, nullptr);
  vkDestroyDescriptorPool(d, descriptors_, nullptr);
  vkDestroyFence(d, fence_, nullptr);
  vkDestroyCommandPool(d, pool_, nullptr);
}

std::string VulkanBackend::name() const {
  const VulkanDeviceInfo& i = device_->info();
  std::string variants = subgroup_reductions_ ? "subgroup reductions" : "";
  const char* matrices = int8_matrices_ && f16_matrices_ ? "cooperative matrices (int8, f16)"
                         : int8_matrices_                ? "cooperative matrices (int8)"
                                                         : "cooperative matrices (f16)";
  for (const auto& [used, what] :
       {std::pair{int8_dot_, "int8 dot"}, std::pair{int8_matrices_ || f16_matrices_, matrices}}) {
    if (used) variants += variants.empty() ? what : std::string(", ") + what;
  }
  return "vulkan:" + std::to_string(i.index) + " (" + i.name + ", " + i.driver + "; " +
         (variants.empty() ? "portable shaders" : variants) + ")";
}

std::string VulkanBackend::shader(const char* name) const {
  const std::string n = name;
  if (subgroup_reductions_ &&
      (n == "rms_norm" || n == "l2_norm" || n == "attention" || n == "attention_partial")) {
    return n + "_subgroup";
  }
  if (int8_dot_ && n.starts_with("matmul_q8_") && !n.ends_with("_coopmat")) return n + "_dot";
  return n;
}

void VulkanBackend::prepare_weights(const WeightList& weights) {
  // Ids name one model's weights: another's would be taken for them.
  if (!matrices_.empty() || !vectors_.empty()) {
    fail("vulkan", "this device backend holds another model's weights (it serves one at a time)");
  }
  try {
    upload_weights(weights);
  } catch (...) {  // all or nothing: it held none before
    matrices_.clear();
    vectors_.clear();
    imports_.clear();
    throw;
  }
}

void VulkanBackend::upload_weights(const WeightList& weights) {
  // Matrices whose data is one (a tied embedding and lm-head) share one copy.
  std::map<const void*, std::shared_ptr<const DeviceMatrix>> by_data;
  for (const auto& [id, d] : matrices_) by_data.emplace(d->data, d);
  const auto prepare = [&](const MatrixRef& m) {
    if (m.data == nullptr || !supports_matrix(m)) return;  // the CPU multiplies it
    if (m.id < 0) fail("vulkan", "a weight matrix was not numbered (number_weights)");
    std::shared_ptr<const DeviceMatrix>& d = by_data[m.data];
    if (d == nullptr) d = upload_matrix(m);
    matrices_[m.id] = d;
  };
  for (const MatrixRef* m : weights.matrices) prepare(*m);
  if (options_.decode) {  // it looks rows up only when it decodes
    for (const MatrixRef* m : weights.tables) prepare(*m);
  }
  for (const WeightVector* v : weights.vectors) {
    if (v->id < 0) fail("vulkan", "a weight vector was not numbered (number_weights)");
    std::unique_ptr<Buffer>& b = vectors_[v->id];
    b = device_memory_.allocate(std::max<int64_t>(v->size(), 1) * sizeof(float));
    b->write(0, v->data(), v->size() * sizeof(float));
  }
}

WeightMemory VulkanBackend::weight_memory() const {
  WeightMemory w;
  std::set<const DeviceMatrix*> counted;  // tied matrices once
  for (const auto& [id, d] : matrices_) {
    if (!counted.insert(d.get()).second) continue;
    w.in_place_bytes += d->memory.in_place_bytes;
    w.copied_bytes += d->memory.copied_bytes;
  }
  for (const auto& [id, b] : vectors_) w.copied_bytes += static_cast<int64_t>(b->bytes());
  w.host_copied_bytes = device_->info().discrete ? 0 : w.copied_bytes;
  return w;
}

void VulkanBackend::release_weights(const WeightList& weights) {
  // Recorded work may read them: waited for, and they are forgotten even when the device failed
  // (it holds nothing of this model after).
  std::exception_ptr failed;
  try {
    synchronize();
  } catch (...) {
    failed = std::current_exception();
  }
  for (const auto* list : {&weights.matrices, &weights.tables}) {
    for (const MatrixRef* m : *list) {
      matrices_.erase(m->id);
      if (m->buffer != nullptr) imports_.erase(m->buffer);
    }
  }
  for (const WeightVector* v : weights.vectors) vectors_.erase(v->id);
  if (failed) std::rethrow_exception(failed);
}

bool VulkanBackend::holds_weights(const Node& node) const {
  const auto held = [&](const WeightVector* v) { return v == nullptr || vectors_.contains(v->id); };
  return (node.matrix == nullptr || matrices_.contains(node.matrix->id)) && held(node.vector) &&
         held(node.vector2);
}

uint64_t VulkanBackend::range_bytes() const {
  return device_->info().max_storage_buffer_range / 4 * 4;  // bindings of whole words
}

uint64_t VulkanBackend::binding_bytes() const {
  const uint64_t limit = options_.max_binding_bytes > 0 ? options_.max_binding_bytes / 4 * 4 : 0;
  return limit > 0 ? std::min(range_bytes(), limit) : range_bytes();
}

namespace {

// The keys of one window of a KV cache bound in parts: the most whole rows within `limit` bytes
// whose byte size is a multiple of the device's binding-offset alignment (a power of two), so
// that every window starts aligned. 0 when not even one such run of rows fits.
int64_t keys_per_window(uint64_t limit, uint64_t row_bytes, uint64_t alignment) {
  const uint64_t step = alignment / std::gcd(alignment, row_bytes);
  return static_cast<int64_t>(limit / row_bytes / step * step);
}

}  // namespace

bool VulkanBackend::supports_matrix(const MatrixRef& m) const {
  if (weight_suffix(m.dtype) == nullptr || m.rows > UINT32_MAX || m.cols > UINT32_MAX) return false;
  // Split into parts of whole rows (matrix()): one row must fit a binding.
  const uint64_t limit = binding_bytes();
  return matrix_bytes(m.dtype, 1, m.cols, m.group_size) <= limit &&
         matrix_scale_bytes(m.dtype, 1, m.cols, m.group_size) <= limit;
}

bool VulkanBackend::supports(const Node& node) const {
  if (!holds_weights(node)) return false;
  switch (node.op) {
    case Op::kEmbed:
      return supports_matrix(*node.matrix);
    case Op::kMatmul:
      // One token's input and output rows within a window (record_matmul).
      return supports_matrix(*node.matrix) &&
             static_cast<uint64_t>(std::max(node.matrix->rows, node.matrix->cols)) *
                     sizeof(float) <=
                 max_window_bytes();
    case Op::kAttention: {
      // A cache larger than one binding is bound in windows of whole rows (record_attention).
      // f32 caches only: quantized rows are read by the CPU's kernels.
      const AttentionShape& a = node.attention;
      const uint64_t row_bytes = a.n_kv_heads * a.head_dim * sizeof(float);
      return a.kv == KvType::kF32 && a.head_dim <= kMaxHeadDim &&
             keys_per_window(binding_bytes(), row_bytes, offset_alignment()) > 0;
    }
    case Op::kConvSilu:
      return node.width >= 1 && node.width <= kMaxConvKernel;
    case Op::kRope:
      return node.rope_axes == nullptr;  // M-RoPE positions are the CPU's
    case Op::kLayerNorm:                 // the vision tower's ops: on the CPU
    case Op::kAddBias:
    case Op::kGelu:
    case Op::kGeluTanh:
    case Op::kBidirectionalAttention:
      return false;
    case Op::kDeltaRule:
      return node.heads.k_dim <= kMaxKDim && (node.rows == 1 || node.chunk == 0 ||
                                              delta_scratch_floats(node) * sizeof(float) <=
                                                  device_->info().max_storage_buffer_range);
    default:
      return true;
  }
}

bool VulkanBackend::claims(const Node& node) const {
  if (options_.decode) return true;
  return node.op != Op::kEmbed && node.rows >= options_.min_prompt_rows;
}

Buffer& VulkanBackend::arena(size_t bytes) {
  if (arena_ == nullptr || arena_->bytes() < bytes) {
    synchronize();
    arena_.reset();
    arena_ = as_device_failure([&] { return device_memory_.allocate(bytes); });
  }
  return *arena_;
}

const VulkanBackend::DeviceMatrix& VulkanBackend::matrix(const MatrixRef& m) const {
  const auto it = matrices_.find(m.id);
  if (it == matrices_.end())
    fail("vulkan", "weight matrix " + std::to_string(m.id) + " is not here");
  return *it->second;
}

std::shared_ptr<const VulkanBackend::DeviceMatrix> VulkanBackend::upload_matrix(
    const MatrixRef& m) {
  auto uploaded = std::make_shared<DeviceMatrix>();
  DeviceMatrix& d = *uploaded;
  d.data = m.data;
  const uint64_t row_bytes = matrix_bytes(m.dtype, 1, m.cols, m.group_size);
  const uint64_t scale_row_bytes = matrix_scale_bytes(m.dtype, 1, m.cols, m.group_size);
  // Each part padded to whole words (the shaders read 32-bit words) and within one binding; in
  // place, with room for the bytes before it up to the buffer alignment.
  const std::shared_ptr<const VulkanHostImport> import = weight_file(m);
  constexpr uint64_t kLeadRoom = 4096;
  const uint64_t widest_row = std::max({row_bytes, scale_row_bytes, uint64_t{1}});
  uint64_t part_limit = binding_bytes();  // a row fits (supports_matrix)
  if (import != nullptr && part_limit >= kLeadRoom + widest_row) part_limit -= kLeadRoom;
  const int64_t rows_per_part = static_cast<int64_t>(part_limit / widest_row);
  const auto* data = static_cast<const std::byte*>(m.data);
  const auto* scales = static_cast<const std::byte*>(m.scales);
  // A part's bytes in place where they start on a word and the device can bind them there
  // within one binding, else a copy of them.
  const auto place = [&](const std::byte* bytes, uint64_t n, uint32_t& word) {
    const uint64_t padded = (n + 3) / 4 * 4;
    size_t lead = 0;
    std::unique_ptr<Buffer> b;
    if (import != nullptr && reinterpret_cast<uintptr_t>(bytes) % 4 == 0) {
      b = VulkanBuffer::over(import, device_, bytes, padded, lead);
      if (b != nullptr && b->bytes() > binding_bytes()) b.reset();
    }
    if (b != nullptr) {
      word = u32(static_cast<int64_t>(lead / 4));
      d.memory.in_place_bytes += static_cast<int64_t>(n);
    } else {
      b = device_memory_.allocate(padded);
      b->write(0, bytes, n);
      word = 0;
      d.memory.copied_bytes += static_cast<int64_t>(n);
    }
    return b;
  };
  for (int64_t first = 0; first < m.rows; first += rows_per_part) {
    MatrixPart& part = d.parts.emplace_back();
    part.first_row = first;
    part.rows = std::min(rows_per_part, m.rows - first);
    part.data = place(data + first * row_bytes, part.rows * row_bytes, part.data_word);
    if (is_quantized(m.dtype)) {
      part.scales =
          place(scales + first * scale_row_bytes, part.rows * scale_row_bytes, part.scales_word);
    }
  }
  return uploaded;
}

std::shared_ptr<const VulkanHostImport> VulkanBackend::weight_file(const MatrixRef& m) {
  // In place only where the device reads host memory as fast as its own (not a discrete GPU,
  // which would read it over PCIe), and only from a mapped file, which lives as long as the model.
  if (!options_.weights_in_place || device_->info().discrete || m.buffer == nullptr ||
      m.buffer->kind() != BufferKind::kMappedFile || m.buffer->host() == nullptr) {
    return nullptr;
  }
  const auto [it, added] = imports_.try_emplace(m.buffer);
  if (added) it->second = VulkanHostImport::create(device_, m.buffer->host(), m.buffer->bytes());
  return it->second;
}

const VulkanBuffer& VulkanBackend::vector(const WeightVector& v, int64_t floats) const {
  const auto it = vectors_.find(v.id);
  if (it == vectors_.end() || v.size() < floats) {
    fail("vulkan", "weight vector " + std::to_string(v.id) + " is not here, or is too short");
  }
  return static_cast<const VulkanBuffer&>(*it->second);
}

size_t VulkanBackend::byte_at(const NodeArgs& args, const Operand& o) const {
  const TensorRef& t = args.values[o.value];
  if (t.buffer == nullptr || t.buffer != arena_.get()) {
    fail("vulkan", "an operand is not in this device's activation arena");
  }
  return t.offset + o.row * t.strides[0] * sizeof(float);
}

uint32_t VulkanBackend::element_at(const NodeArgs& args, const Operand& o) const {
  return u32(static_cast<int64_t>((byte_at(args, o) - arena_window_) / sizeof(float)));
}

uint64_t VulkanBackend::offset_alignment() const {
  return std::max<uint64_t>(device_->info().storage_offset_alignment, options_.offset_alignment);
}

uint64_t VulkanBackend::max_window_bytes() const {
  // A window starts up to one alignment below the first byte it is for.
  return range_bytes() - offset_alignment();
}

int64_t VulkanBackend::max_arena_span_bytes(const Node& node) const {
  // A matmul binds its input and output in windows of their own (record_matmul).
  if (node.op == Op::kMatmul) return INT64_MAX;
  return static_cast<int64_t>(max_window_bytes());
}

void VulkanBackend::set_arena_window(const Plan& plan, const Node& node, const NodeArgs& args) {
  if (node.op == Op::kMatmul) {
    arena_window_ = 0;  // it binds windows of its own
    return;
  }
  size_t begin = SIZE_MAX, end = 0;
  const auto extend = [&](const Operand& o) {
    if (o.value == kNoValue) return;
    const TensorRef& t = args.values[o.value];
    if (t.buffer != arena_.get()) return;
    begin = std::min(begin, t.offset);
    end = std::max(end, t.offset + plan.values[o.value].floats() * sizeof(float));
  };
  for (const Operand& o : node.in) extend(o);
  extend(node.out);
  extend(node.out2);
  if (end == 0) begin = 0;
  arena_window_ = begin / offset_alignment() * offset_alignment();
  if (end > arena_window_ + range_bytes()) {
    fail("vulkan", plan.describe(node) + ": its operands span " +
                       std::to_string(end - arena_window_) +
                       " bytes of the arena, more than one binding (the scheduler places such "
                       "a node on the CPU)");
  }
}

const VulkanBuffer& VulkanBackend::state(const StateBuffer& s, const char* what, int layer) const {
  const VulkanBuffer* buffer = as_vulkan(s.buffer(), *device_);
  if (buffer == nullptr) {
    fail("vulkan", "layer " + std::to_string(layer) + "'s " + what +
                       " is not in this device's memory (make the state with the model that "
                       "runs on it)");
  }
  return *buffer;
}

namespace {

// A state behind a shadow that a failed batch dropped (abandon): its newest elements are gone,
// which the model handles as the device's failure (it redoes the passes that made them).
[[noreturn]] void fail_lost(const std::string& where) {
  fail("vulkan: " + where, "its newest elements were lost with a failed submission",
       ErrorKind::kDeviceFailed);
}

}  // namespace

const VulkanBuffer& VulkanBackend::working_state(const StateBuffer& s, const char* what,
                                                 int layer) {
  const VulkanBuffer& own = state(s, what, layer);
  if (!private_states_) return own;
  const size_t bytes = static_cast<size_t>(s.size()) * sizeof(float);
  const VulkanBuffer* shadow = as_vulkan(s.shadow(), *device_);
  if (shadow == nullptr && s.behind_shadow()) {
    fail_lost("layer " + std::to_string(layer) + "'s " + what);
  }
  if (shadow == nullptr || shadow->bytes() < bytes) {
    // As large as the state's own memory (which grows twofold), holding what the old shadow
    // held, or the state's elements. Without the device memory for it, the state's own memory.
    std::unique_ptr<Buffer> grown;
    try {
      grown = device_memory_.allocate(own.bytes());
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kOutOfMemory) throw;
      retired_.push_back(s.replace_shadow(nullptr));
      return own;
    }
    const VulkanBuffer& from = shadow != nullptr ? *shadow : own;
    copy(from, 0, static_cast<const VulkanBuffer&>(*grown), 0,
         shadow != nullptr ? shadow->bytes() : bytes);
    retired_.push_back(s.replace_shadow(std::move(grown)));
    shadow = static_cast<const VulkanBuffer*>(s.shadow());
  }
  shadowed_.push_back(&s);
  return *shadow;
}

const VulkanBuffer& VulkanBackend::whole_state(const StateBuffer& s, const char* what, int layer) {
  const VulkanBuffer& working = working_state(s, what, layer);
  if (keep_states_ && s.shadow() == nullptr) {  // computing in its own memory would change it
    fail("vulkan",
         "layer " + std::to_string(layer) + "'s " + what +
             ": out of device memory for its private copy",
         ErrorKind::kDeviceFailed);
  }
  return working;
}

void VulkanBackend::mirror(const StateBuffer& s, const VulkanBuffer& working, size_t offset,
                           size_t bytes) {
  const VulkanBuffer& own = *as_vulkan(s.buffer(), *device_);
  if (&working != &own) copy(working, offset, own, offset, bytes);
}

void VulkanBackend::updated(const StateBuffer& s, const VulkanBuffer& working) {
  if (keep_states_) {
    s.set_behind_shadow(true);
  } else {
    mirror(s, working, 0, s.size() * sizeof(float));
    s.set_behind_shadow(false);
  }
}

bool VulkanBackend::keep_states(bool keep) {
  keep_states_ = keep && private_states_;
  return keep_states_;
}

void VulkanBackend::write_back_states(std::span<const StateBuffer* const> states) {
  // Into host-visible memory of its own, then copied by the host once the device is done: a
  // failure part-way leaves the states' own memory untouched.
  std::vector<std::pair<const StateBuffer*, size_t>> behind;  // and where it passes through
  size_t total = 0;
  for (const StateBuffer* s : states) {
    if (!s->behind_shadow()) continue;
    if (as_vulkan(s->shadow(), *device_) == nullptr) fail_lost("writing a state back");
    behind.emplace_back(s, total);
    total += (static_cast<size_t>(s->size()) * sizeof(float) + 15) / 16 * 16;
  }
  if (behind.empty()) return;
  if (options_.profile) profiled_op_ = profiled_op("state write-back", "", 0);
  abandoning_on_failure([&] {
    if (write_back_ == nullptr || write_back_->bytes() < total) {
      write_back_.reset();
      write_back_ = shared_memory_.allocate(std::bit_ceil(total));
    }
    const auto& through = static_cast<const VulkanBuffer&>(*write_back_);
    for (const auto& [s, at] : behind) {
      copy(*as_vulkan(s->shadow(), *device_), 0, through, at, s->size() * sizeof(float));
    }
    profiled_op_ = -1;
    synchronize();
  });
  const auto& through = static_cast<const VulkanBuffer&>(*write_back_);
  for (const auto& [s, at] : behind) {
    copy_bytes(through, at, *s->buffer(), 0, s->size() * sizeof(float));
    s->set_behind_shadow(false);
  }
}

uint32_t VulkanBackend::upload(const void* bytes, size_t n) {
  const size_t aligned = (n + 15) / 16 * 16;
  if (ring_used_ + aligned > ring_->bytes()) {
    synchronize();  // what the ring holds is read by recorded work
    ring_used_ = 0;
    if (aligned > ring_->bytes()) {
      // The old ring stays if the new one cannot be had.
      std::unique_ptr<Buffer> grown = shared_memory_.allocate(std::bit_ceil(aligned));
      ring_ = std::move(grown);
    }
  }
  const size_t offset = ring_used_;
  ring_->write(offset, bytes, n);
  ring_used_ += aligned;
  return u32(static_cast<int64_t>(offset / sizeof(float)));
}

const VulkanBuffer& VulkanBackend::scratch(std::unique_ptr<Buffer>& buffer, size_t bytes) {
  if (buffer == nullptr || buffer->bytes() < bytes) {
    synchronize();  // recorded work may still read the old one
    buffer.reset();
    // Grown by powers of two, but not past what one binding spans (the whole buffer is bound).
    buffer = device_memory_.allocate(
        std::max<uint64_t>(bytes, std::min<uint64_t>(std::bit_ceil(bytes), range_bytes())));
  }
  return static_cast<const VulkanBuffer&>(*buffer);
}

void VulkanBackend::begin() {
  if (recording_) return;
  auto info = vk_info<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  info.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vk_check(vkBeginCommandBuffer(commands_, &info), "recording commands");
  recording_ = true;
  if (timestamps_ != VK_NULL_HANDLE) {
    vkCmdResetQueryPool(commands_, timestamps_, 0, kTimestamps);
    vkCmdWriteTimestamp(commands_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, timestamps_, 0);
    timestamps_used_ = 1;
  }
}

void VulkanBackend::make_room() {
  const bool timestamps_full = timestamps_ != VK_NULL_HANDLE && timestamps_used_ >= kTimestamps;
  if (recording_ && (sets_left_ == 0 || timestamps_full)) submit_recorded();
}

void VulkanBackend::timestamp(const std::string& kernel) {
  if (timestamps_ == VK_NULL_HANDLE) return;
  // When every command before it is done (each ends with a barrier: they run one at a time).
  vkCmdWriteTimestamp(commands_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, timestamps_,
                      timestamps_used_++);
  timed_.push_back({profiled_op_, kernel});
}

void VulkanBackend::barrier() {
  // Every command reads what the one before it wrote: one global barrier after each.
  auto b = vk_info<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  b.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  b.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                    VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags stages =
      VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(commands_, stages, stages, 0, 1, &b, 0, nullptr, 0, nullptr);
}

void VulkanBackend::dispatch(const char* shader, std::initializer_list<Binding> buffers,
                             std::span<const uint32_t> push, uint64_t groups, uint32_t z) {
  if (push.size() > kPushConstantBytes / 4) fail("vulkan", "too many push constants");
  if (groups == 0 || z == 0) return;
  make_room();
  begin();
  const std::string variant = this->shader(shader);
  const VkPipeline pipeline = device_->pipeline(variant);
  VkDescriptorSetLayout layout = device_->set_layout();
  auto alloc = vk_info<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
  alloc.descriptorPool = descriptors_;
  alloc.descriptorSetCount = 1;
  alloc.pSetLayouts = &layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  vk_check(vkAllocateDescriptorSets(device_->device(), &alloc, &set), "allocating descriptors");
  --sets_left_;
  // Unused bindings get the first buffer: every binding of the shared layout must be valid.
  VkDescriptorBufferInfo infos[kMaxBindings];
  VkWriteDescriptorSet writes[kMaxBindings];
  const Binding* list = buffers.begin();
  const VulkanDeviceInfo& limits = device_->info();
  for (uint32_t b = 0; b < kMaxBindings; ++b) {
    Binding binding = b < buffers.size() ? list[b] : list[0];
    if (binding.buffer == arena_.get() && binding.bytes == VK_WHOLE_SIZE) {
      // The node's window of the arena (set_arena_window).
      binding = Binding(binding.buffer, arena_window_,
                        std::min<uint64_t>(range_bytes(), binding.buffer->bytes() - arena_window_));
    }
    // A binding past the device's range reads wrong memory on some drivers: refuse it here.
    const uint64_t span =
        binding.bytes == VK_WHOLE_SIZE ? binding.buffer->bytes() - binding.offset : binding.bytes;
    if (span > limits.max_storage_buffer_range ||
        binding.offset % limits.storage_offset_alignment != 0) {
      fail("vulkan", std::string(shader) + ": a binding of " + std::to_string(span) +
                         " bytes at offset " + std::to_string(binding.offset) +
                         " is outside what the device binds (maxStorageBufferRange " +
                         std::to_string(limits.max_storage_buffer_range) + ", offsets aligned to " +
                         std::to_string(limits.storage_offset_alignment) + ")");
    }
    infos[b] = {binding.buffer->handle(), binding.offset, binding.bytes};
    writes[b] = vk_info<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    writes[b].dstSet = set;
    writes[b].dstBinding = b;
    writes[b].descriptorCount = 1;
    writes[b].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[b].pBufferInfo = &infos[b];
  }
  vkUpdateDescriptorSets(device_->device(), kMaxBindings, writes, 0, nullptr);
  uint32_t words[kPushConstantBytes / 4] = {};
  std::copy(push.begin(), push.end(), words);
  vkCmdBindPipeline(commands_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
  vkCmdBindDescriptorSets(commands_, VK_PIPELINE_BIND_POINT_COMPUTE, device_->pipeline_layout(), 0,
                          1, &set, 0, nullptr);
  vkCmdPushConstants(commands_, device_->pipeline_layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0,
                     sizeof words, words);
  const Grid grid = grid_of(groups);
  vkCmdDispatch(commands_, grid.x, grid.y, z);
  barrier();
  timestamp(variant);
}

void VulkanBackend::copy(const VulkanBuffer& from, size_t from_offset, const VulkanBuffer& to,
                         size_t to_offset, size_t bytes) {
  if (bytes == 0) return;
  make_room();
  begin();
  const VkBufferCopy region{from_offset, to_offset, bytes};
  vkCmdCopyBuffer(commands_, from.handle(), to.handle(), 1, &region);
  barrier();
  timestamp("copy");
}

void VulkanBackend::synchronize() {
  if (!recording_) return;
  submit_recorded();
  ring_used_ = 0;
  retired_.clear();
  shadowed_.clear();
}

void VulkanBackend::submit_recorded() {
  if (options_.fail_submission > 0 && submissions_ + 1 == options_.fail_submission) {
    abandon();
    ++submissions_;
    fail("vulkan: running a plan",
         "fault injected at submission " + std::to_string(options_.fail_submission),
         ErrorKind::kDeviceFailed);
  }
  recording_ = false;
  abandoning_on_failure([&] {
    // What the host reads next (results, states' own memory) made visible to it.
    auto b = vk_info<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    b.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    b.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(commands_,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &b, 0, nullptr, 0, nullptr);
    vk_check(vkEndCommandBuffer(commands_), "recording commands");
    ++submissions_;
    device_->submit_and_wait(commands_, fence_, options_.fence_timeout_ms * 1000000,
                             "running a plan");
    if (timestamps_ != VK_NULL_HANDLE) read_timestamps();
  });
  vkResetCommandBuffer(commands_, 0);
  vkResetDescriptorPool(device_->device(), descriptors_, 0);
  sets_left_ = kSetsPerSubmission;
}

void VulkanBackend::read_timestamps() {
  std::vector<uint64_t> ticks(timestamps_used_);
  vk_check(vkGetQueryPoolResults(device_->device(), timestamps_, 0, timestamps_used_,
                                 ticks.size() * sizeof(uint64_t), ticks.data(), sizeof(uint64_t),
                                 VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
           "reading timestamps");
  const VulkanDeviceInfo& info = device_->info();
  const uint64_t mask =
      info.timestamp_bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << info.timestamp_bits) - 1;
  last_intervals_.clear();
  for (size_t i = 0; i < timed_.size(); ++i) {
    const double seconds =
        static_cast<double>((ticks[i + 1] - ticks[i]) & mask) * info.timestamp_period_ns * 1e-9;
    last_intervals_.push_back(seconds);
    if (timed_[i].op < 0) continue;
    OpTime& op = profile_.ops[timed_[i].op];
    op.seconds += seconds;
    OpTime::Kernel& kernel = op.kernels[timed_[i].kernel];
    kernel.seconds += seconds;
    kernel.arithmetic = arithmetic(timed_[i].kernel);
    profile_.seconds += seconds;
  }
  ++profile_.submissions;
  timed_.clear();
  timestamps_used_ = 0;
}

void VulkanBackend::abandon() {
  if (recording_) vkEndCommandBuffer(commands_);
  recording_ = false;
  vkDeviceWaitIdle(device_->device());
  // The shadows this batch made or wrote hold what it did not finish: made again from the
  // states' own memory next time.
  for (const StateBuffer* s : shadowed_) retired_.push_back(s->replace_shadow(nullptr));
  vkResetFences(device_->device(), 1, &fence_);
  timed_.clear();  // their times are lost with them
  timestamps_used_ = 0;
  vkResetCommandBuffer(commands_, 0);
  vkResetDescriptorPool(device_->device(), descriptors_, 0);
  sets_left_ = kSetsPerSubmission;
  ring_used_ = 0;
  retired_.clear();
  shadowed_.clear();
}

void VulkanBackend::run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) {
  // Grown before the device's own memory is asked for: a sequence's states running out of
  // memory is for the caller (ask for less), as on the CPU, not the device's failure.
  grow_caches(nodes, args);
  abandoning_on_failure([&] { record_nodes(plan, nodes, args); });
}

void VulkanBackend::abandoning_on_failure(const std::function<void()>& work) {
  try {
    as_device_failure(work);
  } catch (...) {
    abandon();
    throw;
  }
}

void VulkanBackend::grow_caches(std::span<const Node> nodes, const NodeArgs& args) {
  for (const Node& node : nodes) {
    if (node.op != Op::kAttention) continue;
    LayerState& cache = args.inputs->layers[node.layer];
    const int64_t floats = (args.inputs->first_pos + node.rows) * cache.kv_row_floats;
    cache.keys.resize(floats);
    cache.values.resize(floats);
  }
}

void VulkanBackend::record_nodes(const Plan& plan, std::span<const Node> nodes,
                                 const NodeArgs& args) {
  for (const Node& node : nodes) {
    if (options_.profile) {
      profiled_op_ = profiled_op(
          op_name(node.op),
          node.matrix != nullptr ? std::string(dtype_name(node.matrix->dtype)) : std::string(),
          node.rows);
      OpTime& op = profile_.ops[profiled_op_];
      ++op.nodes;
      op.cost += node_cost(plan, node, args.inputs->first_pos);
    }
    set_arena_window(plan, node, args);
    record(plan, node, args);
    if (!options_.perturb_op.empty() && options_.perturb_op == op_name(node.op)) {
      // Over windows of its own: a matmul's output may be larger than one.
      const int64_t n = node.rows * plan.values[node.out.value].cols;
      const int64_t per_window = static_cast<int64_t>(max_window_bytes() / sizeof(float));
      for (int64_t first = 0; first < n; first += per_window) {
        const int64_t here = std::min(per_window, n - first);
        uint32_t out = 0;
        const Binding rows =
            arena_rows(byte_at(args, node.out) + first * sizeof(float), here * sizeof(float), out);
        dispatch("perturb", {rows}, {out, 0, out, u32(here)}, groups_of(here));
      }
    }
  }
  profiled_op_ = -1;
}

VulkanBackend::Binding VulkanBackend::arena_rows(size_t byte, size_t bytes, uint32_t& lead) const {
  const size_t alignment = offset_alignment();
  const size_t base = byte / alignment * alignment;
  lead = u32(static_cast<int64_t>((byte - base) / sizeof(float)));
  return Binding(static_cast<const VulkanBuffer*>(arena_.get()), base, byte - base + bytes);
}

void VulkanBackend::record_matmul(const Node& node, const NodeArgs& args) {
  const MatrixRef& m = *node.matrix;
  const VulkanBuffer& arena = static_cast<const VulkanBuffer&>(*arena_);
  // The input's and the output's rows are bound in windows of their own, a slab of tokens at a
  // time, so that an lm-head over a long prompt's every token (151,936 logits a token) runs here
  // however far its input lies from its output and however many logits it writes.
  const size_t x_row = m.cols * sizeof(float), y_row = m.rows * sizeof(float);
  const size_t x0 = byte_at(args, node.in[0]), y0 = byte_at(args, node.out);
  const int64_t rows_per_group = kWorkgroup / device_->matmul_lanes();
  // Prompts' matmuls run on cooperative matrices where the device has the form: int8 activations
  // on int8 ones, float activations on f16 ones in two parts (matmul_coopmat.comp says why that
  // keeps float32's precision) for the weights f16 holds exactly.
  const bool int8 = uses_int8_activations(m);
  // (W4: a block within one group of scales.)
  const bool split_fits = m.dtype == DType::kW4 ? m.group_size % kActivationBlock == 0
                                                : m.dtype != DType::kF32 && m.cols % 4 == 0;
  // A token's activations as the matmul reads them, per block of 32 columns: int8 (32 bytes a
  // block) or f16 hi and lo (128 bytes, more than its floats).
  const int64_t token_blocks = (m.cols + kActivationBlock - 1) / kActivationBlock;
  const size_t block_bytes = int8 ? kActivationBlock : 2 * kActivationBlock * sizeof(uint16_t);
  const uint64_t room = max_window_bytes();
  const bool can_use_matrices =
      int8 ? int8_matrices_ : f16_matrices_ && split_fits && token_blocks * block_bytes <= room;
  const size_t prepared_row = int8 || can_use_matrices ? token_blocks * block_bytes : 0;
  int64_t slab = std::min<int64_t>(node.rows, room / std::max({x_row, y_row, prepared_row}));
  if (slab > kMatmulTokens) slab = slab / kMatmulTokens * kMatmulTokens;
  const std::string shader = int8 ? (m.dtype == DType::kW8 ? "matmul_q8_w8" : "matmul_q8_w4")
                                  : std::string("matmul_") + weight_suffix(m.dtype);
  const std::string matrix_shader =
      int8 ? shader + "_coopmat"
           : std::string("matmul_split_") + weight_suffix(m.dtype) + "_coopmat";
  for (int64_t t0 = 0; t0 < node.rows; t0 += slab) {
    const int64_t n = std::min(slab, node.rows - t0);
    const uint32_t token_groups = u32((n + kMatmulTokens - 1) / kMatmulTokens);
    uint32_t x = 0, y = 0;
    const Binding xs = arena_rows(x0 + t0 * x_row, n * x_row, x);
    const Binding ys = arena_rows(y0 + t0 * y_row, n * y_row, y);
    const bool matrices = can_use_matrices && n >= kMatrixMinTokens;
    const VulkanBuffer *prepared = nullptr, *activation_scales = nullptr;
    if (int8 || matrices) {
      const int64_t blocks = n * token_blocks;
      prepared = &scratch(quantized_, blocks * block_bytes);
      activation_scales = &scratch(scales_, blocks * sizeof(float));
      dispatch(int8 ? "quantize_q8" : "split_f16", {xs, prepared, activation_scales},
               {x, u32(m.cols), u32(blocks)}, groups_of(blocks));
    }
    // Each part of the matrix writes its rows' columns of the output.
    for (const MatrixPart& part : matrix(m).parts) {
      const uint32_t out = y + u32(part.first_row);
      const int64_t row_groups = (part.rows + rows_per_group - 1) / rows_per_group;
      const VulkanBuffer *data = as_device(part.data), *scales = scales_or(part.scales, arena);
      const uint32_t push[] = {
          out,         u32(part.rows), u32(m.cols),     u32(n), u32(m.group_size),
          u32(m.rows), part.data_word, part.scales_word};
      if (matrices) {
        dispatch(matrix_shader.c_str(), {prepared, activation_scales, data, scales, ys}, push,
                 (part.rows + kMatrixTile - 1) / kMatrixTile,
                 u32((n + kMatrixTile - 1) / kMatrixTile));
      } else if (int8) {
        dispatch(shader.c_str(), {prepared, activation_scales, data, scales, ys}, push, row_groups,
                 token_groups);
      } else {
        dispatch(shader.c_str(), {xs, data, scales, ys},
                 {x, out, u32(part.rows), u32(m.cols), u32(n), u32(m.group_size), u32(m.rows),
                  part.data_word, part.scales_word},
                 row_groups, token_groups);
      }
    }
  }
}

void VulkanBackend::record_attention(const Node& node, const NodeArgs& args, uint32_t q,
                                     uint32_t out) {
  const VulkanBuffer& arena = static_cast<const VulkanBuffer&>(*arena_);
  LayerState& cache = args.inputs->layers[node.layer];
  const int64_t kv_width = cache.kv_row_floats, first_pos = args.inputs->first_pos;
  const int64_t n_keys = first_pos + node.rows;
  // (grown to n_keys rows by grow_caches)
  const VulkanBuffer& keys = working_state(cache.keys, "key cache", node.layer);
  const VulkanBuffer& values = working_state(cache.values, "value cache", node.layer);
  const size_t row_bytes = kv_width * sizeof(float);
  // The new rows, into the cache it reads and (with private states) into the cache's own memory.
  const auto append = [&](const StateBuffer& cache_part, const VulkanBuffer& working,
                          Operand input) {
    const size_t at = first_pos * row_bytes, bytes = node.rows * row_bytes;
    copy(arena, byte_at(args, input), working, at, bytes);
    mirror(cache_part, working, at, bytes);
  };
  append(cache.keys, keys, node.in[1]);
  append(cache.values, values, node.in[2]);

  // A cache larger than one binding (a long context on a phone's 128 MiB range) is bound in
  // windows of whole rows; each window's keys are splits of their own, merged as split-key
  // attention merges them.
  const uint64_t limit = binding_bytes();
  int64_t window = n_keys;
  if (n_keys * row_bytes > limit) {
    window = keys_per_window(limit, row_bytes, offset_alignment());
  }
  const AttentionShape& a = node.attention;
  const int64_t items = node.rows * a.n_heads;
  // Splits: of kKeysPerSplit keys for few queries over many keys (a decode step: the splits run
  // in parallel), else one per window (a prompt: its queries give parallelism enough).
  int64_t per_split = std::min(window, n_keys);
  if (n_keys > kKeysPerSplit && items < kSplitBelowItems) {
    per_split = std::min(kKeysPerSplit, window);
  }
  const int64_t splits = (n_keys + per_split - 1) / per_split;
  // A window holds whole splits; it stays a multiple of the alignment step, as kKeysPerSplit is
  // a multiple of any offset alignment the spec allows (at most 256 bytes).
  window = window >= n_keys ? splits * per_split : window / per_split * per_split;
  const int64_t splits_per_window = window / per_split;
  const auto window_of = [&](const VulkanBuffer& cache_part, int64_t first_key) {
    return Binding(&cache_part, first_key * row_bytes,
                   std::min(window, n_keys - first_key) * row_bytes);
  };
  uint32_t push[] = {q,
                     out,
                     u32(node.rows),
                     u32(first_pos),
                     u32(a.n_heads),
                     u32(a.n_kv_heads),
                     u32(a.head_dim),
                     bits(node.scale),
                     u32(per_split),
                     u32(splits),
                     0,  // first_split
                     u32(splits),
                     0};  // key_base
  if (splits == 1) {
    return dispatch("attention", {&arena, window_of(keys, 0), window_of(values, 0)}, push, items);
  }
  const VulkanBuffer& partials =
      scratch(attention_partials_, items * splits * (2 + a.head_dim) * sizeof(float));
  for (int64_t first_key = 0; first_key < n_keys; first_key += window) {
    const int64_t first_split = first_key / per_split;
    const int64_t here = std::min(splits_per_window, splits - first_split);
    push[10] = u32(first_split);
    push[11] = u32(here);
    push[12] = u32(first_key);
    dispatch("attention_partial",
             {&arena, window_of(keys, first_key), window_of(values, first_key), &partials}, push,
             items * here);
  }
  dispatch("attention_combine", {&arena, window_of(keys, 0), window_of(values, 0), &partials}, push,
           items);
}

void VulkanBackend::record(const Plan& plan, const Node& node, const NodeArgs& args) {
  const auto cols = [&](const Operand& o) { return plan.values[o.value].cols; };
  const auto offset = [&](const Operand& o) { return element_at(args, o); };
  const RunInputs& inputs = *args.inputs;
  const VulkanBuffer& arena = static_cast<const VulkanBuffer&>(*arena_);
  switch (node.op) {
    case Op::kEmbed: {
      const MatrixRef& m = *node.matrix;
      const uint32_t ids = upload(inputs.ids.data(), node.rows * sizeof(int32_t));
      const std::string shader = std::string("embed_") + weight_suffix(m.dtype);
      for (const MatrixPart& part : matrix(m).parts) {
        dispatch(shader.c_str(),
                 {ring(), as_device(part.data), scales_or(part.scales, arena), &arena},
                 {ids, offset(node.out), u32(m.cols), u32(node.rows), u32(m.group_size),
                  u32(part.first_row), u32(part.rows), part.data_word, part.scales_word},
                 groups_of(node.rows * m.cols));
      }
      return;
    }
    case Op::kRmsNorm: {
      const int64_t n = node.rows * cols(node.out) / node.width;
      return dispatch("rms_norm", {&arena, &vector(*node.vector, node.width)},
                      {offset(node.in[0]), offset(node.out), u32(node.width), u32(n),
                       bits(node.eps), bits(1.0f)},
                      n);
    }
    case Op::kL2Norm: {
      const int64_t n = node.rows * cols(node.out) / node.width;
      return dispatch("l2_norm", {&arena},
                      {offset(node.out), offset(node.out), u32(node.width), u32(n), bits(1e-6f),
                       bits(node.scale)},
                      n);
    }
    case Op::kAdd:
    case Op::kSigmoidGate:
    case Op::kSiluMul: {
      const int64_t n = node.rows * cols(node.out);
      const char* shader = node.op == Op::kAdd           ? "add"
                           : node.op == Op::kSigmoidGate ? "sigmoid_gate"
                                                         : "silu_mul";
      const uint32_t second = node.op == Op::kSiluMul ? offset(node.in[1]) : 0;
      return dispatch(shader, {&arena}, {offset(node.in[0]), second, offset(node.out), u32(n)},
                      groups_of(n));
    }
    case Op::kMatmul:
      return record_matmul(node, args);
    case Op::kCopyColumns:
    case Op::kSplitHeads: {
      const int64_t n = node.rows * cols(node.out);
      const bool split = node.op == Op::kSplitHeads;
      return dispatch(
          split ? "split_heads" : "copy_columns", {&arena},
          {offset(node.in[0]), offset(node.out), split ? offset(node.out2) : 0,
           u32(cols(node.in[0])), u32(cols(node.out)), u32(node.width), u32(node.offset), u32(n)},
          groups_of(n));
    }
    case Op::kRope: {
      // cos and sin of each angle as the CPU computes them (f32 position · frequency).
      const int64_t half = node.rotary_dim / 2;
      rope_table_.resize(2 * node.rows * half);
      for (int64_t t = 0; t < node.rows; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          const float angle = static_cast<float>(inputs.first_pos + t) * (*node.vector)[i];
          rope_table_[t * half + i] = std::cos(angle);
          rope_table_[(node.rows + t) * half + i] = std::sin(angle);
        }
      }
      const uint32_t table = upload(rope_table_.data(), rope_table_.size() * sizeof(float));
      const int64_t heads = cols(node.out) / node.width;
      return dispatch("rope", {&arena, ring()},
                      {offset(node.out), u32(cols(node.out)), u32(node.width), u32(half), table,
                       u32(node.rows)},
                      groups_of(node.rows * heads * half));
    }
    case Op::kAttention:
      return record_attention(node, args, offset(node.in[0]), offset(node.out));
    case Op::kConvSilu: {
      const int64_t channels = cols(node.out);
      const StateBuffer& conv_state = inputs.layers[node.layer].conv;
      const VulkanBuffer& conv = whole_state(conv_state, "conv state", node.layer);
      dispatch(
          "conv_silu", {&arena, &vector(*node.vector, channels * node.width), &conv},
          {offset(node.in[0]), offset(node.out), u32(channels), u32(node.width), u32(node.rows)},
          groups_of(channels));
      return updated(conv_state, conv);
    }
    case Op::kDeltaGates: {
      const int64_t heads = cols(node.out);
      return dispatch("delta_gates",
                      {&arena, &vector(*node.vector, heads), &vector(*node.vector2, heads)},
                      {offset(node.out), offset(node.out2), u32(heads), u32(node.rows * heads)},
                      groups_of(node.rows * heads));
    }
    case Op::kDeltaRule: {
      const DeltaRuleShape& h = node.heads;
      const StateBuffer& recurrent_state = inputs.layers[node.layer].recurrent;
      const VulkanBuffer& recurrent = whole_state(recurrent_state, "recurrent state", node.layer);
      const uint32_t operands[] = {offset(node.in[0]), offset(node.in[1]), offset(node.in[2]),
                                   offset(node.in[3]), offset(node.in[4]), offset(node.out),
                                   u32(node.rows),     u32(h.n_k_heads),   u32(h.n_v_heads),
                                   u32(h.k_dim),       u32(h.v_dim),       u32(delta_chunk(node))};
      const std::span<const uint32_t> push(operands);
      if (node.rows == 1 || node.chunk == 0) {
        dispatch("delta_rule", {&arena, &recurrent}, push.first(11),
                 h.n_v_heads * ((h.v_dim + kWorkgroup - 1) / kWorkgroup));
        return updated(recurrent_state, recurrent);
      }
      // Prefill: the chunked form (delta_chunk.comp), its intermediates in scratch.
      const VulkanBuffer& work =
          scratch(delta_scratch_, delta_scratch_floats(node) * sizeof(float));
      const int64_t chunks = (node.rows + delta_chunk(node) - 1) / delta_chunk(node);
      dispatch("delta_chunk_prepare", {&arena, &recurrent, &work}, push, h.n_v_heads * chunks);
      dispatch("delta_chunk_state", {&arena, &recurrent, &work}, push,
               h.n_v_heads * ((h.v_dim + kDeltaColumns - 1) / kDeltaColumns));
      dispatch("delta_chunk_output", {&arena, &recurrent, &work}, push, h.n_v_heads * chunks);
      return updated(recurrent_state, recurrent);
    }
    case Op::kCopy: {
      const TensorRef &from = args.values[node.in[0].value], &to = args.values[node.out.value];
      const size_t row_bytes = cols(node.out) * sizeof(float);
      const size_t from_offset = from.offset + node.in[0].row * row_bytes;
      const size_t to_offset = to.offset + node.out.row * row_bytes;
      if (const VulkanBuffer* source = as_vulkan(from.buffer, *device_)) {
        return copy(*source, from_offset, arena, to_offset, node.rows * row_bytes);
      }
      // From the host: recorded work may still use that part of the arena.
      synchronize();
      return copy_bytes(*from.buffer, from_offset, *to.buffer, to_offset, node.rows * row_bytes);
    }
    case Op::kLayerNorm:  // not supported(): never placed here
    case Op::kAddBias:
    case Op::kGelu:
    case Op::kGeluTanh:
    case Op::kBidirectionalAttention:
      break;
  }
  fail("vulkan backend", std::string("no implementation of ") + op_name(node.op));
}

int VulkanBackend::profiled_op(const std::string& op, const std::string& weights, int64_t rows) {
  std::vector<OpTime>& ops = profile_.ops;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].op == op && ops[i].weights == weights && ops[i].rows == rows) {
      return static_cast<int>(i);
    }
  }
  OpTime& added = ops.emplace_back();
  added.op = op;
  added.weights = weights;
  added.rows = rows;
  return static_cast<int>(ops.size() - 1);
}

std::string VulkanBackend::arithmetic(const std::string& shader) const {
  if (shader == "copy" || shader.starts_with("peak_")) return "";
  if (shader.ends_with("_coopmat")) {
    return shader.starts_with("matmul_q8_") ? "int8 matrix" : "f16 matrix";
  }
  if (shader.ends_with("_dot")) return "int8 dot";
  return "fp32 FMA";  // the shader ALU's rate: float and integer scalar work alike
}

DeviceProfile VulkanBackend::take_profile() {
  synchronize();
  DeviceProfile taken = std::move(profile_);
  profile_ = {};
  return taken;
}

double VulkanBackend::time_alone(const char* shader, std::initializer_list<Binding> buffers,
                                 std::initializer_list<uint32_t> push, uint64_t groups) {
  synchronize();
  dispatch(shader, buffers, push, groups);
  synchronize();
  return last_intervals_.empty() ? 0.0 : last_intervals_.back();
}

DevicePeaks VulkanBackend::measure_peaks() {
  if (!options_.profile) fail(name(), "opened without profiling: it measures no peaks");
  const VulkanDeviceInfo& info = device_->info();
  DevicePeaks peaks;
  constexpr uint64_t kOutWords = uint64_t{1} << 20;  // results, overwritten: kept so they count
  const std::unique_ptr<Buffer> out = device_memory_.allocate(kOutWords * sizeof(uint32_t));
  const auto* results = as_device(out);
  // Bandwidth: a buffer far past any cache, read whole by every thread's share of it.
  {
    const uint64_t bytes = std::min<uint64_t>({uint64_t{256} << 20, range_bytes() / 16 * 16,
                                               std::max<uint64_t>(info.memory_bytes / 8, 1 << 20)});
    const std::unique_ptr<Buffer> data = device_memory_.allocate(bytes);
    const uint32_t vectors = u32(static_cast<int64_t>(bytes / 16));
    const uint64_t groups = std::max<uint64_t>(vectors / (kWorkgroup * 16), 1);
    double best = 0;
    for (int pass = 0; pass < 6; ++pass) {  // the first warms the caches of the pipeline
      const double t = time_alone("peak_read", {as_device(data), results},
                                  {vectors, u32(kOutWords - 1)}, groups);
      if (pass > 0 && t > 0) best = best == 0 ? t : std::min(best, t);
    }
    peaks.read_bytes_per_s = best > 0 ? static_cast<double>(bytes) / best : 0.0;
  }
  // Arithmetic: each thread runs a fixed loop of independent chains; the grid doubles until one
  // dispatch takes 2 ms, then the best of three at that size.
  const auto rate = [&](const char* shader, double ops_per_group) {
    constexpr uint64_t kMaxGroups = uint64_t{1} << 20;
    uint64_t groups = 16;
    double t = 0;
    for (;;) {
      t = time_alone(shader, {results, results}, {u32(kOutWords - 1)}, groups);
      if (t >= 2e-3 || groups >= kMaxGroups) break;
      groups *= 2;
    }
    for (int pass = 0; pass < 3; ++pass) {
      const double again = time_alone(shader, {results, results}, {u32(kOutWords - 1)}, groups);
      if (again > 0) t = std::min(t, again);
    }
    return t > 0 ? ops_per_group * static_cast<double>(grid_of(groups).groups()) / t : 0.0;
  };
  // (peak.comp: its loops' operations per workgroup)
  constexpr double kThreads = kWorkgroup, kLoops = 1024;
  peaks.ops_per_s["fp32 FMA"] = rate("peak_fma", kThreads * kLoops * 8 * 4 * 2);
  if (int8_dot_) peaks.ops_per_s["int8 dot"] = rate("peak_dot", kThreads * kLoops * 8 * 8);
  // A subgroup's loop: kMatrixLoops products of 4 accumulators, M·N·K multiply-adds each.
  constexpr double kMatrixLoops = 256;
  const auto matrix_ops = [&](const VulkanDeviceInfo::MatrixShape& m) {
    const double subgroups = kThreads / std::max<uint32_t>(info.subgroup_size, 1);
    return subgroups * kMatrixLoops * 4 * 2.0 * m.m * m.n * m.k;
  };
  if (int8_matrices_) {
    peaks.ops_per_s["int8 matrix"] = rate("peak_int8_matrix", matrix_ops(info.int8_matrix));
  }
  if (f16_matrices_) {
    peaks.ops_per_s["f16 matrix"] = rate("peak_f16_matrix", matrix_ops(info.f16_matrix));
  }
  return peaks;
}

}  // namespace qhx
