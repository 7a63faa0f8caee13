#include "parallel/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "models/moe_weights.h"

namespace fab {

void check_expert_parallel(int64_t ep, const ModelConfig& model, const ParallelSizes& sizes, bool on_host) {
  if (ep == 1) return;
  FAB_USER_CHECK(ep > 1, "expert_parallel_size {} must be at least 1", ep);
  FAB_USER_CHECK(model.is_moe(), "expert_parallel_size {} needs a mixture-of-experts model ({} has no experts)", ep,
                 model.model_type);
  FAB_USER_CHECK(model.moe.num_experts % ep == 0, "expert_parallel_size {} does not divide the {} experts of {}", ep,
                 model.moe.num_experts, model.model_type);
  // Under context parallel the experts fold into dp x cp (Megatron's parallel folding): every rank
  // of a replica routes its share of the rows.
  const int64_t ranks = sizes.dp * sizes.cp;
  FAB_USER_CHECK(ranks % ep == 0,
                 "expert_parallel_size {} does not divide the {} data-parallel ranks{} (expert parallel is folded into "
                 "data parallel)",
                 ep, ranks, sizes.cp > 1 ? format(" (data_parallel {} x context_parallel_size {})", sizes.dp, sizes.cp) : "");
  FAB_USER_CHECK(sizes.tp == 1 && sizes.pp == 1,
                 "expert_parallel_size {} with tensor_parallel_size {} / pipeline_parallel_size {} is not implemented "
                 "in Fabrica yet",
                 ep, sizes.tp, sizes.pp);
  FAB_USER_CHECK(on_host, "expert_parallel_size {} on a device (NCCL all_to_all) is not implemented in Fabrica yet", ep);
}

namespace {

// Layer i's experts blocks in order ({gate_up names}, {down names}), as the whole model names them.
std::vector<std::vector<NamedShape>> expert_blocks(const ModelConfig& c, int64_t layer) {
  const MoeLayerNames n = moe_layer_names(c, layer);
  return {n.gate_up, n.down};
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> expert_ranges(const DecoderModel& model) {
  const ModelConfig& c = model.config();
  const ParamBuffer& params = model.params();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.is_moe_layer(i)) continue;
    int64_t first = -1, last = -1;
    for (const auto& block : expert_blocks(c, i))
      for (const NamedShape& t : block) {
        if (!params.contains(t.name)) continue;  // frozen, or another rank's expert
        const ParamInfo& p = params.info(t.name);
        first = first < 0 ? p.offset : std::min(first, p.offset);
        last = std::max(last, p.offset + p.numel());
      }
    if (first >= 0) ranges.push_back({first, last});
  }
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

std::vector<NamedTensor> gather_expert_weights(const DecoderModel& model, Communicator& group, bool main) {
  const ModelConfig& c = model.config();
  const int ranks = group.size(), rank = group.rank();
  std::vector<NamedTensor> out;
  std::set<std::string> experts;
  std::map<std::string, std::pair<const ParamInfo*, const ParamBuffer*>> held;
  for (const auto& [p, buffer] : model.base_parameters()) held[p->name] = {p, buffer};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.is_moe_layer(i)) continue;
    for (const auto& block : expert_blocks(c, i)) {
      // This rank's tensors of the block, back to back: a fused block's rows of its experts, or
      // its experts' tensors. Rank after rank they make the whole block.
      int64_t whole = 0;
      for (const NamedShape& t : block) {
        whole += shape_numel(t.shape);
        experts.insert(t.name);
      }
      const int64_t local = whole / ranks;
      Tensor all = Tensor::empty({whole}, DType::f32, MemoryCategory::temporaries);
      int64_t at = rank * local;
      for (const NamedShape& t : block) {
        if (model.held_elsewhere(t.name)) continue;
        const auto [p, buffer] = held.at(t.name);
        const Tensor mine = buffer->values_f32(*p).to(Device::cpu(), MemoryCategory::temporaries);
        std::memcpy(all.data<float>() + at, mine.data<float>(), mine.bytes());
        at += mine.numel();
      }
      FAB_CHECK(at == (rank + 1) * local, "expert parallel: this rank holds {} of the block's {} elements",
                at - rank * local, whole);
      group.all_gather(all.data<float>(), whole, "expert parallel: whole " + block.front().name).wait();
      int64_t from = 0;
      for (const NamedShape& t : block) {
        Tensor full = Tensor::empty(t.shape, DType::f32, MemoryCategory::temporaries);
        std::memcpy(full.data<float>(), all.data<float>() + from, full.bytes());
        from += full.numel();
        if (main) out.push_back({t.name, full});
      }
    }
  }
  if (!main) return {};
  for (const auto& [p, buffer] : model.base_parameters())
    if (!experts.count(p->name)) out.push_back({p->name, buffer->values_f32(*p)});
  return out;
}

}  // namespace fab
