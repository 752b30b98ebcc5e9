// The Hexagon backend on Qualcomm's HTP simulator (support/hexagon_device.h): qhx's declarations
// of the QNN ABI against the library itself (the build id read through the function table,
// graphs that compile for two chips, run, serialize, describe themselves and load again), prompt
// chunks of whole models on the NPU with the CPU's greedy replies, the check before use refusing
// a perturbed graph, and a failed graph execution finished by the CPU with the same tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "backend/devices.h"
#include "backend/qnn/hexagon_backend.h"
#include "backend/qnn/npu_pack.h"
#include "backend/qnn/npu_weights.h"
#include "core/dtype.h"
#include "forge/convert.h"
#include "forge/npu_card.h"
#include "forge/npu_pack.h"
#include "kernels/quant.h"
#include "models/model.h"
#include "runtime/device_check.h"
#include "runtime/session.h"
#include "support/cli_run.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "support/hexagon_device.h"
#include "util/error.h"
#include "util/json_file.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

const char* const kFixtures[] = {"qwen3/gqa2_f16", "qwen3_5/gva2_tied"};

fs::path fixture(const char* name) {
  return test::source_dir() / "tests/fixtures" / name;
}

TEST(Hexagon, TheLibraryIsCalledThroughQhxsOwnDeclarations) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const std::string build = library->build_id();  // through slot 4 of the function table
  EXPECT_TRUE(build.starts_with("v2.")) << build;
  const qnn::ApiVersion v = library->api_version();
  EXPECT_EQ(v.core.major, 2u);
  EXPECT_GE(v.core.minor, 32u);
  EXPECT_NE(library->describe().find(build), std::string::npos);
  std::printf("%s\n", library->describe().c_str());
}

// y = rms_norm(x · Wᵀ) over 128 rows, as a graph of two ops.
struct SmallGraph {
  static constexpr uint32_t kRows = 128, kIn = 64, kOut = 32;
  std::vector<float> x = test::random_vector(kRows * kIn, 1),
                     w = test::random_vector(kOut * kIn, 2, 0.2f),
                     gamma = test::random_vector(kOut, 3, 0.5f);

  void build(QnnGraph& g) const {
    const auto in = g.input({kRows, kIn});
    const auto weights = g.constant({kOut, kIn}, w);
    const auto product = g.intermediate({kRows, kOut});
    g.add("FullyConnected", {in, weights}, {product});
    const uint32_t axis[] = {1};
    const auto axes = g.constant_u32({1}, axis);
    const auto scale = g.constant({kOut}, gamma);
    const auto out = g.output({kRows, kOut});
    g.add("RmsNorm", {product, scale}, {out}, {{"epsilon", QnnGraph::f32(1e-6f)}},
          {{"axes", axes}});
    g.finalize();
  }
  std::vector<float> reference() const {
    std::vector<float> y(kRows * kOut);
    for (uint32_t r = 0; r < kRows; ++r) {
      double squares = 0;
      std::vector<double> p(kOut);
      for (uint32_t o = 0; o < kOut; ++o) {
        for (uint32_t i = 0; i < kIn; ++i) p[o] += double(x[r * kIn + i]) * w[o * kIn + i];
        squares += p[o] * p[o];
      }
      const double scale = 1.0 / std::sqrt(squares / kOut + 1e-6);
      for (uint32_t o = 0; o < kOut; ++o) y[r * kOut + o] = float(p[o] * scale * gamma[o]);
    }
    return y;
  }
  std::vector<float> run(QnnGraph& g) const {
    std::vector<float> y(kRows * kOut);
    const std::span<const float> in[] = {x};
    const std::span<float> out[] = {y};
    g.execute(in, out);
    return y;
  }
};

float max_error(const std::vector<float>& got, const std::vector<float>& want) {
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  return worst;
}

TEST(Hexagon, AGraphCompilesForEachChipRunsAndLoadsAgainFromItsBinary) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const SmallGraph small;
  const std::vector<float> want = small.reference();
  std::vector<std::vector<unsigned char>> binaries;
  for (const char* arch : {"v75", "v81"}) {
    SCOPED_TRACE(arch);
    const HexagonChip& chip = *hexagon_chip(arch);
    const auto device = HexagonDevice::open(library, chip);
    std::vector<float> built;
    std::vector<unsigned char> binary;
    {
      HexagonContext context(device);
      QnnGraph g(context, "small");
      small.build(g);
      EXPECT_EQ(g.ops(), 2u);
      built = small.run(g);
      binary = context.binary();
    }
    EXPECT_LT(max_error(built, want), 2e-2f);  // fp16 arithmetic on values of about 3
    const HexagonBinaryInfo info = read_binary_info(*library, binary);
    EXPECT_EQ(info.dsp_arch, chip.arch);
    EXPECT_EQ(info.soc_model, chip.soc);
    EXPECT_EQ(info.build_id, library->build_id());
    ASSERT_EQ(info.graphs.size(), 1u);
    EXPECT_EQ(info.graphs[0].name, "small");
    ASSERT_EQ(info.graphs[0].inputs.size(), 1u);
    EXPECT_EQ(info.graphs[0].inputs[0].dims, (std::vector<uint32_t>{128, 64}));
    EXPECT_GT(info.graphs[0].const_bytes, 0);
    EXPECT_EQ(info.graphs[0].io_bytes, int64_t{128} * (64 + 32) * 4);
    HexagonContext loaded(device, binary);
    QnnGraph again = QnnGraph::retrieve(loaded, info.graphs[0]);
    EXPECT_EQ(small.run(again), built);  // the same compiled graph: the same bits
    binaries.push_back(binary);
  }
  EXPECT_NE(binaries[0], binaries[1]);  // compiled for different chips
}

// x · Wᵀ over 128 rows in a 16-bit form, built as the Hexagon backend builds it
// (add_quantized_matmul), against the product of the weights as their integers and scales say
// them (int8_rows, int4_blocks) in double: what is left is the 16-bit activations' rounding.
struct QuantizedMatmul {
  static constexpr uint32_t kRows = 128;
  uint32_t in, out;
  std::vector<float> x = test::random_vector(kRows * in, 1);

