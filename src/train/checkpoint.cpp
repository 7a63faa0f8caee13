#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_write.h"
#include "core/trace.h"
#include "io/hf_checkpoint.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "parallel/pipeline_parallel.h"
#include "parallel/tensor_parallel.h"
#include "train/finetuning.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

int64_t step_of(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("checkpoint-", 0) != 0) return -1;
  const std::string digits = name.substr(11);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::vector<fs::path> checkpoints_by_step(const std::string& output_dir) {
  std::vector<fs::path> found;
  if (!fs::exists(output_dir)) return found;
  for (const auto& e : fs::directory_iterator(output_dir))
    if (e.is_directory() && step_of(e.path()) >= 0) found.push_back(e.path());
  std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return found;
}

// Each pipeline stage's optimizer files carry the stage in their name: stages hold different
// parameters (and a tied head's copy of the embedding has its own moments).
std::string stage_prefix(const PipelineParallel* pipeline) {
  return pipeline ? format("stage-{}-of-{}-", pipeline->stage(), pipeline->num_stages()) : "";
}

// Tensor parallel: (this rank's slot, slots) of the group, (0, 1) without it.
std::pair<int, int> tp_place(const DataParallel& dp) {
  const TensorParallelOps* tp = dp.model().options().tp;
  return tp ? std::pair{tp->rank(), tp->size()} : std::pair{0, 1};
}

// optimizer-rank-R-of-N.safetensors, with -tp-T-of-P before the extension under tensor parallel
// (each tp rank's pieces are slices of its own).
std::string optimizer_file(int rank, int ranks, std::pair<int, int> tp) {
  const std::string suffix = tp.second > 1 ? "-tp-" + std::to_string(tp.first) + "-of-" + std::to_string(tp.second) : "";
  return "optimizer-rank-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + suffix + ".safetensors";
}

// An integer of a shard's metadata, `fallback` when absent (shards saved without tensor parallel).
int64_t metadata_int(const SafetensorsFile& f, const std::string& key, int64_t fallback) {
  const auto it = f.metadata().find(key);
  if (it == f.metadata().end()) return fallback;
  int64_t value = -1;
  const std::string& text = it->second;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  FAB_USER_CHECK(error == std::errc() && end == text.data() + text.size() && value >= 0,
                 "{}: metadata \"{}\" must be a non-negative integer, got \"{}\"", f.path(), key, text);
  return value;
}

// This rank's AdamW moments (views), with the list of (parameter, first element, length) they hold.
struct OptimizerShard {
  std::vector<NamedTensor> moments;
  std::map<std::string, std::string> metadata;
};

OptimizerShard optimizer_shard(const DataParallel& dp) {
  const AdamW& opt = dp.optimizer();
  nlohmann::json segments = nlohmann::json::array();
  for (const OptimizerSegment& s : opt.segments())
    segments.push_back({dp.model().params().params()[s.param].name, s.begin, s.length});
  const auto [tp_rank, tp_size] = tp_place(dp);
  return {{{"exp_avg", opt.exp_avg()}, {"exp_avg_sq", opt.exp_avg_sq()}},
          {{"step", std::to_string(opt.steps_taken())},
           {"segments", segments.dump()},
           {"tensor_parallel_size", std::to_string(tp_size)},
           {"tensor_parallel_rank", std::to_string(tp_rank)}}};
}

struct SavedPiece {
  const SafetensorsFile* file;
  int64_t begin, length, at;  // elements of the parameter; position in the file's moments
};

// The optimizer steps an optimizer shard records in its metadata: a non-negative integer.
int64_t steps_taken(const SafetensorsFile& f) {
  const auto it = f.metadata().find("step");
  const std::string text = it == f.metadata().end() ? "" : it->second;
  int64_t step = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), step);
  FAB_USER_CHECK(error == std::errc() && end == text.data() + text.size() && step >= 0,
                 "{}: metadata \"step\" must be a non-negative integer, got \"{}\"", f.path(), text);
  return step;
}

