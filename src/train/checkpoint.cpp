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
#include "io/checkpoint_names.h"
#include "io/hf_checkpoint.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "models/peft_adapter.h"
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

// Each pipeline stage's optimizer files carry the stage in their name: stages hold different
// parameters (and a tied head's copy of the embedding has its own moments).
std::string stage_prefix(const ParallelModel& model) {
  const auto [stage, stages] = model.stage_place();
  return stages > 1 ? format("stage-{}-of-{}-", stage, stages) : "";
}

// Tensor parallel: (this rank's slot, slots) of the group, (0, 1) without it.
std::pair<int, int> tp_place(const DataParallel& dp) {
  const Sharding& s = dp.model().sharding();
  return {s.rank(), s.size()};
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

// Where a parameter's moments sit in its whole Hugging Face tensor, seen as a (rows, cols) matrix
// (a 1-D tensor: one column): the slice this rank holds (split_dim 0: rows [begin, begin + length),
// 1: those columns, -1: all of it), possibly running past the end (vocabulary padding).
struct SliceGeometry {
  int64_t full_rows = 1, full_cols = 1;  // the HF tensor
  int64_t rows = 1, cols = 1;            // the slice held
  int64_t row0 = 0, col0 = 0;            // its first row and column in the HF tensor

  static SliceGeometry of(const Shape& full, int split_dim, int64_t begin, int64_t length) {
    SliceGeometry g;
    g.full_rows = full.empty() ? 1 : full[0];
    g.full_cols = full.size() > 1 ? shape_numel(full) / full[0] : 1;
    g.rows = g.full_rows;
    g.cols = g.full_cols;
    if (split_dim == 0) g.rows = length, g.row0 = begin;
    if (split_dim == 1) g.cols = length, g.col0 = begin;
    return g;
  }
};

SliceGeometry geometry_of(const DecoderModel& model, size_t param) {
  const ShardSpec& s = model.shard(param);
  return SliceGeometry::of(s.full_shape, s.split_dim, s.begin, s.length);
}

// This rank's AdamW moments (views), with the list of what they hold: per segment (parameter, first
// element, length) of the slice this rank holds, and that slice's place in the whole HF tensor
// (split_dim, first row or column, rows or columns), so any layout can find its own part in them.
struct OptimizerShard {
  std::vector<NamedTensor> moments;
  std::map<std::string, std::string> metadata;
};

OptimizerShard optimizer_shard(const DataParallel& dp) {
  const AdamW& opt = dp.optimizer();
  nlohmann::json segments = nlohmann::json::array();
  for (const OptimizerSegment& s : opt.segments()) {
    const ShardSpec& slice = dp.model().shard(s.param);
    segments.push_back({dp.model().params().params()[s.param].name, s.begin, s.length, slice.split_dim, slice.begin,
                        slice.length});
  }
  const auto [tp_rank, tp_size] = tp_place(dp);
  // Views on the host; copies from a device.
  return {{{"exp_avg", opt.exp_avg().to(Device::cpu(), MemoryCategory::temporaries)},
           {"exp_avg_sq", opt.exp_avg_sq().to(Device::cpu(), MemoryCategory::temporaries)}},
          {{"step", std::to_string(opt.steps_taken())},
           {"segments", segments.dump()},
           {"tensor_parallel_size", std::to_string(tp_size)},
           {"tensor_parallel_rank", std::to_string(tp_rank)}}};
}

struct SavedPiece {
  const float *exp_avg, *exp_avg_sq;  // the file's moments (mapped)
  int64_t begin, length, at;           // elements of the saved slice; position in the file's moments
  SliceGeometry slice;
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

// Every saved piece of every parameter, by name. A segment saved without its slice (an older
// checkpoint) is a whole tensor, which only tensor_parallel_size 1 saved.
std::map<std::string, std::vector<SavedPiece>> saved_pieces(const std::vector<SafetensorsFile>& files,
                                                            const DecoderModel& model) {
  std::map<std::string, std::vector<SavedPiece>> pieces;
  for (const SafetensorsFile& f : files) {
    try {
      int64_t at = 0;
      for (const auto& seg : nlohmann::json::parse(f.metadata().at("segments"))) {
        const std::string name = seg.at(0).get<std::string>();
        const int64_t begin = seg.at(1).get<int64_t>(), length = seg.at(2).get<int64_t>();
        FAB_USER_CHECK(begin >= 0 && length >= 0, "segment {} has a negative first element or length", seg.dump());
        const bool sliced = seg.size() >= 6;
        FAB_USER_CHECK(sliced || metadata_int(f, "tensor_parallel_size", 1) == 1,
                       "segment {} does not say which slice of {} it holds", seg.dump(), name);
        if (model.params().contains(name)) {
          const Shape& full = model.shard(model.params().index(name)).full_shape;
          const SliceGeometry g = sliced ? SliceGeometry::of(full, seg.at(3).get<int>(), seg.at(4).get<int64_t>(),
                                                             seg.at(5).get<int64_t>())
                                         : SliceGeometry::of(full, -1, 0, 0);
          FAB_USER_CHECK(begin + length <= g.rows * g.cols, "segment {} runs past its slice of {} elements",
                         seg.dump(), g.rows * g.cols);
          pieces[name].push_back({f.tensor("exp_avg").data<float>(), f.tensor("exp_avg_sq").data<float>(), begin,
                                  length, at, g});
        }
        at += length;
      }
      FAB_USER_CHECK(f.tensor("exp_avg").numel() == at && f.tensor("exp_avg_sq").numel() == at,
                     "{}: moments hold {} values, its segments {}", f.path(), f.tensor("exp_avg").numel(), at);
    } catch (const std::exception& e) {
      throw UserError(format("{}: bad optimizer shard: {}", f.path(), e.what()));
    }
  }
  return pieces;
}

// Copies into `dst` (this rank's slice `mine`, its elements [begin, begin + length)) what the
// saved pieces hold of them, row by row of the whole tensor; returns how many elements were found
// (padding rows and columns, beyond the HF tensor, read as zero and count as found). Pieces may
// overlap (a tied embedding saved by two stages, a K/V head shared by tp ranks): the same values.
int64_t fill_from_pieces(const SliceGeometry& mine, int64_t begin, int64_t length,
                         const std::vector<SavedPiece>& pieces, float* dst_m, float* dst_v) {
  int64_t found = 0;
  for (int64_t e = begin; e < begin + length;) {
    const int64_t r = e / mine.cols, c0 = e % mine.cols, c1 = std::min(mine.cols, c0 + (begin + length - e));
    const int64_t row = r + mine.row0, first = c0 + mine.col0, last = c1 + mine.col0;  // in the HF tensor
    float* m = dst_m + (e - begin);
    float* v = dst_v + (e - begin);
    const int64_t real_last = row < mine.full_rows ? std::min(last, mine.full_cols) : first;
    std::fill(m, m + (c1 - c0), 0.0f);
    std::fill(v, v + (c1 - c0), 0.0f);
    std::vector<std::pair<int64_t, int64_t>> covered = {{std::max(first, real_last), last}};  // padding
    for (const SavedPiece& p : pieces) {
      const int64_t pr = row - p.slice.row0;
      if (pr < 0 || pr >= p.slice.rows) continue;
      // The piece's columns in this row, in the HF tensor's columns.
      const int64_t a = std::max(p.begin, pr * p.slice.cols) - pr * p.slice.cols + p.slice.col0;
      const int64_t b = std::min(p.begin + p.length, (pr + 1) * p.slice.cols) - pr * p.slice.cols + p.slice.col0;
      const int64_t x = std::max(a, first), y = std::min(b, real_last);
      if (x >= y) continue;
      const int64_t from = p.at + pr * p.slice.cols + (x - p.slice.col0) - p.begin;
      std::copy_n(p.exp_avg + from, y - x, m + (x - first));
      std::copy_n(p.exp_avg_sq + from, y - x, v + (x - first));
      covered.push_back({x, y});
    }
    std::sort(covered.begin(), covered.end());
    int64_t reach = first;
    for (const auto& [x, y] : covered) {
      found += std::max<int64_t>(0, y - std::max(x, reach));
      reach = std::max(reach, y);
    }
    e += c1 - c0;
  }
  return found;
}

// Fills this rank's segments of the moments from the pieces saved by every rank of the run that
// wrote the checkpoint, whatever its layout was: any data-parallel world size and ZeRO stage, any
// tensor_parallel_size and pipeline_parallel_size (every stage's files are read; each piece says
// where it sits in the whole HF tensor).
void load_optimizer_shards(const fs::path& dir, DataParallel& dp) {
  std::vector<SafetensorsFile> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find("optimizer-rank-") != std::string::npos && e.path().extension() == ".safetensors")
      files.push_back(SafetensorsFile::open(e.path().string()));
  }
  FAB_USER_CHECK(!files.empty(), "{}: no optimizer-rank-*.safetensors (not a complete checkpoint)", dir.string());
  const DecoderModel& model = dp.model();
  std::map<std::string, std::vector<SavedPiece>> pieces = saved_pieces(files, model);
  AdamW& opt = dp.optimizer();
  // Filled on the host: the moments themselves there, else host copies that go to the device after.
  Tensor m = opt.exp_avg().to(Device::cpu(), MemoryCategory::temporaries);
  Tensor v = opt.exp_avg_sq().to(Device::cpu(), MemoryCategory::temporaries);
  int64_t at = 0;
  for (const OptimizerSegment& s : opt.segments()) {
    const std::string& name = model.params().params()[s.param].name;
    const int64_t found = fill_from_pieces(geometry_of(model, s.param), s.begin, s.length, pieces[name],
                                           m.data<float>() + at, v.data<float>() + at);
    FAB_USER_CHECK(found == s.length, "{}: optimizer state of {} covers {} of its elements [{}, {})", dir.string(),
                   name, found, s.begin, s.begin + s.length);
    at += s.length;
  }
  if (!opt.exp_avg().device().is_host()) {
    opt.exp_avg().copy_from(m);
    opt.exp_avg_sq().copy_from(v);
  }
  const int64_t steps = steps_taken(files.front());
  for (const SafetensorsFile& f : files)
    FAB_USER_CHECK(steps_taken(f) == steps, "{}: {} optimizer steps, but {} has {}", f.path(), steps_taken(f),
                   files.front().path(), steps);
  opt.set_steps_taken(steps);
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

// Runs `write`, which writes into a checkpoint's temporary folder; when it fails (a full disk),
// the folder goes before the error does, so a failed save leaves no checkpoint-N.tmp behind. Best
// effort: another rank whose write failed may be removing it too.
template <typename Write>
void removing_tmp_on_failure(const fs::path& tmp, Write&& write) {
  try {
    write();
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

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

std::string trainer_state_json(const TrainerState& state, int64_t world_size, int64_t stages, bool save_only_model) {
  nlohmann::json j = {{"global_step", state.global_step},
                      {"sampler_epoch", state.sampler.epoch},
                      {"sampler_position", state.sampler.position},
                      {"losses", losses_to_json(state.losses)},
                      {"world_size", world_size},
                      {"pipeline_parallel_size", stages}};
  if (save_only_model) j["save_only_model"] = true;
  return j.dump(1) + "\n";
}

// Everything this rank writes of the checkpoint, its tensors copied when `copy` (async_save);
// the main rank makes the temporary folder (and writes a LoRA adapter into it). Collective. The
// caller keeps the parameters gathered until the part's weights are written or copied.
CheckpointPart take_part(const std::string& dir, ParallelModel& model, const TrainerState& state,
                         const std::string& config_yaml, const std::string& base_model, bool copy,
                         bool save_only_model) {
  DataParallel& dp = model.data_parallel();
  Communicator& group = dp.group();
  // Without ZeRO the first data-parallel rank of a stage holds every moment there is (of its
  // tensor-parallel slices) -- under expert parallel, the first ep ranks, each of its experts.
  const bool stage_main = group.rank() < model.expert_place().second;
  CheckpointPart part;
  part.final_dir = dir;
  part.tmp = part.final_dir.string() + ".tmp";
  part.main = model.is_main();
  std::vector<NamedTensor> weights = model.whole_weights(part.main);
  if (part.main) {
    fs::remove_all(part.tmp);
    fs::create_directories(part.tmp);
    if (dp.model().lora().enabled())
      removing_tmp_on_failure(part.tmp, [&] { save_trained_weights(dp.model(), part.tmp.string(), base_model); });
    part.model_config = dp.model().config();
    part.weights = copy ? copied(weights) : std::move(weights);
    // The sampler's bookkeeping counts the data-parallel replicas (dp; not dp x cp, whose context-
    // parallel ranks share their replica's rows).
    part.trainer_state =
        trainer_state_json(state, model.data_group().size(), model.stage_place().second, save_only_model);
    part.config_yaml = config_yaml;
  }
  const std::string shard = stage_prefix(model) + optimizer_file(group.rank(), group.size(), tp_place(dp));
  // Without ZeRO the other data-parallel ranks hold the same moments: they write none.
  // save_only_model: nobody does.
  if (!save_only_model && (dp.zero_stage() > 0 || stage_main)) {
    part.shard_file = shard;
    const OptimizerShard s = optimizer_shard(dp);
    part.moments = copy ? copied(s.moments) : s.moments;
    part.shard_metadata = s.metadata;
  }
  part.marker = ".written-" + shard;
  part.job_ranks = model.processes();
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

}  // namespace

std::vector<fs::path> finished_write_markers(const fs::path& tmp) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(tmp)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".written-", 0) == 0 && name.find(".tmp.") == std::string::npos) found.push_back(e.path());
  }
  return found;
}

