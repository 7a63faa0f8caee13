#include "train/stages/preference_objective.h"

#include <algorithm>

#include "core/error.h"
#include "nn/sequence_logps.h"

namespace fab {
namespace {

// Sequences 2i + side of the items, in item order (side 0: chosen / completion, 1: rejected / KL).
std::vector<int64_t> rows_of_items(const std::vector<int64_t>& items, int64_t side) {
  std::vector<int64_t> rows;
  for (int64_t i : items) rows.push_back(2 * i + side);
  return rows;
}

// Chosen rows first, then rejected: the 2B rows of one forward pass.
std::vector<int64_t> pair_rows(const std::vector<int64_t>& items) {
  std::vector<int64_t> rows = rows_of_items(items, 0), rejected = rows_of_items(items, 1);
  rows.insert(rows.end(), rejected.begin(), rejected.end());
  return rows;
}

void check_has_targets(const std::vector<ResponseLogp>& logps, const std::vector<int64_t>& rows, DataSplit split) {
  for (size_t i = 0; i < logps.size(); ++i)
    FAB_USER_CHECK(logps[i].tokens > 0,
                   "{} sequence {}: its response has no target tokens (all cut off by cutoff_len?); the preference "
                   "losses need at least one",
                   split == DataSplit::train ? "training" : "evaluation", rows[i]);
}

// Runs the model over `batch` and the per-row log-probabilities through `loss`, which returns the
// loss and writes dL/d(row sum) for every row. Under context parallel (`cp`) each rank runs its
// share of every row and the rows' sums and target counts are added over the cp group first: every
// rank sees the whole rows' values (and the same loss), and back-propagates dL/d(row sum) through
// its own tokens; the gradients' sum over cp is the whole rows' gradient.
double logp_forward(DecoderModel& model, const Batch& batch, bool with_grad, const ContextParallel* cp,
                    const std::function<double(const std::vector<ResponseLogp>&, std::vector<float>&)>& loss) {
  const Tensor whole_targets = model.shifted_labels(batch.labels);
  PipelineMicroBatch part{batch.ids, batch.labels, image_layout(batch)};
  if (cp) {
    part.layout.lengths = batch.lengths;
    part = cp->shard(part, whole_targets);
  }
  const Tensor& targets = cp ? part.layout.targets : whole_targets;
  return model.forward_with_head(
      part.ids, with_grad,
      [&](Tape& tape, const Var& hidden) {
        SequenceLogps lp = sequence_logps(tape, hidden, model.lm_head(), targets, part.ids.dim(0));
        std::vector<double> sums(lp.sum);
        sums.insert(sums.end(), lp.count.begin(), lp.count.end());
        if (cp) cp->group().all_reduce(sums.data(), int64_t(sums.size()), "row log-probabilities").wait();
        std::vector<ResponseLogp> rows(lp.sum.size());
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = {sums[i], int64_t(sums[rows.size() + i])};
        return loss(rows, *lp.grad);
      },
      part.layout);
}

// ------------------------------------------------------------------------------------------------
// dpo: the DPO family (pref_loss), chosen and rejected in one forward pass.

class DpoObjective : public PreferenceObjective {
 public:
  DpoObjective(const TrainConfig& c, const StageData& data) : data_(data), eval_batch_(c.per_device_eval_batch_size) {
    options_.loss = parse_pref_loss(c.pref_loss);
    options_.beta = c.pref_beta;
    options_.ftx = c.pref_ftx;
    options_.simpo_gamma = c.simpo_gamma;
    options_.label_smoothing = c.dpo_label_smoothing;
  }

  void prepare(DecoderModel& model, Communicator& group) override {
    if (needs_reference(options_.loss) && !reference_)
      reference_ = make_reference(model, data_, group, 2 * eval_batch_, cp_);
  }

