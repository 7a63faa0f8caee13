#pragma once
// The preference stages' objectives (dpo, kto, rm), which PreferenceStage calls once per
// micro-batch: they turn a micro-batch of items (a pair for dpo and rm, an example for kto) into a
// loss and its gradient. Normalisation over the global step and the optimizer are the stage's.
//
// Data layout (dataset/prepare.h): item i is sequences 2i and 2i + 1 of its split: chosen and
// rejected (dpo, rm), or the completion and the mismatched completion of the KL term (kto).
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/train_config.h"
#include "dataset/token_sequences.h"
#include "models/decoder.h"
#include "parallel/context_parallel.h"
#include "train/batch.h"
#include "train/stages/preference_loss.h"
#include "train/stages/stage.h"

namespace fab {

enum class DataSplit { train, eval };

struct StageData {
  const TokenSequences* train = nullptr;
  const TokenSequences* eval = nullptr;
  const std::vector<uint8_t>* train_desirable = nullptr;  // kto
  const std::vector<uint8_t>* eval_desirable = nullptr;
  int32_t pad_id = 0;
  // A vision-language model's dpo / rm data: each sequence's images (empty: text only).
  const std::vector<SequenceImages>* train_images = nullptr;
  const std::vector<SequenceImages>* eval_images = nullptr;
  const TokenSequences& rows(DataSplit s) const { return s == DataSplit::train ? *train : *eval; }
  const std::vector<SequenceImages>& images(DataSplit s) const {
    static const std::vector<SequenceImages> none;
    const std::vector<SequenceImages>* images = s == DataSplit::train ? train_images : eval_images;
    return images ? *images : none;
  }
  // Sequences `indices` of split `s` as one batch, their images with them.
  Batch batch(DataSplit s, const std::vector<int64_t>& indices) const {
    return collate(rows(s), indices, pad_id, false, images(s));
  }
  const std::vector<uint8_t>& desirable(DataSplit s) const {
    return s == DataSplit::train ? *train_desirable : *eval_desirable;
  }
};

// The reference model's summed log-probabilities of sequences. The seam between full fine-tuning
// (computed once before training from the starting weights: PrecomputedReference) and LoRA (the
// same model with its adapters disabled, per step).
class ReferenceLogps {
 public:
  virtual ~ReferenceLogps() = default;
  // `rows` are the sequence indices of `split` that `batch` holds, in its row order.
  virtual std::vector<ResponseLogp> of(DecoderModel& model, DataSplit split, const std::vector<int64_t>& rows,
                                       const Batch& batch) = 0;
  virtual int64_t bytes() const { return 0; }  // memory it holds
};

// Every sequence's log-probability under the starting weights, computed before the first step over
// the training and evaluation sets, the work split over the ranks (TRL's precompute_ref_log_probs):
// no second copy of the model. 16 bytes per sequence.
class PrecomputedReference : public ReferenceLogps {
 public:
  // Collective: every rank of `group` calls it. `eval_batch_rows`: sequences per forward pass.
  // `cp`: context parallel's sharding of the rows (null: whole rows on each rank).
  PrecomputedReference(DecoderModel& model, const StageData& data, Communicator& group, int64_t eval_batch_rows,
                       const ContextParallel* cp = nullptr);
  std::vector<ResponseLogp> of(DecoderModel& model, DataSplit split, const std::vector<int64_t>& rows,
                               const Batch& batch) override;
  int64_t bytes() const override;

 private:
  std::vector<ResponseLogp> train_, eval_;
};

// LoRA: the base model is the reference — the same model with its adapters disabled, run on each
// batch (TRL's null_ref_context; LLaMA-Factory's default with LoRA). No memory of its own.
class AdapterReference : public ReferenceLogps {
 public:
  explicit AdapterReference(const ContextParallel* cp = nullptr) : cp_(cp) {}
  std::vector<ResponseLogp> of(DecoderModel& model, DataSplit split, const std::vector<int64_t>& rows,
                               const Batch& batch) override;

 private:
  const ContextParallel* cp_;
};

// The reference of this model: adapters off under LoRA, else computed once now (collective).
std::unique_ptr<ReferenceLogps> make_reference(DecoderModel& model, const StageData& data, Communicator& group,
                                               int64_t eval_batch_rows, const ContextParallel* cp = nullptr);

// The summed log-probabilities of every row of `batch` (no gradient); under context parallel (`cp`)
// each rank runs its share of the rows and the sums are added over the cp group (collective).
std::vector<ResponseLogp> batch_logps(DecoderModel& model, const Batch& batch, const ContextParallel* cp = nullptr);

class PreferenceObjective {
 public:
  virtual ~PreferenceObjective() = default;
  int64_t items(const TokenSequences& rows) const { return rows.size() / 2; }
  // Run before the first step, on the starting weights (also when resuming: the reference is the
  // starting model, not the checkpoint's). Collective.
  virtual void prepare(DecoderModel&, Communicator&) {}
  // Context parallel: each rank runs its share of every row (dpo and kto; null: whole rows).
  void set_context_parallel(const ContextParallel* cp) { cp_ = cp; }
  // Forward (and backward when with_grad) of one micro-batch of items of `split`: accumulates the
  // gradient of loss_scale * (sum of the items' losses) and returns that sum. Collective (kto's KL
  // estimate spans the ranks).
  virtual double step(DecoderModel& model, DataSplit split, const std::vector<int64_t>& items, float loss_scale,
                      bool with_grad, StageMetrics& metrics, Communicator& group) = 0;
  virtual std::vector<std::string> metric_names() const = 0;
  // The logged metrics, `prefix` ("" or "eval_") before each name.
  virtual nlohmann::json metrics_json(const StageMetrics& metrics, const std::string& prefix) const;
  // Memory the stage holds besides the model (the reference log-probabilities).
  virtual nlohmann::json memory_json() const { return nlohmann::json::object(); }

 protected:
  const ContextParallel* cp_ = nullptr;
};

// dpo, kto or rm (`config.stage`). The sequences `data` points to must outlive the objective.
std::unique_ptr<PreferenceObjective> make_preference_objective(const TrainConfig& config, const StageData& data);

}  // namespace fab
