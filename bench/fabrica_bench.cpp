// Trains the standard bench model (Llama-style: hidden 256, 4 layers, 4 heads, intermediate 704,
// vocab 8192, sequence 256, batch 8, AdamW) on random tokens and prints one JSON line. The
// PyTorch peer (bench/torch_peer.py) does the same work; bench/run_bench.sh compares them.
// Under mpirun with --data-parallel, the ranks share the batch of 8 through DataParallel (ZeRO
// stage --zero); with --tensor-parallel they split every layer instead (the whole batch of 8 on
// each; --sequence-parallel adds sp) and it also reports the bytes each rank sent per step over
// the tensor-parallel group and its parameter and peak activation bytes; --allreduce-mb N instead times the communicator's all-reduce of N MB against a
// bare MPI_Allreduce (bench/distributed_bench.sh runs both). --fma-peak prints the measured fp32
// FMA peak of the machine (kernels/cpu/fma_peak.h), the denominator of MFU. --save-every N --save-dir DIR
// checkpoints every N timed steps into DIR (save_checkpoint, or with --async-save the background
// writer of async_save), counted in the step time; save_ms is the mean time a save held the
// training thread, and the async run's last write, drained after the timed steps, is reported
// apart (drain_ms). --model moe trains the MoE bench model instead (qwen3_moe: hidden 512, 4 layers,
// 8 heads, 8 experts, top-2, moe_intermediate_size 512, the load-balancing loss at 0.001; batch
// 4 x 256; its peer is bench/moe_peer.py, transformers' own Qwen3MoeForCausalLM) and --model
// moe-dense the dense qwen3 of the same active parameters (intermediate_size 1024 = 2 x 512).
// --model vlm --folder DIR trains the vision-language bench folder bench/vlm_peer.py make-model
// wrote (Qwen2.5-VL, batch 4 x 512, one 448x448 image of 256 tokens a row), the tower and merger
// frozen as LLaMA-Factory's defaults do (--train-tower: trained too). --images FILE,FILE,...
// --folder DIR instead times the image pipeline (decode, LLaMA-Factory's pre-resize, smart_resize,
// bicubic, normalise, patchify) over the files --repeat times and prints images/s.
#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/parallel_map.h"
#include "core/rng.h"
#include "kernels/cpu/fma_peak.h"
#include "kernels/kernel_table.h"
#include "models/decoder.h"
#include "comm/world.h"
#include "parallel/data_parallel.h"
#include "core/error.h"
#include "parallel/layout.h"
#include "parallel/pipeline_parallel.h"
#include "parallel/tensor_parallel.h"
#include "image/qwen2_vl_processor.h"
#include "models/hf_model.h"
#include "train/checkpoint.h"

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <nlohmann/json.hpp>