  std::vector<std::string> metric_names() const override {
    return {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected"};
  }

  nlohmann::json memory_json() const override {
    return {{"reference_logps_bytes", reference_ ? reference_->bytes() : 0}};
  }

  double step(DecoderModel& model, DataSplit split, const std::vector<int64_t>& items, float loss_scale,
              bool with_grad, StageMetrics& metrics, Communicator&) override {
    const std::vector<int64_t> rows = pair_rows(items);
    const Batch batch = data_.batch(split, rows);
    const size_t n = items.size();
    std::vector<ResponseLogp> ref(2 * n);
    if (reference_) ref = reference_->of(model, split, rows, batch);
    return logp_forward(model, batch, with_grad, cp_, [&](const std::vector<ResponseLogp>& lp, std::vector<float>& grad) {
      check_has_targets(lp, rows, split);
      double loss = 0;
      for (size_t i = 0; i < n; ++i) {
        const PairResult p = preference_pair_loss(options_, lp[i], lp[n + i], ref[i], ref[n + i]);
        loss += p.loss;
        grad[i] = float(loss_scale * p.d_chosen);
        grad[n + i] = float(loss_scale * p.d_rejected);
        metrics.add(0, p.chosen_reward);
        metrics.add(1, p.rejected_reward);
        metrics.add(2, p.chosen_reward > p.rejected_reward ? 1.0 : 0.0);
        metrics.add(3, p.chosen_reward - p.rejected_reward);
        metrics.add(4, p.chosen_logp);
        metrics.add(5, p.rejected_logp);
      }
      return loss;
    });
  }

 private:
  StageData data_;
  int64_t eval_batch_;
  PrefLossOptions options_;
  std::unique_ptr<ReferenceLogps> reference_;
};

// ------------------------------------------------------------------------------------------------
// kto: desirable and undesirable examples against a KL estimate from mismatched completions.

class KtoObjective : public PreferenceObjective {
 public:
  KtoObjective(const TrainConfig& c, const StageData& data) : data_(data), eval_batch_(c.per_device_eval_batch_size) {
    options_.beta = c.pref_beta;
    options_.desirable_weight = c.kto_chosen_weight;
    options_.undesirable_weight = c.kto_rejected_weight;
  }

  void prepare(DecoderModel& model, Communicator& group) override {
    if (!reference_) reference_ = make_reference(model, data_, group, 2 * eval_batch_, cp_);
  }

  std::vector<std::string> metric_names() const override {
    return {"rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected", "kl"};
  }

  nlohmann::json metrics_json(const StageMetrics& m, const std::string& prefix) const override {
    nlohmann::json j = PreferenceObjective::metrics_json(m, prefix);
    if (m.has(0) && m.has(1)) j[prefix + "rewards/margins"] = m.mean(0) - m.mean(1);
    return j;
  }

  nlohmann::json memory_json() const override {
    return {{"reference_logps_bytes", reference_ ? reference_->bytes() : 0}};
  }

  // TRL's KTOTrainer: kl = max(0, mean over the ranks of each rank's mean of
  // (policy - reference) log-probabilities of its mismatched completions), detached.
  double step(DecoderModel& model, DataSplit split, const std::vector<int64_t>& items, float loss_scale,
              bool with_grad, StageMetrics& metrics, Communicator& group) override {
    const std::vector<int64_t> rows = rows_of_items(items, 0), kl_rows = rows_of_items(items, 1);
    const Batch batch = collate(data_.rows(split), rows, data_.pad_id);
    const Batch kl_batch = collate(data_.rows(split), kl_rows, data_.pad_id);
    const std::vector<ResponseLogp> ref = reference_->of(model, split, rows, batch);
    const std::vector<ResponseLogp> ref_kl = reference_->of(model, split, kl_rows, kl_batch);
    const std::vector<ResponseLogp> policy_kl = batch_logps(model, kl_batch, cp_);
    double kl_parts[2] = {0, 1};  // this rank's mean, one rank
    for (size_t i = 0; i < items.size(); ++i) kl_parts[0] += (policy_kl[i].sum - ref_kl[i].sum) / double(items.size());
    group.all_reduce(kl_parts, 2, "kto kl").wait();
    const double kl = std::max(0.0, kl_parts[0] / kl_parts[1]);
    metrics.add(4, kl);
    const std::vector<uint8_t>& desirable = data_.desirable(split);
    return logp_forward(model, batch, with_grad, cp_, [&](const std::vector<ResponseLogp>& lp, std::vector<float>& grad) {
      check_has_targets(lp, rows, split);
      double loss = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        const bool good = desirable[size_t(items[i])] != 0;
        const KtoResult k = kto_example_loss(options_, good, lp[i].sum, ref[i].sum, kl);
        loss += k.loss;
        grad[i] = float(loss_scale * k.d_logp);
        metrics.add(good ? 0 : 1, k.reward);
        metrics.add(good ? 2 : 3, lp[i].sum);
      }
      return loss;
    });
  }