  std::vector<float> product(const std::vector<float>& w) const {
    std::vector<float> y(kRows * out);
    for (uint32_t r = 0; r < kRows; ++r) {
      for (uint32_t o = 0; o < out; ++o) {
        double sum = 0;
        for (uint32_t i = 0; i < in; ++i) sum += double(x[r * in + i]) * w[o * in + i];
        y[r * out + o] = float(sum);
      }
    }
    return y;
  }
  // The graph's result and the largest error against `want` (whose range it is encoded over).
  float error(const std::shared_ptr<const QnnLibrary>& library, const char* arch,
              const MatrixRef& w, NpuForm form, const std::vector<float>& want) const {
    const auto device = HexagonDevice::open(library, *hexagon_chip(arch));
    HexagonContext context(device);
    QnnGraph g(context, "quantized");
    MatmulRanges ranges;
    for (const float v : x) ranges.in.include(v);
    for (const float v : want) ranges.out.include(v);
    const auto input = g.input({kRows, in});
    const auto output = g.output({kRows, out});
    add_quantized_matmul(g, input, output, w, form, ranges, kRows);
    g.finalize();
    std::vector<float> y(kRows * out);
    const std::span<const float> ins[] = {x};
    const std::span<float> outs[] = {y};
    g.execute(ins, outs);
    return max_error(y, want);
  }
};

float largest(const std::vector<float>& v) {
  float m = 0;
  for (const float x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(Hexagon, AW8A16MatmulComputesWithInt8RowsAnd16BitActivations) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const QuantizedMatmul m{128, 32};
  const std::vector<float> w = test::random_vector(m.out * m.in, 2, 0.2f);
  const MatrixRef matrix{DType::kF32, w.data(), m.out, m.in};
  const Int8Rows q = int8_rows(matrix);
  std::vector<float> as_int8(w.size());
  for (uint32_t o = 0; o < m.out; ++o) {
    for (uint32_t i = 0; i < m.in; ++i)
      as_int8[o * m.in + i] = q.values[o * m.in + i] * q.scales[o];
  }
  const std::vector<float> want = m.product(as_int8);
  for (const char* arch : {"v75", "v81"}) {
    SCOPED_TRACE(arch);
    const float error = m.error(library, arch, matrix, NpuForm::kW8A16, want);
    std::printf("%s: w8a16 max error %.3g of %.3g\n", arch, error, largest(want));
    EXPECT_LT(error, 2e-4f * largest(want));  // 16-bit activations over ranges 1.25x wide
  }
}

TEST(Hexagon, AW4A16MatmulComputesWithTwoLevelBlockScales) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  // (Blocks of 48 and 24 compute wrong values on the HTP: int4_blocks cuts such groups.)
  for (const auto& [in, out, group] :
       {std::tuple{128u, 32u, 64}, std::tuple{128u, 256u, 32}, std::tuple{96u, 64u, 48}}) {
    const QuantizedMatmul m{in, out};
    const std::vector<float> w = test::random_vector(out * in, 2, 0.2f);
    std::vector<uint8_t> packed(out * in / 2);  // W4 groups, as a bundle has them
    std::vector<uint16_t> scales(out * in / group);
    quantize_w4(w.data(), out, in, group, packed.data(), scales.data());
    const MatrixRef matrix{DType::kW4, packed.data(), out, in, scales.data(), group};
    const Int4Blocks q = int4_blocks(matrix);
    const int64_t blocks = in / q.block;
    std::vector<float> as_int4(w.size());
    for (uint32_t o = 0; o < out; ++o) {
      for (uint32_t i = 0; i < in; ++i) {
        as_int4[o * in + i] =
            q.values[o * in + i] * q.row_scales[o] * q.block_scales[o * blocks + i / q.block];
      }
    }
    const std::vector<float> want = m.product(as_int4);
    for (const char* arch : {"v75", "v81"}) {
      SCOPED_TRACE(arch);
      const float error = m.error(library, arch, matrix, NpuForm::kW4A16, want);
      std::printf("%s: w4a16 %ux%u groups of %d: max error %.3g of %.3g\n", arch, out, in, group,
                  error, largest(want));
      EXPECT_LT(error, 2e-4f * largest(want));
    }
  }
}

TEST(NpuWeights, Int8RowsKeepAW8MatrixAsItLiesAndRoundOthersWithinHalfAStep) {
  const std::vector<float> w = test::random_vector(16 * 64, 5, 0.3f);
  const Int8Rows f = int8_rows({DType::kF32, w.data(), 16, 64});
  for (int64_t r = 0; r < 16; ++r) {
    for (int64_t c = 0; c < 64; ++c) {
      EXPECT_LE(std::fabs(f.values[r * 64 + c] * f.scales[r] - w[r * 64 + c]),
                0.5f * f.scales[r] * 1.0001f);
    }
  }
  const std::vector<float> scales = {0.01f, 0.02f};
  const std::vector<int8_t> ints = {1, -2, 3, 127, -127, 0, 5, 6};
  const Int8Rows same = int8_rows({DType::kW8, ints.data(), 2, 4, scales.data()});
  EXPECT_EQ(same.values, ints);
  EXPECT_EQ(same.scales, scales);
}

TEST(NpuWeights, Int4BlocksFollowAW4MatrixsGroupsWithinTheTwoLevelScalesRounding) {
  // A W4 matrix of 2 rows, groups of 32: every element of group g is ±(g+1) steps of 0.01·(g+1).
  constexpr int64_t kCols = 128, kGroup = 32;
  std::vector<uint8_t> packed(2 * kCols / 2);
  std::vector<uint16_t> scales;
  std::vector<float> want(2 * kCols);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t g = 0; g < kCols / kGroup; ++g) scales.push_back(f32_to_f16(0.01f * (g + 1)));
    for (int64_t c = 0; c < kCols; ++c) {
      const int q = (c % 2 ? -1 : 1) * static_cast<int>(c / kGroup + 1);
      packed[(r * kCols + c) / 2] |= static_cast<uint8_t>((q & 0xF) << ((r * kCols + c) % 2 * 4));
      want[r * kCols + c] = q * f16_to_f32(scales[r * (kCols / kGroup) + c / kGroup]);
    }
  }
  const MatrixRef w{DType::kW4, packed.data(), 2, kCols, scales.data(), kGroup};
  const Int4Blocks q = int4_blocks(w);
  EXPECT_EQ(q.block, kGroup);  // a W4 matrix's own groups, whatever block is asked for
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      const float scale = q.row_scales[r] * q.block_scales[r * (kCols / kGroup) + c / kGroup];
      // The group scales 0.01..0.04 are 3.75, 7.5, 11.25, 15 steps of 0.04/15: each becomes a
      // whole step within one of it (integers of at most 4 are clipped by neither), and the
      // integers rounded again within half the new scale.
      EXPECT_NEAR(scale, f16_to_f32(scales[r * (kCols / kGroup) + c / kGroup]), 0.04f / 15 + 1e-6f);
      EXPECT_NEAR(q.values[r * kCols + c] * scale, want[r * kCols + c], 0.5f * scale + 1e-6f)
          << r << "," << c;
    }
  }
}

