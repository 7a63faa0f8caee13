#include "models/vision_tower.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "nn/vision_ops.h"

namespace fab {
namespace {

std::string block_prefix(int64_t i) { return std::string(kVisionPrefix) + "blocks." + std::to_string(i) + "."; }

constexpr float kNormEps = 1e-6f;  // every norm of both towers (transformers hard-codes it)

Tensor arange(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::i64, MemoryCategory::activations);
  for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = i;
  return t;
}

Tensor index_tensor(const std::vector<int64_t>& values) {
  Tensor t = Tensor::empty({int64_t(values.size())}, DType::i64, MemoryCategory::activations);
  std::copy(values.begin(), values.end(), t.data<int64_t>());
  return t;
}

// Rows of x in the order `order` (out[i] = x[order[i]]; the gradient scatters back): the
// embedding op over x as the table.
Var gather_rows(Tape& tape, const Var& x, const std::vector<int64_t>& order) {
  return embedding(tape, index_tensor(order), x);
}

// Groups of `unit` consecutive rows taken in `group_order`: the row order.
std::vector<int64_t> rows_of_groups(const std::vector<int64_t>& group_order, int64_t unit) {
  std::vector<int64_t> rows;
  rows.reserve(group_order.size() * size_t(unit));
  for (int64_t g : group_order)
    for (int64_t r = 0; r < unit; ++r) rows.push_back(g * unit + r);
  return rows;
}

// The (t, h, w) of image i.
std::array<int64_t, 3> grid_of(const Tensor& grid_thw, int64_t i) {
  const int64_t* g = grid_thw.data<int64_t>() + 3 * i;
  return {g[0], g[1], g[2]};
}

// Every frame of every image is one attention segment (transformers' cu_seqlens).
std::vector<int64_t> frame_bounds(const Tensor& grid_thw) {
  std::vector<int64_t> bounds{0};
  for (int64_t i = 0; i < grid_thw.dim(0); ++i) {
    const auto [t, h, w] = grid_of(grid_thw, i);
    for (int64_t f = 0; f < t; ++f) bounds.push_back(bounds.back() + h * w);
  }
  return bounds;
}

}  // namespace

std::vector<VisionParam> vision_parameters(const VisionConfig& v) {
  const int64_t e = v.width, i = v.intermediate, merged = e * v.merge_unit();
  const std::string p = kVisionPrefix;
  std::vector<VisionParam> out;
  out.push_back({p + "patch_embed.proj.weight", {e, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size}});
  for (int64_t b = 0; b < v.depth; ++b) {
    const std::string q = block_prefix(b);
    for (const char* norm : {"norm1", "norm2"}) {
      out.push_back({q + norm + ".weight", {e}});
      if (!v.qwen2_5) out.push_back({q + norm + ".bias", {e}});
    }
    out.push_back({q + "attn.qkv.weight", {3 * e, e}});
    out.push_back({q + "attn.qkv.bias", {3 * e}});
    out.push_back({q + "attn.proj.weight", {e, e}});
    out.push_back({q + "attn.proj.bias", {e}});
    if (v.qwen2_5) {
      out.push_back({q + "mlp.gate_proj.weight", {i, e}});
      out.push_back({q + "mlp.up_proj.weight", {i, e}, true});
      out.push_back({q + "mlp.gate_proj.bias", {i}});
      out.push_back({q + "mlp.up_proj.bias", {i}, true});
      out.push_back({q + "mlp.down_proj.weight", {e, i}});
      out.push_back({q + "mlp.down_proj.bias", {e}});
    } else {
      out.push_back({q + "mlp.fc1.weight", {i, e}});
      out.push_back({q + "mlp.fc1.bias", {i}});
      out.push_back({q + "mlp.fc2.weight", {e, i}});
      out.push_back({q + "mlp.fc2.bias", {e}});
    }
  }
  const std::string m = kMergerPrefix;
  out.push_back({m + "ln_q.weight", {e}});
  if (!v.qwen2_5) out.push_back({m + "ln_q.bias", {e}});
  out.push_back({m + "mlp.0.weight", {merged, merged}});
  out.push_back({m + "mlp.0.bias", {merged}});
  out.push_back({m + "mlp.2.weight", {v.out_hidden_size, merged}});
  out.push_back({m + "mlp.2.bias", {v.out_hidden_size}});
  return out;
}

