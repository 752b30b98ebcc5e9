#include "models/vision_tower.h"

#include <algorithm>
#include <cmath>

#include "models/blocks.h"
#include "models/weights.h"
#include "util/error.h"

namespace qhx {
namespace {

void add_matmul_bias(Plan& plan, ValueId in, int64_t rows, const MatrixRef& w,
                     const WeightVector& bias, ValueId out) {
  Node& m = plan.add(Op::kMatmul);
  m.in[0] = {in};
  m.out = {out};
  m.rows = rows;
  m.matrix = &w;
  Node& b = plan.add(Op::kAddBias);
  b.out = {out};
  b.rows = rows;
  b.vector = &bias;
}

void add_layer_norm(Plan& plan, ValueId in, int64_t rows, int64_t width, const WeightVector& w,
                    const WeightVector& b, ValueId out) {
  Node& n = plan.add(Op::kLayerNorm);
  n.in[0] = {in};
  n.out = {out};
  n.rows = rows;
  n.width = width;
  n.vector = &w;
  n.vector2 = &b;
  n.eps = 1e-6f;
}

void add_sum(Plan& plan, ValueId sum, int64_t rows, ValueId term) {
  Node& n = plan.add(Op::kAdd);
  n.in[0] = {term};
  n.out = {sum};
  n.rows = rows;
}

}  // namespace

VisionTower::VisionTower(const VisionConfig& config, const Checkpoint& checkpoint,
                         CpuContext& context, std::shared_ptr<Backend> cpu, bool int8_activations)
    : config_(config),
      runner_(
          context, {std::move(cpu)}, [this](const PlanKey& key) { return build(key.n_tokens); },
          PlanKey{4, 0}) {
  const VisionConfig& c = config_;
  const WeightReader r(checkpoint, "model.visual.", int8_activations);
  const int64_t H = c.hidden_size, I = c.intermediate_size, p = c.patch_size;
  const int64_t merged = H * c.spatial_merge_size * c.spatial_merge_size;
  // The Conv3d's kernel [H, C, T, p, p] is a matrix over the patch's values in their order.
  const TensorView& conv = checkpoint.require("model.visual.patch_embed.proj.weight",
                                              {H, c.in_channels, c.temporal_patch_size, p, p});
  patch_embed_ = MatrixRef{conv.dtype, conv.data, H, c.patch_values()};
  patch_embed_.scales = conv.scales;
  patch_embed_.group_size = conv.group_size;
  patch_embed_.buffer = conv.buffer;
  patch_bias_ = r.f32("patch_embed.proj.bias", {H});
  position_table_ = r.f32("pos_embed.weight", {c.num_position_embeddings, H});
  side_ =
      static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(c.num_position_embeddings))));
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    Block k;
    k.norm1 = r.f32(b + "norm1.weight", {H});
    k.norm1_bias = r.f32(b + "norm1.bias", {H});
    k.norm2 = r.f32(b + "norm2.weight", {H});
    k.norm2_bias = r.f32(b + "norm2.bias", {H});
    k.qkv = r.matrix(b + "attn.qkv.weight", 3 * H, H);
    k.qkv_bias = r.f32(b + "attn.qkv.bias", {3 * H});
    k.proj = r.matrix(b + "attn.proj.weight", H, H);
    k.proj_bias = r.f32(b + "attn.proj.bias", {H});
    k.fc1 = r.matrix(b + "mlp.linear_fc1.weight", I, H);
    k.fc1_bias = r.f32(b + "mlp.linear_fc1.bias", {I});
    k.fc2 = r.matrix(b + "mlp.linear_fc2.weight", H, I);
    k.fc2_bias = r.f32(b + "mlp.linear_fc2.bias", {H});
    blocks_.push_back(std::move(k));
  }
  merger_norm_ = r.f32("merger.norm.weight", {H});
  merger_norm_bias_ = r.f32("merger.norm.bias", {H});
  merger_fc1_ = r.matrix("merger.linear_fc1.weight", merged, merged);
  merger_fc1_bias_ = r.f32("merger.linear_fc1.bias", {merged});
  merger_fc2_ = r.matrix("merger.linear_fc2.weight", c.out_hidden_size, merged);
  merger_fc2_bias_ = r.f32("merger.linear_fc2.bias", {c.out_hidden_size});
  // transformers' axial RoPE: head_dim/4 frequencies 1 / θ^(2i / (head_dim/2)), for the row's
  // position and again for the column's.
  std::vector<float> freqs = rope_inv_freq(c.rope_theta, c.head_dim() / 2);
  const size_t quarter = freqs.size();
  freqs.insert(freqs.end(), freqs.begin(), freqs.end());
  rope_axes_.assign(quarter, 1);
  rope_axes_.resize(2 * quarter, 2);
  rope_freqs_ = std::move(freqs);
  runner_.prepare_cpu_weights(weight_list());
}