TEST(Hexagon, ADamagedBinaryIsRefusedInOneLine) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const auto device = HexagonDevice::open(library, *hexagon_chip("v81"));
  std::vector<unsigned char> binary;
  {
    HexagonContext context(device);
    QnnGraph g(context, "small");
    SmallGraph().build(g);
    binary = context.binary();
  }
  binary.resize(binary.size() / 2);
  try {
    HexagonContext broken(device, binary);
    FAIL() << "a truncated binary loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kDeviceFailed);
    EXPECT_NE(message.find("QNN error"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

std::vector<int32_t> long_prompt(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return ids;
}

// A prompt of two chunks and a tail: the chunks' row-wise work runs on the NPU (compiled once per
// graph, run per chunk), the rest and the reply on the CPU, with the CPU's greedy tokens and
// logits within fp16's reach of the CPU's.
TEST(Hexagon, PromptChunksRunOnTheNpuAndTheReplyIsTheCpus) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const auto backend =
        std::make_shared<HexagonBackend>(HexagonDevice::open(library, *hexagon_chip("v81")));
    const auto npu = load_model(fixture(name), {.devices = {backend}});
    const auto cpu = load_model(fixture(name));
    EXPECT_EQ(npu->prompt_rows_multiple(), 128);
    // Its graphs name weights by id: a second model would take the first's.
    test::expect_error([&] { load_model(fixture(name), {.devices = {backend}}); },
                       {"hexagon", "holds another model's weights"});
    const std::vector<int32_t> prompt = long_prompt(300, cpu->config().vocab_size);
    EXPECT_EQ(greedy_reply(*npu, prompt, 8), greedy_reply(*cpu, prompt, 8));
    EXPECT_EQ(backend->chunks_run(), 2);  // 256 of the 300 rows; the 44 left ran on the CPU
    EXPECT_GT(backend->graphs_compiled(), 0);
    const int64_t compiled = backend->graphs_compiled();
    // Another prompt of the same shape compiles nothing more.
    EXPECT_EQ(greedy_reply(*npu, long_prompt(260, cpu->config().vocab_size), 4),
              greedy_reply(*cpu, long_prompt(260, cpu->config().vocab_size), 4));
    EXPECT_EQ(backend->graphs_compiled(), compiled);
    EXPECT_EQ(backend->chunks_run(), 4);
    // The logits of a whole chunk, within fp16's reach.
    std::vector<float> got, want;
    auto s1 = npu->new_state(), s2 = cpu->new_state();
    const std::vector<int32_t> chunk(prompt.begin(), prompt.begin() + 128);
    npu->forward(chunk, *s1, LogitsFor::kEveryToken, got);
    cpu->forward(chunk, *s2, LogitsFor::kEveryToken, want);
    float scale = 0;
    for (const float v : want) scale = std::max(scale, std::fabs(v));
    EXPECT_LT(max_error(got, want), 2e-2f * scale);
    EXPECT_EQ(npu->device_failures(), 0);
  }
}

// Decoding on the NPU (--decode-device hexagon): each step's layers run in one-row graphs, the
// attention over the host's KV cache in graphs by cache length, the lm-head in a graph of its
// own, the Gated DeltaNet's conv and recurrent step too; the embedding and the delta rule's
// gates stay with the CPU. The CPU's greedy tokens
// across a cache-length bucket (128 → 256 rows), a step's logits within fp16's reach, and a
// failed execution mid-reply redone by the CPU with the same tokens.
TEST(Hexagon, DecodeStepsRunOnTheNpuWithTheCpusTokens) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const auto device = HexagonDevice::open(library, *hexagon_chip("v81"));
  HexagonBackendOptions decoding;
  decoding.decode = true;
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const auto cpu = load_model(fixture(name));
    const std::vector<int32_t> prompt = long_prompt(120, cpu->config().vocab_size);
    const std::vector<int32_t> want = greedy_reply(*cpu, prompt, 12);
    const auto backend = std::make_shared<HexagonBackend>(device, decoding);
    const auto npu = load_model(fixture(name), {.devices = {backend}});
    EXPECT_EQ(greedy_reply(*npu, prompt, 12), want);
    EXPECT_EQ(backend->decode_steps(), 11);  // the 12th token's step is not taken
    EXPECT_EQ(backend->chunks_run(), 0);     // 120 rows: the prompt is the CPU's
    EXPECT_EQ(npu->device_failures(), 0);
    EXPECT_TRUE(backend->compile_failures().empty()) << backend->compile_failures().front();

    // One step's logits against the CPU's, from the same state.
    auto on_npu = npu->new_state(), on_cpu = cpu->new_state();
    std::vector<float> got, expected;
    cpu->forward(prompt, *on_cpu, LogitsFor::kLastToken, expected);
    on_npu->restore(*on_cpu);
    const int32_t next = want[0];
    const int64_t steps = backend->decode_steps();
    npu->forward(std::span(&next, 1), *on_npu, LogitsFor::kLastToken, got);
    EXPECT_EQ(backend->decode_steps(), steps + 1);  // the step compared ran on the NPU
    cpu->forward(std::span(&next, 1), *on_cpu, LogitsFor::kLastToken, expected);
    float scale = 0;
    for (const float v : expected) scale = std::max(scale, std::fabs(v));
    EXPECT_LT(max_error(got, expected), 2e-2f * scale);

    const int64_t total = backend->graphs_executed();
    HexagonBackendOptions failing = decoding;
    failing.fail_execution = total / 2;
    const auto model =
        load_model(fixture(name), {.devices = {std::make_shared<HexagonBackend>(device, failing)}});
    EXPECT_EQ(greedy_reply(*model, prompt, 12), want);
    EXPECT_EQ(model->device_failures(), 1);

    // The check before use reads its probes' last tokens as decode steps: it passes the honest
    // decode graphs and refuses a perturbed attention, which only decode steps run here.
    DeviceCheckOptions check;
    check.mode = DeviceCheckMode::kAlways;
    const auto checked_backend = std::make_shared<HexagonBackend>(device, decoding);
    const auto checked = load_model(fixture(name), {.devices = {checked_backend}});
    const DeviceCheckResult passed = check_devices(*checked, "decoding", nullptr, check);
    EXPECT_TRUE(passed.passed) << passed.summary;
    EXPECT_GT(checked_backend->decode_steps(), 0);
    HexagonBackendOptions perturbed = decoding;
    perturbed.perturb_op = "attention";
    const auto wrong = load_model(
        fixture(name), {.devices = {std::make_shared<HexagonBackend>(device, perturbed)}});
    const DeviceCheckResult refused = check_devices(*wrong, "perturbed", nullptr, check);
    EXPECT_FALSE(refused.passed) << refused.summary;
  }
}