 private:
  StageData data_;
  int64_t eval_batch_;
  KtoOptions options_;
  std::unique_ptr<ReferenceLogps> reference_;
};

// ------------------------------------------------------------------------------------------------
// rm: the value head's score at each sequence's last token, pairwise loss.

class RewardObjective : public PreferenceObjective {
 public:
  explicit RewardObjective(const StageData& data) : data_(data) {}

  std::vector<std::string> metric_names() const override {
    return {"rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margins"};
  }

  // LLaMA-Factory's PairwiseTrainer: scores at attention_mask.sum() - 1, the last real token of a
  // right-padded row; loss -log σ(s_chosen - s_rejected), the mean over pairs. Under context
  // parallel the rank holding a row's last token scores it, the scores are summed over cp (the
  // others add 0), and that rank alone back-propagates the row's dL/d score.
  double step(DecoderModel& model, DataSplit split, const std::vector<int64_t>& items, float loss_scale,
              bool with_grad, StageMetrics& metrics, Communicator&) override {
    const std::vector<int64_t> rows = pair_rows(items);
    const TokenSequences& data = data_.rows(split);
    const Batch batch = data_.batch(split, rows);
    const int64_t T = batch.ids.dim(1), n = int64_t(items.size());
    PipelineMicroBatch part{batch.ids, batch.labels, image_layout(batch)};
    if (cp_) part = cp_->shard(part, model.shifted_labels(batch.labels));
    const int64_t width = part.ids.dim(1);
    std::vector<int64_t> last, scored;  // this rank's hidden rows read, and their sequences
    for (size_t r = 0; r < rows.size(); ++r) {
      const int64_t t = data.length(rows[r]) - 1, at = cp_ ? cp_->local_index(T, t) : t;
      if (at < 0) continue;
      last.push_back(int64_t(r) * width + at);
      scored.push_back(int64_t(r));
    }
    return model.forward_with_head(
        part.ids, with_grad,
        [&](Tape& tape, const Var& hidden) {
          RowScores s = row_scores(tape, hidden, model.value_head(), last);
          std::vector<double> score(rows.size(), 0.0), d(rows.size(), 0.0);
          for (size_t k = 0; k < scored.size(); ++k) score[size_t(scored[k])] = s.value[k];
          if (cp_) cp_->group().all_reduce(score.data(), int64_t(score.size()), "reward scores").wait();
          double loss = 0;
          for (int64_t i = 0; i < n; ++i) {
            const double chosen = score[size_t(i)], rejected = score[size_t(n + i)];
            const RewardPairResult p = reward_pair_loss(chosen, rejected);
            loss += p.loss;
            d[size_t(i)] = loss_scale * p.d_chosen;
            d[size_t(n + i)] = loss_scale * p.d_rejected;
            metrics.add(0, chosen);
            metrics.add(1, rejected);
            metrics.add(2, chosen > rejected ? 1.0 : 0.0);
            metrics.add(3, chosen - rejected);
          }
          for (size_t k = 0; k < scored.size(); ++k) (*s.grad)[k] = float(d[size_t(scored[k])]);
          return loss;
        },
        part.layout);
  }

