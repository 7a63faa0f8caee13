#pragma once
// The one schema of `fabrica train` configs: every key, its type, default and meaning, in one
// list. Where LLaMA-Factory has a key we use its name and meaning; our own keys are marked.
// TrainConfig's fields, the YAML reader, the resolved-config writer and docs/CONFIG.md are all
// generated from this list, so they cannot drift apart.
//
// X(yaml_key, field, type, default, status, doc): the field differs from the key only where the key
// is a C++ keyword (template).
//   status: Supported | Accepted (harmless here; noted, no effect) | Later (not implemented yet:
//   using it is an error that says so) | Own (a Fabrica key LLaMA-Factory lacks)
#define FAB_CONFIG_KEYS(X)                                                                                            \
  /* model */                                                                                                         \
  X(model_name_or_path, model_name_or_path, std::string, "", Supported, "Hugging Face model folder: config.json, optional weights, tokenizer") \
  X(trust_remote_code, trust_remote_code, bool, false, Accepted, "Accepted for compatibility; Fabrica runs no model code from the folder") \
  X(stage, stage, std::string, "sft", Supported, "Training stage: pt or sft (dpo, kto, rm, ppo come later)")                  \
  X(do_train, do_train, bool, true, Supported, "Train (false: only prepare data / evaluate)")                                    \
  X(finetuning_type, finetuning_type, std::string, "full", Supported, "full (lora, freeze come later)")                                 \
  X(lora_rank, lora_rank, int64_t, 8, Later, "LoRA rank")                                                                         \
  X(lora_alpha, lora_alpha, int64_t, 16, Later, "LoRA alpha")                                                                      \
  X(lora_dropout, lora_dropout, double, 0.0, Later, "LoRA dropout")                                                                  \
  X(lora_target, lora_target, std::string, "all", Later, "LoRA target modules")                                                     \
  X(pref_beta, pref_beta, double, 0.1, Later, "DPO/KTO beta")                                                                     \
  X(pref_loss, pref_loss, std::string, "sigmoid", Later, "DPO loss variant")                                                      \
  X(deepspeed, deepspeed, std::string, "", Supported, "DeepSpeed config JSON: its zero_optimization.stage selects zero_stage (other fields ignored)") \
  /* data */                                                                                                          \
  X(dataset, dataset, std::string, "", Supported, "Comma-separated dataset names from dataset_info.json, or file paths")        \
  X(dataset_dir, dataset_dir, std::string, "data", Supported, "Folder holding dataset_info.json and the dataset files")             \
  X(eval_dataset, eval_dataset, std::string, "", Supported, "Comma-separated evaluation datasets")                                   \
  X(template, chat_template, std::string, "", Supported, "Chat template by LLaMA-Factory name (sft)")                                 \
  X(cutoff_len, cutoff_len, int64_t, 2048, Supported, "Maximum tokens per sample (pt: block length)")                              \
  X(max_samples, max_samples, int64_t, 0, Supported, "Use at most this many samples per dataset (0: all)")                          \
  X(val_size, val_size, double, 0.0, Supported, "Held-out fraction (< 1) or count (>= 1) of the training data for evaluation")   \
  X(packing, packing, bool, false, Supported, "sft: pack samples into sequences of up to cutoff_len - 1 tokens, attention crossing samples (pt always packs)") \
  X(neat_packing, neat_packing, bool, false, Supported, "sft: packing with attention kept inside each sample (implies packing)") \
  X(train_on_prompt, train_on_prompt, bool, false, Supported, "Also compute the loss on prompt tokens")                                 \
  X(mask_history, mask_history, bool, false, Supported, "Train only on the last turn of multi-turn samples")                         \
  X(enable_thinking, enable_thinking, bool, true, Supported, "qwen3 templates: thinking mode")                                          \
  X(preprocessing_num_workers, preprocessing_num_workers, int64_t, 0, Accepted, "Accepted; preprocessing uses every core by itself")              \
  X(dataloader_num_workers, dataloader_num_workers, int64_t, 0, Accepted, "Accepted; batches come from memory-mapped shards")                  \
  X(overwrite_cache, overwrite_cache, bool, false, Supported, "Re-tokenize even when a cached shard exists")                           \
  /* output and logging */                                                                                            \
  X(output_dir, output_dir, std::string, "", Supported, "Where checkpoints, metrics.jsonl and the final model go")                 \
  X(overwrite_output_dir, overwrite_output_dir, bool, false, Supported, "Allow an output_dir that already holds a run")                      \
  X(logging_steps, logging_steps, int64_t, 10, Supported, "Log every N optimizer steps")                                              \
  X(save_steps, save_steps, int64_t, 500, Supported, "Checkpoint every N optimizer steps (0: only at the end)")                    \
  X(save_total_limit, save_total_limit, int64_t, 0, Supported, "Keep at most N checkpoints (0: all)")                                    \
  X(save_only_model, save_only_model, bool, false, Later, "Checkpoints without optimizer state")                                        \
  X(plot_loss, plot_loss, bool, false, Supported, "Write a loss-curve image to output_dir")                                       \
  X(report_to, report_to, std::string, "none", Supported, "none or tensorboard")                                                  \
  X(ddp_timeout, ddp_timeout, int64_t, 1800, Supported, "Seconds a collective may wait for a rank before the job stops, naming it") \
  /* optimisation */                                                                                                  \
  X(per_device_train_batch_size, per_device_train_batch_size, int64_t, 8, Supported, "Sequences per micro-batch")                                   \
  X(per_device_eval_batch_size, per_device_eval_batch_size, int64_t, 8, Supported, "Sequences per evaluation batch")                              \
  X(gradient_accumulation_steps, gradient_accumulation_steps, int64_t, 1, Supported, "Micro-batches per optimizer step")                            \
  X(learning_rate, learning_rate, double, 5e-5, Supported, "Peak learning rate (AdamW)")                                              \
  X(num_train_epochs, num_train_epochs, double, 3.0, Supported, "Epochs (fractional allowed) when max_steps is not set")                 \
  X(max_steps, max_steps, int64_t, -1, Supported, "Optimizer steps; overrides num_train_epochs when > 0")                          \
  X(lr_scheduler_type, lr_scheduler_type, std::string, "linear", Supported, "transformers' scheduler names")                             \
  X(warmup_ratio, warmup_ratio, double, 0.0, Supported, "Warmup steps as a fraction of the total")                                  \
  X(warmup_steps, warmup_steps, int64_t, 0, Supported, "Warmup steps (overrides warmup_ratio when > 0)")                             \
  X(weight_decay, weight_decay, double, 0.0, Supported, "AdamW decoupled weight decay (tensors with >= 2 dimensions)")               \
  X(adam_beta1, adam_beta1, double, 0.9, Supported, "AdamW beta1")                                                                 \
  X(adam_beta2, adam_beta2, double, 0.999, Supported, "AdamW beta2")                                                               \
  X(adam_epsilon, adam_epsilon, double, 1e-8, Supported, "AdamW epsilon")                                                            \
  X(max_grad_norm, max_grad_norm, double, 1.0, Supported, "Clip gradients to this global L2 norm (0: no clipping)")                   \
  X(bf16, bf16, bool, false, Supported, "bf16 compute with fp32 master weights")                                              \
  X(fp16, fp16, bool, false, Later, "fp16 mixed precision")                                                                  \
  X(seed, seed, int64_t, 42, Supported, "Seed of initialisation, shuffling and sampling")                                    \
  X(eval_strategy, eval_strategy, std::string, "no", Supported, "no, steps or epoch")                                                 \
  X(eval_steps, eval_steps, int64_t, 0, Supported, "Evaluate every N steps (eval_strategy: steps)")                               \
  X(resume_from_checkpoint, resume_from_checkpoint, std::string, "", Supported, "true (latest in output_dir; an error when there is none), false/no/0 or empty (no resume), or a checkpoint folder")          \
  X(flash_attn, flash_attn, std::string, "auto", Accepted, "Accepted; attention is always Fabrica's fused kernel")                 \
  X(disable_shuffling, disable_shuffling, bool, false, Supported, "true keeps the dataset order (sets shuffle: false)")         \
  X(disable_gradient_checkpointing, disable_gradient_checkpointing, bool, false, Supported, "true turns recompute_layers off. LLaMA-Factory checkpoints gradients unless this is set; Fabrica's recompute_layers defaults to off (a step's activations fit a CPU's memory, and recompute costs a third more compute)") \
  X(include_num_input_tokens_seen, include_num_input_tokens_seen, bool, false, Accepted, "Accepted; metrics.jsonl logs tokens_per_s every logged step") \
  X(use_cpu, use_cpu, bool, false, Accepted, "Accepted; Fabrica trains on the CPU")                                             \
  /* Fabrica's own keys */                                                                                            \
  X(shuffle, shuffle, bool, true, Own, "Shuffle samples each epoch (false keeps dataset order)")                                \
  X(threads, threads, int64_t, 0, Own, "Compute threads (0: every core)")                                               \
  X(cache_dir, cache_dir, std::string, "", Own, "Tokenized-data cache (default $FABRICA_CACHE or ~/.cache/fabrica)")                                                       \
  X(recompute_layers, recompute_layers, bool, false, Own, "Recompute each decoder layer in backward (saves activation memory)") \
  /* distributed (Fabrica's own keys) */                                                                            \
  X(nproc_per_node, nproc_per_node, int64_t, 1, Own, "Worker processes on this machine (torchrun's name); fabrica train starts them through mpirun") \
  X(cluster, cluster, std::string, "", Own, "Cluster file from `fabrica init` (hosts, slots, network interface): launch across machines") \
  X(zero_stage, zero_stage, int64_t, 0, Own, "ZeRO stage: 0 (plain data parallel), 1 (optimizer state), 2 (+ gradients), 3 (+ parameters) sharded") \
  X(ddp_bucket_size, ddp_bucket_size, double, 25.0, Own, "Gradient bucket size in MB (torch DDP's bucket_cap_mb): each bucket is reduced while backward goes on")