namespace {

// The main rank's writer: every rank's marker, found on the (shared) file system — no collective.
// False when abandoned (the job is ending on an error); a UserError past `timeout`.
bool wait_for_markers(const CheckpointPart& part, std::chrono::seconds timeout, const std::atomic<bool>& abandon) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (int64_t(finished_write_markers(part.tmp).size()) < part.job_ranks) {
    if (abandon) return false;
    FAB_USER_CHECK(std::chrono::steady_clock::now() < deadline,
                   "{}: {} of {} ranks wrote their part of the checkpoint within ddp_timeout {} s (async_save)",
                   part.tmp.string(), finished_write_markers(part.tmp).size(), part.job_ranks, timeout.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const fs::path& m : finished_write_markers(part.tmp)) fs::remove(m);
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

void save_checkpoint(const std::string& dir, ParallelModel& model, const TrainerState& state,
                     const std::string& config_yaml, const std::string& base_model, bool save_only_model) {
  DataParallel& dp = model.data_parallel();
  dp.gather_all_parameters();
  CheckpointPart part = take_part(dir, model, state, config_yaml, base_model, false, save_only_model);
  if (part.main) removing_tmp_on_failure(part.tmp, [&] { write_main_files(part); });
  part.weights.clear();
  dp.release_gathered_parameters();
  auto barrier = [&](const std::string& what) { model.barrier(what); };
  barrier("checkpoint: folder made");
  pause_for_tests();
  removing_tmp_on_failure(part.tmp, [&] { write_shard(part); });
  barrier("checkpoint: shards written");
  if (part.main) removing_tmp_on_failure(part.tmp, [&] { rename_into_place(part); });
  barrier("checkpoint: renamed");
}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  abandon_ = true;
  if (writer_.joinable()) writer_.join();
}

void AsyncCheckpointWriter::save(const std::string& dir, ParallelModel& model, const TrainerState& state,
                                 const std::string& config_yaml, const std::string& base_model, int64_t keep,
                                 bool save_only_model) {
  wait();
  DataParallel& dp = model.data_parallel();
  dp.gather_all_parameters();
  auto part = std::make_shared<CheckpointPart>(take_part(dir, model, state, config_yaml, base_model, true, save_only_model));
  dp.release_gathered_parameters();
  // On the training thread, in the step's order: the folder exists before any rank writes into it.
  model.barrier("checkpoint: folder made");
  done_ = false;
  writer_ = std::thread([this, part, keep] {
    try {
      removing_tmp_on_failure(part->tmp, [&] { write_in_background(*part, peers_timeout_, abandon_, keep); });
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

TrainerState load_checkpoint(const std::string& dir, DataParallel& dp) {
  FAB_USER_CHECK(fs::exists(fs::path(dir) / "trainer_state.json"), "{}: not a Fabrica checkpoint (no trainer_state.json)",
                 dir);
  std::ifstream in(fs::path(dir) / "trainer_state.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    check_resumable(dir);
    dp.commit_all_parameters();
    load_trained_weights(dp.model(), dir);
    if (dp.model().options().value_head) load_value_head(dp.model(), dir);
    dp.weights_loaded();
    load_optimizer_shards(dir, dp);
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

}  // namespace fab