// Decoding, a step's graphs share their weights with the prompt graphs of the same layers (HTP's
// weight sharing, by content within a context): what the contexts hold grows by the lm-head and
// little else, not by a second copy of every layer — and the tokens are the CPU's.
TEST(Hexagon, DecodeGraphsShareThePromptGraphsWeights) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const auto device = HexagonDevice::open(library, *hexagon_chip("v81"));
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const auto cpu = load_model(fixture(name));
    const ModelConfig& c = cpu->config();
    const std::vector<int32_t> prompt = long_prompt(130, c.vocab_size);
    const std::vector<int32_t> want = greedy_reply(*cpu, prompt, 4);
    int64_t bytes[2] = {};
    for (const bool decode : {false, true}) {
      HexagonBackendOptions options;
      options.decode = decode;
      const auto backend = std::make_shared<HexagonBackend>(device, options);
      const auto model = load_model(fixture(name), {.devices = {backend}});
      EXPECT_EQ(greedy_reply(*model, prompt, 4), want);
      EXPECT_EQ(backend->chunks_run(), 1);
      EXPECT_EQ(backend->decode_steps(), decode ? 3 : 0);
      for (const NpuPackContext& context : backend->export_contexts()) {
        int64_t shared = 0;  // the context's one buffer of shared weights, as each graph says
        for (const auto& g : read_binary_info(*library, context.binary).graphs) {
          bytes[decode] += g.const_bytes;
          shared = std::max(shared, g.shared_weight_bytes);
        }
        bytes[decode] += shared;
      }
    }
    // (Measured: 143,360 bytes of constants, 158,464 with the decode graphs; 1,155,072 and
    // 1,183,744 — a second copy would add as much again.)
    const int64_t lm_head = c.vocab_size * c.hidden_size * 2;  // fp16
    EXPECT_LT(bytes[1] - bytes[0], lm_head + bytes[0] / 4)
        << bytes[0] << " bytes of constants in the prompt graphs, " << bytes[1]
        << " with the decode graphs";
  }
}

// Shards: the same decode graphs cut into many contexts by a small per-context budget (as a model
// too large for one context is cut, in layer order: each context holds the graphs of a range of
// layers, the residual stream passing between them through the host) give the logits of one
// context to the bit.
TEST(Hexagon, DecodeGraphsInManyContextsGiveTheBitsOfOne) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const auto device = HexagonDevice::open(library, *hexagon_chip("v81"));
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    std::vector<std::vector<float>> logits[2];
    std::shared_ptr<HexagonBackend> backends[2];
    int64_t contexts[2] = {};
    for (const int shards : {0, 1}) {
      HexagonBackendOptions options;
      options.decode = true;
      if (shards == 1) options.context_budget_bytes = 16 << 10;
      backends[shards] = std::make_shared<HexagonBackend>(device, options);
      const auto model = load_model(fixture(name), {.devices = {backends[shards]}});
      const std::vector<int32_t> prompt = long_prompt(130, model->config().vocab_size);
      auto state = model->new_state();
      std::vector<float>& first = logits[shards].emplace_back();
      model->forward(prompt, *state, LogitsFor::kLastToken, first);
      for (int32_t step = 0; step < 4; ++step) {
        const int32_t id = 5 + 7 * step;
        model->forward(std::span(&id, 1), *state, LogitsFor::kLastToken,
                       logits[shards].emplace_back());
      }
      EXPECT_EQ(model->device_failures(), 0);
      EXPECT_EQ(backends[shards]->decode_steps(), 4);
      contexts[shards] = backends[shards]->contexts();
    }
    EXPECT_EQ(contexts[0], 1);
    EXPECT_GT(contexts[1], 3);
    EXPECT_EQ(logits[1], logits[0]);
  }
}

// The check before use compares the NPU with the CPU on prompts long enough to reach it: an
// honest one passes, one whose graphs return wrong numbers (the test switch) is refused and the
// CPU takes over.
TEST(Hexagon, TheCheckBeforeUsePassesTheNpuAndRefusesAPerturbedGraph) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const auto device = HexagonDevice::open(library, *hexagon_chip("v75"));
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    DeviceCheckOptions options;
    options.mode = DeviceCheckMode::kAlways;
    const auto backend = std::make_shared<HexagonBackend>(device);
    const auto honest = load_model(fixture(name), {.devices = {backend}});
    const DeviceCheckResult passed = check_devices(*honest, backend->name(), nullptr, options);
    EXPECT_TRUE(passed.passed) << passed.summary;
    EXPECT_GT(backend->chunks_run(), 0);  // the check reached the NPU
    HexagonBackendOptions perturbed;
    perturbed.perturb_op = "silu_mul";
    const auto wrong = load_model(
        fixture(name), {.devices = {std::make_shared<HexagonBackend>(device, perturbed)}});
    const DeviceCheckResult refused = check_devices(*wrong, "perturbed", nullptr, options);
    EXPECT_FALSE(refused.passed);
    EXPECT_NE(refused.summary.find("disagrees with the CPU"), std::string::npos) << refused.summary;
    EXPECT_FALSE(wrong->devices_enabled());
  }
}

// A graph execution that fails (the fault-injection switch: the first, a middle and the last of
// an uninterrupted reply's) costs the reply nothing: the CPU redoes that chunk from the state it
// started from and the reply goes on with the same tokens.
TEST(Hexagon, AFailedGraphExecutionIsRedoneByTheCpuWithTheSameTokens) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const auto device = HexagonDevice::open(library, *hexagon_chip("v81"));
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const auto cpu = load_model(fixture(name));
    const std::vector<int32_t> prompt = long_prompt(300, cpu->config().vocab_size);
    const std::vector<int32_t> want = greedy_reply(*cpu, prompt, 6);
    const auto counting = std::make_shared<HexagonBackend>(device);
    EXPECT_EQ(greedy_reply(*load_model(fixture(name), {.devices = {counting}}), prompt, 6), want);
    const int64_t total = counting->graphs_executed();
    ASSERT_GE(total, 3);
    for (const int64_t n : {int64_t{1}, (total + 1) / 2, total}) {
      SCOPED_TRACE("failing execution " + std::to_string(n));
      HexagonBackendOptions options;
      options.fail_execution = n;
      const auto model = load_model(
          fixture(name), {.devices = {std::make_shared<HexagonBackend>(device, options)}});
      EXPECT_EQ(greedy_reply(*model, prompt, 6), want);
      EXPECT_EQ(model->device_failures(), 1);
      EXPECT_FALSE(model->devices_enabled());
      EXPECT_NE(model->device_failure().find("QHX_HEXAGON_FAIL_EXECUTION"), std::string::npos);
    }
  }
}