VisionTower::~VisionTower() = default;

WeightList VisionTower::weight_list() {
  WeightList w;
  w.matrices = {&patch_embed_, &merger_fc1_, &merger_fc2_};
  w.vectors = {&patch_bias_,      &merger_norm_,     &merger_norm_bias_,
               &merger_fc1_bias_, &merger_fc2_bias_, &rope_freqs_};
  for (Block& b : blocks_) {
    for (MatrixRef* m : {&b.qkv, &b.proj, &b.fc1, &b.fc2}) w.matrices.push_back(m);
    for (WeightVector* v : {&b.norm1, &b.norm1_bias, &b.norm2, &b.norm2_bias, &b.qkv_bias,
                            &b.proj_bias, &b.fc1_bias, &b.fc2_bias}) {
      w.vectors.push_back(v);
    }
  }
  return w;
}

Plan VisionTower::build(int64_t n) const {
  const VisionConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim();
  const int64_t m2 = c.spatial_merge_size * c.spatial_merge_size, tokens = n / m2;
  Plan plan;
  plan.n_tokens = n;
  const ValueId out = plan.add_value(tokens, c.out_hidden_size, /*binding=*/0);
  const ValueId pixels = plan.add_value(n, c.patch_values(), /*binding=*/1);
  const ValueId positions = plan.add_value(n, H, /*binding=*/2);
  const ValueId h = plan.add_value(n, H), x = plan.add_value(n, H), y = plan.add_value(n, H);
  const ValueId qkv = plan.add_value(n, 3 * H), mid = plan.add_value(n, I);
  const ValueId q = plan.add_value(n, H), k = plan.add_value(n, H), v = plan.add_value(n, H);
  // h = patch_embed(pixels) + the resampled position table.
  add_matmul_bias(plan, pixels, n, patch_embed_, patch_bias_, h);
  add_sum(plan, h, n, positions);
  for (const Block& b : blocks_) {
    // h += proj(attention(rope(q), rope(k), v)) of LN1(h).
    add_layer_norm(plan, h, n, H, b.norm1, b.norm1_bias, x);
    add_matmul_bias(plan, x, n, b.qkv, b.qkv_bias, qkv);
    for (int part = 0; part < 3; ++part) {
      Node& split = plan.add(Op::kCopyColumns);
      split.in[0] = {qkv};
      split.out = {part == 0 ? q : part == 1 ? k : v};
      split.rows = n;
      split.offset = part * H;
    }
    for (const ValueId rotated : {q, k}) {
      add_rope(plan, rotated, hd, hd, rope_freqs_, rope_axes_.data());
    }
    Node& attention = plan.add(Op::kBidirectionalAttention);
    attention.in[0] = {q};
    attention.in[1] = {k};
    attention.in[2] = {v};
    attention.out = {x};
    attention.rows = n;
    attention.attention = {c.num_heads, c.num_heads, hd};
    attention.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    add_matmul_bias(plan, x, n, b.proj, b.proj_bias, y);
    add_sum(plan, h, n, y);
    // h += fc2(gelu(fc1(LN2(h)))).
    add_layer_norm(plan, h, n, H, b.norm2, b.norm2_bias, x);
    add_matmul_bias(plan, x, n, b.fc1, b.fc1_bias, mid);
    Node& act = plan.add(c.gelu_tanh ? Op::kGeluTanh : Op::kGelu);
    act.out = {mid};
    act.rows = n;
    add_matmul_bias(plan, mid, n, b.fc2, b.fc2_bias, y);
    add_sum(plan, h, n, y);
  }
  // The merger: LN of each patch into rows of merge² patches, fc1, GELU (erf), fc2.
  const ValueId merged = plan.add_value(tokens, m2 * H), hidden = plan.add_value(tokens, m2 * H);
  add_layer_norm(plan, h, tokens, H, merger_norm_, merger_norm_bias_, merged);
  add_matmul_bias(plan, merged, tokens, merger_fc1_, merger_fc1_bias_, hidden);
  Node& act = plan.add(Op::kGelu);
  act.out = {hidden};
  act.rows = tokens;
  add_matmul_bias(plan, hidden, tokens, merger_fc2_, merger_fc2_bias_, out);
  return plan;
}

