// Every op kind of the plan, on every compiled backend, against its ref:: definition (the CPU
// backend on reference kernels), over the shapes of every model fixture: the suite a new backend
// must pass first. Also: fusion and thread counts change no bit, and the scheduler's placement,
// fallback and copies with a backend that runs a subset of the ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/devices.h"
#include "graph/schedule.h"
#include "io/hf_config.h"
#include "kernels/kernels.h"
#include "models/model.h"
#include "support/fixtures.h"
#include "support/subset_backend.h"
#include "support/test_matrix.h"
#include "support/vulkan_device.h"
#include "util/error.h"

#if QHX_HAVE_VULKAN
#include "backend/vulkan/vulkan_shaders.h"
#endif

namespace qhx {
namespace {

namespace fs = std::filesystem;
using test::random_vector;

// The memory the cases' states start in (the CPU backend's kind).
const HostBufferType kHostMemory;

StateBuffer host_state(const std::vector<float>& values) {
  StateBuffer state(kHostMemory);
  state.assign(values);
  return state;
}

// Runs the schedule with its one output (binding 0) bound to `out`.
void execute_into(Schedule& s, std::span<Backend* const> backends, std::span<const int32_t> ids,
                  std::vector<float>& out) {
  BorrowedBuffer memory(BufferKind::kHost, out.data(), out.size() * sizeof(float),
                        BorrowedBuffer::kWritable);
  Buffer* const bound[] = {&memory};
  execute(s, backends, {.ids = ids, .external = bound});
}

// The message of the Error f throws, or "" when it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One plan to run on each backend from the same inputs and state.
struct OpCase {
  OpCase() = default;
  OpCase(const OpCase&) = delete;  // its nodes and weight list point into its weights
  OpCase& operator=(const OpCase&) = delete;

  std::string name;
  Plan plan;
  std::vector<LayerState> layers;
  std::vector<int32_t> ids;
  int64_t first_pos = 0;
  std::vector<int32_t> positions;    // M-RoPE positions, [3, rows]
  std::vector<int8_t> rope_axes;     // what a kRope node's rope_axes point into
  std::deque<WeightVector> vectors;  // weights the nodes point into
  std::deque<test::TestMatrix> matrices;
  WeightList weights;  // the two above, numbered as a model's are (a device prepares them)
  std::map<int, std::vector<float>> inputs;  // values' contents by id (others: random)

  const WeightVector* vector(int64_t n, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
    WeightVector& v = vectors.emplace_back(random_vector(n, seed, scale));
    for (float& x : v.values) x += offset;
    weights.vectors.push_back(&v);
    number_weights(weights);
    return &v;
  }
  const MatrixRef* matrix(DType dtype, int64_t rows, int64_t cols, uint32_t seed,
                          Activations activations = Activations::kF32) {
    int64_t group = 0;  // W4: the largest groups that divide the columns
    if (dtype == DType::kW4) {
      for (group = 64; cols % group != 0;) group /= 2;
    }
    return matrix_of(random_vector(rows * cols, seed, 0.1f), dtype, rows, cols, group, activations);
  }
  const MatrixRef* matrix_of(const std::vector<float>& values, DType dtype, int64_t rows,
                             int64_t cols, int64_t group = 0,
                             Activations activations = Activations::kF32) {
    MatrixRef& m = matrices.emplace_back(dtype, values, rows, cols, group, activations).ref;
    weights.matrices.push_back(&m);
    number_weights(weights);
    return &m;
  }
  Node& node(Op op, int64_t rows) {
    Node& n = plan.add(op);
    n.rows = rows;
    return n;
  }
};

struct Outcome {
  std::vector<std::vector<float>> values;  // by the schedule's value ids
  std::vector<LayerState> layers;
};

// The case's states in the memory of the backend's sequences.
std::vector<LayerState> states_for(const std::vector<LayerState>& layers, const Backend& backend) {
  std::vector<LayerState> out = layers;
  const BufferType& memory = backend.state_buffer_type();
  for (LayerState& l : out) {
    for (StateBuffer* s : {&l.keys, &l.values, &l.conv, &l.recurrent}) {
      StateBuffer moved(memory);
      moved.assign(s->to_vector());
      *s = std::move(moved);
    }
  }
  return out;
}

// A case's weights prepared on a device (Backend::prepare_weights) while this lives.
class PreparedWeights {
 public:
  PreparedWeights(Backend& backend, const WeightList& weights)
      : backend_(backend), weights_(weights) {
    backend_.prepare_weights(weights_);
  }
  ~PreparedWeights() {
    try {
      backend_.release_weights(weights_);
    } catch (const Error& e) {
      ADD_FAILURE() << "releasing a case's weights: " << e.what();
    }
  }
  PreparedWeights(const PreparedWeights&) = delete;
  PreparedWeights& operator=(const PreparedWeights&) = delete;

 private:
  Backend& backend_;
  const WeightList& weights_;
};

Outcome run_on(const OpCase& c, Backend& backend) {
  Backend* const backends[] = {&backend};
  Schedule s = schedule(c.plan, backends);
  // Every value in memory of its own, so that each input and output can be set and read back (the
  // scheduler would let values whose lifetimes do not overlap share).
  int64_t floats = 0;
  for (Value& value : s.plan.values) {
    value.offset = floats;
    floats += value.floats();
  }
  s.arena_floats[0] = floats;
  Buffer& arena = backend.arena(floats * sizeof(float));
  for (size_t v = 0; v < s.plan.values.size(); ++v) {
    const Value& value = s.plan.values[v];
    const auto given = c.inputs.find(static_cast<int>(v));
    const std::vector<float> init =
        given != c.inputs.end() ? given->second : random_vector(value.floats(), 1000 + v, 0.5f);
    arena.write(value.offset * sizeof(float), init.data(), init.size() * sizeof(float));
  }
  Outcome out;
  out.layers = states_for(c.layers, backend);
  execute(s, backends,
          {.ids = c.ids, .first_pos = c.first_pos, .positions = c.positions, .layers = out.layers});
  for (const Value& value : s.plan.values) {
    std::vector<float>& got = out.values.emplace_back(value.floats());
    arena.read(value.offset * sizeof(float), got.data(), got.size() * sizeof(float));
  }
  return out;
}

// |got − want| ≤ tolerance · max|want| + 1e-6, element by element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what, float tolerance = 1e-4f) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float scale = 0.0f;
  for (const float w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * scale + 1e-6f) << what << " at " << i;
  }
}

void expect_close(const Outcome& got, const Outcome& want, const std::string& what,
                  float tolerance = 1e-4f) {
  ASSERT_EQ(got.values.size(), want.values.size()) << what;
  for (size_t v = 0; v < got.values.size(); ++v) {
    expect_close(got.values[v], want.values[v], what + ", value " + std::to_string(v), tolerance);
  }
  for (size_t l = 0; l < got.layers.size(); ++l) {
    const std::string layer = what + ", layer " + std::to_string(l);
    const LayerState &g = got.layers[l], &w = want.layers[l];
    expect_close(g.keys.to_vector(), w.keys.to_vector(), layer + " keys", tolerance);
    expect_close(g.values.to_vector(), w.values.to_vector(), layer + " values", tolerance);
    expect_close(g.conv.to_vector(), w.conv.to_vector(), layer + " conv", tolerance);
    expect_close(g.recurrent.to_vector(), w.recurrent.to_vector(), layer + " recurrent", tolerance);
  }
}