// Two devices in one model: prompt chunks on the NPU, every reply token on a GPU (lavapipe in
// CI), the states in the GPU's memory (the NPU computes none), the same greedy tokens as the CPU;
// also with the GPU keeping the states in private memory across passes, as a discrete GPU does
// (the NPU has no say in whether states are kept). Two decoding devices are refused.
TEST(HexagonAndVulkan, PromptChunksOnTheNpuRepliesOnTheGpuInOneModel) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  DeviceChoice choice;
  choice.prefill = parse_device_name("hexagon:v81", "--device");
  choice.decode = parse_device_name("vulkan", "--decode-device");
  for (const bool private_states : {false, true}) {
    SCOPED_TRACE(private_states ? "private states" : "shared states");
    if (private_states) setenv("QHX_VULKAN_PRIVATE_STATES", "1", 1);
    const OpenedDevices opened = open_devices(choice);
    unsetenv("QHX_VULKAN_PRIVATE_STATES");
    if (opened.backends.size() < 2) {
      if (std::getenv("QHX_REQUIRE_VULKAN") != nullptr) FAIL() << opened.note;
      GTEST_SKIP() << opened.note;
    }
    EXPECT_EQ(opened.prefill.text(), "hexagon:v81");
    EXPECT_EQ(opened.decode.text(), "vulkan:0");
    EXPECT_NE(devices_name(opened).find(" + vulkan:0"), std::string::npos) << devices_name(opened);
    const auto* npu = dynamic_cast<const HexagonBackend*>(opened.backends[0].get());
    ASSERT_NE(npu, nullptr);
    for (const char* name : kFixtures) {
      SCOPED_TRACE(name);
      const auto cpu = load_model(fixture(name));
      const std::vector<int32_t> prompt = long_prompt(300, cpu->config().vocab_size);
      const std::vector<int32_t> want = greedy_reply(*cpu, prompt, 6);
      const auto both = load_model(fixture(name), {.devices = opened.backends});
      const int64_t chunks = npu->chunks_run();
      // Two turns: the second reads its prompt from the states the first reply left (kept on
      // the GPU between passes when private).
      Session session(*both);
      TurnOptions turn;
      turn.max_new_tokens = 6;
      std::vector<int32_t> history = prompt;
      for (int t = 0; t < 2; ++t) {
        std::vector<int32_t> reply;
        session.generate(history, turn, [&](int32_t id) {
          reply.push_back(id);
          return true;
        });
        if (t == 0) {
          EXPECT_EQ(reply, want);
        }
        history.insert(history.end(), reply.begin(), reply.end());
        history.insert(history.end(), prompt.begin(), prompt.begin() + 130);
      }
      // 256 of the first prompt's 300 tokens; 128 of the second turn's 130 (after the reply's).
      EXPECT_EQ(npu->chunks_run() - chunks, 3);
      // Every pass touched a device: the prompt's (NPU and GPU) and the reply's steps (the GPU).
      EXPECT_GE(both->device_traffic().passes, 2 * (1 + 5));
      EXPECT_EQ(both->device_failures(), 0) << both->device_failure();
    }
  }
  for (const auto& [prefill, decode, why] :
       {std::tuple{"vulkan", "hexagon:v81", "a device that decodes takes both"},
        std::tuple{"vulkan", "vulkan:1", "one device of a kind takes both"},
        std::tuple{"hexagon:v79", "hexagon:v81", "one device of a kind takes both"}}) {
    choice.prefill = parse_device_name(prefill, "--device");
    choice.decode = parse_device_name(decode, "--decode-device");
    try {
      open_devices(choice);
      ADD_FAILURE() << prefill << " then " << decode << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

// A W8 bundle of a fixture (unless said), and an NPU pack of it (for v75 and v81 unless said).
struct PackedFixture {
  test::TempDir dir;
  fs::path bundle = dir.path() / "bundle", pack = dir.path() / "pack";
  std::vector<NpuPackChipReport> reports;
  explicit PackedFixture(const char* name, int64_t budget = 0,
                         std::vector<std::string> chips = {"v75", "v81"},
                         NpuPackOptions options = {}, DType weights = DType::kW8) {
    ConvertOptions convert;
    convert.weights = weights;
    convert.int8_activations = false;  // the CPU in float, as the NPU in fp16 (HexagonCli says why)
    convert.gate = false;
    forge_convert(fixture(name), bundle, convert);
    options.context_budget_bytes = budget;
    options.chips = std::move(chips);
    reports = forge_npu_pack(bundle, pack, options);
  }
};

std::shared_ptr<HexagonBackend> from_pack(const std::shared_ptr<const QnnLibrary>& library,
                                          const fs::path& pack, const fs::path& base, int arch,
                                          bool decode = false) {
  const NpuPackManifest m = read_npu_pack(pack);
  HexagonBackendOptions options;  // the pack's form and ranges, as hexagon_factory.cc sets them
  options.form = m.form;
  options.ranges = m.ranges;
  options.decode = decode;
  return std::make_shared<HexagonBackend>(
      HexagonDevice::open(library, *hexagon_chip(std::to_string(arch))), options,
      load_npu_pack_chip(pack, base, arch, decode));
}

// The 16-bit forms: packs calibrated on token sequences (the fixtures have no tokenizer), gated
// at their form's thresholds, their ranges in the manifest, loading with them and reading
// prompts on the NPU without compiling (w4a16 compiles them: QNN crashes running some of them
// loaded from a binary); a 16-bit form without calibration is refused. w4a16 pairs
// with a W4 bundle here: 4-bit weights of a random tiny model fail the gate against its float
// self (the CPU's own W4: top-1 0.63), against its W4 self they must agree.
TEST(HexagonPack, W8A16AndW4A16PacksAreCalibratedGatedAndLoad) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const char* name = kFixtures[1];  // Qwen3.5: attention and Gated DeltaNet layers
  const auto base = load_model(fixture(name));
  const int64_t vocab = base->config().vocab_size;
  for (const NpuForm form : {NpuForm::kW8A16, NpuForm::kW4A16}) {
    SCOPED_TRACE(npu_form_name(form));
    NpuPackOptions options;
    options.form = form;
    options.calibration_ids = {long_prompt(400, vocab), long_prompt(200, vocab / 2)};
    const PackedFixture packed(name, 0, {"v81"}, options,
                               form == NpuForm::kW8A16 ? DType::kW8 : DType::kW4);
    const NpuPackManifest m = read_npu_pack(packed.pack);
    EXPECT_EQ(m.form, form);
    EXPECT_EQ(m.calibration_tokens, 600);
    ASSERT_FALSE(m.ranges.empty());
    for (const auto& [weight, r] : m.ranges) {
      EXPECT_LT(r.in.lo, 0) << weight;
      EXPECT_GT(r.in.hi, 0) << weight;
      EXPECT_LT(r.out.lo, r.out.hi) << weight;
    }
    ASSERT_EQ(m.chips.size(), 1u);
    EXPECT_NE(m.chips[0].gate.find("agrees with the CPU"), std::string::npos) << m.chips[0].gate;
    const auto backend = from_pack(library, packed.pack, packed.bundle, 81);
    EXPECT_EQ(backend->computes_weights_as(), form == NpuForm::kW8A16 ? DType::kW8 : DType::kW4);
    EXPECT_NE(backend->name().find(npu_form_name(form)), std::string::npos) << backend->name();
    const auto npu = load_model(packed.bundle, {.devices = {backend}});
    const std::vector<int32_t> prompt = long_prompt(300, vocab);
    EXPECT_EQ(greedy_reply(*npu, prompt, 4).size(), 4u);
    EXPECT_EQ(backend->chunks_run(), 2);
    if (form == NpuForm::kW8A16) {
      EXPECT_EQ(backend->graphs_compiled(), 0) << "a prompt graph was not in the pack";
      EXPECT_GT(backend->graphs_from_pack(), 0);
    } else {  // compiled where they run (docs/hexagon.md): the pack holds no binary
      EXPECT_TRUE(m.chips[0].files.empty());
      EXPECT_GT(backend->graphs_compiled(), 0);
    }
  }
  NpuPackOptions uncalibrated;
  uncalibrated.form = NpuForm::kW8A16;
  try {
    const PackedFixture packed(name, 0, {"v81"}, uncalibrated);
    ADD_FAILURE() << "a w8a16 pack without calibration was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--calibrate"), std::string::npos) << e.what();
  }
}

