// The Vulkan backend: every op kind of the plan (graph/plan.h) as compute shaders on one device.
// Weights are read in place from their mapped files where the device shares the host's memory
// and imports it, else uploaded once to device memory, when the model loads (prepare_weights:
// matrices, the embedding when it decodes, the norm, conv and gate vectors; kept by weight id,
// nodes of weights it does not hold left to the CPU), activations live in a device arena, and the
// states of the sequences it shares with the CPU in host-visible memory both address (computed in
// device-local copies when a discrete GPU decodes: private_states). Nodes are recorded into one
// command buffer and submitted when the CPU needs their results (synchronize), so a run of device
// nodes costs one submission.
//
// Placement: it claims the nodes of prompt-sized work (at least min_prompt_rows rows) and, with
// `decode`, single-token steps too; the embedding lookup stays on the CPU unless decoding here.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_buffer.h"
#include "backend/vulkan/vulkan_device.h"
#include "graph/backend.h"

namespace qhx {

struct VulkanBackendOptions {
  bool decode = false;          // single-token steps run here too (else on the CPU)
  int64_t min_prompt_rows = 2;  // the rows from which a node counts as prompt work
  uint64_t fence_timeout_ms = 120000;
  // Test switches (docs/vulkan.md; QHX_VULKAN_FAIL_SUBMISSION and QHX_VULKAN_PERTURB set them
  // from the environment): the N-th submission fails as a lost device would (0: none), and the
  // output of every node of one op kind (op_name, e.g. "silu_mul") is perturbed ("": none).
  int64_t fail_submission = 0;
  std::string perturb_op;
  // Test switch (QHX_VULKAN_FAIL_ALLOCATION): the N-th allocation of device memory fails as a
  // device out of memory would (0: none).
  int64_t fail_allocation = 0;
  // Only the portable shaders (Vulkan 1.1 storage buffers, shared-memory reductions), not the
  // faster variants the device supports (subgroup reductions, int8 dot products, cooperative
  // matrices):
  // QHX_VULKAN_PORTABLE=1, for a driver whose fast paths misbehave, and the tests of both.
  bool portable = false;
  // Test switch: weight matrices and KV caches are bound in parts of at most this many bytes, as
  // on a device whose maxStorageBufferRange is that small (0: the device's range).
  uint64_t max_binding_bytes = 0;
  // Test switch: windows of buffers start on multiples of this many bytes (a power of two), as on
  // a device whose minStorageBufferOffsetAlignment is that large (0: the device's).
  uint64_t offset_alignment = 0;
  // A mapped weight file's matrices are used in place where the device shares the host's memory
  // and can import it (VK_EXT_external_memory_host), else uploaded. false: always uploaded
  // (QHX_VULKAN_UPLOAD_WEIGHTS=1, for a driver whose import misbehaves).
  bool weights_in_place = true;
  // When it decodes, the states of its sequences (KV caches, conv and recurrent states) are
  // computed in device-local copies it keeps equal to them (StateBuffer::shadow): a discrete GPU
  // does (it would read host memory over PCIe); true makes any device do it
  // (QHX_VULKAN_PRIVATE_STATES=1, the tests of that path on lavapipe).
  bool private_states = false;
  // A timestamp after every command it records (qhx bench --profile): the device's time per op
  // kind, weight type and kernel (take_profile), and the device's peaks (measure_peaks).
  bool profile = false;
};

class VulkanBackend final : public Backend {
 public:
  VulkanBackend(std::shared_ptr<VulkanDevice> device, VulkanBackendOptions options = {});
  ~VulkanBackend() override;

  std::string name() const override;
  const BufferType& buffer_type() const override { return device_memory_; }
  const BufferType& state_buffer_type() const override { return shared_memory_; }
  void prepare_weights(const WeightList& weights) override;
  void release_weights(const WeightList& weights) override;
  bool supports(const Node& node) const override;
  bool claims(const Node& node) const override;
  Buffer& arena(size_t bytes) override;
  int64_t max_arena_span_bytes(const Node& node) const override;
  void run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) override;
  void synchronize() override;
  bool keep_states(bool keep) override;
  void write_back_states(std::span<const StateBuffer* const> states) override;
  int64_t submissions() const { return submissions_; }  // command buffers submitted so far
  // Allocations of device memory attempted so far (the fail_allocation switch counts them).
  int64_t device_allocations() const { return device_memory_.allocations(); }
  WeightMemory weight_memory() const override;
  bool profiles() const override { return options_.profile; }
  DeviceProfile take_profile() override;
  DevicePeaks measure_peaks() override;