bool is_vision_parameter(const std::string& name) { return name.rfind(kVisionPrefix, 0) == 0; }
bool is_merger_parameter(const std::string& name) { return name.rfind(kMergerPrefix, 0) == 0; }

std::vector<int64_t> check_images(const VisionConfig& v, const Tensor& pixel_values, const Tensor& grid_thw) {
  FAB_USER_CHECK(grid_thw.defined() && grid_thw.ndim() == 2 && grid_thw.dim(1) == 3 && grid_thw.dtype() == DType::i64,
                 "image_grid_thw must be (images, 3) int64, got {}",
                 grid_thw.defined() ? shape_str(grid_thw.shape()) : std::string("nothing"));
  FAB_USER_CHECK(pixel_values.ndim() == 2 && pixel_values.dim(1) == v.patch_values() &&
                     pixel_values.dtype() == DType::f32,
                 "pixel_values must be (patches, {}) float32 (channels {} x temporal {} x {} x {} patches), got {}",
                 v.patch_values(), v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size,
                 shape_str(pixel_values.shape()));
  std::vector<int64_t> merged;
  int64_t patches = 0;
  for (int64_t i = 0; i < grid_thw.dim(0); ++i) {
    const auto [t, h, w] = grid_of(grid_thw, i);
    FAB_USER_CHECK(t > 0 && h > 0 && w > 0 && h % v.spatial_merge_size == 0 && w % v.spatial_merge_size == 0,
                   "image_grid_thw of image {} is ({}, {}, {}): positive, with height and width multiples of "
                   "spatial_merge_size {}",
                   i, t, h, w, v.spatial_merge_size);
    patches += t * h * w;
    merged.push_back(t * h * w / v.merge_unit());
  }
  FAB_USER_CHECK(patches == pixel_values.dim(0), "image_grid_thw describes {} patches but pixel_values holds {}",
                 patches, pixel_values.dim(0));
  return merged;
}

std::vector<int64_t> patch_positions(const VisionConfig& v, const Tensor& grid_thw) {
  const int64_t s = v.spatial_merge_size;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < grid_thw.dim(0); ++i) {
    const auto [t, h, w] = grid_of(grid_thw, i);
    for (int64_t f = 0; f < t; ++f)
      for (int64_t hb = 0; hb < h / s; ++hb)
        for (int64_t wb = 0; wb < w / s; ++wb)
          for (int64_t r = 0; r < s; ++r)
            for (int64_t c = 0; c < s; ++c) {
              out.push_back(hb * s + r);
              out.push_back(wb * s + c);
            }
  }
  return out;
}

// Per image: its (t, h / s, w / s) merge groups padded to whole windows of `size` groups a side,
// windows taken row-major within each frame, the groups of a window row-major; empty windows
// (the padding) add repeated bounds, which unique_consecutive drops.
VisionWindows vision_windows(const VisionConfig& v, const Tensor& grid_thw) {
  const int64_t size = v.window_size / v.spatial_merge_size / v.patch_size, unit = v.merge_unit();
  VisionWindows out;
  out.bounds = {0};
  int64_t first_group = 0;
  for (int64_t i = 0; i < grid_thw.dim(0); ++i) {
    const auto [t, h, w] = grid_of(grid_thw, i);
    const int64_t gh = h / v.spatial_merge_size, gw = w / v.spatial_merge_size;
    const int64_t windows_h = (gh + size - (gh % size)) / size, windows_w = (gw + size - (gw % size)) / size;
    for (int64_t f = 0; f < t; ++f)
      for (int64_t wh = 0; wh < windows_h; ++wh)
        for (int64_t ww = 0; ww < windows_w; ++ww) {
          int64_t count = 0;
          for (int64_t r = wh * size; r < std::min(gh, (wh + 1) * size); ++r)
            for (int64_t c = ww * size; c < std::min(gw, (ww + 1) * size); ++c, ++count)
              out.group_order.push_back(first_group + (f * gh + r) * gw + c);
          if (count > 0) out.bounds.push_back(out.bounds.back() + count * unit);
        }
    first_group += t * gh * gw;
  }
  return out;
}