std::vector<float> VisionTower::encode(const PixelValues& pixels) const {
  const VisionConfig& c = config_;
  const int64_t m = c.spatial_merge_size, H = c.hidden_size;
  const ImageGrid& g = pixels.grid;
  if (pixels.cols != c.patch_values() || g.h % m != 0 || g.w % m != 0 || g.t < 1 ||
      static_cast<int64_t>(pixels.values.size()) != g.patches() * pixels.cols) {
    fail("image", "its patches do not fit this vision tower (" + std::to_string(pixels.cols) +
                      " values a patch, grid " + std::to_string(g.h) + "x" + std::to_string(g.w) +
                      ")");
  }
  const int64_t n = g.patches(), tokens = g.tokens(m);
  // Each patch's (row, column) in merge-block order, repeated over the frames.
  std::vector<int32_t> positions(3 * n, 0);
  std::vector<float> table(n * H);
  const auto taps = [&](int64_t index, int64_t size, int64_t(&at)[2], float(&w)[2]) {
    // align_corners bilinear, in f32 as transformers' get_vision_interpolation_indices_and_weights
    const float src = static_cast<float>(index) * static_cast<float>(side_ - 1) /
                      static_cast<float>(std::max<int64_t>(size - 1, 1));
    const float floor = std::floor(src);
    for (int o = 0; o < 2; ++o) {
      at[o] = std::clamp(static_cast<int64_t>(floor) + o, int64_t{0}, side_ - 1);
      w[o] = std::max(1.0f - std::fabs(src - floor - static_cast<float>(o)), 0.0f);
    }
  };
  for (int64_t i = 0; i < n; ++i) {
    const int64_t within = i % (g.h * g.w);
    const int64_t block = within / (m * m), in_block = within % (m * m);
    const int64_t row = block / (g.w / m) * m + in_block / m;
    const int64_t col = block % (g.w / m) * m + in_block % m;
    positions[n + i] = static_cast<int32_t>(row);
    positions[2 * n + i] = static_cast<int32_t>(col);
    int64_t rh[2], cw[2];
    float wh[2], ww[2];
    taps(row, g.h, rh, wh);
    taps(col, g.w, cw, ww);
    float* dst = &table[i * H];
    for (int64_t d = 0; d < H; ++d) {
      float sum = 0.0f;
      for (int a = 0; a < 2; ++a) {
        for (int b = 0; b < 2; ++b) {
          sum += position_table_[(rh[a] * side_ + cw[b]) * H + d] * (wh[a] * ww[b]);
        }
      }
      dst[d] = sum;
    }
  }
  std::vector<float> features(tokens * c.out_hidden_size);
  BorrowedBuffer out(BufferKind::kHost, features.data(), features.size() * sizeof(float),
                     BorrowedBuffer::kWritable);
  BorrowedBuffer in(BufferKind::kHost, pixels.values.data(), pixels.values.size() * sizeof(float),
                    BorrowedBuffer::kReadOnly);
  BorrowedBuffer pos(BufferKind::kHost, table.data(), table.size() * sizeof(float),
                     BorrowedBuffer::kReadOnly);
  Buffer* const external[] = {&out, &in, &pos};
  Sequence none;
  runner_.run_on_cpu({}, {n, 0}, none, external, positions);
  return features;
}

}  // namespace qhx