bool same_bits(const Outcome& a, const Outcome& b) {
  if (a.values != b.values || a.layers.size() != b.layers.size()) return false;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerState &x = a.layers[l], &y = b.layers[l];
    if (x.keys.to_vector() != y.keys.to_vector() || x.values.to_vector() != y.values.to_vector() ||
        x.conv.to_vector() != y.conv.to_vector() ||
        x.recurrent.to_vector() != y.recurrent.to_vector()) {
      return false;
    }
  }
  return true;
}

// The weight types and activations of the matmul cases.
const std::pair<DType, Activations> kMatrixTypes[] = {
    {DType::kF32, Activations::kF32}, {DType::kBF16, Activations::kF32},
    {DType::kF16, Activations::kF32}, {DType::kW8, Activations::kF32},
    {DType::kW8, Activations::kInt8}, {DType::kW4, Activations::kF32},
    {DType::kW4, Activations::kInt8}};
constexpr int64_t kPromptRows = 70;

std::string matmul_name(DType dtype, Activations activations) {
  return "matmul " + std::string(dtype_name(dtype)) +
         (activations == Activations::kInt8 ? " int8" : "");
}

// A rows × cols matmul of n tokens.
void add_matmul(OpCase& k, int64_t n, DType dtype, Activations activations, int64_t rows,
                int64_t cols) {
  Node& m = k.node(Op::kMatmul, n);
  m.in[0] = {k.plan.add_value(n, cols)};
  m.out = {k.plan.add_value(n, rows)};
  m.matrix = k.matrix(dtype, rows, cols, 4, activations);
}

