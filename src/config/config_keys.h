#pragma once
// The one schema of `fabrica train` configs: every key, its type, default and meaning, in one
// list. Where LLaMA-Factory has a key we use its name and meaning; our own keys are marked.
// TrainConfig's fields, the YAML reader, the resolved-config writer and docs/CONFIG.md are all
// generated from this list, so they cannot drift apart.
//
// X(yaml_key, field, type, default, status, doc): the field differs from the key only where the key
// is a C++ keyword (template).
//   status: Supported | Accepted (harmless here; noted, no effect) | Later (not implemented yet:
//   using it with a value other than its default is an error that says so) | Own (a Fabrica key
//   LLaMA-Factory lacks, or, for cache_dir, has with another meaning)
// Every field of LLaMA-Factory's ModelArguments, DataArguments, FinetuningArguments,
// GeneratingArguments and TrainingArguments (transformers' Seq2SeqTrainingArguments and its own
// additions) is a key here: tests/config/llamafactory_keys.txt lists them and a test checks it.
// Keys LLaMA-Factory types as None-able take 0 / "" for None.
#define FAB_CONFIG_KEYS(X)                                                                                            \
  /* model */                                                                                                         \
  X(model_name_or_path, model_name_or_path, std::string, "", Supported, "Hugging Face model folder: config.json, optional weights, tokenizer") \
  X(trust_remote_code, trust_remote_code, bool, false, Accepted, "Accepted for compatibility; Fabrica runs no model code from the folder") \
  X(stage, stage, Stage, Stage::sft, Supported, "Training stage: pt, sft, dpo, kto, rm, grpo or ppo")                  \
  X(do_train, do_train, bool, true, Supported, "Train (false: only prepare data / evaluate)")                                    \
  X(finetuning_type, finetuning_type, std::string, "full", Supported, "full, lora (PEFT-format adapters) or freeze (only some layers/modules train)")                                 \
  X(lora_rank, lora_rank, int64_t, 8, Supported, "LoRA rank r")                                                                         \
  X(lora_alpha, lora_alpha, int64_t, 0, Supported, "LoRA alpha: the adapter output is scaled by alpha / r (0: 2 * lora_rank, as LLaMA-Factory)")                                                                      \
  X(lora_dropout, lora_dropout, double, 0.0, Supported, "Dropout on the LoRA branch input, in [0, 1)")                                                                  \
  X(lora_target, lora_target, std::string, "all", Supported, "LoRA target modules: all (every linear layer but lm_head) or a comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")                                                     \
  X(pref_beta, pref_beta, double, 0.1, Supported, "DPO/KTO beta")                                                                     \
  X(pref_loss, pref_loss, std::string, "sigmoid", Supported, "DPO loss: sigmoid, hinge, ipo, orpo or simpo")                                                      \
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
  X(save_only_model, save_only_model, bool, false, Supported, "Checkpoints hold the weights (LoRA: the adapter), trainer_state.json and the config, but no optimizer state: smaller, and, as in Hugging Face's Trainer, not resumable (resume_from_checkpoint refuses them)")                                        \
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
  X(include_num_input_tokens_seen, include_num_input_tokens_seen, std::string, "no", Accepted, "Accepted; metrics.jsonl logs tokens_per_s every logged step") \
  X(use_cpu, use_cpu, bool, false, Accepted, "Accepted; Fabrica trains on the CPU")                                             \
  /* model (LLaMA-Factory's ModelArguments) */ \
  X(adapter_name_or_path, adapter_name_or_path, std::string, "", Supported, "A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) to start from: continue training it, or generate with it") \
  X(adapter_folder, adapter_folder, std::string, "", Later, "The folder containing the adapter weights to load") \
  X(use_fast_tokenizer, use_fast_tokenizer, bool, true, Accepted, "Accepted; Fabrica has one tokenizer, with ids identical to HF tokenizers") \
  X(resize_vocab, resize_vocab, bool, false, Later, "Whether or not to resize the tokenizer vocab and the embedding layers") \
  X(split_special_tokens, split_special_tokens, bool, false, Later, "Whether or not the special tokens should be split during the tokenization process") \
  X(add_tokens, add_tokens, std::string, "", Later, "Non-special tokens to be added into the tokenizer") \
  X(add_special_tokens, add_special_tokens, std::string, "", Later, "Special tokens to be added into the tokenizer") \
  X(new_special_tokens_config, new_special_tokens_config, std::string, "", Later, "Path to YAML config with special token descriptions for semantic initialization") \
  X(init_special_tokens, init_special_tokens, std::string, "noise_init", Later, "Initialization method for new special tokens: 'noise_init' (default, random noise...") \
  X(model_revision, model_revision, std::string, "main", Accepted, "Accepted; Fabrica reads local folders only and downloads nothing") \
  X(low_cpu_mem_usage, low_cpu_mem_usage, bool, true, Accepted, "Accepted; no effect in Fabrica (a torch loading/checkpointing detail)") \
  X(rope_scaling, rope_scaling, std::string, "", Later, "Which scaling strategy should be adopted for the RoPE embeddings") \
  X(shift_attn, shift_attn, bool, false, Later, "Enable shift short attention (S^2-Attn) proposed by LongLoRA") \
  X(mixture_of_depths, mixture_of_depths, std::string, "", Later, "Convert the model to mixture-of-depths (MoD) or load the MoD model") \
  X(use_unsloth, use_unsloth, bool, false, Later, "Whether or not to use unsloth's optimization for the LoRA training") \
  X(use_unsloth_gc, use_unsloth_gc, bool, false, Later, "Whether or not to use unsloth's gradient checkpointing (no need to install unsloth)") \
  X(enable_liger_kernel, enable_liger_kernel, bool, false, Accepted, "Accepted; no effect (Fabrica's own kernels are fused already)") \
  X(moe_aux_loss_coef, moe_aux_loss_coef, double, 0.0, Supported, "Coefficient of the auxiliary router loss in mixture-of-experts model: above 0 it turns the load-balancing loss on at this weight, as LLaMA-Factory sets router_aux_loss_coef and output_router_logits (0: config.json's output_router_logits and router_aux_loss_coef decide). Transformers' load_balancing_loss_func over each micro-batch's rows (padding masked), E * sum_e f_e P_e over every MoE layer's router logits joined; the objective adds the coefficient times its mean over the step's micro-batches and data-parallel ranks, each rank's over its own rows under expert parallel too (docs/architecture/moe.md). metrics.jsonl logs it as aux_loss, apart from loss (the cross-entropy), with moe_load_max_over_mean") \
  X(use_reentrant_gc, use_reentrant_gc, bool, true, Accepted, "Accepted; no effect in Fabrica (a torch loading/checkpointing detail)") \
  X(upcast_layernorm, upcast_layernorm, bool, false, Later, "Whether or not to upcast the layernorm weights in fp32") \
  X(upcast_lmhead_output, upcast_lmhead_output, bool, false, Later, "Whether or not to upcast the output of lm_head in fp32") \
  X(train_from_scratch, train_from_scratch, bool, false, Later, "Whether or not to randomly initialize the model weights") \
  X(infer_backend, infer_backend, std::string, "huggingface", Accepted, "Accepted; an inference setting, no effect on training") \
  X(offload_folder, offload_folder, std::string, "offload", Accepted, "Accepted; no effect in Fabrica (a torch loading/checkpointing detail)") \
  X(use_kv_cache, use_kv_cache, bool, true, Accepted, "Accepted; an inference setting, no effect on training") \
  X(use_v1_kernels, use_v1_kernels, bool, false, Later, "Whether or not to use high-performance kernels in training") \
  X(infer_dtype, infer_dtype, std::string, "auto", Accepted, "Accepted; an inference setting, no effect on training") \
  X(hf_hub_token, hf_hub_token, std::string, "", Accepted, "Accepted; Fabrica reads local folders only and downloads nothing") \
  X(ms_hub_token, ms_hub_token, std::string, "", Accepted, "Accepted; Fabrica reads local folders only and downloads nothing") \
  X(om_hub_token, om_hub_token, std::string, "", Accepted, "Accepted; Fabrica reads local folders only and downloads nothing") \
  X(print_param_status, print_param_status, bool, false, Accepted, "Accepted; no effect") \
  X(quantization_method, quantization_method, std::string, "bnb", Accepted, "Accepted; no effect without quantization_bit (later)") \
  X(quantization_bit, quantization_bit, int64_t, 0, Later, "The number of bits to quantize the model using on-the-fly quantization") \
  X(quantization_type, quantization_type, std::string, "nf4", Accepted, "Accepted; no effect without quantization_bit (later)") \
  X(double_quantization, double_quantization, bool, true, Accepted, "Accepted; no effect without quantization_bit (later)") \
  X(quantization_device_map, quantization_device_map, std::string, "", Accepted, "Accepted; no effect without quantization_bit (later)") \
  X(image_max_pixels, image_max_pixels, int64_t, 589824, Supported, "Image datasets: an image above this many pixels is first scaled down to it (LLaMA-Factory's pre-resize)") \
  X(image_min_pixels, image_min_pixels, int64_t, 1024, Supported, "Image datasets: an image below this many pixels is first scaled up to it (LLaMA-Factory's pre-resize)") \
  X(image_do_pan_and_scan, image_do_pan_and_scan, bool, false, Accepted, "Accepted; a multimodal setting, no effect (Fabrica trains text-only models)") \
  X(crop_to_patches, crop_to_patches, bool, false, Accepted, "Accepted; a multimodal setting, no effect (Fabrica trains text-only models)") \
  X(video_max_pixels, video_max_pixels, int64_t, 65536, Accepted, "Accepted; a multimodal setting, no effect (Fabrica trains text-only models)") \
  X(video_min_pixels, video_min_pixels, int64_t, 256, Accepted, "Accepted; a multimodal setting, no effect (Fabrica trains text-only models)") \
  X(video_fps, video_fps, double, 2.0, Accepted, "Accepted; a multimodal setting, no effect (Fabrica trains text-only models)") \
  X(video_maxlen, video_maxlen, int64_t, 128, Accepted, "Accepted; a multimodal setting, no effect (Fabrica trains text-only models)") \
  X(use_audio_in_video, use_audio_in_video, bool, false, Accepted, "Accepted; a multimodal setting, no effect (Fabrica trains text-only models)") \
  X(audio_sampling_rate, audio_sampling_rate, int64_t, 16000, Accepted, "Accepted; a multimodal setting, no effect (Fabrica trains text-only models)") \
  X(export_dir, export_dir, std::string, "", Accepted, "Accepted; a llamafactory-cli export setting, no effect on training (see fabrica export)") \
  X(export_size, export_size, int64_t, 5, Accepted, "Accepted; a llamafactory-cli export setting, no effect on training (see fabrica export)") \
  X(export_device, export_device, std::string, "cpu", Accepted, "Accepted; a llamafactory-cli export setting, no effect on training (see fabrica export)") \
  X(export_quantization_bit, export_quantization_bit, int64_t, 0, Accepted, "Accepted; a llamafactory-cli export setting, no effect on training (see fabrica export)") \
  X(export_quantization_dataset, export_quantization_dataset, std::string, "", Accepted, "Accepted; a llamafactory-cli export setting, no effect on training (see fabrica export)") \
  X(export_quantization_nsamples, export_quantization_nsamples, int64_t, 128, Accepted, "Accepted; a llamafactory-cli export setting, no effect on training (see fabrica export)") \
  X(export_quantization_maxlen, export_quantization_maxlen, int64_t, 1024, Accepted, "Accepted; a llamafactory-cli export setting, no effect on training (see fabrica export)") \
  X(export_legacy_format, export_legacy_format, bool, false, Accepted, "Accepted; a llamafactory-cli export setting, no effect on training (see fabrica export)") \
  X(export_hub_model_id, export_hub_model_id, std::string, "", Accepted, "Accepted; a llamafactory-cli export setting, no effect on training (see fabrica export)") \
  X(use_kt, use_kt, bool, false, Later, "Whether to use KTransformers AMX MoE backend for SFT training") \
  X(kt_weight_path, kt_weight_path, std::string, "", Later, "Path to pre-quantized INT8 expert weights (.kt files)") \
  X(kt_expert_checkpoint_path, kt_expert_checkpoint_path, std::string, "", Later, "Path to expert checkpoint (safetensors) for online conversion") \
  X(kt_use_lora_experts, kt_use_lora_experts, bool, false, Later, "Whether to use GPU-side LoRA Experts") \
  X(kt_lora_expert_num, kt_lora_expert_num, int64_t, 0, Later, "Number of GPU-side LoRA Experts") \
  X(kt_lora_expert_intermediate_size, kt_lora_expert_intermediate_size, int64_t, 0, Later, "Intermediate size for GPU-side LoRA Experts") \
  X(vllm_maxlen, vllm_maxlen, int64_t, 4096, Accepted, "Accepted; an inference setting, no effect on training") \
  X(vllm_gpu_util, vllm_gpu_util, double, 0.7, Accepted, "Accepted; an inference setting, no effect on training") \
  X(vllm_enforce_eager, vllm_enforce_eager, bool, false, Accepted, "Accepted; an inference setting, no effect on training") \
  X(vllm_max_lora_rank, vllm_max_lora_rank, int64_t, 32, Accepted, "Accepted; an inference setting, no effect on training") \
  X(vllm_config, vllm_config, std::string, "", Later, "Config to initialize the vllm engine") \
  X(sglang_maxlen, sglang_maxlen, int64_t, 4096, Accepted, "Accepted; an inference setting, no effect on training") \
  X(sglang_mem_fraction, sglang_mem_fraction, double, 0.7, Accepted, "Accepted; an inference setting, no effect on training") \
  X(sglang_tp_size, sglang_tp_size, int64_t, -1, Accepted, "Accepted; an inference setting, no effect on training") \
  X(sglang_config, sglang_config, std::string, "", Later, "Config to initialize the SGLang engine") \
  X(sglang_lora_backend, sglang_lora_backend, std::string, "triton", Accepted, "Accepted; an inference setting, no effect on training") \
  /* data (LLaMA-Factory's DataArguments) */ \
  X(media_dir, media_dir, std::string, "", Supported, "Folder where image paths of datasets are looked up first (default: dataset_dir)") \
  X(streaming, streaming, bool, false, Later, "Enable dataset streaming") \
  X(buffer_size, buffer_size, int64_t, 16384, Later, "Size of the buffer to randomly sample examples from in dataset streaming") \
  X(mix_strategy, mix_strategy, std::string, "concat", Later, "Strategy to use in dataset mixing (concat/interleave)...") \
  X(interleave_probs, interleave_probs, std::string, "", Later, "Probabilities to sample data from datasets") \
  X(preprocessing_batch_size, preprocessing_batch_size, int64_t, 1000, Accepted, "Accepted; preprocessing batches by itself") \
  X(eval_num_beams, eval_num_beams, int64_t, 0, Later, "Number of beams to use for evaluation") \
  X(ignore_pad_token_for_loss, ignore_pad_token_for_loss, bool, true, Later, "Whether or not to ignore the tokens corresponding to the pad label in loss computation") \
  X(eval_on_each_dataset, eval_on_each_dataset, bool, false, Later, "Whether or not to evaluate on each dataset separately") \
  X(tool_format, tool_format, std::string, "", Later, "Tool format to use for constructing function calling examples") \
  X(default_system, default_system, std::string, "", Later, "Override the default system message in the template") \
  X(preserve_thinking, preserve_thinking, bool, false, Later, "Whether or not to preserve thinking content in historical turns for reasoning models") \
  X(tokenized_path, tokenized_path, std::string, "", Later, "Path to save or load the tokenized datasets") \
  X(data_shared_file_system, data_shared_file_system, bool, false, Later, "Whether or not to use a shared file system for the datasets") \
  /* fine-tuning methods (LLaMA-Factory's FinetuningArguments) */ \
  X(freeze_trainable_layers, freeze_trainable_layers, int64_t, 2, Supported, "freeze: trainable decoder layers, the last N (N > 0) or the first |N| (N < 0)") \
  X(freeze_trainable_modules, freeze_trainable_modules, std::string, "all", Supported, "freeze: trainable modules of those layers: all, or a comma list of self_attn, mlp, input_layernorm, post_attention_layernorm") \
  X(freeze_extra_modules, freeze_extra_modules, std::string, "", Supported, "freeze: modules outside the decoder layers that train too: comma list of embed_tokens, norm, lm_head") \
  X(additional_target, additional_target, std::string, "", Supported, "lora: modules trained in full and saved with the adapter (PEFT modules_to_save, matched as PEFT does: module names ending with it): comma list of embed_tokens, lm_head, norm, input_layernorm, post_attention_layernorm, q_norm, k_norm") \
  X(module_dropout, module_dropout, double, 0.0, Later, "Dropout rate for the OFT fine-tuning") \
  X(oft_rank, oft_rank, int64_t, 0, Later, "The intrinsic dimension for OFT fine-tuning") \
  X(oft_block_size, oft_block_size, int64_t, 32, Later, "The intrinsic dimension for OFT fine-tuning") \
  X(oft_target, oft_target, std::string, "all", Later, "Name(s) of target modules to apply OFT. Use commas to separate multiple modules") \
  X(create_new_adapter, create_new_adapter, bool, false, Later, "Whether or not to create a new adapter with randomly initialized weight") \
  X(loraplus_lr_ratio, loraplus_lr_ratio, double, 0.0, Later, "LoRA plus learning rate ratio (lr_B / lr_A)") \
  X(loraplus_lr_embedding, loraplus_lr_embedding, double, 1e-06, Later, "LoRA plus learning rate for lora embedding layers") \
  X(use_rslora, use_rslora, bool, false, Supported, "Whether or not to use the rank stabilization scaling factor for LoRA layer") \
  X(use_dora, use_dora, bool, false, Later, "Whether or not to use the weight-decomposed lora method (DoRA)") \
  X(pissa_init, pissa_init, bool, false, Later, "Whether or not to initialize a PiSSA adapter") \
  X(pissa_iter, pissa_iter, int64_t, 16, Later, "The number of iteration steps performed by FSVD in PiSSA. Use -1 to disable it") \
  X(pissa_convert, pissa_convert, bool, false, Later, "Whether or not to convert the PiSSA adapter to a normal LoRA adapter") \
  X(pref_ftx, pref_ftx, double, 0.0, Supported, "The supervised fine-tuning loss coefficient in DPO training") \
  X(pref_bco_weight, pref_bco_weight, double, 0.0, Later, "The Binary Classifier Optimization coefficient in DPO training") \
  X(dpo_label_smoothing, dpo_label_smoothing, double, 0.0, Supported, "The robust DPO label smoothing parameter in cDPO that should be between 0 and 0.5") \
  X(kto_chosen_weight, kto_chosen_weight, double, 1.0, Supported, "The weight factor of the desirable losses in KTO training") \
  X(kto_rejected_weight, kto_rejected_weight, double, 1.0, Supported, "The weight factor of the undesirable losses in KTO training") \
  X(simpo_gamma, simpo_gamma, double, 0.5, Supported, "The target reward margin term in SimPO loss") \
  X(ppo_buffer_size, ppo_buffer_size, int64_t, 1, Later, "The number of mini-batches to make experience buffer in a PPO optimization step") \
  X(ppo_epochs, ppo_epochs, int64_t, 0, Supported, "grpo, ppo: passes over each rollout batch, each mini-batch one optimizer step of the actor (and ppo's critic). 0: 1 for grpo (verl's ppo_epochs, TRL's num_iterations: one on-policy update per rollout batch unless ppo_mini_batch_size cuts it), 4 for ppo (LLaMA-Factory's default)") \
  X(num_generations, num_generations, int64_t, 0, Own, "grpo, ppo: responses sampled per prompt, one group (verl's rollout.n, TRL's num_generations; 0: 8 for grpo, 1 for ppo)") \
  X(reward, reward, std::string, "", Own, "grpo, ppo: comma-separated rewards, summed: exact_match, gsm8k, boxed, format:REGEX, command:CMD, model:PATH (see the notes)") \
  X(reward_timeout, reward_timeout, double, 600.0, Own, "grpo, ppo: seconds one call of a command:CMD reward may take (each step and rank); past it its process group is killed and the run stops naming the command. Keep it below ddp_timeout") \
  X(truncation, truncation, std::string, "error", Own, "grpo, ppo: a prompt longer than cutoff_len (its template included): error (stop, counting them), left (keep its last cutoff_len tokens: the end of the question and the assistant header) or middle (its first and last halves); verl's data.truncation. The answer is never cut") \
  X(norm_adv_by_std, norm_adv_by_std, bool, true, Own, "grpo: advantages (r - mean) / (std + 1e-6) per group; false: r - mean (Dr. GRPO; verl's norm_adv_by_std_in_grpo)") \
  X(clip_ratio_low, clip_ratio_low, double, 0.2, Own, "grpo, ppo: PPO ratio clipped below at 1 - clip_ratio_low (verl)") \
  X(clip_ratio_high, clip_ratio_high, double, 0.2, Own, "grpo, ppo: PPO ratio clipped above at 1 + clip_ratio_high (verl)") \
  X(clip_ratio_c, clip_ratio_c, double, 3.0, Own, "grpo, ppo: dual-clip bound of the loss of negative advantages, > 1 (verl)") \
  X(loss_agg_mode, loss_agg_mode, std::string, "token-mean", Own, "grpo, ppo: token-mean, seq-mean-token-sum, seq-mean-token-mean (verl) or seq-mean-token-sum-norm (Dr. GRPO: the sum over every token / (responses x max_new_tokens), TRL's dr_grpo)") \
  X(policy_loss, policy_loss, std::string, "vanilla", Own, "grpo, ppo: vanilla (PPO's per-token clipped ratio with dual clip), gspo (the length-normalised sequence ratio clipped once per response; GSPO, TRL's importance_sampling_level sequence) or cispo (the clipped ratio as a stop-gradient weight of the log-probability; MiniMax-M1) (verl's actor.policy_loss.loss_mode)") \
  X(loss_type, loss_type, std::string, "", Own, "grpo, ppo: TRL's loss_type, read as the loss_agg_mode it normalises by: grpo seq-mean-token-mean, bnpo and dapo token-mean, dr_grpo seq-mean-token-sum-norm (empty: loss_agg_mode decides; both given must agree)") \
  X(importance_sampling_level, importance_sampling_level, std::string, "token", Own, "grpo, ppo: TRL's name: token (policy_loss as given) or sequence (policy_loss gspo)") \
  X(adv_estimator, adv_estimator, std::string, "", Own, "grpo, ppo: grpo (group-normalised), rloo (leave-one-out baseline) or reinforce_plus_plus (the score whitened over every response token of the batch) for stage grpo; gae for stage ppo (empty: the stage's own; verl's algorithm.adv_estimator)") \
  X(scale_rewards, scale_rewards, std::string, "", Own, "grpo: TRL's advantage scaling, r - the group's mean over group (the group's std + 1e-4), batch (the batch's std + 1e-4) or none (1); empty: norm_adv_by_std decides (verl's 1e-6)") \
  X(mask_truncated_completions, mask_truncated_completions, bool, false, Own, "grpo, ppo: a response cut at max_new_tokens takes no part in the loss (its reward still counts in its group's advantages; TRL's name)") \
  X(filter_groups, filter_groups, bool, false, Own, "grpo: DAPO's dynamic sampling: a group whose rewards are all equal is dropped and more prompts are drawn until the batch is full or max_num_gen_batches rollout batches were drawn (verl's algorithm.filter_groups.enable)") \
  X(max_num_gen_batches, max_num_gen_batches, int64_t, 10, Own, "grpo: with filter_groups, the most rollout batches per step; past it the batch is filled up with dropped groups, which have advantage 0 (verl's filter_groups.max_num_gen_batches)") \
  X(overlong_buffer_len, overlong_buffer_len, int64_t, 0, Own, "grpo, ppo: DAPO's overlong shaping: a response longer than max_new_tokens - overlong_buffer_len loses overlong_penalty_factor per overlong_buffer_len tokens past it (0: off; verl's reward_model.overlong_buffer.len)") \
  X(overlong_penalty_factor, overlong_penalty_factor, double, 1.0, Own, "grpo, ppo: the largest overlong penalty, at max_new_tokens (verl's overlong_buffer.penalty_factor)") \
  X(logp_kernels, logp_kernels, std::string, "rollout", Own, "grpo, ppo: the kernels of the policy's forward passes (old and reference log-probabilities, updates): rollout (the rollout engine's batch-invariant decode GEMM and per-query attention, so the training forward's log-probabilities equal the rollout's bit for bit and rollout_logp_diff is 0, fp32 and bf16) or training (oneDNN's GEMMs and flash attention, off from the rollout's by rounding). The backward is the same either way") \
  X(rollout_is, rollout_is, std::string, "", Own, "grpo, ppo: rollout correction of the rollout engine's log-probabilities against the training forward's (verl's algorithm.rollout_correction.rollout_is): token (truncated importance sampling: each token's policy loss times min(pi_old / pi_rollout, rollout_is_threshold)) or sequence (the product over the response's tokens, truncated the same, on all of them); the weights are constants; empty: off. The issue's token_is / seq_is and the alias rollout_correction are accepted") \
  X(rollout_is_threshold, rollout_is_threshold, double, 2.0, Own, "grpo, ppo: with rollout_is, the largest importance weight (verl's default 2.0)") \
  X(rollout_is_batch_normalize, rollout_is_batch_normalize, bool, false, Own, "grpo, ppo: with rollout_is, the truncated weights divided by their mean over every rank's response tokens (token) or responses (sequence), as verl's rollout_is_batch_normalize") \
  X(kl_loss_coef, kl_loss_coef, double, 0.0, Own, "grpo, ppo: weight of the KL term to the reference (0: none, verl's use_kl_loss false)") \
  X(kl_loss_type, kl_loss_type, std::string, "low_var_kl", Own, "grpo, ppo: k1 (kl), k2 (mse) or k3 (low_var_kl, clamped as verl)") \
  X(ppo_mini_batch_size, ppo_mini_batch_size, int64_t, 0, Own, "grpo, ppo: prompts per optimizer step within a rollout batch, their num_generations responses each (0: the whole batch; verl)") \
  X(critic_model_path, critic_model_path, std::string, "", Own, "ppo: the critic's start, an HF folder or a stage rm output (its value head becomes the critic's); empty: the actor's start weights with a zero value head") \
  X(critic_learning_rate, critic_learning_rate, double, 0.0, Own, "ppo: the critic's peak learning rate, on the actor's schedule (0: learning_rate; verl's critic.optim.lr)") \
  X(critic_max_grad_norm, critic_max_grad_norm, double, 1.0, Own, "ppo: clip the critic's gradients to this global L2 norm (0: no clipping; verl's critic.grad_clip)") \
  X(critic_warmup, critic_warmup, int64_t, 0, Own, "ppo: the actor updates from this step on (1-based, as verl's trainer.critic_warmup; 0 and 1: from the first), the critic every step") \
  X(gamma, gamma, double, 1.0, Own, "ppo: GAE discount; grpo with adv_estimator reinforce_plus_plus: the discount of its returns (verl's algorithm.gamma)") \
  X(lam, lam, double, 1.0, Own, "ppo: GAE lambda (verl's algorithm.lam)") \
  X(cliprange_value, cliprange_value, double, 0.5, Own, "ppo: the critic's values clipped to within this of their rollout-time values in the value loss (verl)") \
  X(use_kl_in_reward, use_kl_in_reward, bool, false, Own, "ppo: subtract kl_coef * kl_penalty(rollout policy, reference) from every token's reward (verl's algorithm.use_kl_in_reward)") \
  X(kl_penalty, kl_penalty, std::string, "kl", Own, "ppo: the KL of use_kl_in_reward: k1 (kl), k2 (mse) or k3 (low_var_kl) (verl's algorithm.kl_penalty)") \
  X(kl_ctrl_type, kl_ctrl_type, std::string, "fixed", Own, "ppo: the KL-in-reward coefficient's controller: fixed (adaptive is not implemented yet; verl's algorithm.kl_ctrl.type)") \
  X(kl_coef, kl_coef, double, 0.001, Own, "ppo: the KL-in-reward coefficient (verl's algorithm.kl_ctrl.kl_coef)") \
  X(ppo_score_norm, ppo_score_norm, bool, false, Later, "Use score normalization in PPO training") \
  X(ppo_target, ppo_target, double, 6.0, Later, "Target KL value for adaptive KL control in PPO training") \
  X(ppo_whiten_rewards, ppo_whiten_rewards, bool, false, Later, "Whiten the rewards before compute advantages in PPO training") \
  X(ref_model, ref_model, std::string, "", Later, "Path to the reference model used for the PPO or DPO training") \
  X(ref_model_adapters, ref_model_adapters, std::string, "", Later, "Path to the adapters of the reference model") \
  X(ref_model_quantization_bit, ref_model_quantization_bit, int64_t, 0, Later, "The number of bits to quantize the reference model") \
  X(reward_model, reward_model, std::string, "", Later, "Path to the reward model used for the PPO training") \
  X(reward_model_adapters, reward_model_adapters, std::string, "", Later, "Path to the adapters of the reward model") \
  X(reward_model_quantization_bit, reward_model_quantization_bit, int64_t, 0, Later, "The number of bits to quantize the reward model") \
  X(reward_model_type, reward_model_type, std::string, "lora", Later, "The type of the reward model in PPO training") \
  X(ld_alpha, ld_alpha, double, 0.0, Later, "Alpha parameter from the LD-DPO paper, which controls the weighting of the verbose...") \
  X(use_galore, use_galore, bool, false, Later, "Whether or not to use the gradient low-Rank projection (GaLore)") \
  X(galore_target, galore_target, std::string, "all", Later, "Name(s) of modules to apply GaLore") \
  X(galore_rank, galore_rank, int64_t, 16, Later, "The rank of GaLore gradients") \
  X(galore_update_interval, galore_update_interval, int64_t, 200, Later, "Number of steps to update the GaLore projection") \
  X(galore_scale, galore_scale, double, 2.0, Later, "GaLore scaling coefficient") \
  X(galore_proj_type, galore_proj_type, std::string, "std", Later, "Type of GaLore projection") \
  X(galore_layerwise, galore_layerwise, bool, false, Later, "Whether or not to enable layer-wise update to further save memory") \
  X(use_apollo, use_apollo, bool, false, Later, "Whether or not to use the APOLLO optimizer") \
  X(apollo_target, apollo_target, std::string, "all", Later, "Name(s) of modules to apply APOLLO. Use commas to separate multiple modules") \
  X(apollo_rank, apollo_rank, int64_t, 16, Later, "The rank of APOLLO gradients") \
  X(apollo_update_interval, apollo_update_interval, int64_t, 200, Later, "Number of steps to update the APOLLO projection") \
  X(apollo_scale, apollo_scale, double, 32.0, Later, "APOLLO scaling coefficient") \
  X(apollo_proj, apollo_proj, std::string, "random", Later, "Type of APOLLO low-rank projection algorithm (svd or random)") \
  X(apollo_proj_type, apollo_proj_type, std::string, "std", Later, "Type of APOLLO projection") \
  X(apollo_scale_type, apollo_scale_type, std::string, "channel", Later, "Type of APOLLO scaling (channel or tensor)") \
  X(apollo_layerwise, apollo_layerwise, bool, false, Later, "Whether or not to enable layer-wise update to further save memory") \
  X(apollo_scale_front, apollo_scale_front, bool, false, Later, "Whether or not to use the norm-growth limiter in front of gradient scaling") \
  X(use_badam, use_badam, bool, false, Later, "Whether or not to use the BAdam optimizer") \
  X(badam_mode, badam_mode, std::string, "layer", Later, "Whether to use layer-wise or ratio-wise BAdam optimizer") \
  X(badam_start_block, badam_start_block, int64_t, 0, Later, "The starting block index for layer-wise BAdam") \
  X(badam_switch_mode, badam_switch_mode, std::string, "ascending", Later, "the strategy of picking block to update for layer-wise BAdam") \
  X(badam_switch_interval, badam_switch_interval, int64_t, 50, Later, "Number of steps to update the block for layer-wise BAdam") \
  X(badam_update_ratio, badam_update_ratio, double, 0.05, Later, "The ratio of the update for ratio-wise BAdam") \
  X(badam_mask_mode, badam_mask_mode, std::string, "adjacent", Later, "The mode of the mask for BAdam optimizer") \
  X(badam_verbose, badam_verbose, int64_t, 0, Later, "The verbosity level of BAdam optimizer") \
  X(use_swanlab, use_swanlab, bool, false, Later, "Whether or not to use the SwanLab (an experiment tracking and visualization tool)") \
  X(swanlab_project, swanlab_project, std::string, "llamafactory", Later, "The project name in SwanLab") \
  X(swanlab_workspace, swanlab_workspace, std::string, "", Later, "The workspace name in SwanLab") \
  X(swanlab_run_name, swanlab_run_name, std::string, "", Later, "The experiment name in SwanLab") \
  X(swanlab_mode, swanlab_mode, std::string, "cloud", Later, "The mode of SwanLab") \
  X(swanlab_api_key, swanlab_api_key, std::string, "", Later, "The API key for SwanLab") \
  X(swanlab_logdir, swanlab_logdir, std::string, "", Later, "The log directory for SwanLab") \
  X(swanlab_lark_webhook_url, swanlab_lark_webhook_url, std::string, "", Later, "The Lark webhook URL for SwanLab") \
  X(swanlab_lark_secret, swanlab_lark_secret, std::string, "", Later, "The Lark secret for SwanLab") \
  X(pure_bf16, pure_bf16, bool, false, Later, "Whether or not to train model in purely bf16 precision (without AMP)") \
  X(use_llama_pro, use_llama_pro, bool, false, Later, "Whether or not to make only the parameters in the expanded blocks trainable") \
  X(use_adam_mini, use_adam_mini, bool, false, Later, "Whether or not to use the Adam-mini optimizer") \
  X(use_mca, use_mca, bool, false, Later, "Whether or not to use MCA (Megatron Core Adapter) training") \
  X(use_hyper_parallel, use_hyper_parallel, bool, false, Later, "Whether or not to use HyperParallel distributed training backend (FSDP/TP)") \
  X(hyper_parallel_args, hyper_parallel_args, std::string, "", Later, "Path to a JSON file containing HyperParallel strategy arguments (e.g., tp_size,...") \
  X(use_muon, use_muon, bool, false, Later, "Whether or not to use the Muon optimizer") \
  X(use_dft_loss, use_dft_loss, bool, false, Later, "Whether to use the DFT loss") \
  X(use_asft_loss, use_asft_loss, bool, false, Later, "Whether to use the ASFT loss") \
  X(asft_alpha, asft_alpha, double, 0.1, Later, "The alpha parameter for ASFT loss to control the power of adaptive weight") \
  X(use_eaft_loss, use_eaft_loss, bool, false, Later, "Whether to use the EAFT loss") \
  X(eaft_alpha, eaft_alpha, double, 1.0, Later, "The alpha parameter for EAFT loss to control the power of adaptive weight") \
  X(freeze_vision_tower, freeze_vision_tower, bool, true, Supported, "qwen2_vl / qwen2_5_vl: the vision tower (patch embedding and blocks) does not train") \
  X(freeze_multi_modal_projector, freeze_multi_modal_projector, bool, true, Supported, "qwen2_vl / qwen2_5_vl: the vision merger (multi-modal projector) does not train") \
  X(freeze_language_model, freeze_language_model, bool, false, Supported, "qwen2_vl / qwen2_5_vl: the language model (embedding, layers, norm, lm_head) does not train") \
  X(compute_accuracy, compute_accuracy, bool, false, Later, "Whether or not to compute the token-level accuracy at evaluation") \
  X(early_stopping_steps, early_stopping_steps, int64_t, 0, Later, "Number of steps to stop training if the `metric_for_best_model` does not improve") \
  X(include_effective_tokens_per_second, include_effective_tokens_per_second, bool, false, Accepted, "Accepted; metrics.jsonl logs tokens_per_s every logged step") \
  /* generation (LLaMA-Factory's GeneratingArguments) */ \
  X(do_sample, do_sample, bool, true, Accepted, "Accepted; a generation setting (LLaMA-Factory's predict/chat), no effect on training") \
  X(temperature, temperature, double, 0.95, Supported, "grpo, ppo: rollout sampling temperature, and the one the log-probabilities of the loss are taken at (softmax(logits / temperature), as verl and TRL; 0: greedy, log-probabilities at 1). Not set: 1.0, verl's and TRL's RL default (the 0.95 shown is LLaMA-Factory's generation default). Other stages: no effect") \
  X(top_p, top_p, double, 0.7, Supported, "grpo, ppo: rollout nucleus sampling (1: off). Not set: 1.0, verl's and TRL's RL default, so that the loss sees the whole distribution sampled from (the 0.7 shown is LLaMA-Factory's generation default). Other stages: no effect") \
  X(top_k, top_k, int64_t, 50, Supported, "grpo, ppo: rollout top-k filter (0: off). Not set: 0, as verl (-1) and TRL (0) for RL (the 50 shown is LLaMA-Factory's generation default). Other stages: no effect") \
  X(num_beams, num_beams, int64_t, 1, Accepted, "Accepted; a generation setting (LLaMA-Factory's predict/chat), no effect on training") \
  X(max_length, max_length, int64_t, 1024, Accepted, "Accepted; a generation setting (LLaMA-Factory's predict/chat), no effect on training") \
  X(max_new_tokens, max_new_tokens, int64_t, 1024, Supported, "grpo, ppo: most tokens per rollout response. Other stages: no effect") \
  X(repetition_penalty, repetition_penalty, double, 1.0, Accepted, "Accepted; a generation setting (LLaMA-Factory's predict/chat), no effect on training") \
  X(length_penalty, length_penalty, double, 1.0, Accepted, "Accepted; a generation setting (LLaMA-Factory's predict/chat), no effect on training") \
  X(skip_special_tokens, skip_special_tokens, bool, true, Accepted, "Accepted; a generation setting (LLaMA-Factory's predict/chat), no effect on training") \
  /* training (transformers' Seq2SeqTrainingArguments) */ \
  X(lr_scheduler_kwargs, lr_scheduler_kwargs, std::string, "", Later, "The extra arguments for the lr_scheduler") \
  X(optim, optim, std::string, "adamw_torch_fused", Supported, "adamw_torch or adamw_torch_fused (the same AdamW); other optimizers come later") \
  X(optim_args, optim_args, std::string, "", Later, "Optional arguments supplied to optimizers such as AnyPrecisionAdamW, AdEMAMix, and GaLore") \
  X(optim_target_modules, optim_target_modules, std::string, "", Later, "The target modules to optimize") \
  X(average_tokens_across_devices, average_tokens_across_devices, bool, true, Later, "Whether or not to average tokens across devices") \
  X(label_smoothing_factor, label_smoothing_factor, double, 0.0, Later, "Label smoothing factor to prevent overconfidence") \
  X(bf16_full_eval, bf16_full_eval, bool, false, Later, "Use full BF16 precision for evaluation (not just mixed precision)") \
  X(fp16_full_eval, fp16_full_eval, bool, false, Later, "Use full FP16 precision for evaluation (not just mixed precision)") \
  X(tf32, tf32, bool, false, Later, "Enable TF32 mode on Ampere and newer GPUs") \
  X(gradient_checkpointing, gradient_checkpointing, bool, false, Supported, "true turns recompute_layers on (LLaMA-Factory checkpoints by default; see disable_gradient_checkpointing)") \
  X(gradient_checkpointing_kwargs, gradient_checkpointing_kwargs, std::string, "", Later, "Keyword arguments passed to `gradient_checkpointing_enable()`") \
  X(torch_compile, torch_compile, bool, false, Later, "Compile the model using `torch.compile()` for faster training") \
  X(torch_compile_backend, torch_compile_backend, std::string, "", Later, "Backend for `torch.compile()`. If set, automatically enables `torch_compile`") \
  X(torch_compile_mode, torch_compile_mode, std::string, "", Later, "Compilation mode for `torch.compile()`. If set, automatically enables `torch_compile`") \
  X(use_liger_kernel, use_liger_kernel, bool, false, Accepted, "Accepted; no effect (Fabrica's own kernels are fused already)") \
  X(liger_kernel_config, liger_kernel_config, std::string, "", Accepted, "Accepted; no effect (Fabrica's own kernels are fused already)") \
  X(use_cache, use_cache, bool, false, Accepted, "Accepted; training uses no KV cache") \
  X(neftune_noise_alpha, neftune_noise_alpha, double, 0.0, Later, "If not None, activates NEFTune noise embeddings") \
  X(torch_empty_cache_steps, torch_empty_cache_steps, int64_t, 0, Accepted, "Accepted; a torch memory/gather detail, no effect") \
  X(auto_find_batch_size, auto_find_batch_size, bool, false, Later, "Whether to find a batch size that will fit into memory automatically through...") \
  X(logging_strategy, logging_strategy, std::string, "steps", Later, "The logging strategy to adopt during training") \
  X(logging_first_step, logging_first_step, bool, false, Accepted, "Accepted; a logging detail, no effect") \
  X(log_on_each_node, log_on_each_node, bool, true, Accepted, "Accepted; a logging detail, no effect") \
  X(logging_nan_inf_filter, logging_nan_inf_filter, bool, true, Accepted, "Accepted; a logging detail, no effect") \
  X(log_level, log_level, std::string, "passive", Accepted, "Accepted; a logging detail, no effect") \
  X(log_level_replica, log_level_replica, std::string, "warning", Accepted, "Accepted; a logging detail, no effect") \
  X(disable_tqdm, disable_tqdm, bool, false, Accepted, "Accepted; a logging detail, no effect") \
  X(run_name, run_name, std::string, "", Accepted, "Accepted; a name for experiment trackers, no effect") \
  X(project, project, std::string, "huggingface", Accepted, "Accepted; a name for experiment trackers, no effect") \
  X(trackio_space_id, trackio_space_id, std::string, "", Later, "Hugging Face Space id for live Gradio-based Trackio logging (read/write Bucket access)") \
  X(trackio_bucket_id, trackio_bucket_id, std::string, "", Later, "Optional HF Bucket id when using a Trackio Space; if unset, Trackio picks a default") \
  X(trackio_static_space_id, trackio_static_space_id, std::string, "", Later, "Static read-only Trackio Space over the Bucket (stable model-card links)") \
  X(eval_delay, eval_delay, double, 0.0, Later, "Number of epochs or steps to wait for before the first evaluation can be performed,...") \
  X(prediction_loss_only, prediction_loss_only, bool, false, Accepted, "Accepted; evaluation computes the loss only") \
  X(eval_on_start, eval_on_start, bool, false, Later, "Whether to run through the entire `evaluation` step at the very beginning of training...") \
  X(eval_do_concat_batches, eval_do_concat_batches, bool, true, Accepted, "Accepted; a torch memory/gather detail, no effect") \
  X(eval_use_gather_object, eval_use_gather_object, bool, false, Accepted, "Accepted; a torch memory/gather detail, no effect") \
  X(eval_accumulation_steps, eval_accumulation_steps, int64_t, 0, Accepted, "Accepted; a torch memory/gather detail, no effect") \
  X(include_for_metrics, include_for_metrics, std::string, "", Later, "Include additional data in the `compute_metrics` function") \
  X(batch_eval_metrics, batch_eval_metrics, bool, false, Later, "Break eval metrics calculation into batches to save memory") \
  X(save_strategy, save_strategy, std::string, "steps", Later, "The checkpoint save strategy to adopt during training") \
  X(save_on_each_node, save_on_each_node, bool, false, Later, "When doing multi-node distributed training, whether to save models and checkpoints on...") \
  X(enable_jit_checkpoint, enable_jit_checkpoint, bool, false, Later, "Enable JIT checkpointing on SIGTERM signal for graceful termination on preemptible...") \
  X(push_to_hub, push_to_hub, bool, false, Later, "Whether or not to push the model to the Hub every time the model is saved") \
  X(hub_token, hub_token, std::string, "", Accepted, "Accepted; no effect without push_to_hub (later)") \
  X(hub_private_repo, hub_private_repo, bool, false, Accepted, "Accepted; no effect without push_to_hub (later)") \
  X(hub_model_id, hub_model_id, std::string, "", Accepted, "Accepted; no effect without push_to_hub (later)") \
  X(hub_strategy, hub_strategy, std::string, "every_save", Accepted, "Accepted; no effect without push_to_hub (later)") \
  X(hub_always_push, hub_always_push, bool, false, Accepted, "Accepted; no effect without push_to_hub (later)") \
  X(hub_revision, hub_revision, std::string, "", Accepted, "Accepted; no effect without push_to_hub (later)") \
  X(load_best_model_at_end, load_best_model_at_end, bool, false, Later, "Load the best checkpoint at the end of training") \
  X(metric_for_best_model, metric_for_best_model, std::string, "", Later, "Metric to use for comparing models when `load_best_model_at_end=True`. Defaults to 'loss'") \
  X(greater_is_better, greater_is_better, bool, false, Later, "Whether higher metric values are better") \
  X(ignore_data_skip, ignore_data_skip, bool, false, Later, "When resuming training, skip fast-forwarding through the dataset to reach the previous...") \
  X(restore_callback_states_from_checkpoint, restore_callback_states_from_checkpoint, bool, false, Accepted, "Accepted; no effect") \
  X(full_determinism, full_determinism, bool, false, Later, "Whether to call enable_full_determinism instead of set_seed for reproducibility in...") \
  X(data_seed, data_seed, int64_t, 0, Later, "Random seed to be used with data samplers") \
  X(accelerator_config, accelerator_config, std::string, "", Later, "Configuration for the internal Accelerate integration") \
  X(parallelism_config, parallelism_config, std::string, "", Later, "Parallelism configuration for the training run") \
  X(dataloader_drop_last, dataloader_drop_last, bool, false, Later, "Drop the last incomplete batch if it is not divisible by the batch size") \
  X(dataloader_pin_memory, dataloader_pin_memory, bool, true, Accepted, "Accepted; batches come from memory-mapped shards") \
  X(dataloader_persistent_workers, dataloader_persistent_workers, bool, false, Accepted, "Accepted; batches come from memory-mapped shards") \
  X(dataloader_prefetch_factor, dataloader_prefetch_factor, int64_t, 0, Accepted, "Accepted; batches come from memory-mapped shards") \
  X(remove_unused_columns, remove_unused_columns, bool, true, Accepted, "Accepted; a datasets-column detail, no effect") \
  X(label_names, label_names, std::string, "", Accepted, "Accepted; a datasets-column detail, no effect") \
  X(train_sampling_strategy, train_sampling_strategy, std::string, "random", Later, "Sampler for training: 'random' (default), 'sequential', or 'group_by_length'") \
  X(length_column_name, length_column_name, std::string, "length", Accepted, "Accepted; a datasets-column detail, no effect") \
  X(ddp_find_unused_parameters, ddp_find_unused_parameters, bool, false, Accepted, "Accepted; a torch DDP detail, no effect (Fabrica's collectives run over MPI)") \
  X(ddp_bucket_cap_mb, ddp_bucket_cap_mb, int64_t, 0, Supported, "Sets ddp_bucket_size (MB) when > 0") \
  X(ddp_broadcast_buffers, ddp_broadcast_buffers, bool, false, Accepted, "Accepted; a torch DDP detail, no effect (Fabrica's collectives run over MPI)") \
  X(ddp_static_graph, ddp_static_graph, bool, false, Accepted, "Accepted; a torch DDP detail, no effect (Fabrica's collectives run over MPI)") \
  X(ddp_backend, ddp_backend, std::string, "", Accepted, "Accepted; a torch DDP detail, no effect (Fabrica's collectives run over MPI)") \
  X(fsdp, fsdp, std::string, "", Later, "Enable PyTorch FSDP for distributed training") \
  X(fsdp_config, fsdp_config, std::string, "", Later, "Config to be used with FSDP (Pytorch Fully Sharded Data Parallel)") \
  X(debug, debug, std::string, "", Later, "transformers debug features (underflow_overflow, tpu_metrics_debug)") \
  X(skip_memory_metrics, skip_memory_metrics, bool, true, Accepted, "Accepted; a torch memory/gather detail, no effect") \
  X(do_eval, do_eval, bool, false, Later, "Evaluate once after training (eval_strategy evaluates during training)") \
  X(do_predict, do_predict, bool, false, Later, "Whether to run predictions on the test set") \
  X(logging_dir, logging_dir, std::string, "", Later, "TensorBoard folder (Fabrica writes its events to output_dir)") \
  X(local_rank, local_rank, int64_t, -1, Accepted, "Accepted; set by launchers, Fabrica takes the rank from MPI") \
  X(sortish_sampler, sortish_sampler, bool, false, Later, "Whether to use SortishSampler or not") \
  X(predict_with_generate, predict_with_generate, bool, false, Later, "Whether to use generate to calculate generative metrics (ROUGE, BLEU)") \
  X(generation_max_length, generation_max_length, int64_t, 0, Accepted, "Accepted; a generation setting (LLaMA-Factory's predict/chat), no effect on training") \
  X(generation_num_beams, generation_num_beams, int64_t, 0, Accepted, "Accepted; a generation setting (LLaMA-Factory's predict/chat), no effect on training") \
  X(generation_config, generation_config, std::string, "", Later, "Model id, file path or url pointing to a GenerationConfig json file, to use during...") \
  /* training (LLaMA-Factory's additions to the training arguments) */ \
  X(ray_num_workers, ray_num_workers, int64_t, 1, Later, "The number of workers for Ray training") \
  X(ray_init_kwargs, ray_init_kwargs, std::string, "", Later, "The arguments to pass to ray.init for Ray training") \
  X(master_addr, master_addr, std::string, "", Later, "The master address for init_process_group") \
  X(master_port, master_port, std::string, "", Later, "The master port for init_process_group") \
  X(fp8, fp8, bool, false, Later, "Enable FP8 mixed precision training via HuggingFace Accelerate") \
  X(fp8_backend, fp8_backend, std::string, "auto", Later, "FP8 backend to use ('auto', 'torchao', 'te', 'msamp')") \
  X(fp8_enable_fsdp_float8_all_gather, fp8_enable_fsdp_float8_all_gather, bool, false, Later, "Enable FP8 optimizations for FSDP2 all-gather operations") \
  X(enable_torch_profiler, enable_torch_profiler, bool, false, Accepted, "Accepted; torch profiler setting, no effect") \
  X(profiler_output_dir, profiler_output_dir, std::string, "", Accepted, "Accepted; torch profiler setting, no effect") \
  X(profiler_wait_steps, profiler_wait_steps, int64_t, 1, Accepted, "Accepted; torch profiler setting, no effect") \
  X(profiler_warmup_steps, profiler_warmup_steps, int64_t, 1, Accepted, "Accepted; torch profiler setting, no effect") \
  X(profiler_active_steps, profiler_active_steps, int64_t, 1, Accepted, "Accepted; torch profiler setting, no effect") \
  X(profiler_repeat, profiler_repeat, int64_t, 1, Accepted, "Accepted; torch profiler setting, no effect") \
  X(profiler_record_shapes, profiler_record_shapes, bool, true, Accepted, "Accepted; torch profiler setting, no effect") \
  X(profiler_profile_memory, profiler_profile_memory, bool, true, Accepted, "Accepted; torch profiler setting, no effect") \
  X(profiler_with_stack, profiler_with_stack, bool, true, Accepted, "Accepted; torch profiler setting, no effect") \
  X(profile_modules, profile_modules, std::string, "", Accepted, "Accepted; torch profiler setting, no effect") \
  /* Fabrica's own keys */                                                                                            \
  X(shuffle, shuffle, bool, true, Own, "Shuffle samples each epoch (false keeps dataset order)")                                \
  X(threads, threads, int64_t, 0, Own, "Compute threads (0: every core)")                                               \
  X(device, device, std::string, "cpu", Own, "Where the model, optimizer and every tensor of a step live: cpu, cuda (an NVIDIA GPU; a user error naming the missing GPU or driver where there is none) or auto (cuda when a GPU is present, else cpu). cuda trains every stage (full, freeze or lora) with data and tensor parallel and ZeRO-0 to 3; pipeline parallel is cpu only") \
  X(cache_dir, cache_dir, std::string, "", Own, "Tokenized-data cache (default $FABRICA_CACHE or ~/.cache/fabrica). LLaMA-Factory's cache_dir is its hub download cache; Fabrica downloads nothing")                                                       \
  X(recompute_layers, recompute_layers, bool, false, Own, "Recompute each decoder layer in backward (saves activation memory)") \
  /* distributed (Fabrica's own keys) */                                                                            \
  X(nproc_per_node, nproc_per_node, int64_t, 1, Own, "Worker processes on this machine (torchrun's name); fabrica train starts them through mpirun") \
  X(cluster, cluster, std::string, "", Own, "Cluster file from `fabrica init` (hosts, slots, network interface): launch across machines") \
  X(zero_stage, zero_stage, int64_t, 0, Own, "ZeRO stage: 0 (plain data parallel), 1 (optimizer state), 2 (+ gradients), 3 (+ parameters) sharded") \
  X(nan_policy, nan_policy, std::string, "stop", Own, "A non-finite loss or gradient norm on any rank: stop (exit naming the step and the rank, saving nothing new) or skip (drop that optimizer step, count it in metrics)") \
  X(max_skipped_steps, max_skipped_steps, int64_t, 10, Own, "nan_policy skip: stop once more optimizer steps than this were skipped") \
  X(save_every_minutes, save_every_minutes, double, 0.0, Own, "Also checkpoint at the end of the first step after this many minutes since the last save (0: off); bounds the work a crash can lose") \
  X(trace, trace, bool, false, Own, "Write a per-rank timeline of trace_steps to output_dir/trace/rank-N.json (Chrome/Perfetto trace format; `fabrica trace summary output_dir` sums it up)") \
  X(trace_steps, trace_steps, std::vector<int64_t>, {}, Own, "[first, last] optimizer steps (1-based, inclusive) the trace records; empty: [2, 4] (the first step warms caches)") \
  X(max_restarts, max_restarts, int64_t, 0, Own, "Launcher: restart every worker from the newest checkpoint when a worker dies, hangs past ddp_timeout or a collective times out, up to N times (torchrun's --max-restarts; also given as `fabrica train run.yaml --max-restarts N`)") \
  X(restart_backoff_s, restart_backoff_s, double, 3.0, Own, "Seconds the launcher waits before a restart") \
  X(min_nodes, min_nodes, int64_t, 0, Own, "With a cluster file: before each launch and restart, leave out the hosts that do not answer (through rsh_agent, 3 tries) as long as this many remain; the job resumes on fewer ranks (0: every host is needed, none probed)") \
  X(async_save, async_save, bool, false, Own, "Checkpoints copied to host memory at the step and written by a background thread while training goes on (renamed to checkpoint-N once on disk; one save in flight)") \
  X(ddp_bucket_size, ddp_bucket_size, double, 25.0, Own, "Gradient bucket size in MB (torch DDP's bucket_cap_mb): each bucket is reduced while backward goes on") \
  /* model parallelism (Fabrica's own keys; Megatron's spellings are aliases, below) */                 \
  X(tensor_parallel_size, tensor_parallel_size, int64_t, 1, Own, "Tensor-parallel ranks (Megatron's split of each layer; tensor_model_parallel_size is an alias). world = tp x cp x pp x dp, tp fastest") \
  X(sequence_parallel, sequence_parallel, bool, false, Own, "With tensor parallel: norms and the residual stream on 1/tp of the tokens, all-gather / reduce-scatter instead of all-reduce") \
  X(context_parallel_size, context_parallel_size, int64_t, 1, Own, "Context-parallel ranks (Megatron's name; LLaMA-Factory v1's cp_size is an alias): each row's tokens split over them, rank r holding chunks r and 2cp-1-r of 2cp; world = tp x cp x pp x dp, gradients summed and ZeRO sharded over dp x cp. Mixture-of-experts models too (their router statistics summed over cp). Stages pt, sft, dpo, kto and rm (the rows' log-probabilities, or scores, summed over cp). With tensor parallel inside it (each rank attending with its heads' slice) and pipeline parallel around it. Not yet with expert parallel, vision-language models, the RL stages, or a device (docs/architecture/parallelism.md)") \
  X(cp_comm_type, cp_comm_type, std::string, "p2p", Own, "Context parallel attention: p2p (ring attention: K/V blocks passed around the ring), all_gather (K/V all-gathered) or a2a (Ulysses all-to-all from sequence to head shards; needs num_attention_heads, and num_key_value_heads or cp, divisible). LLaMA-Factory v1's cp_mode is an alias, its ring and ulysses read as p2p and a2a") \
  X(pipeline_parallel_size, pipeline_parallel_size, int64_t, 1, Own, "Pipeline stages (pipeline_model_parallel_size is an alias)") \
  X(moe_router_load_balancing_type, moe_router_load_balancing_type, std::string, "", Own, "Mixture-of-experts, stage pt/sft: Megatron's load-balancing loss instead of transformers' (empty: transformers' load_balancing_loss_func, see moe_aux_loss_coef). aux_loss: each MoE layer's E / (k T^2) sum_e tokens_e sum_t p_te over its unmasked rows (1 when balanced), the objective adding the coefficient times their sum over layers; seq_aux_loss: the same within each sequence (row of the micro-batch), averaged over the rows; none: no load-balancing term. The coefficient is moe_aux_loss_coef (moe_aux_loss_coeff), else config.json's router_aux_loss_coef when its output_router_logits is on; aux_loss in metrics.jsonl is then the mean over layers. global_aux_loss is not implemented yet") \
  X(moe_z_loss_coeff, moe_z_loss_coeff, double, 0.0, Own, "Mixture-of-experts, stage pt/sft: Megatron's router z-loss (ST-MoE): each MoE layer's mean over unmasked rows of logsumexp(router logits)^2, the objective adding this coefficient times their sum over layers, per micro-batch as the load-balancing loss; metrics.jsonl logs the mean over layers as z_loss (0: off)") \
  X(moe_expert_capacity_factor, moe_expert_capacity_factor, double, 0.0, Own, "Mixture-of-experts, stage pt/sft: Megatron's token dropping: each expert takes at most ceil(T k / E * factor) of a micro-batch's picks on a rank (T its real tokens; padding takes no capacity, where Megatron counts it), the rest dropped (their weight zeroed, the token's other experts unchanged). Training and evaluation passes; generation stays dropless. 0: dropless") \
  X(moe_token_drop_policy, moe_token_drop_policy, std::string, "probs", Own, "With moe_expert_capacity_factor: which picks an over-full expert drops: probs (the lowest routing weights) or position (the latest tokens)") \
  X(moe_router_enable_expert_bias, moe_router_enable_expert_bias, bool, false, Later, "DeepSeek-V3's aux-loss-free balancing: a per-expert bias added to the scores for top-k selection only, updated after each step by moe_router_bias_update_rate towards the mean load") \
  X(moe_router_bias_update_rate, moe_router_bias_update_rate, double, 1e-3, Later, "Step of the expert bias update (moe_router_enable_expert_bias)") \
  X(expert_parallel_size, expert_parallel_size, int64_t, 1, Own, "Expert-parallel ranks of a mixture-of-experts model (Megatron's expert_model_parallel_size is an alias), folded into data parallel: it must divide the data-parallel ranks and the experts; each group of that many data-parallel ranks (dp x cp under context parallel) splits the experts (each rank holds, computes and updates E/ep of every MoE layer's experts; checkpoints reshard to any ep) and exchanges tokens by all-to-all (CPU; not with tensor/pipeline parallel or the rollout stages; docs/architecture/moe.md)") \
  X(virtual_pipeline_parallel_size, virtual_pipeline_parallel_size, int64_t, 1, Own, "Model chunks per pipeline stage for interleaved 1F1B (virtual_pipeline_model_parallel_size is an alias)") \
  X(pipeline_layers, pipeline_layers, std::vector<int64_t>, {}, Own, "Decoder layers of each model chunk in layer order, e.g. [3, 5] (pp entries; pp x vpp interleaved, chunk k on stage k % pp); empty: an automatic split balancing a token's FLOPs, the head's vocab GEMM included") \
  X(pipeline_schedule, pipeline_schedule, std::string, "1f1b", Own, "1f1b or interleaved_1f1b (needs virtual_pipeline_parallel_size > 1; left out, virtual_pipeline_parallel_size > 1 implies it, as in Megatron)") \
  X(parallel, parallel, std::string, "", Own, "auto: the planner (docs/PLANNER.md) chooses tensor_parallel_size, pipeline_parallel_size, virtual_pipeline_parallel_size, sequence_parallel, zero_stage, recompute_layers and the micro-batch (per_device_train_batch_size x gradient_accumulation_steps, keeping the global batch) for the run's ranks, and reports predicted against measured memory and step time; the layout keys set in the config constrain the search. Empty: the layout as the keys give it") \
  X(plan_cluster, plan_cluster, std::string, "", Own, "parallel: auto: the hardware to plan for, a file from `fabrica plan --calibrate` (empty: this machine, measured at start)")