VisionTower::VisionTower(const VisionConfig& config, const LinearOf& linear, const VarOf& var,
                         const AdaptersOf& adapters)
    : c_(config) {
  patch_embed_ = linear({std::string(kVisionPrefix) + "patch_embed.proj.weight"}, {});
  // The conv3d's kernel equals its stride: one GEMM over the flattened patch, weight (width, patch_values).
  const Var conv = patch_embed_.weight;
  patch_embed_.weight = make_var(conv->value.reshape({c_.width, c_.patch_values()}), conv->requires_grad);
  if (conv->grad.defined()) patch_embed_.weight->grad = conv->grad.reshape({c_.width, c_.patch_values()});
  if (patch_embed_.weight_bf16.defined())
    patch_embed_.weight_bf16 = patch_embed_.weight_bf16.reshape({c_.width, c_.patch_values()});
  for (int64_t i = 0; i < c_.depth; ++i) {
    const std::string p = block_prefix(i);
    Block b;
    b.norm1 = var(p + "norm1.weight");
    b.norm2 = var(p + "norm2.weight");
    if (!c_.qwen2_5) {
      b.norm1_bias = var(p + "norm1.bias");
      b.norm2_bias = var(p + "norm2.bias");
    }
    b.qkv = linear({p + "attn.qkv.weight"}, {p + "attn.qkv.bias"});
    b.proj = linear({p + "attn.proj.weight"}, {p + "attn.proj.bias"});
    if (c_.qwen2_5) {
      b.mlp_in = linear({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"},
                        {p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias"});
      b.mlp_out = linear({p + "mlp.down_proj.weight"}, {p + "mlp.down_proj.bias"});
      b.mlp_in_lora = adapters(p + "mlp.", {{"gate_proj", c_.intermediate}, {"up_proj", c_.intermediate}});
      b.mlp_out_lora = adapters(p + "mlp.", {{"down_proj", c_.width}});
    } else {
      b.mlp_in = linear({p + "mlp.fc1.weight"}, {p + "mlp.fc1.bias"});
      b.mlp_out = linear({p + "mlp.fc2.weight"}, {p + "mlp.fc2.bias"});
      b.mlp_in_lora = adapters(p + "mlp.", {{"fc1", c_.intermediate}});
      b.mlp_out_lora = adapters(p + "mlp.", {{"fc2", c_.width}});
    }
    b.qkv_lora = adapters(p + "attn.", {{"qkv", 3 * c_.width}});
    b.proj_lora = adapters(p + "attn.", {{"proj", c_.width}});
    blocks_.push_back(std::move(b));
  }
  const std::string m = kMergerPrefix;
  merger_norm_ = var(m + "ln_q.weight");
  if (!c_.qwen2_5) merger_norm_bias_ = var(m + "ln_q.bias");
  merger_fc1_ = linear({m + "mlp.0.weight"}, {m + "mlp.0.bias"});
  merger_fc2_ = linear({m + "mlp.2.weight"}, {m + "mlp.2.bias"});
}

bool VisionTower::blocks_train() const {
  return patch_embed_.weight->requires_grad || std::any_of(blocks_.begin(), blocks_.end(), [](const Block& b) {
           return b.qkv.weight->requires_grad || !b.qkv_lora.empty() || !b.proj_lora.empty() ||
                  !b.mlp_in_lora.empty() || !b.mlp_out_lora.empty();
         });
}

Var VisionTower::norm(Tape& tape, const Var& x, const Var& weight, const Var& bias) const {
  return c_.qwen2_5 ? rmsnorm(tape, x, weight, kNormEps) : layernorm(tape, x, weight, bias, kNormEps);
}

// VisionRotaryEmbedding(head_dim / 2): head_dim / 4 frequencies 1 / theta^(2j / (head_dim / 2));
// a patch's angles are its row times them, then its column times them (head_dim / 2 in all),
// applied as rotate-half RoPE over the whole head.
RopeTable VisionTower::rotary_table(const std::vector<int64_t>& positions) const {
  const int64_t quarter = c_.head_dim() / 4, rows = int64_t(positions.size()) / 2;
  const std::vector<float> inv_freq = RopeTable::default_inv_freq(c_.head_dim() / 2, c_.rope_theta);
  return rope_table_of(rows, 2 * quarter, 1.0f, MemoryCategory::activations, [&](int64_t r, int64_t p) {
    return float(positions[size_t(2 * r + p / quarter)]) * inv_freq[size_t(p % quarter)];
  });
}

// x + proj(attention(rope(q), rope(k), v)) of norm1(x), then + mlp(norm2(x)); each linear with its
// LoRA adapters while `lora` is set.
Var VisionTower::block_forward(Tape& tape, const Block& b, const Var& x, const Tensor& positions,
                               const RopeTable& rope, const std::vector<int64_t>& bounds, const LoraPass* lora) const {
  const int64_t e = c_.width, heads = c_.num_heads;
  auto adapted = [&tape, lora](const Var& in, const Linear& l, const std::vector<LoraBranch>& adapters) {
    Var y = linear(tape, in, l);
    if (lora && !adapters.empty()) add_lora(tape, in, y, adapters, *lora);
    return y;
  };
  std::vector<Var> qkv = split_columns(tape, adapted(norm(tape, x, b.norm1, b.norm1_bias), b.qkv, b.qkv_lora), {e, e, e});
  const Var q = fab::rope(tape, qkv[0], positions, rope, heads), k = fab::rope(tape, qkv[1], positions, rope, heads);
  const float scale = float(1.0 / std::sqrt(double(c_.head_dim())));
  const Var attended = segment_attention(tape, q, k, qkv[2], bounds, heads, scale);
  const Var h = add(tape, x, adapted(attended, b.proj, b.proj_lora));
  const Var inner = adapted(norm(tape, h, b.norm2, b.norm2_bias), b.mlp_in, b.mlp_in_lora);
  const Var act = c_.qwen2_5 ? swiglu(tape, inner, c_.intermediate) : quick_gelu(tape, inner);
  return add(tape, h, adapted(act, b.mlp_out, b.mlp_out_lora));
}

// PatchMerger: norm, each merge group's patches side by side (merge_unit * width), fc1, GELU, fc2.
Var VisionTower::merge(Tape& tape, const Var& x) const {
  const int64_t groups = x->value.dim(0) / c_.merge_unit();
  const Var normed = norm(tape, x, merger_norm_, merger_norm_bias_);
  const Var side_by_side = reshape(tape, normed, {groups, c_.width * c_.merge_unit()});
  return linear(tape, gelu(tape, linear(tape, side_by_side, merger_fc1_)), merger_fc2_);
}

Var VisionTower::forward(Tape& tape, const Tensor& pixel_values, const Tensor& grid_thw, const LoraPass* lora) const {
  check_images(c_, pixel_values, grid_thw);
  const int64_t patches = pixel_values.dim(0), unit = c_.merge_unit();
  std::vector<int64_t> positions = patch_positions(c_, grid_thw);
  const std::vector<int64_t> frames = frame_bounds(grid_thw);
  VisionWindows windows;
  std::vector<int64_t> row_order;  // qwen2_5_vl: the blocks see the patches window after window
  if (c_.qwen2_5) {
    windows = vision_windows(c_, grid_thw);
    row_order = rows_of_groups(windows.group_order, unit);
    std::vector<int64_t> reordered(positions.size());
    for (size_t r = 0; r < row_order.size(); ++r)
      for (size_t axis = 0; axis < 2; ++axis) reordered[2 * r + axis] = positions[size_t(2 * row_order[r]) + axis];
    positions = std::move(reordered);
  }
  const RopeTable rope = rotary_table(positions);
  const Tensor rows = arange(patches);
  // Frozen patch embedding and blocks run without recording: no gradient flows through them.
  Tape untaped(false);
  Tape& body = blocks_train() ? tape : untaped;
  Var x = linear(body, make_var(pixel_values, false), patch_embed_);
  if (c_.qwen2_5) x = gather_rows(body, x, row_order);
  for (int64_t i = 0; i < c_.depth; ++i) {
    const bool full = !c_.qwen2_5 || std::find(c_.fullatt_block_indexes.begin(), c_.fullatt_block_indexes.end(),
                                               i) != c_.fullatt_block_indexes.end();
    x = block_forward(body, blocks_[size_t(i)], x, rows, rope, full ? frames : windows.bounds, lora);
  }
  if (&body == &untaped) x->requires_grad = false;
  Var merged = merge(tape, x);
  if (!c_.qwen2_5) return merged;
  std::vector<int64_t> back(windows.group_order.size());  // argsort(window_index)
  for (size_t g = 0; g < back.size(); ++g) back[size_t(windows.group_order[g])] = int64_t(g);
  return gather_rows(tape, merged, back);
}

}  // namespace fab