// What forge npu measured goes into the manifest, per way the pack runs (prompts on the NPU;
// with decode, the replies too), on the check's probes and on a suite of the user's prompts;
// the card is rendered from the manifest alone. A manifest whose figures do not add up is
// refused in one line.
TEST(HexagonPack, TheAcceptanceOfEachWayItRunsIsInTheManifestAndTheCard) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const char* name = kFixtures[1];
  const int64_t vocab = load_model(fixture(name))->config().vocab_size;
  NpuPackOptions options;
  options.form = NpuForm::kW8A16;
  options.calibration_ids = {long_prompt(400, vocab)};
  options.suite = {{"a", long_prompt(150, vocab), {}}, {"b", long_prompt(140, vocab / 3), {}}};
  options.suite_name = "two prompts";
  options.suite_tokens = 4;
  options.decode = true;
  const PackedFixture packed(name, 0, {"v81"}, options);
  const NpuPackManifest m = read_npu_pack(packed.pack);
  ASSERT_EQ(m.chips.size(), 1u);
  const std::vector<NpuAcceptance>& a = m.chips[0].acceptance;
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(describe_acceptance(a[i]));
    EXPECT_EQ(a[i].replies, i >= 2);
    EXPECT_EQ(a[i].suite, i % 2 == 0 ? "probes" : "two prompts");
    EXPECT_EQ(a[i].prompts, i % 2 == 0 ? 3 : 2);
    EXPECT_EQ(a[i].greedy_tokens, i % 2 == 0 ? 8 : 4);
    EXPECT_EQ(static_cast<int64_t>(a[i].first_divergence.size()), a[i].prompts);
    EXPECT_GT(a[i].top1, 0.9);
    EXPECT_GT(a[i].pearson_min, 0.99);
    // The probes passed the check; a suite's figures are recorded, not judged.
    if (i % 2 == 0) {
      EXPECT_TRUE(a[i].passed);
    }
  }
  EXPECT_EQ(packed.reports[0].acceptance.size(), 4u);
  std::ifstream in(packed.pack / "README.md");
  const std::string card((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(card, render_npu_pack_card(m));
  for (const std::string& says :
       {m.chips[0].files[0].sha256, std::string("| v81 | prompts and replies | two prompts (2) |"),
        m.qnn_build, std::string("w8a16")}) {
    EXPECT_NE(card.find(says), std::string::npos) << says << "\n" << card;
  }

  Json manifest = read_json_file(packed.pack / "MANIFEST.json");
  manifest["chips"][0]["acceptance"][3]["kl_mean"] = nullptr;  // as a non-finite KL is written
  std::ofstream(packed.pack / "MANIFEST.json") << manifest.dump();
  EXPECT_TRUE(std::isnan(read_npu_pack(packed.pack).chips[0].acceptance[3].kl_mean));
  manifest["chips"][0]["acceptance"][1]["greedy_identical"] = 3;  // of 2 prompts
  std::ofstream(packed.pack / "MANIFEST.json") << manifest.dump();
  try {
    read_npu_pack(packed.pack);
    ADD_FAILURE() << "3 of 2 prompts identical was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chips[0]: acceptance[1]"), std::string::npos) << e.what();
  }
}

// forge npu --no-check compiles the graphs without running them (a layout run): the manifest
// says it was not compared and records no acceptance, and the graphs are the real ones.
TEST(HexagonPack, UncheckedPacksAreCompiledNotRunAndSaySo) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  NpuPackOptions options;
  options.check = false;
  const PackedFixture packed(kFixtures[0], 0, {"v81"}, options);
  const NpuPackManifest m = read_npu_pack(packed.pack);
  EXPECT_NE(m.chips[0].gate.find("never run (forge npu --no-check)"), std::string::npos)
      << m.chips[0].gate;
  EXPECT_TRUE(m.chips[0].acceptance.empty());
  const auto cpu = load_model(packed.bundle);
  const std::vector<int32_t> prompt = long_prompt(260, cpu->config().vocab_size);
  const auto backend = from_pack(library, packed.pack, packed.bundle, 81);
  EXPECT_EQ(greedy_reply(*load_model(packed.bundle, {.devices = {backend}}), prompt, 4),
            greedy_reply(*cpu, prompt, 4));
  EXPECT_EQ(backend->graphs_compiled(), 0);
  EXPECT_EQ(backend->chunks_run(), 2);
}

