#include "parallel/layout.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/backend.h"
#include "core/error.h"
#include "parallel/expert_parallel.h"

namespace fab {
namespace {

std::string join(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return "[" + out + "]";
}

// Forward FLOPs per token (backward is twice these for every part, so the ratios hold):
// 2 per weight of each GEMM, and causal attention's QK^T and PV over half the sequence on average.
double layer_flops(const ModelConfig& m, int64_t sequence_length) {
  const double C = double(m.hidden_size), D = double(m.head_dim), H = double(m.num_attention_heads),
               KV = double(m.num_key_value_heads), I = double(m.intermediate_size);
  const double gemm = 2 * (C * (H + 2 * KV) * D + H * D * C + 3 * C * I);
  const double attention = 2 * 2 * H * D * double(sequence_length) / 2;
  return gemm + attention;
}

double head_flops(const ModelConfig& m) { return 2.0 * double(m.vocab_size) * double(m.hidden_size); }

void check_tensor_parallel(const ModelConfig& m, int tp) {
  FAB_USER_CHECK(m.num_attention_heads % tp == 0,
                 "tensor_parallel_size {} does not divide config.json's num_attention_heads {}: each rank holds "
                 "whole attention heads",
                 tp, m.num_attention_heads);
  FAB_USER_CHECK(m.num_key_value_heads % tp == 0 || tp % m.num_key_value_heads == 0,
                 "tensor_parallel_size {} neither divides nor is a multiple of config.json's num_key_value_heads {}: "
                 "each rank holds whole key/value heads (its own, or one shared by a group of ranks)",
                 tp, m.num_key_value_heads);
  FAB_USER_CHECK(m.intermediate_size % tp == 0,
                 "tensor_parallel_size {} does not divide config.json's intermediate_size {}: the MLP is split "
                 "evenly",
                 tp, m.intermediate_size);
}

void check_pipeline(const TrainConfig& c, const ModelConfig& m, const ParallelLayout& l) {
  const int64_t layers = m.num_hidden_layers;
  FAB_USER_CHECK(l.vpp == 1 || l.pp > 1,
                 "virtual_pipeline_parallel_size {} needs pipeline_parallel_size > 1 (it is the model chunks of "
                 "each pipeline stage)",
                 l.vpp);
  FAB_USER_CHECK(l.schedule == "1f1b" || l.schedule == "interleaved_1f1b",
                 "pipeline_schedule \"{}\": expected 1f1b or interleaved_1f1b", l.schedule);
  FAB_USER_CHECK(l.schedule != "interleaved_1f1b" || l.vpp > 1,
                 "pipeline_schedule interleaved_1f1b with virtual_pipeline_parallel_size 1: interleaved_1f1b runs "
                 "several model chunks per stage; set virtual_pipeline_parallel_size > 1, or pipeline_schedule 1f1b");
  FAB_USER_CHECK(l.schedule != "1f1b" || l.vpp == 1,
                 "pipeline_schedule 1f1b with virtual_pipeline_parallel_size {}: 1f1b runs one model chunk per "
                 "stage; set pipeline_schedule interleaved_1f1b (what leaving it out gives), or "
                 "virtual_pipeline_parallel_size 1",
                 l.vpp);
  FAB_USER_CHECK(l.chunks() <= layers,
                 "pipeline_parallel_size {} x virtual_pipeline_parallel_size {} = {} model chunks, but config.json "
                 "has {} layers (each chunk needs at least one)",
                 l.pp, l.vpp, l.chunks(), layers);
  FAB_USER_CHECK(l.vpp == 1 || c.gradient_accumulation_steps % l.pp == 0,
                 "interleaved_1f1b runs the micro-batches in groups of pipeline_parallel_size: "
                 "gradient_accumulation_steps {} is not a multiple of pipeline_parallel_size {}",
                 c.gradient_accumulation_steps, l.pp);
  FAB_USER_CHECK(l.pp == 1 || c.zero_stage < 3,
                 "zero_stage 3 with pipeline_parallel_size {} is not supported: each stage already holds only its "
                 "layers; use zero_stage 1 or 2",
                 l.pp);
  FAB_USER_CHECK(l.pp == 1 || c.zero_stage < 2 || !m.tie_word_embeddings,
                 "zero_stage {} with pipeline_parallel_size {} and tie_word_embeddings is not supported yet: the tied "
                 "embedding's gradient is summed between the first and last stage after the data-parallel reduction, "
                 "which ZeRO-2 leaves only as shards; use zero_stage 1",
                 c.zero_stage, l.pp);
  if (c.pipeline_layers.empty()) return;
  FAB_USER_CHECK(l.pp > 1, "pipeline_layers {} is set but pipeline_parallel_size is 1", join(c.pipeline_layers));
  FAB_USER_CHECK(int64_t(c.pipeline_layers.size()) == l.chunks(),
                 "pipeline_layers {} has {} entries; expected pipeline_parallel_size {} x "
                 "virtual_pipeline_parallel_size {} = {}",
                 join(c.pipeline_layers), c.pipeline_layers.size(), l.pp, l.vpp, l.chunks());
  const int64_t sum = std::accumulate(c.pipeline_layers.begin(), c.pipeline_layers.end(), int64_t(0));
  const bool positive = std::all_of(c.pipeline_layers.begin(), c.pipeline_layers.end(), [](int64_t n) { return n > 0; });
  FAB_USER_CHECK(positive && sum == layers,
                 "pipeline_layers {}: expected positive layer counts summing to config.json's num_hidden_layers {}",
                 join(c.pipeline_layers), layers);
}

// What context parallel runs with so far; everything else is refused by name.
void check_context_parallel(const TrainConfig& c, const ModelConfig& m, const ParallelLayout& l, bool on_host) {
  if (l.cp == 1) return;
  const auto refuse = [&](bool bad, const std::string& what) {
    FAB_USER_CHECK(!bad, "context_parallel_size {} with {} is not implemented in Fabrica yet: context parallel runs "
                         "pt, sft, dpo, kto and rm on the CPU, with tensor, pipeline and expert parallel and data "
                         "parallel (and ZeRO)",
                   l.cp, what);
  };
  refuse(m.vision.has_value(), format("a vision-language model ({})", m.model_type));
  refuse(c.stage != Stage::sft && c.stage != Stage::pt && c.stage != Stage::dpo && c.stage != Stage::kto &&
             c.stage != Stage::rm,
         format("stage {}", c.stage));
  refuse(!on_host, format("device {}", c.device));
  FAB_USER_CHECK(c.cutoff_len >= 2 * l.cp,
                 "cutoff_len {} is shorter than 2 x context_parallel_size {} = {}: each row is split into 2cp chunks",
                 c.cutoff_len, l.cp, 2 * l.cp);
  if (l.cp_comm != "a2a") return;
  // Ulysses splits the heads a rank computes: under tensor parallel its slice of them.
  const int64_t heads = m.num_attention_heads / l.tp;
  const int64_t kv_heads = m.num_key_value_heads % l.tp == 0 ? m.num_key_value_heads / l.tp : 1;
  const std::string per_rank = l.tp > 1 ? format(" (per tensor-parallel rank of {})", l.tp) : "";
  FAB_USER_CHECK(heads % l.cp == 0 && (kv_heads % l.cp == 0 || l.cp % kv_heads == 0),
                 "cp_comm_type a2a (Ulysses) with context_parallel_size {}: the attention heads {}{} must be divisible "
                 "by it, and the K/V heads {} divisible by it or divide it (K/V heads replicated); config.json has "
                 "num_attention_heads {}, num_key_value_heads {}",
                 l.cp, heads, per_rank, kv_heads, m.num_attention_heads, m.num_key_value_heads);
}

}  // namespace

int64_t ParallelLayout::first_layer(int chunk) const {
  FAB_CHECK(chunk >= 0 && chunk < int(chunk_layers.size()), "chunk {} of {}", chunk, chunk_layers.size());
  return std::accumulate(chunk_layers.begin(), chunk_layers.begin() + chunk, int64_t(0));
}

std::vector<int64_t> balanced_layer_split(const ModelConfig& m, int chunks, int64_t sequence_length) {
  const int64_t layers = m.num_hidden_layers;
  FAB_CHECK(chunks >= 1 && chunks <= layers, "{} chunks of {} layers", chunks, layers);
  const double layer = layer_flops(m, sequence_length), head = head_flops(m);
  // cost(k, first, n): chunk k holding layers [first, first + n).
  auto cost = [&](int k, int64_t n) { return double(n) * layer + (k == chunks - 1 ? head : 0.0); };
  // best[k][i]: the least possible costliest chunk when chunks 0..k-1 hold the first i layers.
  constexpr double kNone = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(chunks + 1), std::vector<double>(size_t(layers + 1), kNone));
  std::vector<std::vector<int64_t>> take(size_t(chunks + 1), std::vector<int64_t>(size_t(layers + 1), 0));
  best[0][0] = 0;
  for (int k = 0; k < chunks; ++k)
    for (int64_t i = k; i <= layers; ++i) {
      if (best[size_t(k)][size_t(i)] == kNone) continue;
      for (int64_t n = 1; i + n <= layers - (chunks - 1 - k); ++n) {
        const double worst = std::max(best[size_t(k)][size_t(i)], cost(k, n));
        // Ties go to the split that puts fewer layers first (the first stage holds the most
        // activations in flight under 1F1B).
        if (worst < best[size_t(k + 1)][size_t(i + n)]) {
          best[size_t(k + 1)][size_t(i + n)] = worst;
          take[size_t(k + 1)][size_t(i + n)] = n;
        }
      }
    }
  std::vector<int64_t> split(static_cast<size_t>(chunks));
  for (int k = chunks, i = int(layers); k > 0; --k) {
    split[size_t(k - 1)] = take[size_t(k)][size_t(i)];
    i -= int(split[size_t(k - 1)]);
  }
  return split;
}

