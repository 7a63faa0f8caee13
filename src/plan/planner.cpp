#include "plan/planner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <tuple>
#include <type_traits>

#include "core/error.h"
#include "parallel/layout.h"

namespace fab {
namespace {

constexpr int kMaxVirtualStages = 8;
constexpr int64_t kMaxMicroBatch = 64;
// Context parallel pays for its ring when rows are long: the planner leaves a rank at least this
// many tokens of a row (a cp the run sets is searched whatever it leaves).
constexpr int64_t kFewestContextTokens = 512;
// parallel_layout's refusals of combinations the rules allow but Fabrica does not run yet ("... is
// not implemented in Fabrica yet": LoRA with tp or pp, freeze with tp, preference stages with
// either): its last checks.
constexpr const char* kNotImplemented = "is not implemented";

std::vector<int64_t> divisors(int64_t n, int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= std::min(n, limit); ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

std::string fixed(double value, int decimals) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string gigabytes(double bytes) { return fixed(bytes / 1e9, 1) + " GB"; }

// parallel_layout's verdict on the sizes (the trainer's own checks): "" when it accepts them.
// Its "not implemented" refusals come after every rule passed: such a layout is planned from the
// formulas and marked as not runnable yet.
struct Legality {
  std::string reason;
  bool implemented = true;
};

bool given(const TrainConfig& c, const char* key) {
  return std::find(c.given_keys.begin(), c.given_keys.end(), key) != c.given_keys.end();
}

class LegalityCache {
 public:
  LegalityCache(const PlanProblem& problem, const TrainConfig& run, int devices)
      : problem_(problem), run_(run), devices_(devices) {}

  const Legality& check(const PlanLayout& l) {
    const int ga_residue = l.vpp > 1 ? int(l.gradient_accumulation_steps % l.pp) : 0;
    const auto key = std::make_tuple(l.tp, l.cp, l.pp, l.vpp, l.zero_stage, ga_residue, l.ep);
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, evaluate(l)).first;
    return it->second;
  }

 private:
  Legality evaluate(const PlanLayout& l) const {
    TrainConfig c = run_;
    c.tensor_parallel_size = l.tp;
    c.context_parallel_size = l.cp;
    c.pipeline_parallel_size = l.pp;
    c.virtual_pipeline_parallel_size = l.vpp;
    c.sequence_parallel = l.sequence_parallel;
    if (!given(run_, "pipeline_schedule")) c.pipeline_schedule = l.vpp > 1 ? "interleaved_1f1b" : "1f1b";
    c.zero_stage = l.zero_stage;
    c.expert_parallel_size = l.ep;
    c.gradient_accumulation_steps = l.gradient_accumulation_steps;
    c.cutoff_len = problem_.sequence_length;
    if (l.pp > 1 && run_.pipeline_layers.empty()) c.pipeline_layers = l.chunk_layers;
    try {
      parallel_layout(c, problem_.model, devices_);
      return {};
    } catch (const UserError& e) {
      const std::string what = e.what();
      if (what.find(kNotImplemented) != std::string::npos) return {"", false};
      return {what, true};
    }
  }

  const PlanProblem& problem_;
  const TrainConfig& run_;
  int devices_;
  std::map<std::tuple<int, int, int, int, int, int, int>, Legality> cache_;
};

class SplitCache {
 public:
  SplitCache(const PlanProblem& problem) : problem_(problem) {}
  const std::vector<int64_t>& split(int chunks) {
    auto it = cache_.find(chunks);
    if (it == cache_.end())
      it = cache_.emplace(chunks, balanced_layer_split(problem_.model, chunks, problem_.sequence_length)).first;
    return it->second;
  }