// qhx forge npu: a pack for two chips whose graphs load instead of compiling, with the tokens of
// graphs compiled on first use (the CPU's), its manifest recording what the binaries say.
TEST(HexagonPack, LoadsInsteadOfCompilingAndGivesTheSameTokens) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const PackedFixture packed(name);
    const NpuPackManifest m = read_npu_pack(packed.pack);
    ASSERT_EQ(m.chips.size(), 2u);
    EXPECT_EQ(m.base_manifest_sha256, npu_pack_base_id(packed.bundle));
    EXPECT_EQ(m.qnn_build, library->build_id());
    for (const NpuPackChip& chip : m.chips) {
      EXPECT_NE(chip.gate.find("agrees with the CPU"), std::string::npos) << chip.gate;
      ASSERT_FALSE(chip.files.empty());
      for (const NpuPackFile& f : chip.files) {
        ASSERT_FALSE(f.graphs.empty());
        for (const NpuPackGraph& g : f.graphs) EXPECT_GT(g.const_bytes, 0) << g.key;
      }
    }
    EXPECT_EQ(verify_npu_pack(packed.pack), 2);
    const auto cpu = load_model(packed.bundle);
    const std::vector<int32_t> prompt = long_prompt(300, cpu->config().vocab_size);
    const std::vector<int32_t> want = greedy_reply(*cpu, prompt, 6);
    for (const int arch : {75, 81}) {
      const auto backend = from_pack(library, packed.pack, packed.bundle, arch);
      EXPECT_GT(backend->graphs_from_pack(), 0);
      // What memory admission counts: the binaries it loaded, in the host's RAM.
      const NpuPackChip& chip = *std::find_if(m.chips.begin(), m.chips.end(),
                                              [&](const NpuPackChip& c) { return c.arch == arch; });
      EXPECT_EQ(backend->weight_memory().host_copied_bytes, chip.bytes());
      const auto npu = load_model(packed.bundle, {.devices = {backend}});
      EXPECT_EQ(greedy_reply(*npu, prompt, 6), want);
      EXPECT_EQ(backend->chunks_run(), 2);
      EXPECT_EQ(backend->graphs_compiled(), 0) << "a prompt graph was not in the pack";
    }
  }
}

// forge npu --decode packs the decode steps' graphs in contexts of their own: a run decoding on
// the NPU loads them and compiles nothing (attention's graphs of every cache length up to
// --decode-context among them), with the tokens of decode graphs compiled at load; a run whose
// CPU decodes leaves them unloaded. On both fixtures: attention, and the conv and delta rule.
TEST(HexagonPack, DecodeGraphsComeFromThePackAndLoadOnlyToDecode) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const auto device = HexagonDevice::open(library, *hexagon_chip("v81"));
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    NpuPackOptions options;
    options.decode = true;
    options.decode_context = 512;
    options.check = false;  // (the acceptance with replies is HexagonPack.TheAcceptance...'s)
    const PackedFixture packed(name, 0, {"v81"}, options);
    const NpuPackManifest m = read_npu_pack(packed.pack);
    ASSERT_EQ(m.chips.size(), 1u);
    int64_t decode_files = 0, attention_lengths = 0;
    for (const NpuPackFile& f : m.chips[0].files) {
      if (!f.decode) continue;
      ++decode_files;
      EXPECT_NE(f.path.find("/decode_"), std::string::npos) << f.path;
      for (const NpuPackGraph& g : f.graphs) attention_lengths += g.key.starts_with("attention");
    }
    EXPECT_EQ(decode_files, packed.reports[0].decode_contexts);
    ASSERT_GT(decode_files, 0);
    EXPECT_EQ(attention_lengths, 3);  // 128, 256, 512 (one attention shape per fixture)
    EXPECT_EQ(
        static_cast<int64_t>(load_npu_pack_chip(packed.pack, packed.bundle, 81, false).size()),
        packed.reports[0].contexts);

    const auto cpu = load_model(packed.bundle);
    const std::vector<int32_t> prompt = long_prompt(300, cpu->config().vocab_size);
    HexagonBackendOptions decoding;
    decoding.decode = true;
    const auto compiled = std::make_shared<HexagonBackend>(device, decoding);
    const std::vector<int32_t> want =
        greedy_reply(*load_model(packed.bundle, {.devices = {compiled}}), prompt, 6);
    EXPECT_EQ(want, greedy_reply(*cpu, prompt, 6));
    const auto backend = from_pack(library, packed.pack, packed.bundle, 81, true);
    EXPECT_EQ(backend->contexts(), packed.reports[0].contexts + decode_files);
    const auto npu = load_model(packed.bundle, {.devices = {backend}});
    EXPECT_EQ(greedy_reply(*npu, prompt, 6), want);
    EXPECT_EQ(backend->decode_steps(), 5);
    EXPECT_EQ(backend->chunks_run(), 2);
    EXPECT_EQ(npu->device_failures(), 0);
    EXPECT_EQ(backend->graphs_compiled(), 0) << "a decode graph was not in the pack";
    // Memory admission: both sets of binaries (the decode graphs hold the layers again).
    EXPECT_EQ(backend->weight_memory().host_copied_bytes, m.chips[0].bytes());
  }
}