 private:
  // A weight matrix on the device in parts of whole rows, each within one storage-buffer binding
  // (an embedding or lm-head can exceed maxStorageBufferRange).
  struct MatrixPart {
    int64_t first_row = 0, rows = 0;
    std::unique_ptr<Buffer> data, scales;  // scales: W8/W4 only
    // Where in them the part begins, in words: 0 for a copy; in place, where its file has it.
    uint32_t data_word = 0, scales_word = 0;
  };
  struct DeviceMatrix {
    const void* data = nullptr;  // the host data it holds (matrices sharing it share it)
    std::vector<MatrixPart> parts;
    WeightMemory memory;  // what its parts take
  };
  // What one storage-buffer binding of a dispatch spans: a whole buffer, or `bytes` of it from
  // `offset` (a window of a buffer larger than one binding may span).
  struct Binding {
    Binding(const VulkanBuffer* b) : buffer(b) {}  // NOLINT: a whole buffer binds as itself
    Binding(const VulkanBuffer* b, size_t offset, size_t bytes)
        : buffer(b), offset(offset), bytes(bytes) {}
    const VulkanBuffer* buffer;
    size_t offset = 0;
    size_t bytes = VK_WHOLE_SIZE;
  };

  bool supports_matrix(const MatrixRef& m) const;
  uint64_t range_bytes() const;    // maxStorageBufferRange in whole words
  uint64_t binding_bytes() const;  // the most one part of a matrix or KV cache may span
  void record_attention(const Node& node, const NodeArgs& args, uint32_t q, uint32_t out);
  void record_matmul(const Node& node, const NodeArgs& args);
  uint64_t max_window_bytes() const;  // what one window of a buffer may span past its first byte
  uint64_t offset_alignment() const;  // of a window's start: the device's, or the test switch's
  // A window of the arena over [byte, byte + bytes), from the alignment below it; `lead` gets
  // the elements before `byte`.
  Binding arena_rows(size_t byte, size_t bytes, uint32_t& lead) const;
  // The variant of a shader this backend runs: `name` or a faster one the device supports.
  std::string shader(const char* name) const;
  // Runs `work`, which records or submits commands: on an error what was recorded is dropped
  // (abandon), and memory running out is the device's failure (kDeviceFailed: the CPU redoes it).
  void abandoning_on_failure(const std::function<void()>& work);
  void record_nodes(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args);
  void grow_caches(std::span<const Node> nodes, const NodeArgs& args);
  void record(const Plan& plan, const Node& node, const NodeArgs& args);
  void set_arena_window(const Plan& plan, const Node& node, const NodeArgs& args);
  void upload_weights(const WeightList& weights);  // prepare_weights' work
  // Whether prepare_weights gave it the node's weights.
  bool holds_weights(const Node& node) const;
  const DeviceMatrix& matrix(const MatrixRef& m) const;
  std::shared_ptr<const DeviceMatrix> upload_matrix(const MatrixRef& m);
  // The device's import of the mapped file `m` lies in, when its parts are used in place.
  std::shared_ptr<const VulkanHostImport> weight_file(const MatrixRef& m);
  // A weight vector's copy, of at least `floats` elements.
  const VulkanBuffer& vector(const WeightVector& v, int64_t floats) const;
  // Where an operand's first row lies in the arena: in bytes from its start (copies, windows
  // of their own), and in elements from the node's window (shaders).
  size_t byte_at(const NodeArgs& args, const Operand& o) const;
  uint32_t element_at(const NodeArgs& args, const Operand& o) const;
  const VulkanBuffer& state(const StateBuffer& s, const char* what, int layer) const;
  // The buffer a node computes the state in: its own, or with private states its shadow (made
  // or grown from what it holds, recorded before the node).
  const VulkanBuffer& working_state(const StateBuffer& s, const char* what, int layer);
  // A conv or recurrent state's working buffer: with kept states (keep_states) always its
  // shadow, else as working_state.
  const VulkanBuffer& whole_state(const StateBuffer& s, const char* what, int layer);
  // After a node wrote [offset, offset + bytes) of `working`: the state's own memory made equal
  // to it there again (nothing when they are one).
  void mirror(const StateBuffer& s, const VulkanBuffer& working, size_t offset, size_t bytes);
  // After a node updated a whole conv or recurrent state in `working`: kept there (its own
  // memory marked behind), or mirrored.
  void updated(const StateBuffer& s, const VulkanBuffer& working);
  // Bytes to the upload ring (valid until the next submission); returns their element offset.
  uint32_t upload(const void* bytes, size_t n);
  const VulkanBuffer* ring() const { return static_cast<const VulkanBuffer*>(ring_.get()); }
  const VulkanBuffer& scratch(std::unique_ptr<Buffer>& buffer, size_t bytes);