// Fills this rank's segments of the moments from the pieces saved by every rank of the run that
// wrote the checkpoint, whatever its world size was.
void load_optimizer_shards(const fs::path& dir, DataParallel& dp, const std::string& prefix) {
  std::vector<SafetensorsFile> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix + "optimizer-rank-", 0) == 0)
      files.push_back(SafetensorsFile::open(e.path().string()));
  FAB_USER_CHECK(!files.empty(), "{}: no {}optimizer-rank-*.safetensors (not a complete checkpoint)", dir.string(),
                 prefix);
  // Optimizer state saved at another tensor_parallel_size would have to be cut anew: not implemented.
  const auto [tp_rank, tp_size] = tp_place(dp);
  for (const SafetensorsFile& f : files)
    FAB_USER_CHECK(metadata_int(f, "tensor_parallel_size", 1) == tp_size,
                   "{}: saved at tensor_parallel_size {}, resumed at tensor_parallel_size {}: resuming at another "
                   "tensor-parallel layout is not implemented (resume at tensor_parallel_size {}, or start from the "
                   "checkpoint's model folder without resume_from_checkpoint)",
                   dir.string(), metadata_int(f, "tensor_parallel_size", 1), tp_size, metadata_int(f, "tensor_parallel_size", 1));
  std::map<std::string, std::vector<SavedPiece>> pieces;
  for (const SafetensorsFile& f : files) {
    if (metadata_int(f, "tensor_parallel_rank", 0) != tp_rank) continue;
    try {
      int64_t at = 0;
      for (const auto& seg : nlohmann::json::parse(f.metadata().at("segments"))) {
        const int64_t begin = seg.at(1).get<int64_t>(), length = seg.at(2).get<int64_t>();
        FAB_USER_CHECK(begin >= 0 && length >= 0, "segment {} has a negative first element or length", seg.dump());
        pieces[seg.at(0).get<std::string>()].push_back({&f, begin, length, at});
        at += length;
      }
      FAB_USER_CHECK(f.tensor("exp_avg").numel() == at && f.tensor("exp_avg_sq").numel() == at,
                     "{}: moments hold {} values, its segments {}", f.path(), f.tensor("exp_avg").numel(), at);
    } catch (const std::exception& e) {
      throw UserError(format("{}: bad optimizer shard: {}", f.path(), e.what()));
    }
  }
  AdamW& opt = dp.optimizer();
  int64_t at = 0;
  for (const OptimizerSegment& s : opt.segments()) {
    const std::string& name = dp.model().params().params()[s.param].name;
    int64_t covered = 0;
    for (const SavedPiece& p : pieces[name]) {
      const int64_t first = std::max(s.begin, p.begin), last = std::min(s.begin + s.length, p.begin + p.length);
      if (first >= last) continue;
      for (auto [key, dst] : {std::pair{"exp_avg", &opt.exp_avg()}, std::pair{"exp_avg_sq", &opt.exp_avg_sq()}})
        std::copy_n(p.file->tensor(key).data<float>() + p.at + (first - p.begin), last - first,
                    dst->data<float>() + at + (first - s.begin));
      covered += last - first;
    }
    FAB_USER_CHECK(covered == s.length, "{}: optimizer state of {} covers {} of its elements [{}, {})",
                   dir.string(), name, covered, s.begin, s.begin + s.length);
    at += s.length;
  }
  opt.set_steps_taken(steps_taken(files.front()));
}

// A step skipped under nan_policy skip has a non-finite loss: null in the JSON (which has no NaN).
nlohmann::json losses_to_json(const std::vector<double>& losses) {
  nlohmann::json out = nlohmann::json::array();
  for (double loss : losses) out.push_back(std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json());
  return out;
}

std::vector<double> losses_from_json(const nlohmann::json& j) {
  if (!j.is_array()) throw nlohmann::json::type_error::create(302, "losses must be a list of numbers", &j);
  std::vector<double> losses;
  for (const nlohmann::json& loss : j) losses.push_back(loss.is_null() ? NAN : loss.get<double>());
  return losses;
}

// Every number of trainer_state.json in range, and one loss per step taken.
void check_trainer_state(const TrainerState& s, const std::string& path) {
  auto require_non_negative = [&](int64_t value, const char* field) {
    FAB_USER_CHECK(value >= 0, "{}: {} must be >= 0, got {}", path, field, value);
  };
  require_non_negative(s.global_step, "global_step");
  require_non_negative(s.sampler.epoch, "sampler_epoch");
  require_non_negative(s.sampler.position, "sampler_position");
  FAB_USER_CHECK(s.world_size >= 1, "{}: world_size must be >= 1, got {}", path, s.world_size);
  FAB_USER_CHECK(int64_t(s.losses.size()) == s.global_step,
                 "{}: losses holds {} values but global_step is {} (expected one loss per step)", path,
                 s.losses.size(), s.global_step);
}

}  // namespace