// The cases for one model configuration, each op at rows 1 (decode) and 5 (a prompt; the delta
// rule a whole chunk and 5 more, so that a chunk boundary is crossed), and the matmuls at
// kPromptRows too. A deque: the nodes point into their case, which must not move.
// (Or at other row counts: a device whose graphs have a static shape.)
std::deque<OpCase> cases_for(const ModelConfig& c, const std::vector<int64_t>& row_counts = {1, 5},
                             int64_t prompt_rows = kPromptRows) {
  std::deque<OpCase> cases;
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  const AttentionShape shape{c.num_heads, c.num_kv_heads, hd};
  const bool linear = c.linear_num_value_heads > 0;
  const DeltaRuleShape heads{
      linear ? c.linear_num_key_heads : 2, linear ? c.linear_num_value_heads : 4,
      linear ? c.linear_key_head_dim : 16, linear ? c.linear_value_head_dim : 16};
  const int64_t kd = heads.n_k_heads * heads.k_dim, vd = heads.n_v_heads * heads.v_dim;
  const int64_t channels = 2 * kd + vd, kernel = 4;
  const int64_t rotary = c.rotary_dim > 0 ? c.rotary_dim : hd;
  const auto add = [&](const std::string& name, int64_t rows,
                       const std::function<void(OpCase&, int64_t)>& build) {
    OpCase& k = cases.emplace_back();
    k.name = name + " rows " + std::to_string(rows);
    k.plan.n_tokens = rows;
    build(k, rows);
  };
  for (const int64_t rows : row_counts) {
    add("embed", rows, [&](OpCase& k, int64_t n) {
      const int64_t vocab = std::min<int64_t>(c.vocab_size, 512);
      Node& e = k.node(Op::kEmbed, n);
      e.matrix = k.matrix(DType::kBF16, vocab, H, 1);
      e.out = {k.plan.add_value(n, H)};
      for (int64_t t = 0; t < n; ++t) k.ids.push_back(static_cast<int32_t>((t * 97 + 3) % vocab));
    });
    for (const int64_t width : {H, hd}) {
      if (rows * H % width != 0) continue;  // norms of whole groups of `width` elements
      add("rms_norm " + std::to_string(width), rows, [&](OpCase& k, int64_t n) {
        Node& r = k.node(Op::kRmsNorm, n);
        r.in[0] = {k.plan.add_value(n, H)};
        r.out = {k.plan.add_value(n, H)};
        r.width = width;
        r.vector = k.vector(width, 2, 0.5f, 1.0f);
        r.eps = 1e-6f;
      });
    }
    add("add", rows, [&](OpCase& k, int64_t n) {
      Node& a = k.node(Op::kAdd, n);
      a.in[0] = {k.plan.add_value(n, H)};
      a.out = {k.plan.add_value(n, H)};
    });
    add("add + rms_norm", rows, [&](OpCase& k, int64_t n) {
      const ValueId h = k.plan.add_value(n, H);
      Node& a = k.node(Op::kAdd, n);
      a.in[0] = {k.plan.add_value(n, H)};
      a.out = {h};
      Node& r = k.node(Op::kRmsNorm, n);
      r.in[0] = {h};
      r.out = {k.plan.add_value(n, H)};
      r.width = H;
      r.vector = k.vector(H, 3, 0.5f, 1.0f);
      r.eps = 1e-6f;
    });
    for (const auto& pair : kMatrixTypes) {
      const DType dtype = pair.first;  // named: lambdas may not capture structured bindings
      const Activations activations = pair.second;
      const std::string name = matmul_name(dtype, activations);
      add(name, rows, [&](OpCase& k, int64_t n) { add_matmul(k, n, dtype, activations, I, H); });
      add(name + " x3 of one input", rows, [&](OpCase& k, int64_t n) {
        const ValueId x = k.plan.add_value(n, H);
        for (const int64_t out : {q_width, kv_width, kv_width}) {
          Node& m = k.node(Op::kMatmul, n);
          m.in[0] = {x};
          m.out = {k.plan.add_value(n, out)};
          m.matrix = k.matrix(dtype, out, H, 5 + static_cast<uint32_t>(out), activations);
        }
      });
    }
    add("copy_columns", rows, [&](OpCase& k, int64_t n) {
      Node& p = k.node(Op::kCopyColumns, n);
      p.in[0] = {k.plan.add_value(n, channels)};
      p.out = {k.plan.add_value(n, kd)};
      p.offset = kd;
    });
    add("split_heads", rows, [&](OpCase& k, int64_t n) {
      Node& s = k.node(Op::kSplitHeads, n);
      s.in[0] = {k.plan.add_value(n, 2 * q_width)};
      s.out = {k.plan.add_value(n, q_width)};
      s.out2 = {k.plan.add_value(n, q_width)};
      s.width = hd;
    });
    add("rope", rows, [&](OpCase& k, int64_t n) {
      k.first_pos = 7;
      Node& r = k.node(Op::kRope, n);
      r.out = {k.plan.add_value(n, q_width)};
      r.width = hd;
      r.rotary_dim = rotary;
      r.vector = k.vector(rotary / 2, 6, 0.5f, 0.5f);
    });
    add("rope, M-RoPE axes", rows, [&](OpCase& k, int64_t n) {
      k.first_pos = 9;  // not read: the rows have positions of their own
      for (int64_t i = 0; i < rotary / 2; ++i) k.rope_axes.push_back(static_cast<int8_t>(i % 3));
      for (int64_t axis = 0; axis < 3; ++axis) {
        for (int64_t t = 0; t < n; ++t)
          k.positions.push_back(static_cast<int32_t>(5 + 3 * t + axis * (t % 4)));
      }
      Node& r = k.node(Op::kRope, n);
      r.out = {k.plan.add_value(n, q_width)};
      r.width = hd;
      r.rotary_dim = rotary;
      r.rope_axes = k.rope_axes.data();
      r.vector = k.vector(rotary / 2, 6, 0.5f, 0.5f);
    });
    add("layer_norm", rows, [&](OpCase& k, int64_t n) {
      Node& l = k.node(Op::kLayerNorm, n);
      l.in[0] = {k.plan.add_value(n, H)};
      l.out = {k.plan.add_value(n, H)};
      l.width = H;
      l.vector = k.vector(H, 21, 0.5f, 1.0f);
      l.vector2 = k.vector(H, 22, 0.5f);
      l.eps = 1e-6f;
    });
    add("add_bias", rows, [&](OpCase& k, int64_t n) {
      Node& b = k.node(Op::kAddBias, n);
      b.out = {k.plan.add_value(n, H)};
      b.vector = k.vector(H, 23);
    });
    for (const Op gelu : {Op::kGelu, Op::kGeluTanh}) {
      add(op_name(gelu), rows, [&](OpCase& k, int64_t n) {
        Node& g = k.node(gelu, n);
        g.out = {k.plan.add_value(n, I)};
      });
    }
    add("bidirectional_attention", rows * 3, [&](OpCase& k, int64_t n) {
      Node& a = k.node(Op::kBidirectionalAttention, n);
      a.in[0] = {k.plan.add_value(n, q_width)};
      a.in[1] = {k.plan.add_value(n, kv_width)};
      a.in[2] = {k.plan.add_value(n, kv_width)};
      a.out = {k.plan.add_value(n, q_width)};
      a.attention = shape;
      a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    });
    for (const bool split : {false, true}) {
      add(split ? "split_heads + q/k rms_norm + rope" : "q/k rms_norm + rope", rows,
          [&](OpCase& k, int64_t n) {
            k.first_pos = 3;
            ValueId q = k.plan.add_value(n, q_width);
            if (split) {
              Node& s = k.node(Op::kSplitHeads, n);
              s.in[0] = {k.plan.add_value(n, 2 * q_width)};
              s.out = {q};
              s.out2 = {k.plan.add_value(n, q_width)};
              s.width = hd;
            }
            const ValueId kv = k.plan.add_value(n, kv_width);
            for (const ValueId v : {q, kv}) {
              Node& r = k.node(Op::kRmsNorm, n);
              r.in[0] = r.out = {v};
              r.width = hd;
              r.vector = k.vector(hd, 7, 0.5f, 1.0f);
              r.eps = 1e-6f;
            }
            const WeightVector* inv_freq = k.vector(rotary / 2, 8, 0.5f, 0.5f);
            for (const ValueId v : {q, kv}) {
              Node& r = k.node(Op::kRope, n);
              r.out = {v};
              r.width = hd;
              r.rotary_dim = rotary;
              r.vector = inv_freq;
            }
          });
    }
    // A short context, and one long enough for the device's split-key decode.
    for (const int64_t context : {int64_t{6}, int64_t{700}}) {
      add("attention after " + std::to_string(context), rows, [&](OpCase& k, int64_t n) {
        k.first_pos = context;
        LayerState& cache = k.layers.emplace_back();
        cache.kv_row_floats = kv_width;
        cache.keys = host_state(random_vector(k.first_pos * kv_width, 9));
        cache.values = host_state(random_vector(k.first_pos * kv_width, 10));
        Node& a = k.node(Op::kAttention, n);
        a.in[0] = {k.plan.add_value(n, q_width)};
        a.in[1] = {k.plan.add_value(n, kv_width)};
        a.in[2] = {k.plan.add_value(n, kv_width)};
        a.out = {k.plan.add_value(n, q_width)};
        a.layer = 0;
        a.attention = shape;
        a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      });
    }
    add("sigmoid_gate", rows, [&](OpCase& k, int64_t n) {
      Node& g = k.node(Op::kSigmoidGate, n);
      g.in[0] = {k.plan.add_value(n, q_width)};
      g.out = {k.plan.add_value(n, q_width)};
    });
    add("silu_mul", rows, [&](OpCase& k, int64_t n) {
      Node& s = k.node(Op::kSiluMul, n);
      s.in[0] = {k.plan.add_value(n, I)};
      s.in[1] = {k.plan.add_value(n, I)};
      s.out = {k.plan.add_value(n, I)};
    });
    add("conv_silu", rows, [&](OpCase& k, int64_t n) {
      LayerState& state = k.layers.emplace_back();
      state.conv = host_state(random_vector((kernel - 1) * channels, 11));
      Node& cv = k.node(Op::kConvSilu, n);
      cv.in[0] = {k.plan.add_value(n, channels)};
      cv.out = {k.plan.add_value(n, channels)};
      cv.width = kernel;
      cv.vector = k.vector(channels * kernel, 12, 0.5f);
      cv.layer = 0;
    });
    add("l2_norm", rows, [&](OpCase& k, int64_t n) {
      Node& l = k.node(Op::kL2Norm, n);
      l.out = {k.plan.add_value(n, kd)};
      l.width = heads.k_dim;
      l.scale = 0.25f;
    });
    for (const int64_t chunk : {int64_t{4}, int64_t{64}}) {
      add("delta_gates + delta_rule, chunk " + std::to_string(chunk), rows > 1 ? chunk + 5 : 1,
          [&](OpCase& k, int64_t n) {
            LayerState& state = k.layers.emplace_back();
            state.recurrent =
                host_state(random_vector(heads.n_v_heads * heads.k_dim * heads.v_dim, 13, 0.1f));
            const ValueId b = k.plan.add_value(n, heads.n_v_heads);
            const ValueId a = k.plan.add_value(n, heads.n_v_heads);
            Node& g = k.node(Op::kDeltaGates, n);
            g.out = {b};
            g.out2 = {a};
            g.vector = k.vector(heads.n_v_heads, 14, 0.5f);
            g.vector2 = k.vector(heads.n_v_heads, 15, 0.5f);
            const ValueId q = k.plan.add_value(n, kd), key = k.plan.add_value(n, kd);
            for (const ValueId v : {q, key}) {
              Node& l = k.node(Op::kL2Norm, n);
              l.out = {v};
              l.width = heads.k_dim;
            }
            Node& r = k.node(Op::kDeltaRule, n);
            r.in[0] = {q};
            r.in[1] = {key};
            r.in[2] = {k.plan.add_value(n, vd)};
            r.in[3] = {b};
            r.in[4] = {a};
            r.out = {k.plan.add_value(n, vd)};
            r.layer = 0;
            r.heads = heads;
            r.chunk = chunk;
          });
    }
    // The rule alone, from gates as the host gives them (β in (0, 1), g < 0): what a device
    // that leaves the gates to the host runs.
    add("delta_rule", rows > 1 ? 9 : 1, [&](OpCase& k, int64_t n) {
      LayerState& state = k.layers.emplace_back();
      state.recurrent =
          host_state(random_vector(heads.n_v_heads * heads.k_dim * heads.v_dim, 16, 0.1f));
      Node& r = k.node(Op::kDeltaRule, n);
      for (int i = 0; i < 3; ++i) r.in[i] = {k.plan.add_value(n, i < 2 ? kd : vd)};
      for (const auto& [i, lo, hi] : {std::tuple{3, 0.2f, 0.9f}, std::tuple{4, -2.0f, -0.01f}}) {
        r.in[i] = {k.plan.add_value(n, heads.n_v_heads)};
        std::vector<float> gate = random_vector(n * heads.n_v_heads, 17 + i, 0.5f);
        for (float& x : gate) x = lo + (hi - lo) / (1.0f + std::exp(-4.0f * x));
        k.inputs[r.in[i].value] = gate;
      }
      r.out = {k.plan.add_value(n, vd)};
      r.layer = 0;
      r.heads = heads;
      r.chunk = 4;
    });
    add("copy", rows, [&](OpCase& k, int64_t n) {
      Node& p = k.node(Op::kCopy, n);
      p.in[0] = {k.plan.add_value(n, H)};
      p.out = {k.plan.add_value(n, H)};
    });
  }
  // Prompt-sized matmuls: more tokens than a workgroup of any matmul shader takes (the
  // cooperative-matrix one takes 64) and a partial workgroup's worth, both ways round.
  for (const auto& pair : kMatrixTypes) {
    const DType dtype = pair.first;
    const Activations activations = pair.second;
    add(matmul_name(dtype, activations), prompt_rows,
        [&](OpCase& k, int64_t n) { add_matmul(k, n, dtype, activations, I, H); });
    add(matmul_name(dtype, activations) + " down", prompt_rows,
        [&](OpCase& k, int64_t n) { add_matmul(k, n, dtype, activations, H, I); });
  }
  return cases;
}