// Other spellings of keys, read as the key they name (Megatron's, as LLaMA-Factory's mcore backend
// and verl write them). Setting both spellings is an error.
#define FAB_CONFIG_ALIASES(A)                                                                                       \
  A(tensor_model_parallel_size, tensor_parallel_size)                                                               \
  A(pipeline_model_parallel_size, pipeline_parallel_size)                                                           \
  A(virtual_pipeline_model_parallel_size, virtual_pipeline_parallel_size)                                           \
  A(expert_model_parallel_size, expert_parallel_size)                                                               \
  A(moe_aux_loss_coeff, moe_aux_loss_coef)                                                                          \
  A(rollout_correction, rollout_is)                                                                                 \
  A(epsilon, clip_ratio_low)                                                                                        \
  A(epsilon_high, clip_ratio_high)                                                                                  \
  A(cp_size, context_parallel_size)                                                                                 \
  A(cp_mode, cp_comm_type)

// Longer notes docs/CONFIG.md adds after the tables, one section per topic.
inline constexpr const char* kConfigNotes = R"(## Rewards (stages grpo and ppo)

`reward` lists one or more rewards, comma-separated; a response's reward is their sum. A comma
starts a new reward only where a reward name follows it, so a regex or a command may hold commas.

| reward | score of a response |
|---|---|
| `exact_match` | 1 when the decoded response, stripped of surrounding whitespace and the end-of-turn token, equals the dataset's answer (alpaca `output`, the sharegpt assistant turn, or `answer` of `{prompt, answer}` JSONL) stripped the same way; else 0. Also logged as `accuracy` whatever the reward |
| `gsm8k` | 1 when the number after the response's first `#### ` equals the answer's (the number after its `#### `, or the whole answer), commas removed, as verl's gsm8k reward; else 0 |
| `boxed` | 1 when the response's last `oxed{...}` (nested braces) equals the answer's last `oxed{}` (or the answer itself) as a number (`1/2` = `0.5`, `1,000` = `1000`), or as text when either is not a number; else 0 |
| `format:REGEX` | 1 when REGEX (PCRE2) matches somewhere in the response, else 0 (anchor it with `^...$` for the whole response) |
| `command:CMD` | CMD runs through `/bin/sh` once per step and rank; its stdin holds one JSON line per response, `{"prompt": ..., "response": ..., "answer": ...}`, and it prints one number per line, in order. A non-zero exit, a line that is not a number, or a count other than the responses' stops the run naming the command and the line. It runs in a process group of its own: past `reward_timeout` seconds (default 600), or when a stop signal reaches the run, the whole group is killed and the run stops naming the command; if the run itself is killed (even by SIGKILL), a guardian process (`reward-guard`) kills the group |
| `model:PATH` | a `stage: rm` output folder: a full model (value_head.safetensors, or v_head.* in its weights), or a LoRA adapter (finetuning_type lora) with its value_head.safetensors, merged into its base_model_name_or_path when loaded. The value head's score at the last token of prompt + response, as `fabrica score` computes it. Its tokenizer must be the policy's: every token id of the policy's tokenizer must be the same token in the reward model's, and its vocab_size at least the policy's, checked at the start (the run stops naming both folders) |