namespace {

// One rank's part of a checkpoint, gathered at the step: what it writes needs no collective.
struct CheckpointPart {
  fs::path final_dir, tmp;
  bool main = false;  // writes the weights and trainer state, fsyncs the folder and renames it
  ModelConfig model_config;
  std::vector<NamedTensor> weights;  // main: the whole model (empty under LoRA: written at the step)
  std::string trainer_state, config_yaml;
  std::string shard_file;  // this rank's optimizer shard ("" when another rank writes the same one)
  std::vector<NamedTensor> moments;
  std::map<std::string, std::string> shard_metadata;
  std::string marker;     // async: the file that says this rank's part is on disk
  int64_t job_ranks = 1;  // async: the markers the main rank waits for
};

std::vector<NamedTensor> copied(const std::vector<NamedTensor>& tensors) {
  std::vector<NamedTensor> out;
  for (const NamedTensor& t : tensors) out.push_back({t.name, t.tensor.clone(MemoryCategory::temporaries)});
  return out;
}

// The whole model's tensors on the rank that writes them: the pipeline's stages gathered on
// stage 0, a tensor-parallel model's slices gathered, or the model's own parameters (views: the
// parameters must stay gathered while they are used). Collective, as save_checkpoint.
std::vector<NamedTensor> whole_weights(DataParallel& dp, Communicator* tp, PipelineParallel* pipeline, bool main) {
  if (pipeline) return dp.group().rank() == 0 ? pipeline->gather_weights() : std::vector<NamedTensor>();
  if (tp) return gather_full_tensors(dp.model(), *tp);
  std::vector<NamedTensor> tensors;
  if (main && !dp.model().lora().enabled())
    for (const auto& [p, buffer] : dp.model().base_parameters()) tensors.push_back({p->name, buffer->values_f32(*p)});
  return tensors;
}

std::string trainer_state_json(const TrainerState& state, int64_t world_size, int64_t stages) {
  const nlohmann::json j = {{"global_step", state.global_step},
                            {"sampler_epoch", state.sampler.epoch},
                            {"sampler_position", state.sampler.position},
                            {"losses", losses_to_json(state.losses)},
                            {"world_size", world_size},
                            {"pipeline_parallel_size", stages}};
  return j.dump(1) + "\n";
}

// Everything this rank writes of the checkpoint, its tensors copied when `copy` (async_save);
// the main rank makes the temporary folder (and writes a LoRA adapter into it). Collective. The
// caller keeps the parameters gathered until the part's weights are written or copied.
CheckpointPart take_part(const std::string& dir, DataParallel& dp, const TrainerState& state,
                         const std::string& config_yaml, Communicator* tp, const std::string& base_model,
                         PipelineParallel* pipeline, bool copy) {
  Communicator& group = dp.group();
  const bool stage_main = group.rank() == 0;  // of this stage's data-parallel group
  CheckpointPart part;
  part.final_dir = dir;
  part.tmp = part.final_dir.string() + ".tmp";
  part.main = stage_main && (!tp || tp->rank() == 0) && (!pipeline || pipeline->stage() == 0);
  std::vector<NamedTensor> weights = whole_weights(dp, tp, pipeline, part.main);
  if (part.main) {
    fs::remove_all(part.tmp);
    fs::create_directories(part.tmp);
    if (dp.model().lora().enabled()) save_trained_weights(dp.model(), part.tmp.string(), base_model);
    part.model_config = dp.model().config();
    part.weights = copy ? copied(weights) : std::move(weights);
    part.trainer_state = trainer_state_json(state, group.size(), pipeline ? pipeline->num_stages() : 1);
    part.config_yaml = config_yaml;
  }
  const std::string shard = stage_prefix(pipeline) + optimizer_file(group.rank(), group.size(), tp_place(dp));
  // Without ZeRO every data-parallel rank of a stage holds the whole optimizer state (of its
  // tensor-parallel slices): data-parallel rank 0 writes it once.
  if (dp.zero_stage() > 0 || stage_main) {
    part.shard_file = shard;
    const OptimizerShard s = optimizer_shard(dp);
    part.moments = copy ? copied(s.moments) : s.moments;
    part.shard_metadata = s.metadata;
  }
  part.marker = ".written-" + shard;
  part.job_ranks = int64_t(group.size()) * tp_place(dp).second * (pipeline ? pipeline->num_stages() : 1);
  return part;
}

// FAB_TEST_SLOW_SAVE_MS: tests make a checkpoint's write take this long (so a kill lands mid-write).
void pause_for_tests() {
  const char* ms = std::getenv("FAB_TEST_SLOW_SAVE_MS");
  if (ms) std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(ms)));
}