TEST(BackendOps, EveryOpOnEveryBackendMatchesTheReferenceOnEveryFixturesShapes) {
  CpuContext reference_context(1, CpuKernels{});
  CpuBackend reference(reference_context, /*fusion=*/false);
  CpuContext one(1, CpuKernels::from_environment()), two(2, CpuKernels::from_environment());
  CpuBackend fast_one(one), fast_two(two), unfused(one, /*fusion=*/false);
  std::set<Op> covered;
  const std::vector<fs::path> configs = test::fixture_checkpoints();
  ASSERT_GE(configs.size(), 7u);
  for (const fs::path& dir : configs) {
    const ModelConfig config = load_model_config(dir / "config.json");
    for (const OpCase& c : cases_for(config)) {
      const std::string what = dir.filename().string() + ": " + c.name;
      for (const Node& n : c.plan.nodes) covered.insert(n.op);
      const Outcome want = run_on(c, reference);
      const Outcome got = run_on(c, fast_one);
      expect_close(got, want, what);
      EXPECT_TRUE(same_bits(run_on(c, fast_two), got)) << what << ": 2 threads differ from 1";
      EXPECT_TRUE(same_bits(run_on(c, unfused), got)) << what << ": fusion changed a bit";
    }
  }
  EXPECT_EQ(covered.size(), static_cast<size_t>(kOpKinds)) << "an op kind has no case";
  std::printf("fast kernels: %s\n", one.kernels().describe().c_str());
}

// Every device kind the registry has (backend/devices.h), on the first device of that kind, in
// the variants its factory gives: each op against the reference. A kind with no device here is
// skipped, or fails under its factory's required switch (QHX_REQUIRE_VULKAN in CI).
// The vision tower's ops, which the devices leave to the CPU (as they do rope with M-RoPE axes).
const std::set<Op> kVisionOps = {Op::kLayerNorm, Op::kAddBias, Op::kGelu, Op::kGeluTanh,
                                 Op::kBidirectionalAttention};
bool left_to_the_cpu(const Node& n) {
  return kVisionOps.contains(n.op) || (n.op == Op::kRope && n.rope_axes != nullptr);
}
bool takes_case(const Backend& backend, const OpCase& c) {
  return std::all_of(c.plan.nodes.begin(), c.plan.nodes.end(),
                     [&](const Node& n) { return backend.supports(n); });
}

TEST(BackendOps, EveryOpOnEveryDeviceMatchesTheReferenceOnEveryFixturesShapes) {
  CpuContext reference_context(1, CpuKernels{});
  CpuBackend reference(reference_context, /*fusion=*/false);
  int devices = 0;
  for (const DeviceFactory* factory : device_factories()) {
    std::string why;
    const std::vector<DeviceFactory::SuiteVariant> variants = factory->op_suite_variants(&why);
    const std::string kind(factory->kind()), required(factory->required_switch());
    if (variants.empty()) {
      if (!required.empty() && std::getenv(required.c_str()) != nullptr) {
        ADD_FAILURE() << "no " << kind << " device (" << required << " is set): " << why;
      } else {
        std::printf("%s: skipped, no device: %s\n", kind.c_str(), why.c_str());
      }
      continue;
    }
    ++devices;
    for (const auto& v : variants) {
      std::printf("%s: %s\n", kind.c_str(), v.name.c_str());
      std::set<Op> covered;
      for (const fs::path& dir : test::fixture_checkpoints()) {
        const ModelConfig config = load_model_config(dir / "config.json");
        const std::shared_ptr<Backend> backend = v.make();
        const std::deque<OpCase> cases =
            v.rows.empty() ? cases_for(config) : cases_for(config, v.rows, v.rows.back());
        for (const OpCase& c : cases) {
          if (v.matmuls_only && c.plan.nodes.front().op != Op::kMatmul) continue;
          const PreparedWeights prepared(*backend, c.weights);
          // A device that takes only some ops (or shapes) is tested on the cases it takes; one
          // that takes every op leaves only the vision tower's and M-RoPE to the CPU.
          if (!takes_case(*backend, c)) {
            if (v.every_op) {
              for (const Node& n : c.plan.nodes) {
                EXPECT_TRUE(backend->supports(n) || left_to_the_cpu(n))
                    << v.name << " does not take " << c.plan.describe(n);
              }
            }
            continue;
          }
          for (const Node& n : c.plan.nodes) covered.insert(n.op);
          const std::string what = dir.filename().string() + ": " + c.name + " on " + v.name;
          try {
            expect_close(run_on(c, *backend), run_on(c, reference), what, v.tolerance);
          } catch (const Error& e) {
            ADD_FAILURE() << what << ": " << e.what();
          }
        }
      }
      if (v.every_op && !v.matmuls_only) {
        EXPECT_EQ(covered.size() + kVisionOps.size(), static_cast<size_t>(kOpKinds))
            << v.name << ": an op kind has no case";
      }
      std::string ops;
      for (const Op op : covered) ops += std::string(" ") + op_name(op);
      std::printf("  ops:%s\n", ops.c_str());
      EXPECT_FALSE(covered.empty()) << v.name << " ran no case";
    }
  }
  if (devices == 0) GTEST_SKIP() << "no device of any kind";
}

#if QHX_HAVE_VULKAN