 private:
  StageData data_;
};

}  // namespace

std::vector<ResponseLogp> batch_logps(DecoderModel& model, const Batch& batch, const ContextParallel* cp) {
  std::vector<ResponseLogp> out;
  logp_forward(model, batch, false, cp, [&](const std::vector<ResponseLogp>& rows, std::vector<float>&) {
    out = rows;
    return 0.0;
  });
  return out;
}

// Rank r takes batches r, r + N, ...; in a round where it has none left it runs a one-row pass
// whose result is dropped, so every rank runs as many forward passes (ZeRO-3 gathers in each).
// Each sequence is computed by one rank and zero elsewhere, so the sum over the ranks is exact.
std::vector<ResponseLogp> AdapterReference::of(DecoderModel& model, DataSplit, const std::vector<int64_t>&,
                                               const Batch& batch) {
  model.set_adapters_enabled(false);
  std::vector<ResponseLogp> logps;
  try {
    logps = batch_logps(model, batch, cp_);
  } catch (...) {
    model.set_adapters_enabled(true);
    throw;
  }
  model.set_adapters_enabled(true);
  return logps;
}

std::unique_ptr<ReferenceLogps> make_reference(DecoderModel& model, const StageData& data, Communicator& group,
                                               int64_t eval_batch_rows, const ContextParallel* cp) {
  if (model.lora().enabled()) return std::make_unique<AdapterReference>(cp);
  return std::make_unique<PrecomputedReference>(model, data, group, eval_batch_rows, cp);
}

PrecomputedReference::PrecomputedReference(DecoderModel& model, const StageData& data, Communicator& group,
                                           int64_t eval_batch_rows, const ContextParallel* cp) {
  for (DataSplit split : {DataSplit::train, DataSplit::eval}) {
    const TokenSequences& rows = data.rows(split);
    const int64_t n = rows.size(), ranks = group.size();
    const int64_t batches = (n + eval_batch_rows - 1) / eval_batch_rows, rounds = (batches + ranks - 1) / ranks;
    std::vector<double> values(size_t(2 * n), 0.0);  // sum, tokens per sequence
    for (int64_t round = 0; round < rounds; ++round) {
      const int64_t first = (round * ranks + group.rank()) * eval_batch_rows;
      std::vector<int64_t> picked;
      for (int64_t i = first; i < std::min(n, first + eval_batch_rows); ++i) picked.push_back(i);
      const std::vector<ResponseLogp> lp =
          batch_logps(model, data.batch(split, picked.empty() ? std::vector<int64_t>{0} : picked), cp);
      for (size_t k = 0; k < picked.size(); ++k) {
        values[size_t(2 * picked[k])] = lp[k].sum;
        values[size_t(2 * picked[k] + 1)] = double(lp[k].tokens);
      }
    }
    group.all_reduce(values.data(), int64_t(values.size()), "reference log-probabilities").wait();
    std::vector<ResponseLogp>& out = split == DataSplit::train ? train_ : eval_;
    for (int64_t i = 0; i < n; ++i) out.push_back({values[size_t(2 * i)], int64_t(values[size_t(2 * i + 1)])});
  }
}

std::vector<ResponseLogp> PrecomputedReference::of(DecoderModel&, DataSplit split, const std::vector<int64_t>& rows,
                                                   const Batch&) {
  const std::vector<ResponseLogp>& all = split == DataSplit::train ? train_ : eval_;
  std::vector<ResponseLogp> out;
  for (int64_t r : rows) out.push_back(all[size_t(r)]);
  return out;
}

int64_t PrecomputedReference::bytes() const {
  return int64_t((train_.size() + eval_.size()) * sizeof(ResponseLogp));
}

nlohmann::json PreferenceObjective::metrics_json(const StageMetrics& m, const std::string& prefix) const {
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i < m.names().size(); ++i)
    if (m.has(i)) j[prefix + m.names()[i]] = m.mean(i);
  return j;
}

std::unique_ptr<PreferenceObjective> make_preference_objective(const TrainConfig& c, const StageData& data) {
  if (c.stage == Stage::dpo) return std::make_unique<DpoObjective>(c, data);
  if (c.stage == Stage::kto) return std::make_unique<KtoObjective>(c, data);
  if (c.stage == Stage::rm) return std::make_unique<RewardObjective>(data);
  return nullptr;
}

}  // namespace fab