void write_main_files(const CheckpointPart& part) {
  if (!part.weights.empty()) save_model_folder(part.model_config, part.weights, part.tmp.string());
  write_file_atomically((part.tmp / "trainer_state.json").string(), part.trainer_state);
  write_file_atomically((part.tmp / "train_config.yaml").string(), part.config_yaml);
}

void write_shard(const CheckpointPart& part) {
  if (!part.shard_file.empty()) save_safetensors((part.tmp / part.shard_file).string(), part.moments, part.shard_metadata);
}

// Every file is on disk (each was fsynced as it was written): the folder too, then the rename.
void rename_into_place(const CheckpointPart& part) {
  for (const auto& e : fs::directory_iterator(part.tmp)) fsync_path(e.path());
  fsync_path(part.tmp);
  fs::remove_all(part.final_dir);
  fs::rename(part.tmp, part.final_dir);
  fsync_path(part.final_dir.parent_path().empty() ? fs::path(".") : part.final_dir.parent_path());
}

std::vector<fs::path> markers_in(const fs::path& tmp) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(tmp))
    if (e.path().filename().string().rfind(".written-", 0) == 0) found.push_back(e.path());
  return found;
}

// The main rank's writer: every rank's marker, found on the (shared) file system — no collective.
// False when abandoned (the job is ending on an error); a UserError past `timeout`.
bool wait_for_markers(const CheckpointPart& part, std::chrono::seconds timeout, const std::atomic<bool>& abandon) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (int64_t(markers_in(part.tmp).size()) < part.job_ranks) {
    if (abandon) return false;
    FAB_USER_CHECK(std::chrono::steady_clock::now() < deadline,
                   "{}: {} of {} ranks wrote their part of the checkpoint within ddp_timeout {} s (async_save)",
                   part.tmp.string(), markers_in(part.tmp).size(), part.job_ranks, timeout.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const fs::path& m : markers_in(part.tmp)) fs::remove(m);
  return true;
}

void write_in_background(const CheckpointPart& part, std::chrono::seconds peers_timeout,
                         const std::atomic<bool>& abandon, int64_t keep) {
  if (trace::recording()) trace::name_thread("checkpoint writer");  // a thread per save: named only when traced
  trace::Scope traced(trace::kCheckpoint, "write " + part.final_dir.filename().string());
  if (part.main) write_main_files(part);
  pause_for_tests();
  write_shard(part);
  write_file_atomically((part.tmp / part.marker).string(), "");
  if (!part.main || !wait_for_markers(part, peers_timeout, abandon)) return;
  rename_into_place(part);
  prune_checkpoints(part.final_dir.parent_path().string(), keep);
}

}  // namespace

void save_checkpoint(const std::string& dir, DataParallel& dp, const TrainerState& state,
                     const std::string& config_yaml, Communicator* tp, const std::string& base_model,
                     PipelineParallel* pipeline) {
  dp.gather_all_parameters();
  CheckpointPart part = take_part(dir, dp, state, config_yaml, tp, base_model, pipeline, false);
  if (part.main) write_main_files(part);
  part.weights.clear();
  dp.release_gathered_parameters();
  // The data-parallel group's barrier, then the tensor-parallel group's or the pipeline's:
  // together every rank of the job.
  auto barrier = [&](const std::string& what) {
    dp.group().barrier(what);
    if (tp) tp->barrier(what);
    if (pipeline) pipeline->group().barrier(what);
  };
  barrier("checkpoint: folder made");
  pause_for_tests();
  write_shard(part);
  barrier("checkpoint: shards written");
  if (part.main) rename_into_place(part);
  barrier("checkpoint: renamed");
}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  abandon_ = true;
  if (writer_.joinable()) writer_.join();
}