 private:
  const PlanProblem& problem_;
  std::map<int, std::vector<int64_t>> cache_;
};

// Every layout of one family (tp, pp, vpp, zero stage): the micro-batch sizes and recompute.
void plan_family(const PlanProblem& p, const ClusterSpec& c, const PlanConstraints& fixed, PlanLayout base,
                 LegalityCache& legality, Plan& plan) {
  std::string illegal;
  double least_memory = 0;
  bool any_legal = false, any_fits = false;
  for (int64_t mbs : divisors(p.global_batch / base.dp, kMaxMicroBatch)) {
    if (fixed.micro_batch_size && *fixed.micro_batch_size != mbs) continue;
    PlanLayout l = base;
    l.micro_batch_size = mbs;
    l.gradient_accumulation_steps = p.global_batch / (base.dp * mbs);
    const Legality& verdict = legality.check(l);
    if (!verdict.reason.empty()) {
      if (illegal.empty()) illegal = verdict.reason;
      continue;
    }
    any_legal = true;
    for (bool recompute : {false, true}) {
      if (fixed.recompute && *fixed.recompute != recompute) continue;
      l.recompute = recompute;
      ++plan.evaluated;
      const MemoryBreakdown memory = predict_memory(p, c, l);
      if (memory.total() > c.device.memory_bytes) {
        if (least_memory == 0 || memory.total() < least_memory) least_memory = memory.total();
        continue;
      }
      any_fits = true;
      plan.layouts.push_back({l, memory, predict_time(p, c, l), verdict.implemented});
    }
  }
  if (any_fits) return;
  if (!any_legal && illegal.empty())  // no micro-batch size left: the fixed one does not divide
    illegal = format("micro-batch {} does not divide the global batch {} / dp={}", fixed.micro_batch_size.value_or(0),
                     p.global_batch, base.dp);
  const std::string reason = any_legal ? "needs " + gigabytes(least_memory) + " > " +
                                             gigabytes(c.device.memory_bytes) + " (" + c.device.name + ")"
                                       : illegal;
  plan.pruned.push_back({base.tp, base.pp, base.vpp, base.zero_stage, reason, base.cp});
}

// The tensor-parallel size alone: a node's devices and the heads (pp = 1 asks parallel_layout).
std::string tensor_parallel_problem(const PlanProblem& p, const ClusterSpec& c, const PlanConstraints& fixed, int tp,
                                    LegalityCache& legality) {
  if (tp > c.devices_per_node)
    return format("tp={} exceeds {} devices per node", tp, c.devices_per_node);
  PlanLayout l;
  l.tp = tp;
  l.dp = c.devices() / tp;
  l.sequence_parallel = fixed.sequence_parallel.value_or(tp > 1);
  l.chunk_layers = {p.model.num_hidden_layers};
  const std::string reason = legality.check(l).reason;
  // A pipeline_layers or pipeline_schedule the run sets is pp's business, not tp's.
  return reason.find("pipeline") != std::string::npos ? "" : reason;
}

// Whether a size is the one the constraints fix (always, when they fix none).
bool allowed(const std::optional<int>& fixed, int64_t value) { return !fixed || *fixed == value; }

std::string family_name(const PrunedFamily& f) {
  std::string name = format("tp={}", f.tp);
  if (f.cp > 1) name += format(" cp={}", f.cp);
  if (f.pp > 0) name += format(" pp={}", f.pp);
  if (f.vpp > 1) name += format(" vpp={}", f.vpp);
  if (f.zero_stage >= 0) name += format(" zero={}", f.zero_stage);
  return name;
}

}  // namespace

PlanProblem problem_from_config(const TrainConfig& c, const ModelConfig& m, int world_size) {
  const int64_t model_parallel = c.tensor_parallel_size * c.context_parallel_size * c.pipeline_parallel_size;
  FAB_USER_CHECK(model_parallel >= 1 && world_size % model_parallel == 0,
                 "{} ranks is not a multiple of tensor_parallel_size x context_parallel_size x pipeline_parallel_size "
                 "= {}",
                 world_size, model_parallel);
  PlanProblem p;
  p.model = m;
  p.sequence_length = std::min(c.cutoff_len, m.max_position_embeddings);
  p.global_batch = c.per_device_train_batch_size * c.gradient_accumulation_steps * (world_size / model_parallel);
  p.bf16 = c.bf16;
  FAB_USER_CHECK(p.sequence_length > 0 && p.global_batch > 0, "cutoff_len and the batch must be positive");
  return p;
}

PlanConstraints plan_constraints(const TrainConfig& config) {
  PlanConstraints fixed;
  fixed.run = config;
  if (config.parallel != "auto") return fixed;
  auto fix = [&](const std::vector<const char*>& keys, const char* shown, auto value, auto& slot) {
    for (const char* key : keys)
      if (given(config, key)) {
        slot = value;
        if constexpr (std::is_same_v<decltype(value), bool>)
          fixed.keys.push_back(format("{}={}", shown, value ? "true" : "false"));
        else
          fixed.keys.push_back(format("{}={}", shown, value));
        return;
      }
  };
  fix({"tensor_parallel_size"}, "tensor_parallel_size", int(config.tensor_parallel_size), fixed.tp);
  fix({"context_parallel_size"}, "context_parallel_size", int(config.context_parallel_size), fixed.cp);
  fix({"pipeline_parallel_size"}, "pipeline_parallel_size", int(config.pipeline_parallel_size), fixed.pp);
  fix({"virtual_pipeline_parallel_size"}, "virtual_pipeline_parallel_size",
      int(config.virtual_pipeline_parallel_size), fixed.vpp);
  fix({"zero_stage", "deepspeed"}, "zero_stage", int(config.zero_stage), fixed.zero_stage);
  fix({"recompute_layers", "gradient_checkpointing", "disable_gradient_checkpointing"}, "recompute_layers",
      config.recompute_layers, fixed.recompute);
  fix({"sequence_parallel"}, "sequence_parallel", config.sequence_parallel, fixed.sequence_parallel);
  fix({"expert_parallel_size", "expert_model_parallel_size"}, "expert_parallel_size", int(config.expert_parallel_size),
      fixed.ep);
  for (const char* key : {"pipeline_layers", "pipeline_schedule"})
    if (given(config, key)) fixed.keys.push_back(format("{} (as set)", key));
  return fixed;
}

Plan make_plan(const PlanProblem& p, const ClusterSpec& c, const PlanConstraints& fixed) {
  const auto start = std::chrono::steady_clock::now();
  Plan plan;
  plan.constrained_by = fixed.keys;
  const int devices = c.devices();
  LegalityCache legality(p, fixed.run, devices);
  SplitCache splits(p);
  for (int64_t tp : divisors(devices, devices)) {
    if (!allowed(fixed.tp, tp)) continue;
    if (tp > 1 && p.model.is_moe()) {
      plan.pruned.push_back({int(tp), 0, 1, -1,
                             "tensor parallel with sequence parallel (which the planner turns on with tp) is not "
                             "implemented for mixture-of-experts models"});
      continue;
    }
    const std::string tp_problem = tensor_parallel_problem(p, c, fixed, int(tp), legality);
    if (!tp_problem.empty()) {
      plan.pruned.push_back({int(tp), 0, 1, -1, tp_problem});
      continue;
    }
    for (int64_t cp : divisors(devices / tp, devices)) {
      if (!allowed(fixed.cp, cp)) continue;
      // Shorter shares are not searched (not listed as pruned either: nothing forbids them).
      if (cp > 1 && !fixed.cp && p.sequence_length / cp < kFewestContextTokens) continue;
      if (cp > 1 && p.sequence_length < 2 * cp) {
        plan.pruned.push_back({int(tp), 0, 1, -1,
                               format("sequence {} is shorter than 2 x cp={}: each row is split into 2cp chunks",
                                      p.sequence_length, cp),
                               int(cp)});
        continue;
      }
      for (int64_t pp : divisors(devices / (tp * cp), devices)) {
        if (!allowed(fixed.pp, pp)) continue;
        if (pp > 1 && p.model.is_moe()) {
          plan.pruned.push_back(
              {int(tp), int(pp), 1, -1, "pipeline parallel is not implemented for mixture-of-experts models", int(cp)});
          continue;
        }
        const int dp = int(devices / (tp * cp * pp));
        if (p.global_batch % dp != 0) {
          plan.pruned.push_back({int(tp), int(pp), 1, -1,
                                 format("global batch {} is not a multiple of dp={}", p.global_batch, dp), int(cp)});
          continue;
        }
        if (pp > p.model.num_hidden_layers) {
          plan.pruned.push_back({int(tp), int(pp), 1, -1,
                                 format("pp={} exceeds the {} layers", pp, p.model.num_hidden_layers), int(cp)});
          continue;
        }
        const int max_vpp = fixed.vpp ? *fixed.vpp : pp > 1 ? kMaxVirtualStages : 1;
        for (int vpp = 1; vpp <= max_vpp && pp * vpp <= p.model.num_hidden_layers; ++vpp) {
          if (!allowed(fixed.vpp, vpp)) continue;
          // One replica: every stage is ZeRO-0 (unless the run fixes one, which parallel_layout judges);
          // ZeRO shards over dp x cp.
          const int max_zero = fixed.zero_stage ? *fixed.zero_stage : dp * cp > 1 ? 3 : 0;
          for (int zero = 0; zero <= max_zero; ++zero) {
            if (!allowed(fixed.zero_stage, zero)) continue;
            // Expert parallel folds into dp x cp: each divisor of it that divides the experts.
            for (int64_t ep : divisors(int64_t(dp) * cp, int64_t(dp) * cp)) {
              if (!allowed(fixed.ep, int(ep))) continue;
              if (ep > 1 && (!p.model.is_moe() || p.model.moe.num_experts % ep != 0)) continue;
              PlanLayout base;
              base.tp = int(tp);
              base.cp = int(cp);
              base.pp = int(pp);
              base.vpp = vpp;
              base.dp = dp;
              base.ep = int(ep);
              base.zero_stage = zero;
              base.sequence_parallel = fixed.sequence_parallel.value_or(tp > 1);
              const bool own_split = !fixed.run.pipeline_layers.empty() &&
                                     int64_t(fixed.run.pipeline_layers.size()) == pp * vpp;
              base.chunk_layers = own_split ? fixed.run.pipeline_layers : splits.split(int(pp) * vpp);
              plan_family(p, c, fixed, base, legality, plan);
            }
          }
        }
      }
    }
  }
  std::sort(plan.layouts.begin(), plan.layouts.end(), [](const PlannedLayout& a, const PlannedLayout& b) {
    if (a.time.step != b.time.step) return a.time.step < b.time.step;
    return a.memory.total() < b.memory.total();
  });
  plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

const PlannedLayout* first_runnable(const Plan& plan) {
  for (const PlannedLayout& r : plan.layouts)
    if (r.implemented) return &r;
  return nullptr;
}

std::string no_layout_reason(const Plan& plan, int devices) {
  if (!plan.layouts.empty())
    return format("the {} layouts that fit {} devices are all ones Fabrica does not run yet (the fastest: tp={} cp={} "
                  "pp={})",
                  plan.layouts.size(), devices, plan.layouts.front().layout.tp, plan.layouts.front().layout.cp,
                  plan.layouts.front().layout.pp);
  std::string out = format("no layout of {} devices fits or is legal:", devices);
  constexpr size_t kShown = 6;
  for (size_t i = 0; i < std::min(kShown, plan.pruned.size()); ++i)
    out += "\n  " + family_name(plan.pruned[i]) + ": " + plan.pruned[i].reason;
  if (plan.pruned.size() > kShown) out += format("\n  ... and {} more (`fabrica plan` lists them)", plan.pruned.size() - kShown);
  return out;
}

std::string memory_breakdown_text(const MemoryBreakdown& m) {
  const std::string save = m.save_gathered > m.activations + m.logits
                               ? format(" (the peak: the final save gathers {})", gigabytes(m.save_gathered))
                               : std::string();
  return format("parameters {}, gradients {}, optimizer state {}, activations {}, logits chunk {}, buffers {}, "
                "reserved {}: total {}{}",
                gigabytes(m.parameters), gigabytes(m.gradients), gigabytes(m.optimizer_state),
                gigabytes(m.activations), gigabytes(m.logits), gigabytes(m.buffers), gigabytes(m.reserved),
                gigabytes(m.total()), save);
}

std::string plan_table(const Plan& plan, const PlanProblem& p, const ClusterSpec& c, int top) {
  const ModelConfig& m = p.model;
  const double params = double(m.num_parameters());
  const std::string count = params >= 1e9 ? fixed(params / 1e9, 2) + " B" : fixed(params / 1e6, 1) + " M";
  std::string out = format("model: {} layers, hidden {}, heads {}:{}, vocab {}, {} parameters; sequence {}, "
                           "global batch {}, {}\n",
                           m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads,
                           m.vocab_size, count, p.sequence_length, p.global_batch,
                           p.bf16 ? "bf16" : "fp32");
  out += format("cluster: {} node(s) x {} {} ({} each), {} devices\n", c.nodes, c.devices_per_node, c.device.name,
                gigabytes(c.device.memory_bytes), c.devices());
  if (!plan.constrained_by.empty()) {
    std::string keys;
    for (const std::string& k : plan.constrained_by) keys += (keys.empty() ? "" : ", ") + k;
    out += "parallel: auto, searching only layouts with " + keys + " (set in the config)\n";
  }
  out += format("{} layouts evaluated in {} s, {} fit\n\n", plan.evaluated, fixed(plan.seconds, 3), plan.layouts.size());
  char line[256];
  std::snprintf(line, sizeof line, "%3s %3s %3s %3s %3s %4s %3s %4s %9s %4s %5s %10s %9s %11s %6s %6s\n", "#", "tp",
                "cp", "pp", "vpp", "dp", "ep", "zero", "recompute", "mbs", "ga", "memory", "step s", "tokens/s", "MFU",
                "bubble");
  out += line;
  bool any_planned_only = false;
  for (int i = 0; i < std::min<int>(top, int(plan.layouts.size())); ++i) {
    const PlannedLayout& r = plan.layouts[size_t(i)];
    const PlanLayout& l = r.layout;
    std::snprintf(line, sizeof line, "%3d %3d %3d %3d %3d %4d %3d %4d %9s %4lld %5lld %10s %9.3f %11.0f %5.1f%% %5.1f%%%s\n",
                  i + 1, l.tp, l.cp, l.pp, l.vpp, l.dp, l.ep, l.zero_stage, l.recompute ? "on" : "off",
                  (long long)l.micro_batch_size, (long long)l.gradient_accumulation_steps,
                  gigabytes(r.memory.total()).c_str(), r.time.step, r.time.tokens_per_s, 100 * r.time.mfu,
                  100 * r.time.bubble_fraction, r.implemented ? "" : " *");
    out += line;
    any_planned_only |= !r.implemented;
  }
  if (any_planned_only) out += "  * planned from the formulas: Fabrica does not run this layout yet\n";
  const PlannedLayout* runnable = first_runnable(plan);
  if (runnable && runnable != &plan.layouts.front())
    out += format("  parallel: auto takes #{}, the fastest that Fabrica runs\n", runnable - plan.layouts.data() + 1);
  if (!plan.layouts.empty()) {
    const PlannedLayout& best = plan.layouts.front();
    out += "\nmemory of #1 per device: " + memory_breakdown_text(best.memory) + "\n";
    const TimeBreakdown& t = best.time;
    out += format("time of #1 per step: compute {} s, tp comm {} s, cp comm {} s (not hidden), pp comm {} s, ep comm "
                  "{} s, bubble {} s, dp comm {} s ({} s exposed), optimizer {} s\n",
                  fixed(t.compute, 3), fixed(t.tensor_comm, 3), fixed(t.context_comm, 3), fixed(t.pipeline_comm, 3),
                  fixed(t.expert_comm, 3), fixed(t.bubble, 3), fixed(t.data_comm, 3), fixed(t.data_comm_exposed, 3),
                  fixed(t.optimizer, 3));
  } else {
    out += "no layout fits: see the pruned families below\n";
  }
  if (plan.pruned.empty()) return out;
  // The interleaved variants of a pruned (tp, pp, zero) fail for the same reason as vpp = 1 but
  // for the numbers: one line for them all.
  std::map<std::tuple<int, int, int, int>, int> interleaved;  // pruned vpp > 1 variants of a pruned vpp = 1
  for (const PrunedFamily& f : plan.pruned)
    if (f.vpp == 1) interleaved[std::make_tuple(f.tp, f.cp, f.pp, f.zero_stage)] = 0;
  for (const PrunedFamily& f : plan.pruned) {
    auto it = interleaved.find(std::make_tuple(f.tp, f.cp, f.pp, f.zero_stage));
    if (f.vpp > 1 && it != interleaved.end()) ++it->second;
  }
  std::vector<std::string> lines;
  for (const PrunedFamily& f : plan.pruned) {
    auto it = interleaved.find(std::make_tuple(f.tp, f.cp, f.pp, f.zero_stage));
    const bool folded = it != interleaved.end();
    if (f.vpp > 1 && folded) continue;
    const int n = folded ? it->second : 0;
    lines.push_back("  " + family_name(f) + ": " + f.reason +
                    (n > 0 ? format(" (and its {} interleaved variants)", n) : "") + "\n");
  }
  constexpr size_t kShown = 40;
  out += "\npruned:\n";
  for (size_t i = 0; i < std::min(kShown, lines.size()); ++i) out += lines[i];
  if (lines.size() > kShown) out += format("  ... and {} more (--json lists every one)\n", lines.size() - kShown);
  return out;
}

nlohmann::json layout_json(const PlannedLayout& r) {
  const PlanLayout& l = r.layout;
  const MemoryBreakdown& m = r.memory;
  const TimeBreakdown& t = r.time;
  return {{"tensor_parallel_size", l.tp},
          {"context_parallel_size", l.cp},
          {"pipeline_parallel_size", l.pp},
          {"virtual_pipeline_parallel_size", l.vpp},
          {"data_parallel_size", l.dp},
          {"expert_parallel_size", l.ep},
          {"sequence_parallel", l.sequence_parallel},
          {"zero_stage", l.zero_stage},
          {"recompute", l.recompute},
          {"micro_batch_size", l.micro_batch_size},
          {"gradient_accumulation_steps", l.gradient_accumulation_steps},
          {"pipeline_layers", l.chunk_layers},
          {"memory_bytes", int64_t(m.total())},
          {"step_seconds", t.step},
          {"tokens_per_s", t.tokens_per_s},
          {"mfu", t.mfu},
          {"bubble_fraction", t.bubble_fraction},
          {"implemented", r.implemented},
          {"memory", {{"parameters", int64_t(m.parameters)},
                      {"gradients", int64_t(m.gradients)},
                      {"optimizer_state", int64_t(m.optimizer_state)},
                      {"activations", int64_t(m.activations)},
                      {"logits", int64_t(m.logits)},
                      {"buffers", int64_t(m.buffers)},
                      {"reserved", int64_t(m.reserved)},
                      {"save_gathered", int64_t(m.save_gathered)}}},
          {"time", {{"compute", t.compute},
                    {"tensor_comm", t.tensor_comm},
                    {"context_comm", t.context_comm},
                    {"pipeline_comm", t.pipeline_comm},
                    {"expert_comm", t.expert_comm},
                    {"bubble", t.bubble},
                    {"data_comm", t.data_comm},
                    {"data_comm_exposed", t.data_comm_exposed},
                    {"optimizer", t.optimizer}}}};
}

nlohmann::json plan_json(const Plan& plan, int top) {
  nlohmann::json layouts = nlohmann::json::array(), pruned = nlohmann::json::array();
  for (int i = 0; i < std::min<int>(top, int(plan.layouts.size())); ++i) layouts.push_back(layout_json(plan.layouts[size_t(i)]));
  for (const PrunedFamily& f : plan.pruned)
    pruned.push_back({{"family", family_name(f)},
                      {"tensor_parallel_size", f.tp},
                      {"context_parallel_size", f.cp},
                      {"pipeline_parallel_size", f.pp},
                      {"virtual_pipeline_parallel_size", f.vpp},
                      {"zero_stage", f.zero_stage},
                      {"reason", f.reason}});
  return {{"layouts", layouts},
          {"pruned", pruned},
          {"constrained_by", plan.constrained_by},
          {"evaluated", plan.evaluated},
          {"seconds", plan.seconds}};
}

}  // namespace fab