// A pack is refused by name, never used quietly: one made from another bundle, one without the
// chip's folder, one whose binary changed; through open_devices too (not a fall back to the CPU).
TEST(HexagonPack, RefusesAnotherBaseAnAbsentChipAndATamperedBinary) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const PackedFixture packed(kFixtures[0]);
  const test::TempDir other;
  ConvertOptions convert;
  convert.weights = DType::kW8;
  convert.gate = false;
  forge_convert(fixture(kFixtures[1]), other.path() / "bundle", convert);
  const auto refused = [&](const fs::path& pack, const fs::path& base, int arch) {
    try {
      load_npu_pack_chip(pack, base, arch);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  EXPECT_NE(refused(packed.pack, other.path() / "bundle", 81).find("made from another base"),
            std::string::npos);
  EXPECT_NE(refused(packed.pack, packed.bundle, 79).find("has no graphs for hexagon:v79"),
            std::string::npos);
  {
    std::fstream f(packed.pack / "v81/context_0.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4000);
    f.put('\x5a');
  }
  EXPECT_NE(refused(packed.pack, packed.bundle, 81).find("context_0.bin: sha256 differs"),
            std::string::npos);
  EXPECT_EQ(refused(packed.pack, packed.bundle, 75), "loaded");  // the other chip's is intact
  // MANIFEST.json itself is hashed by nothing: a graph naming a value its run does not have is
  // not run (its run goes to the CPU; runs placed anew around it compile as without a pack),
  // never bound to memory outside the run.
  {
    const fs::path manifest = packed.pack / "MANIFEST.json";
    Json m = read_json_file(manifest);
    for (Json& chip : m["chips"]) {
      for (Json& f : chip["files"]) {
        for (Json& g : f["graphs"]) g["inputs"][0] = 999;
      }
    }
    std::ofstream(manifest) << m.dump();
    const auto cpu = load_model(packed.bundle);
    const std::vector<int32_t> prompt = long_prompt(260, cpu->config().vocab_size);
    const auto backend = from_pack(library, packed.pack, packed.bundle, 75);
    EXPECT_EQ(greedy_reply(*load_model(packed.bundle, {.devices = {backend}}), prompt, 4),
              greedy_reply(*cpu, prompt, 4));
  }
  DeviceChoice choice;
  choice.prefill = parse_device_name("hexagon:v81", "device");
  choice.settings = {{"npu_pack", packed.pack.string()}, {"model", packed.bundle.string()}};
  EXPECT_THROW(open_devices(choice), DeviceSettingError);
}

// A pack over the per-context budget is split into contexts that each stay within it (their
// sizes from the binaries' own fields), and runs as one.
TEST(HexagonPack, ContextsStayWithinTheBudget) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const PackedFixture whole(kFixtures[1], 0, {"v81"});
  int64_t largest = 0, total = 0;
  const NpuPackManifest one = read_npu_pack(whole.pack);
  for (const NpuPackFile& f : one.chips[0].files) {
    for (const NpuPackGraph& g : f.graphs) {
      largest = std::max(largest, g.const_bytes);
      total += g.const_bytes;
    }
  }
  const int64_t budget = std::max(largest * 3 / 2, total / 3);
  const PackedFixture split(kFixtures[1], budget, {"v81"});
  const NpuPackManifest m = read_npu_pack(split.pack);
  for (const NpuPackChip& chip : m.chips) {
    EXPECT_GE(chip.files.size(), 2u);
    for (const NpuPackFile& f : chip.files) {
      int64_t bytes = 0;
      for (const NpuPackGraph& g : f.graphs) bytes += g.const_bytes;
      EXPECT_LE(bytes, budget) << f.path;
    }
  }
  EXPECT_EQ(m.context_budget_bytes, budget);
  const auto backend = from_pack(library, split.pack, split.bundle, 81);
  EXPECT_GE(backend->contexts(), 2);
  const auto cpu = load_model(split.bundle);
  const std::vector<int32_t> prompt = long_prompt(260, cpu->config().vocab_size);
  EXPECT_EQ(greedy_reply(*load_model(split.bundle, {.devices = {backend}}), prompt, 4),
            greedy_reply(*cpu, prompt, 4));
  EXPECT_EQ(backend->graphs_compiled(), 0);
}

// The command line, as a user meets it: qhx devices lists the NPU, forge npu and verify make and
// check a pack, generate reads the prompt's chunks on the NPU and prints the CPU's one line of
// ids, saying how many prompt tokens ran there; contradictions are one-line errors.
TEST(HexagonCli, ForgeVerifyAndGenerateWithAPack) {
  QHX_QNN_LIBRARY_OR_SKIP(library);
  const test::TempDir dir;
  const test::TempDir cache;
  ::setenv("QHX_CACHE_DIR", cache.path().c_str(), 1);
  const test::CliRun devices = test::run_qhx("devices");
  ASSERT_EQ(devices.exit_code, 0) << devices.err;
  EXPECT_NE(devices.out.find("hexagon:v73|v75|v79|v81"), std::string::npos) << devices.out;
  EXPECT_NE(devices.out.find(library->build_id()), std::string::npos) << devices.out;
  const fs::path bundle = dir.path() / "bundle", pack = dir.path() / "pack";
  const test::CliRun convert =
      test::run_qhx("forge convert " + fixture(kFixtures[1]).string() + " -o " + bundle.string() +
                    " --weights w8 --activations f32 --no-gate");
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  const test::CliRun forged =
      test::run_qhx("forge npu " + bundle.string() + " --chips v75,v81 -o " + pack.string());
  ASSERT_EQ(forged.exit_code, 0) << forged.err;
  EXPECT_NE(forged.err.find("v81 fp16: "), std::string::npos) << forged.err;
  EXPECT_NE(forged.err.find("prompts on the NPU, probes: top-1 "), std::string::npos) << forged.err;
  std::ifstream card(pack / "README.md");
  const std::string card_text((std::istreambuf_iterator<char>(card)),
                              std::istreambuf_iterator<char>());
  EXPECT_NE(card_text.find("| v75 | prompts | probes (3) |"), std::string::npos) << card_text;
  const test::CliRun verified = test::run_qhx("verify " + pack.string());
  ASSERT_EQ(verified.exit_code, 0) << verified.err;
  EXPECT_NE(verified.out.find("NPU pack"), std::string::npos) << verified.out;

  std::string ids;
  // (The CPU multiplies the W8 matrices by float activations here, as the NPU does in fp16; with
  // int8 activations a random tiny model's flat logits may tie-break differently.)
  const int64_t vocab = load_model(fixture(kFixtures[1]))->config().vocab_size;
  for (const int32_t id : long_prompt(300, vocab)) {
    ids += (ids.empty() ? "" : ",") + std::to_string(id);
  }
  const std::string run =
      "generate --model " + bundle.string() + " --prompt-ids " + ids + " -n 6 --greedy --print-ids";
  const test::CliRun cpu = test::run_qhx(run);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  ASSERT_EQ(std::count(cpu.out.begin(), cpu.out.end(), '\n'), 1) << cpu.out;
  const test::CliRun npu = test::run_qhx(run + " --device hexagon:v81 --npu-pack " + pack.string());
  ASSERT_EQ(npu.exit_code, 0) << npu.err;
  EXPECT_EQ(npu.out, cpu.out);
  EXPECT_NE(npu.err.find("256 prompt tokens on hexagon:v81"), std::string::npos) << npu.err;
  EXPECT_NE(npu.err.find("from the pack's 1 context(s)"), std::string::npos) << npu.err;
  EXPECT_NE(npu.err.find("agrees with the CPU"), std::string::npos) << npu.err;

  // Decoding on the NPU too: its kind alone names the prompt's device.
  const test::CliRun decoding = test::run_qhx(
      run + " --device hexagon:v81 --decode-device hexagon --npu-pack " + pack.string());
  ASSERT_EQ(decoding.exit_code, 0) << decoding.err;
  EXPECT_EQ(decoding.out, cpu.out);
  EXPECT_NE(decoding.err.find("agrees with the CPU"), std::string::npos) << decoding.err;

  for (const std::string& wrong :
       {" --npu-pack " + pack.string(), " --device hexagon:v79 --npu-pack " + pack.string()}) {
    const test::CliRun r = test::run_qhx(run + wrong);
    EXPECT_EQ(r.exit_code, 1) << wrong;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  const test::CliRun packed =
      test::run_qhx("pack -o " + (dir.path() / "p2").string() + " " + pack.string());
  EXPECT_NE(packed.exit_code, 0);
  EXPECT_NE(packed.err.find("an NPU pack"), std::string::npos) << packed.err;
  ::unsetenv("QHX_CACHE_DIR");
}

}  // namespace
}  // namespace qhx