void AsyncCheckpointWriter::save(const std::string& dir, DataParallel& dp, const TrainerState& state,
                                 const std::string& config_yaml, Communicator* tp, const std::string& base_model,
                                 PipelineParallel* pipeline, int64_t keep) {
  wait();
  dp.gather_all_parameters();
  auto part = std::make_shared<CheckpointPart>(take_part(dir, dp, state, config_yaml, tp, base_model, pipeline, true));
  dp.release_gathered_parameters();
  // On the training thread, in the step's order: the folder exists before any rank writes into it.
  dp.group().barrier("checkpoint: folder made");
  if (tp) tp->barrier("checkpoint: folder made");
  if (pipeline) pipeline->group().barrier("checkpoint: folder made");
  done_ = false;
  writer_ = std::thread([this, part, keep] {
    try {
      write_in_background(*part, peers_timeout_, abandon_, keep);
    } catch (const std::exception& e) {
      failure_ = std::make_exception_ptr(
          UserError(format("{} (written in the background, async_save): {}", part->final_dir.string(), e.what())));
    }
    done_ = true;
  });
}

void AsyncCheckpointWriter::check() {
  if (done_) wait();
}

void AsyncCheckpointWriter::wait() {
  if (writer_.joinable()) writer_.join();
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

TrainerState load_checkpoint(const std::string& dir, DataParallel& dp, PipelineParallel* pipeline) {
  FAB_USER_CHECK(fs::exists(fs::path(dir) / "trainer_state.json"), "{}: not a Fabrica checkpoint (no trainer_state.json)",
                 dir);
  std::ifstream in(fs::path(dir) / "trainer_state.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    const int64_t saved_stages = j.value("pipeline_parallel_size", int64_t(1));
    const int64_t stages = pipeline ? pipeline->num_stages() : 1;
    FAB_USER_CHECK(saved_stages == stages,
                   "{} was saved with pipeline_parallel_size {} and this run has pipeline_parallel_size {}: resuming at "
                   "another pipeline layout is not implemented yet (its optimizer state is per stage)",
                   dir, saved_stages, stages);
    load_trained_weights(dp.model(), dir);
    if (dp.model().options().value_head) load_value_head(dp.model(), dir);
    dp.weights_loaded();
    load_optimizer_shards(dir, dp, stage_prefix(pipeline));
    TrainerState s;
    s.global_step = j.at("global_step").get<int64_t>();
    s.sampler.epoch = j.at("sampler_epoch").get<int64_t>();
    s.sampler.position = j.at("sampler_position").get<int64_t>();
    s.losses = losses_from_json(j.at("losses"));
    s.world_size = j.value("world_size", int64_t(1));
    check_trainer_state(s, (fs::path(dir) / "trainer_state.json").string());
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw UserError(format("{}/trainer_state.json: {}", dir, e.what()));
  }
}

std::string latest_checkpoint(const std::string& output_dir) {
  auto found = checkpoints_by_step(output_dir);
  return found.empty() ? "" : found.back().string();
}

std::string checkpoint_to_resume(const TrainConfig& config) {
  const std::string& value = config.resume_from_checkpoint;
  const std::optional<bool> flag = parse_bool(value);
  if (value.empty() || flag == false) return "";
  if (flag == true) {
    const std::string latest = latest_checkpoint(config.output_dir);
    FAB_USER_CHECK(!latest.empty(),
                   "resume_from_checkpoint: true: no valid checkpoint found in output_dir {} (no checkpoint-N folder)",
                   config.output_dir);
    return latest;
  }
  FAB_USER_CHECK(fs::exists(fs::path(value) / "trainer_state.json"),
                 "resume_from_checkpoint: {}: not a Fabrica checkpoint (expected a checkpoint-N folder with "
                 "trainer_state.json)",
                 value);
  return value;
}

void prune_checkpoints(const std::string& output_dir, int64_t keep) {
  if (keep <= 0) return;
  auto found = checkpoints_by_step(output_dir);
  for (size_t i = 0; i + size_t(keep) < found.size(); ++i) fs::remove_all(found[i]);
}

}  // namespace fab