namespace {

struct Flags {
  std::string precision = "fp32";
  int warmup = 2, steps = 8, threads = 2;
  bool recompute = false;
  bool lora = false;  // LoRA r 8, alpha 16 on every projection, the base frozen (PEFT's setup)
  bool data_parallel = false;
  bool tensor_parallel = false, sequence_parallel = false;
  int pipeline_chunks = 0;  // > 0: pipeline over the ranks with this many model chunks per stage
  int layers = 4;
  int zero = 0;
  double allreduce_mb = 0;
  bool fma_peak = false;
  int save_every = 0;  // > 0: a checkpoint every N timed steps into save_dir
  std::string save_dir;
  bool async_save = false;
  std::string model = "standard";  // standard | moe | moe-dense | vlm
  std::string folder;  // vlm: the HF folder; --images: where preprocessor_config.json is
  bool train_tower = false;
  std::string images;  // comma-separated files: time the image pipeline
  int repeat = 5;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fabrica_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (a == "--precision") f.precision = next();
    else if (a == "--warmup") f.warmup = std::stoi(next());
    else if (a == "--steps") f.steps = std::stoi(next());
    else if (a == "--threads") f.threads = std::stoi(next());
    else if (a == "--recompute") f.recompute = true;
    else if (a == "--lora") f.lora = true;
    else if (a == "--data-parallel") f.data_parallel = true;
    else if (a == "--pipeline") f.pipeline_chunks = std::stoi(next());
    else if (a == "--layers") f.layers = std::stoi(next());
    else if (a == "--tensor-parallel") f.tensor_parallel = true;
    else if (a == "--sequence-parallel") f.sequence_parallel = true;
    else if (a == "--zero") f.zero = std::stoi(next());
    else if (a == "--allreduce-mb") f.allreduce_mb = std::stod(next());
    else if (a == "--fma-peak") f.fma_peak = true;
    else if (a == "--save-every") f.save_every = std::stoi(next());
    else if (a == "--save-dir") f.save_dir = next();
    else if (a == "--async-save") f.async_save = true;
    else if (a == "--model") f.model = next();
    else if (a == "--folder") f.folder = next();
    else if (a == "--train-tower") f.train_tower = true;
    else if (a == "--images") f.images = next();
    else if (a == "--repeat") f.repeat = std::stoi(next());
    else {
      std::fprintf(stderr, "usage: fabrica_bench [--precision fp32|bf16] [--warmup N] [--steps N] [--threads N] [--recompute]\n"
                           "                     [--data-parallel [--zero N] | --tensor-parallel [--sequence-parallel]]\n"
                           "                     [--pipeline CHUNKS [--layers N]] [--allreduce-mb N] [--fma-peak]\n"
                           "                     [--save-every N --save-dir DIR [--async-save]] [--model standard|moe|moe-dense]\n"
                           "                     [--model vlm --folder DIR [--train-tower]] [--images FILE,... --folder DIR [--repeat N]]\n");
      std::exit(2);
    }
  }
  if (f.precision != "fp32" && f.precision != "bf16") {
    std::fprintf(stderr, "fabrica_bench: --precision must be fp32 or bf16\n");
    std::exit(2);
  }
  if (f.model != "standard" && f.model != "moe" && f.model != "moe-dense" && f.model != "vlm") {
    std::fprintf(stderr, "fabrica_bench: --model must be standard, moe, moe-dense or vlm\n");
    std::exit(2);
  }
  if ((f.model == "vlm" || !f.images.empty()) && f.folder.empty()) {
    std::fprintf(stderr, "fabrica_bench: --model vlm and --images need --folder\n");
    std::exit(2);
  }
  if (f.save_every > 0 && (f.save_dir.empty() || f.tensor_parallel)) {
    std::fprintf(stderr, "fabrica_bench: --save-every needs --save-dir (and no --tensor-parallel)\n");
    std::exit(2);
  }
  return f;
}

}  // namespace