ParallelLayout parallel_layout(const TrainConfig& c, const ModelConfig& m, int world_size) {
  ParallelLayout l;
  FAB_USER_CHECK(c.tensor_parallel_size >= 1 && c.pipeline_parallel_size >= 1 && c.virtual_pipeline_parallel_size >= 1,
                 "tensor_parallel_size {}, pipeline_parallel_size {} and virtual_pipeline_parallel_size {} must each "
                 "be at least 1",
                 c.tensor_parallel_size, c.pipeline_parallel_size, c.virtual_pipeline_parallel_size);
  l.tp = int(c.tensor_parallel_size);
  l.pp = int(c.pipeline_parallel_size);
  l.vpp = int(c.virtual_pipeline_parallel_size);
  l.sequence_parallel = c.sequence_parallel;
  l.schedule = c.pipeline_schedule;
  FAB_USER_CHECK(c.context_parallel_size >= 1, "context_parallel_size {} must be at least 1", c.context_parallel_size);
  l.cp = int(c.context_parallel_size);
  l.cp_comm = c.cp_comm_type == "ring" ? "p2p" : c.cp_comm_type == "ulysses" ? "a2a" : c.cp_comm_type;
  FAB_USER_CHECK(l.cp_comm == "p2p" || l.cp_comm == "all_gather" || l.cp_comm == "a2a",
                 "cp_comm_type \"{}\": expected p2p, all_gather or a2a (cp_mode: ring or ulysses)", c.cp_comm_type);
  FAB_USER_CHECK(world_size % (l.tp * l.cp * l.pp) == 0,
                 "{} ranks is not a multiple of tensor_parallel_size {} x context_parallel_size {} x "
                 "pipeline_parallel_size {} = {} (world = tp x cp x pp x dp)",
                 world_size, l.tp, l.cp, l.pp, l.tp * l.cp * l.pp);
  l.dp = world_size / (l.tp * l.cp * l.pp);
  FAB_USER_CHECK(!l.sequence_parallel || l.tp > 1,
                 "sequence_parallel needs tensor_parallel_size > 1 (it splits the tokens over the tensor-parallel "
                 "ranks)");
  check_tensor_parallel(m, l.tp);
  check_pipeline(c, m, l);
  const bool rl = is_rollout(c.stage);
  FAB_USER_CHECK(!rl || (l.tp == 1 && l.pp == 1 && c.zero_stage < 3),
                 "stage {} with tensor_parallel_size {}, pipeline_parallel_size {} and zero_stage {} is not "
                 "implemented in Fabrica yet: rollouts run on whole weights, so {} runs data parallel with "
                 "zero_stage 0, 1 or 2",
                 c.stage, l.tp, l.pp, c.zero_stage, c.stage);
  // Here, so that parallel: auto never picks them for a device run (`fabrica plan` of a cuda run
  // plans on a machine without one too: the setting counts, not this machine's GPU).
  const bool on_host = c.device == "cpu" || (c.device == "auto" && !cuda_backend().available());
  check_context_parallel(c, m, l, on_host);
  check_expert_parallel(c.expert_parallel_size, m, l.sizes(), on_host);
  FAB_USER_CHECK(c.expert_parallel_size == 1 || !rl,
                 "expert_parallel_size {} with stage {} is not implemented in Fabrica yet: each rank holds its share "
                 "of the experts, and rollouts decode on whole weights",
                 c.expert_parallel_size, c.stage);
  FAB_USER_CHECK(on_host || l.pp == 1,
                 "device {} with pipeline_parallel_size {} is not implemented in Fabrica yet: on a device a run is "
                 "data and tensor parallel (with ZeRO-0 to 3)",
                 c.device, l.pp);
  const bool preference = is_preference(c.stage);
  FAB_USER_CHECK(!preference || (l.tp == 1 && l.pp == 1),
                 "stage {} with tensor_parallel_size {} and pipeline_parallel_size {} is not implemented in Fabrica "
                 "yet: the preference stages run data parallel (and ZeRO) only",
                 c.stage, l.tp, l.pp);
  l.chunk_layers = c.pipeline_layers.empty() ? balanced_layer_split(m, l.chunks(), std::min(c.cutoff_len, m.max_position_embeddings)) : c.pipeline_layers;
  FAB_USER_CHECK(l.pp == 1 || c.finetuning_type != "lora",
                 "finetuning_type lora with pipeline_parallel_size {} is not implemented in Fabrica yet: a pipeline "
                 "trains full or freeze fine-tuning",
                 l.pp);
  FAB_USER_CHECK(l.tp == 1 || c.finetuning_type == "full",
                 "finetuning_type {} with tensor_parallel_size {} is not implemented in Fabrica yet: tensor parallel "
                 "trains every parameter (finetuning_type full)",
                 c.finetuning_type, l.tp);
  // A mixture of experts and a vision tower are whole on every tp rank, which holds all the rows:
  // sequence parallel's share of them is not built for either.
  FAB_USER_CHECK(l.tp == 1 || !l.sequence_parallel || (!m.is_moe() && !m.vision),
                 "sequence_parallel with tensor_parallel_size {} and {} is not implemented in Fabrica yet (set "
                 "sequence_parallel: false)",
                 l.tp, m.vision ? "a vision-language model" : "a mixture-of-experts model");
  FAB_USER_CHECK(l.tp == 1 || !m.vision || !c.freeze_language_model,
                 "freeze_language_model with tensor_parallel_size {} is not implemented in Fabrica yet: frozen "
                 "tensor-parallel slices",
                 l.tp);
  return l;
}

}  // namespace fab