// A prompt's matmul with float activations keeps float32's precision on every weight type, with
// activations of every size (blocks from 2^-30 to 2^20, a larger outlier in each token, a block
// whose largest value is just under a power of two, zeros in a block) and weights of every size
// (2^-22 to 2^16 of 0.1 in a row, 2^-67 of 0.1 in the last). Each output is within
//   cols · 2^-24 · Σ_c |w·x|  +  2^-28 · Σ_c |w| · max|x over c's block of 32 columns|
// of the exact (double) sum: float32's bound for a sum of cols terms, plus the floor of the
// cooperative-matrix form that holds activations as two f16 parts (split_f16.comp: a block's
// values far below its largest keep fewer bits). f16 activations miss it by far (their error is
// 2^-12 of a term). Column counts with a partial block.
TEST(BackendOps, VulkanPromptMatmulsWithFloatActivationsKeepFloat32Precision) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const std::string shaders = VulkanBackend(device).name();
  std::printf("shaders: %s\n", shaders.c_str());
  if (device->info().f16_matrix.k > 0 && find_shader("split_f16") != nullptr) {
    EXPECT_NE(shaders.find("f16)"), std::string::npos) << "the f16 matrices are not used";
  }
  const int64_t n = kPromptRows, rows = 72;
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kW8, DType::kW4}) {
    for (const int64_t cols : {int64_t{160}, int64_t{100}}) {
      OpCase k;
      k.name = matmul_name(dtype, Activations::kF32) + " " + std::to_string(cols) + " columns";
      Node& node = k.node(Op::kMatmul, n);
      node.in[0] = {k.plan.add_value(n, cols)};
      node.out = {k.plan.add_value(n, rows)};
      // f16 holds BF16's and F16's smallest only scaled, and no BF16 row's largest values.
      std::vector<float> weights = random_vector(rows * cols, 5, 0.1f);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const int64_t r = i / cols, c = i % cols;
        const int tiny = r == rows - 1 ? -45 : 0;
        weights[i] = std::ldexp(weights[i], static_cast<int>(r % 15 - 22 + (c % 7) * 4) + tiny);
      }
      const int64_t group = cols % 32 == 0 ? 32 : 4;  // W4: whole blocks, or not
      const MatrixRef& m = *k.matrix_of(weights, dtype, rows, cols, group);
      node.matrix = &m;
      std::vector<float>& x = k.inputs[node.in[0].value];
      x = random_vector(n * cols, 77, 1.0f);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t block = c / kActivationBlock;
          float& v = x[t * cols + c];
          v = block == 1 && t % 3 == 0 ? 0.0f
                                       : std::ldexp(v, static_cast<int>((t + 7 * block) % 51) - 30);
        }
        x[t * cols + (t * 13) % cols] = std::ldexp(1.0f, 21) * 1.37f;
        // Block 0's largest: x / s rounds up to 2^15 in f16.
        x[t * cols + 3] = std::nextafter(std::ldexp(1.0f, 22), 0.0f);
      }
      VulkanBackend vulkan(device);
      const PreparedWeights prepared(vulkan, k.weights);
      const Outcome got = run_on(k, vulkan);
      const std::vector<float>& y = got.values[node.out.value];
      std::vector<float> w(cols);
      for (int64_t r = 0; r < rows; ++r) {
        ref::read_row(m, r, w.data());
        for (int64_t t = 0; t < n; ++t) {
          double exact = 0.0, magnitude = 0.0, floor = 0.0;
          for (int64_t b = 0; b < cols; b += kActivationBlock) {
            const int64_t end = std::min(cols, b + kActivationBlock);
            double largest = 0.0;
            for (int64_t c = b; c < end; ++c) {
              largest = std::max(largest, std::fabs(double{x[t * cols + c]}));
            }
            for (int64_t c = b; c < end; ++c) {
              const double term = static_cast<double>(w[c]) * x[t * cols + c];
              exact += term;
              magnitude += std::fabs(term);
              floor += std::fabs(double{w[c]}) * largest;
            }
          }
          ASSERT_NEAR(y[t * rows + r], exact,
                      std::ldexp(magnitude * cols, -24) + std::ldexp(floor, -28))
              << k.name << ", token " << t << ", row " << r;
        }
      }
    }
  }
}

// A device opened to profile times every node it runs (qhx bench --profile): each op kind,
// weight type and row count of the suite's cases gets its nodes, their cost (node_cost) and a
// device time, made up of its kernels' times, summing to the device's time; its results stay the
// reference's. It measures its peaks in every arithmetic its kernels use. A device opened
// without it profiles nothing.
TEST(BackendOps, VulkanProfilingTimesEveryNodeAtItsCost) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  CpuContext reference_context(1, CpuKernels{});
  CpuBackend reference(reference_context, /*fusion=*/false);
  VulkanBackendOptions options;
  options.decode = true;  // it takes the embedding too
  options.profile = true;
  VulkanBackend backend(device, options);
  ASSERT_TRUE(backend.profiles());
  std::set<Op> timed;
  const ModelConfig config = load_model_config(test::fixture_checkpoints().front() / "config.json");
  for (const OpCase& c : cases_for(config)) {
    const PreparedWeights prepared(backend, c.weights);
    if (!takes_case(backend, c)) continue;  // the vision tower's ops
    expect_close(run_on(c, backend), run_on(c, reference), c.name);
    const DeviceProfile profile = backend.take_profile();
    std::map<std::tuple<std::string, std::string, int64_t>, std::pair<int64_t, NodeCost>> want;
    for (const Node& n : c.plan.nodes) {
      auto& [nodes, cost] = want[{
          op_name(n.op),
          n.matrix != nullptr ? std::string(dtype_name(n.matrix->dtype)) : std::string(), n.rows}];
      ++nodes;
      cost += node_cost(c.plan, n, c.first_pos);
      timed.insert(n.op);
    }
    double sum = 0;
    for (const OpTime& op : profile.ops) {
      const std::string what = c.name + ": " + op.op + " " + op.weights;
      const auto it = want.find({op.op, op.weights, op.rows});
      ASSERT_NE(it, want.end()) << what << " is no node of the case";
      EXPECT_EQ(op.nodes, it->second.first) << what;
      EXPECT_DOUBLE_EQ(op.cost.bytes, it->second.second.bytes) << what;
      EXPECT_DOUBLE_EQ(op.cost.flops, it->second.second.flops) << what;
      EXPECT_GT(op.seconds, 0.0) << what;
      EXPECT_FALSE(op.kernels.empty()) << what;
      double kernels = 0;
      for (const auto& [name, k] : op.kernels) kernels += k.seconds;
      EXPECT_NEAR(kernels, op.seconds, 1e-9 + 1e-9 * op.seconds) << what;
      sum += op.seconds;
      want.erase(it);
    }
    EXPECT_TRUE(want.empty()) << c.name << ": " << want.size() << " kinds of its nodes untimed";
    EXPECT_NEAR(sum, profile.seconds, 1e-9 + 1e-9 * sum) << c.name;
    EXPECT_GE(profile.submissions, 1) << c.name;
  }
  EXPECT_EQ(timed.size() + kVisionOps.size(), static_cast<size_t>(kOpKinds));
  EXPECT_TRUE(backend.take_profile().ops.empty()) << "taken twice";

  const DevicePeaks peaks = backend.measure_peaks();
  EXPECT_GT(peaks.read_bytes_per_s, 0.0);
  EXPECT_GT(peaks.ops_per_s.at("fp32 FMA"), 0.0);
  const bool has_matrices = find_shader("matmul_q8_w8_coopmat") != nullptr;
  EXPECT_EQ(peaks.ops_per_s.contains("int8 dot"), device->info().int8_dot);
  EXPECT_EQ(peaks.ops_per_s.contains("int8 matrix"),
            has_matrices && device->info().int8_matrix.k > 0);
  EXPECT_EQ(peaks.ops_per_s.contains("f16 matrix"),
            has_matrices && device->info().f16_matrix.k > 0);
  for (const auto& [arithmetic, rate] : peaks.ops_per_s) EXPECT_GT(rate, 0.0) << arithmetic;
  std::printf("peaks of %s: read %.1f GB/s", device->info().name.c_str(),
              peaks.read_bytes_per_s * 1e-9);
  for (const auto& [arithmetic, rate] : peaks.ops_per_s) {
    std::printf(", %s %.1f Gop/s", arithmetic.c_str(), rate * 1e-9);
  }
  std::printf("\n");

  VulkanBackend plain(device);
  EXPECT_FALSE(plain.profiles());
  const std::deque<OpCase> cases = cases_for(config);
  const OpCase& first = cases.front();
  const PreparedWeights prepared(plain, first.weights);
  run_on(first, plain);
  EXPECT_TRUE(plain.take_profile().ops.empty());
  EXPECT_THROW(plain.measure_peaks(), Error);
}
#endif