  // Profiling: the entry of the ops its next commands run for (found or added), a timestamp
  // after the command just recorded, and the device time of one dispatch measured alone.
  int profiled_op(const std::string& op, const std::string& weights, int64_t rows);
  void timestamp(const std::string& kernel);
  double time_alone(const char* shader, std::initializer_list<Binding> buffers,
                    std::initializer_list<uint32_t> push, uint64_t groups);
  // What `shader` (a name as dispatched) computes with, as DevicePeaks names it; "" nothing.
  std::string arithmetic(const std::string& shader) const;
  // Room in this submission for one more command (its descriptor set, its timestamp), else the
  // submission is made now.
  void make_room();

  void begin();  // a command buffer to record into, if none is open
  void dispatch(const char* shader, std::initializer_list<Binding> buffers,
                std::span<const uint32_t> push, uint64_t groups, uint32_t z = 1);
  void dispatch(const char* shader, std::initializer_list<Binding> buffers,
                std::initializer_list<uint32_t> push, uint64_t groups, uint32_t z = 1) {
    dispatch(shader, buffers, std::span(push.begin(), push.size()), groups, z);
  }
  void copy(const VulkanBuffer& from, size_t from_offset, const VulkanBuffer& to, size_t to_offset,
            size_t bytes);
  void barrier();
  void abandon();  // drops what was recorded (after an error)
  // Submits what was recorded and waits for it; synchronize also frees what that work read (the
  // upload ring, retired shadows), which a submission in the middle of a node (make_room) must
  // not: the node's later commands may read them.
  void submit_recorded();
  void read_timestamps();  // of the submission just waited for, into profile_

  std::shared_ptr<VulkanDevice> device_;
  VulkanBackendOptions options_;
  // The faster variants in use.
  bool subgroup_reductions_ = false, int8_dot_ = false;
  bool int8_matrices_ = false, f16_matrices_ = false;  // matmul_coopmat.comp's two forms
  bool private_states_ = false;
  bool keep_states_ = false;            // conv and recurrent states stay in their shadows
  std::unique_ptr<Buffer> write_back_;  // host-visible: kept states pass through it to the host
  VulkanBufferType device_memory_, shared_memory_;
  std::unique_ptr<Buffer> arena_;
  // Where the window of the arena that the node being recorded binds begins (bytes): an arena
  // may be larger than one binding, one node's operands are not (max_arena_span_bytes).
  size_t arena_window_ = 0;
  std::unique_ptr<Buffer> ring_;  // host-visible: token ids, RoPE tables
  size_t ring_used_ = 0;
  // A matmul's activations as its shader reads them: int8 (quantize_q8) or f16 parts (split_f16),
  // and their scales.
  std::unique_ptr<Buffer> quantized_, scales_;
  std::unique_ptr<Buffer> delta_scratch_;       // the chunked delta rule's intermediates
  std::unique_ptr<Buffer> attention_partials_;  // split-key attention's per-split results
  std::map<int64_t, std::shared_ptr<const DeviceMatrix>> matrices_;  // by weight id
  // Weight files imported for use in place, by their buffer (null: the import failed).
  std::map<const Buffer*, std::shared_ptr<const VulkanHostImport>> imports_;
  std::map<int64_t, std::unique_ptr<Buffer>> vectors_;  // by weight id
  std::vector<float> rope_table_;  // a RoPE node's cos and sin, before they are uploaded
  std::vector<std::unique_ptr<Buffer>> retired_;  // replaced shadows recorded work still reads
  std::vector<const StateBuffer*> shadowed_;      // states computed in shadows since the last wait

  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer commands_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkDescriptorPool descriptors_ = VK_NULL_HANDLE;
  uint32_t sets_left_ = 0;
  bool recording_ = false;
  int64_t submissions_ = 0;  // so far: the fault-injection switch counts them

  // Profiling: timestamp 0 at the start of the command buffer, timestamp i + 1 after its
  // command i, which ran for timed_[i] (an entry of profile_.ops, -1: none).
  struct TimedCommand {
    int op;
    std::string kernel;
  };
  VkQueryPool timestamps_ = VK_NULL_HANDLE;
  uint32_t timestamps_used_ = 0;
  std::vector<TimedCommand> timed_;
  int profiled_op_ = -1;
  DeviceProfile profile_;               // since take_profile
  std::vector<double> last_intervals_;  // of the last submission, in seconds
};

}  // namespace qhx