Every score must be a finite number within ±1e15 (larger ones overflow a group's mean and variance);
the run stops naming the reward and the response otherwise.

Example: `reward: gsm8k,format:^.*#### -?[0-9]+$` gives 2 to a right answer in the right format.

## Prompts (stages grpo and ppo)

Each example's prompt goes through the template up to and with the assistant header (every earlier
turn included, as LLaMA-Factory's `encode_oneturn`); its answer (the last response) is kept whole
for the rewards and never read by the model. `cutoff_len` bounds the prompt, as verl's
`max_prompt_length`; `max_new_tokens` bounds the response, and the longest prompt plus
`max_new_tokens` must fit the model's `max_position_embeddings` (checked at the start, as `fabrica
generate` checks it).

A prompt longer than `cutoff_len` is never cut from the right, which would drop the end of the
question and the assistant header the response must follow. LLaMA-Factory's own PPO data cuts the
prompt's head (`input_ids[:source_len]` after `infer_seqlen`), which is that defect; Fabrica does
what verl's `data.truncation` does instead:

| truncation | a prompt longer than cutoff_len |
|---|---|
| `error` (default, as verl) | the run stops before training, counting such prompts and naming the longest |
| `left` | keeps its last `cutoff_len` tokens: the end of the question and the assistant header |
| `middle` | keeps its first `cutoff_len / 2` and last `cutoff_len - cutoff_len / 2` tokens |

Cut prompts are counted as `truncated` in the `data:` line.

## Rollout sampling (stages grpo and ppo)

Responses are sampled at `temperature` with `top_p` and `top_k`, and every log-probability of the
loss (the rollout policy's "old" ones, the reference's, the policy's during the updates) and the
`entropy` metric are of softmax(logits / temperature), the distribution sampled from, as verl's
actor and TRL's GRPOTrainer compute them. Left unset, the three keys take verl's and TRL's RL
defaults for these stages: temperature 1, top_p 1, top_k 0 (off), not LLaMA-Factory's generation
defaults (0.95, 0.7, 50), under which the responses would come from a truncated distribution whose
probabilities the loss never sees. What the config sets is kept.

## Settings under which nothing is learned (stages grpo and ppo)

Refused at the start: grpo with `num_generations: 1` (a group of one has advantage 0), and grpo with
greedy decoding (`temperature: 0` or `top_k: 1`), which gives every response of a group the same
text. A warning: ppo with `critic_warmup` past the run's steps trains only the critic. A non-finite
loss or gradient norm of the actor or the critic stops the run naming the step and the ranks.
)";