// The fused runs are fused where the plan has them side by side.
TEST(BackendOps, TheCpuBackendFusesWhatItCan) {
  const ModelConfig config =
      load_model_config(test::source_dir() / "tests/fixtures/qwen3_5/gva2_tied/config.json");
  CpuContext cx(1, CpuKernels::from_environment());
  CpuBackend cpu(cx);
  Backend* const backends[] = {&cpu};
  int checked = 0;
  for (const OpCase& c : cases_for(config)) {
    const Schedule s = schedule(c.plan, backends);
    const int64_t n = static_cast<int64_t>(c.plan.nodes.size());
    if (c.name.starts_with("add + rms_norm") ||
        c.name.find("x3 of one input") != std::string::npos ||
        c.name.find("rms_norm + rope") != std::string::npos) {
      EXPECT_EQ(s.plan.nodes[0].fused, n - 1) << c.name;
      ++checked;
    } else if (n == 1) {
      EXPECT_EQ(s.plan.nodes[0].fused, 0) << c.name;
    }
  }
  EXPECT_EQ(checked, 2 * (1 + 7 + 2));
}

// A backend that runs a subset of the ops: nodes it claims run there, the rest on the CPU, with a
// copy wherever a value crosses; a whole model gives the CPU's logits within float tolerance, and
// a decode step (nothing claimed) the CPU's exact bits.
TEST(Scheduler, PlacesClaimedNodesOnADeviceWithCopiesAndFallsBackToTheCpu) {
  for (const char* fixture : {"qwen3/gqa2_f16", "qwen3_5/gva2_tied"}) {
    SCOPED_TRACE(fixture);
    const fs::path dir = test::source_dir() / "tests" / "fixtures" / fixture;
    auto device = std::make_shared<test::SubsetBackend>(
        std::initializer_list<Op>{Op::kMatmul, Op::kRmsNorm, Op::kAdd, Op::kSiluMul}, 4);
    const auto alone = load_model(dir);
    const auto placed = load_model(dir, {.devices = {device}});
    const std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21, 25, 29};
    auto state_alone = alone->new_state();
    auto state_placed = placed->new_state();
    std::vector<float> want, got;
    alone->forward(prompt, *state_alone, LogitsFor::kEveryToken, want);
    placed->forward(prompt, *state_placed, LogitsFor::kEveryToken, got);
    EXPECT_GT(device->nodes_run, 0);
    expect_close(got, want, "prefill logits");
    // Decode: one row, which the device does not claim; its weightless neighbours stay on the
    // CPU too, so the step is the CPU's to the bit (given the same state).
    state_placed->restore(*state_alone);
    const int64_t before = device->nodes_run;
    const int32_t next = 3;
    alone->forward(std::span(&next, 1), *state_alone, LogitsFor::kLastToken, want);
    placed->forward(std::span(&next, 1), *state_placed, LogitsFor::kLastToken, got);
    EXPECT_EQ(device->nodes_run, before);
    EXPECT_EQ(got, want);
  }
}

// The scheduler tests' small plan, n = 3 tokens: embed (on the host), a claimed H×H matmul
// into h, what `middle` adds on h, then an lm-head matmul whose logits come back to the caller.
constexpr int64_t kSmallTokens = 3, kSmallHidden = 8, kSmallVocab = 16;

void small_plan(OpCase& c, const std::function<void(OpCase&, ValueId)>& middle) {
  const int64_t n = kSmallTokens, H = kSmallHidden, V = kSmallVocab;
  c.plan.n_tokens = n;
  const ValueId x = c.plan.add_value(n, H), h = c.plan.add_value(n, H);
  Node& e = c.node(Op::kEmbed, n);
  e.matrix = c.matrix(DType::kF32, V, H, 1);
  e.out = {x};
  c.ids = {1, 2, 3};
  Node& m = c.node(Op::kMatmul, n);  // claimed: 3 rows
  m.in[0] = {x};
  m.out = {h};
  m.matrix = c.matrix(DType::kF32, H, H, 2);
  middle(c, h);
  const ValueId logits = c.plan.add_value(n, V, /*binding=*/0);
  Node& head = c.node(Op::kMatmul, n);  // claimed; its output must come back to the caller
  head.in[0] = {h};
  head.out = {logits};
  head.matrix = c.matrix(DType::kF32, V, H, 4);
}

// "op@backend" for each node of the schedule.
std::vector<std::string> placement(const Schedule& s) {
  std::vector<std::string> placed;
  for (const Node& node : s.plan.nodes) {
    placed.push_back(std::string(op_name(node.op)) + "@" + std::to_string(node.backend));
  }
  return placed;
}

// The schedule's logits are the CPU's alone (within float tolerance).
void expect_cpu_logits(Schedule& s, std::span<Backend* const> backends, const OpCase& c,
                       Backend& cpu) {
  std::vector<float> got(kSmallTokens * kSmallVocab), want(got.size());
  execute_into(s, backends, c.ids, got);
  Backend* const cpu_only[] = {&cpu};
  Schedule alone = schedule(c.plan, cpu_only);
  EXPECT_EQ(alone.copies, 0);
  execute_into(alone, cpu_only, c.ids, want);
  expect_close(got, want, "logits");
}

// Placement rules on a small plan: a claimed matmul moves to the device with a copy of its input;
// a node the device does not run falls back to the CPU with a copy back; the logits come home.
TEST(Scheduler, InsertsACopyWhereAValueChangesBackend) {
  CpuContext cx(1, CpuKernels::from_environment());
  CpuBackend cpu(cx);
  test::SubsetBackend device({Op::kMatmul}, 2);
  Backend* const backends[] = {&cpu, &device};
  OpCase c;
  small_plan(c, [](OpCase& k, ValueId h) {
    Node& r = k.node(Op::kRmsNorm, kSmallTokens);  // not supported there: back on the CPU
    r.in[0] = r.out = {h};
    r.width = kSmallHidden;
    r.vector = k.vector(kSmallHidden, 3, 0.5f, 1.0f);
    r.eps = 1e-6f;
  });
  Schedule s = schedule(c.plan, backends);
  EXPECT_EQ(placement(s), (std::vector<std::string>{"embed@0", "copy@1", "matmul@1", "copy@0",
                                                    "rms_norm@0", "copy@1", "matmul@1", "copy@0"}));
  EXPECT_EQ(s.copies, 4);
  EXPECT_GT(s.arena_floats[1], 0);
  expect_cpu_logits(s, backends, c, cpu);
}