// Seconds per all-reduce of `mb` megabytes: the communicator's ring against MPI_Allreduce.
int allreduce_bandwidth(const Flags& flags, fab::Communicator& world) {
  using namespace fab;
  const int64_t n = int64_t(flags.allreduce_mb * double(1 << 20) / sizeof(float));
  std::vector<float> data(static_cast<size_t>(n), 1.0f);
  auto time_it = [&](auto&& fn) {
    for (int i = 0; i < flags.warmup; ++i) fn();
    world.barrier("bench");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < flags.steps; ++i) fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / flags.steps;
  };
  const double ours = time_it([&] { world.all_reduce(data.data(), n, "bench").wait(); });
  const double bare = time_it([&] { MPI_Allreduce(MPI_IN_PLACE, data.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
  if (world.rank() == 0) {
    // Bus bandwidth: what each rank moves in a ring all-reduce, 2 (N - 1) / N of the buffer, per second.
    const double bus = 2.0 * (world.size() - 1) / world.size() * double(n) * sizeof(float) / 1e9;
    std::printf("{\"impl\":\"fabrica\",\"allreduce_mb\":%.1f,\"ranks\":%d,\"fabrica_ms\":%.2f,\"mpi_ms\":%.2f,"
                "\"fabrica_bus_gb_s\":%.2f,\"mpi_bus_gb_s\":%.2f}\n",
                flags.allreduce_mb, world.size(), 1000 * ours, 1000 * bare, bus / ours, bus / bare);
  }
  return 0;
}

// The pipeline over every rank (one stage each, --pipeline chunks per stage): the batch of 8
// as 8 micro-batches of 1 x seq through 1F1B or interleaved 1F1B, with clipping and AdamW. Prints
// each stage's idle fraction and bytes sent per step beside the formulas.
int pipeline_bench(const Flags& flags, const fab::ModelConfig& cfg, int64_t seq, fab::Communicator& world) {
  using namespace fab;
  const int stages = world.size(), chunks = flags.pipeline_chunks, micro = 8;
  DecoderOptions options;
  options.precision = flags.precision == "bf16" ? Precision::bf16 : Precision::fp32;
  options.max_seq_len = seq;
  const std::vector<int64_t> split = balanced_layer_split(cfg, stages * chunks, seq);
  options.stage = pipeline_stage(split, stages, world.rank());
  DecoderModel model(cfg, options);
  model.init_random(1234);
  PipelineParallel pipeline(model, world, chunks);
  LocalCommunicator alone;
  DataParallelOptions dp_options;
  dp_options.adamw = {0.9f, 0.95f, 1e-8f, 0.1f};
  dp_options.model_parallel_groups = {&world};
  DataParallel dp(model, alone, dp_options);
  Rng rng(42);  // every stage the same batches
  double seconds = 0;
  for (int step = 0; step < flags.warmup + flags.steps; ++step) {
    std::vector<PipelineMicroBatch> batches;
    for (int m = 0; m < micro; ++m) {
      Tensor ids = Tensor::empty({1, seq}, DType::i64, MemoryCategory::activations);
      for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = int64_t(rng.next_u64() % cfg.vocab_size);
      batches.push_back({ids, ids, {}});
    }
    if (step == flags.warmup) pipeline.take_stats();
    const auto start = std::chrono::steady_clock::now();
    dp.begin_step(micro);
    pipeline.forward_backward(batches, float(1.0 / double(micro * (seq - 1))), dp);
    dp.finish_gradients();
    dp.clip_grad_norm(1.0);
    dp.optimizer_step(3e-4f);
    if (step >= flags.warmup) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const PipelineStats s = pipeline.take_stats();
  std::vector<double> mine(size_t(2 * stages), 0.0);
  mine[size_t(world.rank())] = 1.0 - s.busy_seconds / s.span_seconds;
  mine[size_t(stages + world.rank())] = double(s.bytes_sent) / double(s.steps);
  world.all_reduce(mine.data(), int64_t(mine.size()), "report").wait();
  if (world.rank() == 0) {
    std::string idle, sent;
    for (int r = 0; r < stages; ++r) {
      idle += fab::format("{}{}", r ? "," : "", mine[size_t(r)]);
      sent += fab::format("{}{}", r ? "," : "", int64_t(mine[size_t(stages + r)]));
    }
    std::string layers;
    for (size_t k = 0; k < split.size(); ++k) layers += fab::format("{}{}", k ? "," : "", split[k]);
    const double formula = double(stages - 1) / double(chunks * micro + stages - 1);
    // B*T*H floats per micro-batch per boundary each way; one message per boundary and direction.
    const double per_boundary = 2.0 * double(seq * cfg.hidden_size) * sizeof(float) * micro;
    std::printf("{\"impl\":\"fabrica\",\"pipeline_stages\":%d,\"chunks_per_stage\":%d,\"micro_batches\":%d,"
                "\"layers\":[%s],\"tokens_per_s\":%.1f,\"pipeline_bubble_fraction\":[%s],\"formula\":%.4f,"
                "\"bytes_sent_per_step\":[%s],\"formula_bytes_per_boundary\":%.0f}\n",
                stages, chunks, micro, layers.c_str(), double(micro * seq) * flags.steps / seconds, idle.c_str(),
                formula, sent.c_str(), per_boundary);
  }
  return 0;
}

// The image pipeline over --images, --repeat times after one warm-up pass: images/s.
int images_bench(const Flags& flags) {
  using namespace fab;
  std::vector<std::string> files;
  for (size_t at = 0; at <= flags.images.size();) {
    const size_t comma = std::min(flags.images.find(',', at), flags.images.size());
    if (comma > at) files.push_back(flags.images.substr(at, comma - at));
    at = comma + 1;
  }
  const Qwen2VLImageConfig config = load_qwen2_vl_image_config(flags.folder + "/preprocessor_config.json");
  const ImagePixelBounds bounds;  // LLaMA-Factory's defaults, as the peer's
  auto pass = [&] {  // as the dataset's images are processed (dataset/multimodal.cpp): one per thread
    int64_t patches = 0;
    for (const ProcessedImage& image :
         parallel_map(files.size(), [&](size_t i) { return qwen2_vl_load_image(files[i], bounds, config); }, 1))
      patches += image.patches();
    return patches;
  };
  pass();
  const auto start = std::chrono::steady_clock::now();
  int64_t patches = 0;
  for (int r = 0; r < flags.repeat; ++r) patches += pass();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t images = int64_t(files.size()) * flags.repeat;
  std::printf("{\"impl\":\"fabrica\",\"processor\":\"fabrica\",\"threads\":%d,\"images\":%lld,\"patches\":%lld,"
              "\"images_per_s\":%.2f}\n",
              flags.threads, (long long)images, (long long)patches, double(images) / seconds);
  return 0;
}

// One bench micro-batch: ids, labels and, for the vision-language model, its images.
struct BenchBatch {
  fab::Tensor ids, labels;
  fab::SequenceLayout layout;
};

// Random tokens, labels = ids (the text models').
BenchBatch text_batch(fab::Rng& rng, int64_t batch, int64_t seq, int64_t vocab) {
  using namespace fab;
  Tensor ids = Tensor::empty({batch, seq}, DType::i64, MemoryCategory::activations);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = int64_t(rng.next_u64() % uint64_t(vocab));
  return {ids, ids, {}};
}

// bench/vlm_peer.py's batch: each row vision_start, one image's pad tokens, vision_end, random
// text below 8000; labels the ids with the image tokens -100; N(0, 1) pixel values.
BenchBatch image_batch(fab::Rng& rng, const fab::ModelConfig& cfg, int64_t vision_end, int64_t batch, int64_t seq) {
  using namespace fab;
  const int64_t grid = 448 / cfg.vision->patch_size, merge = cfg.vision->spatial_merge_size;
  const int64_t image_tokens = grid * grid / (merge * merge);
  BenchBatch b = text_batch(rng, batch, seq, 8000);
  b.labels = Tensor::empty({batch, seq}, DType::i64, MemoryCategory::activations);
  for (int64_t r = 0; r < batch; ++r) {
    int64_t* row = b.ids.data<int64_t>() + r * seq;
    row[0] = cfg.vision_start_token_id;
    for (int64_t t = 1; t <= image_tokens; ++t) row[t] = cfg.image_token_id;
    row[image_tokens + 1] = vision_end;
    for (int64_t t = 0; t < seq; ++t)
      b.labels.data<int64_t>()[r * seq + t] = row[t] == cfg.image_token_id ? -100 : row[t];
  }
  const int64_t patches = batch * grid * grid;
  b.layout.pixel_values = Tensor::empty({patches, cfg.vision->patch_values()}, DType::f32, MemoryCategory::activations);
  for (int64_t i = 0; i < b.layout.pixel_values.numel(); ++i) b.layout.pixel_values.data<float>()[i] = float(rng.normal());
  b.layout.image_grid_thw = Tensor::empty({batch, 3}, DType::i64, MemoryCategory::activations);
  for (int64_t r = 0; r < batch; ++r) {
    int64_t* thw = b.layout.image_grid_thw.data<int64_t>() + 3 * r;
    thw[0] = 1, thw[1] = grid, thw[2] = grid;
  }
  return b;
}

// The standard bench model, or the MoE bench model and its dense equivalent (bench/moe_peer.py).
fab::ModelConfig bench_model(const Flags& flags) {
  fab::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.vocab_size = 8192;
  cfg.hidden_size = 256;
  cfg.intermediate_size = 704;
  cfg.num_hidden_layers = flags.layers;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 4;
  cfg.head_dim = 64;
  cfg.rope_theta = 10000;
  cfg.rms_norm_eps = 1e-6;
  if (flags.model == "standard") return cfg;
  cfg.model_type = flags.model == "moe" ? "qwen3_moe" : "qwen3";
  cfg.qk_norm = true;
  cfg.hidden_size = 512;
  cfg.num_attention_heads = cfg.num_key_value_heads = 8;
  cfg.intermediate_size = 1024;  // moe-dense: the two active experts' width
  if (flags.model == "moe") {
    cfg.moe.num_experts = 8;
    cfg.moe.num_experts_per_tok = 2;
    cfg.moe.moe_intermediate_size = 512;
    cfg.moe.norm_topk_prob = true;
    cfg.moe.router_aux_loss_coef = 0.001;
    cfg.moe.output_router_logits = true;
  }
  return cfg;
}

int main(int argc, char** argv) {
  using namespace fab;
  const Flags flags = parse(argc, argv);
  omp_set_num_threads(flags.threads);
  if (flags.fma_peak) {  // the fp32 FMA peak of the vectors our kernels use (FAB_CPU_ISA applies)
    const bool avx512 = std::string(cpu_kernels().isa) == "avx512";
    std::printf("{\"impl\":\"fabrica\",\"fma_peak_gflops\":%.1f,\"isa\":\"%s\",\"threads\":%d}\n",
                cpu::measured_fma_peak_gflops(avx512, flags.threads), cpu_kernels().isa, flags.threads);
    return 0;
  }
  WorldInfo info = world_from_environment();
  std::unique_ptr<Communicator> world = join_world(info, 600);
  if (flags.allreduce_mb > 0) {
    const int rc = allreduce_bandwidth(flags, *world);
    world.reset();
    leave_world();
    return rc;
  }

  if (!flags.images.empty()) {
    const int rc = images_bench(flags);
    world.reset();
    leave_world();
    return rc;
  }

  const bool vlm = flags.model == "vlm";
  const ModelConfig cfg = vlm ? load_model_config(flags.folder + "/config.json") : bench_model(flags);
  FAB_CHECK(!vlm || cfg.vision, "{}: not a vision-language folder", flags.folder);
  const int64_t vision_end =
      vlm ? nlohmann::json::parse(std::ifstream(flags.folder + "/config.json")).value("vision_end_token_id", int64_t(0)) : 0;
  const int64_t full_batch = flags.model == "standard" ? 8 : 4;
  const int64_t seq = vlm ? 512 : 256, batch = flags.data_parallel ? full_batch / world->size() : full_batch;  // per rank (tp: whole)
  if (flags.pipeline_chunks > 0) {
    const int rc = pipeline_bench(flags, cfg, seq, *world);
    world.reset();
    leave_world();
    return rc;
  }

  DecoderOptions options;
  options.precision = flags.precision == "bf16" ? Precision::bf16 : Precision::fp32;
  options.recompute_layers = flags.recompute;
  options.max_seq_len = seq;
  std::unique_ptr<TensorParallel> tp;
  if (flags.tensor_parallel) {
    tp = std::make_unique<TensorParallel>(*world, flags.sequence_parallel);
    options.sharding = tp.get();
  }
  LocalCommunicator alone;  // the data-parallel group under tensor parallel
  Communicator& dp_group = tp ? static_cast<Communicator&>(alone) : *world;
  if (flags.lora) {
    options.lora.rank = 8;
    options.lora.alpha = 16;
    options.lora.targets = lora_projection_names();
    options.trainable = [](const std::string&) { return false; };
  }
  std::unique_ptr<DecoderModel> built;
  if (vlm) {
    if (!flags.train_tower)  // LLaMA-Factory's freeze_vision_tower and freeze_multi_modal_projector
      options.trainable = [](const std::string& name) { return name.rfind("model.visual.", 0) != 0; };
    built = load_model_folder(flags.folder, options);
  } else {
    built = std::make_unique<DecoderModel>(cfg, options);
    built->init_random(1234);
  }
  DataParallelOptions dp_options;
  dp_options.zero_stage = flags.zero;
  dp_options.adamw = {0.9f, 0.95f, 1e-8f, 0.1f};
  if (tp) {
    dp_options.model_parallel_groups = {world.get()};
    dp_options.not_counted = ranges_counted_elsewhere(*built);
  }
  ParallelModel parallel(std::move(built), dp_group, dp_options);
  DecoderModel& model = parallel.model();
  DataParallel& dp = parallel.data_parallel();

  // A fresh random batch every step, all made before timing (as the PyTorch peer does).
  Rng rng(42 + uint64_t(tp ? 0 : world->rank()));  // each rank its own share of the data (tp: the same)
  std::vector<BenchBatch> batches;
  for (int step = 0; step < flags.warmup + flags.steps; ++step)
    batches.push_back(vlm ? image_batch(rng, cfg, vision_end, batch, seq) : text_batch(rng, batch, seq, cfg.vocab_size));

  double loss = 0, seconds = 0, drain_seconds = 0, save_seconds = 0;  // save: on the training thread
  int saves = 0;
  int64_t bytes_sent = 0;
  AsyncCheckpointWriter writer(std::chrono::seconds(600));
  TrainerState saved;
  auto save = [&](int step) {
    saved.global_step = step + 1;
    saved.losses.assign(size_t(step + 1), loss);
    const std::string dir = flags.save_dir + "/checkpoint-" + std::to_string(step + 1);
    if (flags.async_save) return writer.save(dir, parallel, saved, "", "", 2);
    save_checkpoint(dir, parallel, saved, "");
    if (world->rank() == 0) prune_checkpoints(flags.save_dir, 2);
  };
  for (int step = 0; step < flags.warmup + flags.steps; ++step) {
    if (step == flags.warmup) {
      bytes_sent = world->stats().bytes_sent;  // over tp, or over dp
      backend(DeviceKind::cpu).allocator().reset_peaks();
    }
    auto start = std::chrono::steady_clock::now();
    const BenchBatch& b = batches[size_t(step)];
    double targets = double(DecoderModel::count_targets(b.labels));
    dp_group.all_reduce(&targets, 1, "targets").wait();
    dp.begin_step(1);
    dp.begin_micro_batch(0);
    loss = model.forward_backward(b.ids, b.labels, float(1.0 / targets), b.layout) / targets;
    dp.finish_gradients();
    dp.clip_grad_norm(1.0);
    dp.optimizer_step(3e-4f);
    if (flags.save_every > 0 && step >= flags.warmup && (step + 1 - flags.warmup) % flags.save_every == 0) {
      const auto save_start = std::chrono::steady_clock::now();
      save(step);
      save_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count();
      ++saves;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step >= flags.warmup) seconds += s;
  }
  const auto drain_start = std::chrono::steady_clock::now();
  writer.wait();
  drain_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - drain_start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  bytes_sent = (world->stats().bytes_sent - bytes_sent) / flags.steps;
  const double activations = double(backend(DeviceKind::cpu).allocator().stats(MemoryCategory::activations).peak);
  if (!tp) world->all_reduce(&loss, 1, "loss").wait();  // each rank's share of the mean
  const double tokens = double(batch * seq * (tp ? 1 : world->size())) * flags.steps;
  if (world->rank() == 0)
    std::printf(
        "{\"impl\":\"fabrica\",\"precision\":\"%s\",\"threads\":%d,\"ranks\":%d,\"zero_stage\":%d,"
        "\"tensor_parallel\":%d,\"sequence_parallel\":%d,"
        "\"tokens_per_s\":%.1f,\"step_ms\":%.1f,\"peak_rss_mb\":%.1f,\"final_loss\":%.4f,\"kernels\":\"%s\","
        "\"parameter_bytes\":%lld,\"gradient_bytes\":%lld,\"optimizer_state_bytes\":%lld,"
        "\"peak_activation_bytes\":%.0f,\"tp_bytes_sent_per_step\":%lld,\"dp_bytes_sent_per_step\":%lld,"
        "\"save_every\":%d,\"async_save\":%d,\"save_ms\":%.1f,\"drain_ms\":%.1f,\"model\":\"%s\"}\n",
        (flags.precision + (flags.lora ? "+lora" : "")).c_str(), flags.threads, world->size(), flags.zero,
        int(flags.tensor_parallel), int(flags.sequence_parallel), tokens / seconds, 1000.0 * seconds / flags.steps,
        double(usage.ru_maxrss) / 1024.0, loss, backend(DeviceKind::cpu).name().c_str(),
        (long long)dp.state_bytes().parameters, (long long)dp.state_bytes().gradients,
        (long long)dp.state_bytes().optimizer_state, activations, (long long)(tp ? bytes_sent : 0),
        (long long)(tp ? 0 : bytes_sent), flags.save_every, int(flags.async_save),
        saves ? 1000.0 * save_seconds / saves : 0.0, 1000.0 * drain_seconds, flags.model.c_str());
  world.reset();
  leave_world();
  return 0;
}
