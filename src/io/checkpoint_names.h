#pragma once
// The checkpoint folders of an output_dir: output_dir/checkpoint-<step> (Hugging Face's names),
// written as checkpoint-<step>.tmp and renamed once complete, so a .tmp folder is never a
// checkpoint. What they hold is train/checkpoint.h's; which one a run resumes, what the launcher's
// restarts and `parallel: auto` look for, is here, with no dependency on the trainer.
#include <cstdint>
#include <string>
#include <vector>

namespace fab {

// "checkpoint-<step>": the folder name of the checkpoint saved after `step` optimizer steps.
std::string checkpoint_name(int64_t step);
// The step of a folder path named checkpoint-<digits>; -1 for any other name (checkpoint-3.tmp too).
int64_t checkpoint_step(const std::string& dir);
// The checkpoint-<N> folders of output_dir, in increasing N (none when output_dir does not exist).
std::vector<std::string> checkpoints_by_step(const std::string& output_dir);
// The checkpoint-<N> folder of output_dir with the largest N, or "" when there is none.
std::string latest_checkpoint(const std::string& output_dir);
// Deletes the oldest checkpoints beyond `keep` (save_total_limit; 0 keeps all).
void prune_checkpoints(const std::string& output_dir, int64_t keep);

// A checkpoint saved with save_only_model holds no optimizer state: it cannot continue the run
// (Hugging Face's Trainer says the same of its own): a UserError naming how to use it instead. A
// trainer_state.json that cannot be read passes here (load_checkpoint reports it).
void check_resumable(const std::string& dir);
// The checkpoint folder resume_from_checkpoint asks for: "" when it is empty or false; for true,
// the latest checkpoint of output_dir; else the folder it names. Asking for one that is not there
// is a UserError ("no valid checkpoint found in <output_dir>", as Hugging Face's Trainer says),
// never a fresh start over the earlier run; so is one saved with save_only_model.
std::string checkpoint_to_resume(const std::string& resume_from_checkpoint, const std::string& output_dir);

}  // namespace fab