// A device compiles each run of nodes placed on it once, when the plan is scheduled; every run
// of the schedule hands it back. A run it cannot compile goes to the CPU, with the same logits.
TEST(Scheduler, KeepsWhatADeviceCompiledAndRunsWhatItCannotCompileOnTheCpu) {
  CpuContext cx(1, CpuKernels::from_environment());
  CpuBackend cpu(cx);
  test::SubsetBackend device({Op::kMatmul, Op::kSiluMul}, 2);
  device.compiling = true;
  Backend* const backends[] = {&cpu, &device};
  OpCase c;
  small_plan(c, [](OpCase& k, ValueId h) {
    Node& s = k.node(Op::kSiluMul, kSmallTokens);
    s.in[0] = s.in[1] = s.out = {h};
  });
  Schedule s = schedule(c.plan, backends);
  EXPECT_EQ(placement(s), (std::vector<std::string>{"embed@0", "copy@1", "matmul@1", "silu_mul@1",
                                                    "matmul@1", "copy@0"}));
  const int64_t compiled = device.runs_compiled;
  EXPECT_GE(compiled, 1);
  expect_cpu_logits(s, backends, c, cpu);
  expect_cpu_logits(s, backends, c, cpu);
  EXPECT_EQ(device.runs_compiled, compiled);              // compiled once, run twice
  EXPECT_EQ(device.compiled_runs_run, device.nodes_run);  // every run had its compiled form
  EXPECT_GT(device.compiled_runs_run, 0);

  device.refuse_to_compile = Op::kSiluMul;
  Schedule fallback = schedule(c.plan, backends);
  EXPECT_EQ(placement(fallback),
            (std::vector<std::string>{"embed@0", "copy@1", "matmul@1", "copy@0", "silu_mul@0",
                                      "copy@1", "matmul@1", "copy@0"}));
  expect_cpu_logits(fallback, backends, c, cpu);
}

// A device binds a window of its arena per node: a node whose operands lie further apart than
// that runs on the CPU, the rest where they would, and the logits are the same.
TEST(Scheduler, MovesANodeWhoseOperandsSpanMoreThanTheDeviceBindsToTheCpu) {
  CpuContext cx(1, CpuKernels::from_environment());
  CpuBackend cpu(cx);
  test::SubsetBackend device({Op::kMatmul, Op::kSiluMul}, 2);
  Backend* const backends[] = {&cpu, &device};
  OpCase c;
  small_plan(c, [](OpCase& k, ValueId h) {
    Node& gate = k.node(Op::kSiluMul, kSmallTokens);
    gate.in[0] = gate.in[1] = gate.out = {h};
  });
  // Unbounded: everything the device supports runs there.
  Schedule s = schedule(c.plan, backends);
  EXPECT_EQ(placement(s), (std::vector<std::string>{"embed@0", "copy@1", "matmul@1", "silu_mul@1",
                                                    "matmul@1", "copy@0"}));
  // 250 bytes: the lm-head's operands (h and the 3 x 16 logits: 288 bytes) do not fit, the first
  // matmul's (x and h: 224 bytes once the logits are gone) and the gate's do.
  device.max_arena_span = 250;
  s = schedule(c.plan, backends);
  EXPECT_EQ(placement(s), (std::vector<std::string>{"embed@0", "copy@1", "matmul@1", "silu_mul@1",
                                                    "copy@0", "matmul@0"}));
  expect_cpu_logits(s, backends, c, cpu);
  // 200 bytes: no matmul fits; the gate follows its input to the CPU.
  device.max_arena_span = 200;
  s = schedule(c.plan, backends);
  EXPECT_EQ(placement(s),
            (std::vector<std::string>{"embed@0", "matmul@0", "silu_mul@0", "matmul@0"}));
  EXPECT_EQ(s.copies, 0);
}

// A node that updates its value in place (RoPE, the q/k norms, the delta-rule gates: no input
// operand) runs where that value is when the backend runs it, not back on the CPU.
TEST(Scheduler, RunsAnInPlaceNodeWhereItsValueIs) {
  CpuContext cx(1, CpuKernels::from_environment());
  CpuBackend cpu(cx);
  test::SubsetBackend device({Op::kMatmul, Op::kL2Norm}, 2);
  Backend* const backends[] = {&cpu, &device};
  OpCase c;
  small_plan(c, [](OpCase& k, ValueId h) {
    Node& norm = k.node(Op::kL2Norm, kSmallTokens);  // in place, on the matmul's output
    norm.out = {h};
    norm.width = kSmallHidden;
    norm.scale = 1.0f;
  });
  Schedule s = schedule(c.plan, backends);
  EXPECT_EQ(placement(s), (std::vector<std::string>{"embed@0", "copy@1", "matmul@1", "l2_norm@1",
                                                    "matmul@1", "copy@0"}));
  EXPECT_EQ(s.copies, 2);
  expect_cpu_logits(s, backends, c, cpu);
}

// Values whose lifetimes do not overlap share arena memory: a 28-layer plan's arena is the size
// of a few layers' activations, not of all of them.
TEST(Scheduler, ArenaReusesMemoryAcrossLayers) {
  CpuContext cx(1, CpuKernels::from_environment());
  CpuBackend cpu(cx);
  Backend* const backends[] = {&cpu};
  Plan plan;
  plan.n_tokens = 4;
  const int64_t H = 64;
  const WeightVector scale(std::vector<float>(H, 1.0f));
  ValueId x = plan.add_value(4, H);
  Node& first = plan.add(Op::kCopy);
  first.in[0] = {plan.add_value(4, H)};
  first.out = {x};
  first.rows = 4;
  int64_t total = 0;
  for (int layer = 0; layer < 28; ++layer) {
    const ValueId y = plan.add_value(4, H);
    Node& n = plan.add(Op::kRmsNorm);
    n.in[0] = {x};
    n.out = {y};
    n.rows = 4;
    n.width = H;
    n.vector = &scale;
    total += 4 * H;
    x = y;
  }
  const Schedule s = schedule(plan, backends);
  EXPECT_LE(s.arena_floats[0], 3 * 4 * H);
  EXPECT_LT(s.arena_floats[0], total / 4);
}

// Weights a backend's buffer type allocated are at home there: a node that reads them runs on that
// backend although it does not claim the node (one row), and its input is copied over.
TEST(Scheduler, RunsANodeWhereItsWeightsLive) {
  CpuContext cx(1, CpuKernels::from_environment());
  CpuBackend cpu(cx);
  test::SubsetBackend device({Op::kMatmul}, /*claim_rows=*/1000);
  Backend* const backends[] = {&cpu, &device};
  OpCase c;
  const int64_t H = 8;
  c.plan.n_tokens = 1;
  const ValueId x = c.plan.add_value(1, H), y = c.plan.add_value(1, H, /*binding=*/0);
  Node& e = c.node(Op::kEmbed, 1);
  e.matrix = c.matrix(DType::kF32, 4, H, 1);
  e.out = {x};
  c.ids = {2};
  // The weights, in the device's memory.
  const MatrixRef* host_weights = c.matrix(DType::kF32, H, H, 2);
  const std::unique_ptr<Buffer> on_device = device.buffer_type().allocate(H * H * sizeof(float));
  on_device->write(0, host_weights->data, H * H * sizeof(float));
  MatrixRef at_home = *host_weights;
  at_home.data = on_device->host();
  at_home.buffer = on_device.get();
  Node& m = c.node(Op::kMatmul, 1);
  m.in[0] = {x};
  m.out = {y};
  m.matrix = &at_home;

  Schedule s = schedule(c.plan, backends);
  std::vector<std::string> placed;
  for (const Node& node : s.plan.nodes) {
    placed.push_back(std::string(op_name(node.op)) + "@" + std::to_string(node.backend));
  }
  EXPECT_EQ(placed, (std::vector<std::string>{"embed@0", "copy@1", "matmul@1", "copy@0"}));

  std::vector<float> got(H), want(H);
  execute_into(s, backends, c.ids, got);
  EXPECT_EQ(device.nodes_run, 2);  // the copy in and the matmul
  m.matrix = host_weights;
  Backend* const cpu_only[] = {&cpu};
  Schedule alone = schedule(c.plan, cpu_only);
  execute_into(alone, cpu_only, c.ids, want);
  expect_close(got, want, "matmul on the weights' home");
}

