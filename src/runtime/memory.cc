#include "runtime/memory.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "util/error.h"

namespace qhx {
namespace {

constexpr int64_t kFloat = sizeof(float);
constexpr int64_t kShortestContext = 256;  // below this, refusing is clearer than shrinking

std::string gigabytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GB", static_cast<double>(bytes) / 1e9);
  return text;
}

int64_t attention_layers(const ModelConfig& c) {
  return std::count(c.layer_types.begin(), c.layer_types.end(), LayerKind::kFullAttention);
}

int64_t linear_layers(const ModelConfig& c) {
  return static_cast<int64_t>(c.layer_types.size()) - attention_layers(c);
}

// One session's conv + recurrent state (Gated DeltaNet layers).
int64_t recurrent_bytes(const ModelConfig& c) {
  const int64_t kd = c.linear_num_key_heads * c.linear_key_head_dim;
  const int64_t vd = c.linear_num_value_heads * c.linear_value_head_dim;
  const int64_t conv = (c.linear_conv_kernel_dim - 1) * (2 * kd + vd);
  const int64_t recurrent =
      c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  return linear_layers(c) * (conv + recurrent) * kFloat;
}

int64_t read_cgroup_value(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

int64_t MemoryPlan::total() const {
  return weights + kv_cache + recurrent + checkpoints + scratch + prefix_cache + resident;
}

std::string MemoryPlan::describe() const {
  std::string text = gigabytes(weights) + " weights + " + gigabytes(kv_cache) + " KV cache";
  if (recurrent > 0) text += " + " + gigabytes(recurrent) + " recurrent state";
  if (checkpoints > 0) text += " + " + gigabytes(checkpoints) + " turn checkpoints";
  text += " + " + gigabytes(scratch) + " scratch";
  if (prefix_cache > 0) text += " + " + gigabytes(prefix_cache) + " prefix cache";
  if (resident > 0) text += " + " + gigabytes(resident) + " process and tokenizer";
  return text + " = " + gigabytes(total());
}

MemoryPlan plan_memory(const ModelConfig& c, const MemoryRequest& r) {
  MemoryPlan plan;
  plan.weights = r.weights_bytes;
  const int64_t kv_per_token =
      attention_layers(c) * 2 * c.num_kv_heads * kv_head_floats(r.kv_type, c.head_dim) * kFloat;
  plan.kv_cache = r.sessions * r.context_length * kv_per_token;
  plan.recurrent = r.sessions * recurrent_bytes(c);
  plan.checkpoints = r.sessions * r.max_checkpoints * (recurrent_bytes(c) + c.vocab_size * kFloat);
  plan.scratch = r.activation_bytes + r.sessions * c.vocab_size * kFloat;
  // The cache copies a prompt's state before it evicts for it: one state over the bound.
  plan.prefix_cache =
      r.prefix_cache_bytes > 0
          ? r.prefix_cache_bytes + r.context_length * kv_per_token + recurrent_bytes(c)
          : 0;
  plan.resident = r.resident_bytes;
  return plan;
}

int64_t available_memory_bytes() {
  int64_t available = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") available = kib * 1024;
  }
  const int64_t limit = read_cgroup_value("/sys/fs/cgroup/memory.max");
  const int64_t used = read_cgroup_value("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0) {
    const int64_t room = std::max<int64_t>(limit - used, 0);
    available = available < 0 ? room : std::min(available, room);
  }
  if (available < 0) fail("memory", "cannot read the available memory from /proc/meminfo");
  return available;
}

int64_t resident_memory_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, pages = 0;
  if (!(statm >> size >> pages)) return 0;
  return pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t admit_context(const ModelConfig& config, MemoryRequest request, int64_t requested,
                      int64_t available, std::string* note) {
  const int64_t model_max = config.max_position_embeddings;
  if (requested < 0) fail("context", "must be >= 0");
  if (requested > model_max) {
    fail("context", std::to_string(requested) + " tokens exceed the model's " +
                        std::to_string(model_max) + " (max_position_embeddings)");
  }
  const auto needs = [&](int64_t context) {
    request.context_length = context;
    return plan_memory(config, request);
  };
  const int64_t wanted = requested > 0 ? requested : model_max;
  // What is resident already is not in `available`.
  const auto fits = [&](const MemoryPlan& p) { return p.total() - p.resident <= available; };
  const MemoryPlan plan = needs(wanted);
  if (fits(plan)) return wanted;

  // The longest context that fits (the estimate grows with the context).
  int64_t lo = 0, hi = wanted;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (fits(needs(mid))) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const std::string estimate = std::to_string(wanted) + " tokens × " +
                               std::to_string(request.sessions) + " session(s) needs " +
                               plan.describe() + ", but " + gigabytes(available) + " is available";
  if (lo < std::min<int64_t>(kShortestContext, wanted)) {
    fail("memory", "the model does not fit: a context of " + estimate, ErrorKind::kOutOfMemory);
  }
  if (requested > 0) {
    fail("memory",
         "a context of " + estimate + "; a context of " + std::to_string(lo) + " tokens fits",
         ErrorKind::kOutOfMemory);
  }
  if (note != nullptr) {
    *note = "context lowered to " + std::to_string(lo) + " tokens to fit in memory (the model's " +
            estimate + ")";
  }
  return lo;
}

}  // namespace qhx