// An output bound to too little memory is an error, not a write past its end.
TEST(Scheduler, RefusesAnOutputBufferThatIsTooSmall) {
  CpuContext cx(1, CpuKernels::from_environment());
  CpuBackend cpu(cx);
  Backend* const backends[] = {&cpu};
  OpCase c;
  c.plan.n_tokens = 1;
  Node& e = c.node(Op::kEmbed, 1);
  e.matrix = c.matrix(DType::kF32, 4, 8, 1);
  e.out = {c.plan.add_value(1, 8, /*binding=*/0)};
  c.ids = {1};
  Schedule s = schedule(c.plan, backends);
  std::vector<float> small(4);
  EXPECT_NE(error_of([&] { execute_into(s, backends, c.ids, small); }).find("has 16 bytes, not 32"),
            std::string::npos);
}

// Memory the host cannot address, as a GPU's is: bytes move only through read and write.
class DeviceLikeBuffer final : public Buffer {
 public:
  DeviceLikeBuffer(const BufferType* type, size_t bytes)
      : Buffer(BufferKind::kDevice, type, nullptr, bytes, true), memory_(bytes) {}
  void write(size_t offset, const void* from, size_t n) override {
    check_range(offset, n, "write");
    std::memcpy(memory_.data() + offset, from, n);
  }
  void read(size_t offset, void* to, size_t n) const override {
    check_range(offset, n, "read");
    std::memcpy(to, memory_.data() + offset, n);
  }

 private:
  std::vector<std::byte> memory_;
};

class DeviceLikeType final : public BufferType {
 public:
  std::string name() const override { return "device-like"; }
  BufferKind kind() const override { return BufferKind::kDevice; }
  std::unique_ptr<Buffer> allocate(size_t bytes) const override {
    return std::make_unique<DeviceLikeBuffer>(this, bytes);
  }
};

TEST(Buffer, HostMemoryIsZeroedAlignedAndChecked) {
  const HostBufferType host;
  const std::unique_ptr<Buffer> b = host.allocate(100);
  EXPECT_EQ(b->kind(), BufferKind::kHost);
  EXPECT_EQ(b->type(), &host);
  EXPECT_EQ(b->bytes(), 100u);
  ASSERT_NE(b->host(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->host()) % 64, 0u);
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(b->host()[i], std::byte{0});
  const float x[2] = {1.5f, -2.0f};
  b->write(92, x, sizeof x);
  float back[2];
  b->read(92, back, sizeof back);
  EXPECT_EQ(back[1], -2.0f);
  EXPECT_NE(error_of([&] { b->write(96, x, sizeof x); }).find("outside its 100 bytes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { b->read(101, back, 0); }).find("outside"), std::string::npos);
}

TEST(Buffer, MappedFileBytesAreReadOnly) {
  const std::vector<float> file = {1, 2, 3};
  BorrowedBuffer mapped(BufferKind::kMappedFile, file.data(), 12, BorrowedBuffer::kReadOnly);
  EXPECT_EQ(mapped.type(), nullptr);
  float x = 0;
  mapped.read(4, &x, 4);
  EXPECT_EQ(x, 2.0f);
  EXPECT_EQ(error_of([&] { mapped.write(0, &x, 4); }), "mapped file buffer: is read-only");
}

TEST(Buffer, CopiesReachMemoryTheHostCannotAddress) {
  const HostBufferType host;
  const DeviceLikeType device_type, other_device_type;
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const size_t bytes = values.size() * sizeof(float);
  const std::unique_ptr<Buffer> h = host.allocate(bytes), d = device_type.allocate(bytes);
  const std::unique_ptr<Buffer> d2 = other_device_type.allocate(bytes), back = host.allocate(bytes);
  EXPECT_EQ(d->host(), nullptr);
  h->write(0, values.data(), bytes);
  copy_bytes(*h, 0, *d, 0, bytes);                  // upload
  copy_bytes(*d, 0, *d2, 0, bytes);                 // device to device, through the host
  copy_bytes(*d2, 2 * sizeof(float), *back, 0, 8);  // download of a range
  const float* got = reinterpret_cast<const float*>(back->host());
  EXPECT_EQ(got[0], 3.0f);
  EXPECT_EQ(got[1], 4.0f);
  EXPECT_EQ(got[2], 0.0f);
}

// A sequence's state grows in its backend's memory as a std::vector would, on any kind of memory.
TEST(StateBuffer, GrowsKeepingItsContentsInItsBackendsMemory) {
  const HostBufferType host;
  const DeviceLikeType device;
  for (const BufferType* type : std::initializer_list<const BufferType*>{&host, &device}) {
    SCOPED_TRACE(type->name());
    StateBuffer s(*type, 3);
    EXPECT_EQ(s.to_vector(), (std::vector<float>{0, 0, 0}));
    s.assign(std::vector<float>{1, 2, 3});
    s.resize(5);  // beyond capacity: at least doubles, keeps the contents, zeroes the rest
    EXPECT_EQ(s.capacity(), 6);
    EXPECT_EQ(s.to_vector(), (std::vector<float>{1, 2, 3, 0, 0}));
    EXPECT_EQ(s.buffer()->type(), type);
    s.resize(2);
    s.resize(4);  // within capacity: the regrown elements are zero again
    EXPECT_EQ(s.to_vector(), (std::vector<float>{1, 2, 0, 0}));
    s.reserve(40);
    EXPECT_EQ(s.capacity(), 40);
    EXPECT_EQ(s.to_vector(), (std::vector<float>{1, 2, 0, 0}));

    const StateBuffer snapshot = s;  // deep, and only the elements in use
    EXPECT_EQ(snapshot.capacity(), 4);
    s.fill_zero();
    EXPECT_EQ(snapshot.to_vector(), (std::vector<float>{1, 2, 0, 0}));
    s = snapshot;  // keeps its larger capacity
    EXPECT_EQ(s.capacity(), 40);
    EXPECT_EQ(s.to_vector(), snapshot.to_vector());
    s.clear();
    EXPECT_TRUE(s.empty());
  }
  StateBuffer on_device(device, 2);
  EXPECT_NE(error_of([&] { (void)on_device.data(); }).find("not addressable by the host"),
            std::string::npos);
  StateBuffer untyped;
  EXPECT_NE(error_of([&] { untyped.resize(1); }).find("without a buffer type"), std::string::npos);
}

}  // namespace
}  // namespace qhx
