// The parallel layout read from a config: sizes, Megatron's aliases, the automatic layer split
// that balances the LM head, and every conflicting combination refused with the sizes named.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/layout.h"

namespace fab {
namespace {

ModelConfig model(int64_t layers, int64_t vocab = 64) {
  return parse_model_config(R"({"model_type":"llama","vocab_size":)" + std::to_string(vocab) +
                                R"(,"hidden_size":32,"intermediate_size":48,"num_hidden_layers":)" +
                                std::to_string(layers) +
                                R"(,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":64})",
                            "config.json");
}

TrainConfig config(const std::string& yaml) { return parse_train_config("output_dir: out\n" + yaml, "run.yaml"); }

std::string error_of(const TrainConfig& c, const ModelConfig& m, int world) {
  try {
    parallel_layout(c, m, world);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelLayout, DataParallelTakesTheRanksLeft) {
  const ParallelLayout l = parallel_layout(config(""), model(2), 4);
  EXPECT_EQ(l.tp, 1);
  EXPECT_EQ(l.pp, 1);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.chunk_layers, (std::vector<int64_t>{2}));
}

TEST(ParallelLayout, TensorTimesPipelineTimesDataParallel) {
  const ParallelLayout l = parallel_layout(config("tensor_parallel_size: 2\npipeline_parallel_size: 2\n"
                                                  "sequence_parallel: true\n"),
                                           model(4), 8);
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_TRUE(l.sequence_parallel);
  EXPECT_EQ(l.chunk_layers.size(), 2u);
}

// A device run is data and tensor parallel: the setting decides (`fabrica plan` of a cuda run
// needs no GPU).
TEST(ParallelLayout, ADeviceRunRefusesPipelineParallel) {
  EXPECT_NE(error_of(config("device: cuda\npipeline_parallel_size: 2\n"), model(2), 2)
                .find("device cuda with pipeline_parallel_size 2 is not implemented"),
            std::string::npos);
  EXPECT_EQ(parallel_layout(config("device: cuda\ntensor_parallel_size: 2\nzero_stage: 3\n"), model(2), 4).dp, 2);
}

TEST(ParallelLayout, MegatronSpellingsAreAliases) {
  const TrainConfig c = config("tensor_model_parallel_size: 2\npipeline_model_parallel_size: 2\n"
                               "virtual_pipeline_model_parallel_size: 2\npipeline_schedule: interleaved_1f1b\n");
  EXPECT_EQ(c.tensor_parallel_size, 2);
  EXPECT_EQ(c.pipeline_parallel_size, 2);
  EXPECT_EQ(c.virtual_pipeline_parallel_size, 2);
  try {
    config("tensor_parallel_size: 2\ntensor_model_parallel_size: 2\n");
    FAIL() << "both spellings accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("\"tensor_parallel_size\" is set twice (as its alias "
                                         "\"tensor_model_parallel_size\")"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(config("pipeline_layers: [1, 3]\n").pipeline_layers, (std::vector<int64_t>{1, 3}));
  EXPECT_THROW(config("pipeline_layers: 4\n"), UserError);
}

// As Megatron: virtual pipeline stages without a pipeline_schedule run the interleaved schedule
// (it was refused with a message that asked for virtual_pipeline_parallel_size > 1 when it was 2).
TEST(ParallelLayout, VirtualStagesImplyTheInterleavedSchedule) {
  const TrainConfig c = config("pipeline_parallel_size: 2\nvirtual_pipeline_parallel_size: 2\ngradient_accumulation_steps: 2\n");
  EXPECT_EQ(c.pipeline_schedule, "interleaved_1f1b");
  const ParallelLayout l = parallel_layout(c, model(4), 2);
  EXPECT_EQ(l.schedule, "interleaved_1f1b");
  EXPECT_EQ(l.vpp, 2);
  EXPECT_EQ(l.chunk_layers.size(), 4u);
  EXPECT_EQ(config("pipeline_parallel_size: 2\n").pipeline_schedule, "1f1b");
  EXPECT_EQ(config("virtual_pipeline_model_parallel_size: 2\n").pipeline_schedule, "interleaved_1f1b");  // the alias
  // Without pipeline stages the inferred schedule still says what is missing.
  EXPECT_NE(error_of(config("virtual_pipeline_parallel_size: 2\n"), model(4), 1).find("needs pipeline_parallel_size > 1"),
            std::string::npos);
}

TEST(ParallelLayout, AutomaticSplitBalancesTheHead) {
  // Equal layers and no head: an even split.
  EXPECT_EQ(balanced_layer_split(model(8, 1), 2, 16), (std::vector<int64_t>{4, 4}));
  // A head as costly as several layers: the last chunk takes fewer layers.
  const std::vector<int64_t> split = balanced_layer_split(model(8, 32000), 2, 16);
  EXPECT_EQ(split[0] + split[1], 8);
  EXPECT_GT(split[0], split[1]);
  EXPECT_EQ(balanced_layer_split(model(5, 1), 5, 16), (std::vector<int64_t>(5, 1)));
}

TEST(ParallelLayout, TensorParallelTakesItsRanksFromTheWorld) {
  const ParallelLayout l = parallel_layout(config("tensor_model_parallel_size: 2\nsequence_parallel: true\n"), model(4), 4);
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_TRUE(l.sequence_parallel);
  // More ranks than K/V heads: each head shared by a group of ranks.
  EXPECT_EQ(parallel_layout(config("tensor_parallel_size: 4\n"), model(4), 4).tp, 4);
}

TEST(ParallelLayout, ConflictsNameTheSizes) {
  auto expect = [](const std::string& yaml, int world, const std::string& words, int64_t layers = 4) {
    const std::string e = error_of(config(yaml), model(layers), world);
    EXPECT_NE(e.find(words), std::string::npos) << yaml << " -> " << e;
  };
  expect("tensor_parallel_size: 3\n", 3, "does not divide config.json's num_attention_heads 4");
  const ModelConfig three_kv_heads = parse_model_config(
      R"({"model_type":"llama","vocab_size":64,"hidden_size":48,"intermediate_size":48,"num_hidden_layers":2,
          "num_attention_heads":6,"num_key_value_heads":3,"max_position_embeddings":64})",
      "config.json");
  EXPECT_NE(error_of(config("tensor_parallel_size: 2\n"), three_kv_heads, 2)
                .find("neither divides nor is a multiple of config.json's num_key_value_heads 3"),
            std::string::npos);
  expect("tensor_parallel_size: 2\n", 3, "3 ranks is not a multiple of tensor_parallel_size 2");
  expect("pipeline_parallel_size: 8\n", 8, "8 model chunks, but config.json has 4 layers");
  expect("pipeline_parallel_size: 2\nzero_stage: 3\n", 2, "zero_stage 3 with pipeline_parallel_size 2");
  expect("virtual_pipeline_parallel_size: 2\npipeline_schedule: interleaved_1f1b\n", 1,
         "needs pipeline_parallel_size > 1");
  expect("pipeline_parallel_size: 2\nvirtual_pipeline_parallel_size: 2\npipeline_schedule: 1f1b\n", 2,
         "pipeline_schedule 1f1b with virtual_pipeline_parallel_size 2: 1f1b runs one model chunk per stage; set "
         "pipeline_schedule interleaved_1f1b");
  expect("pipeline_parallel_size: 2\npipeline_schedule: interleaved_1f1b\n", 2,
         "pipeline_schedule interleaved_1f1b with virtual_pipeline_parallel_size 1: interleaved_1f1b runs several "
         "model chunks per stage; set virtual_pipeline_parallel_size > 1");
  expect("pipeline_parallel_size: 2\nvirtual_pipeline_parallel_size: 2\npipeline_schedule: interleaved_1f1b\n"
         "gradient_accumulation_steps: 3\n",
         2, "gradient_accumulation_steps 3 is not a multiple of pipeline_parallel_size 2");
  expect("pipeline_parallel_size: 2\npipeline_layers: [1, 2]\n", 2, "summing to config.json's num_hidden_layers 4");
  expect("pipeline_parallel_size: 2\npipeline_layers: [1, 1, 2]\n", 2, "has 3 entries; expected");
  expect("pipeline_layers: [4]\n", 1, "pipeline_parallel_size is 1");
  expect("sequence_parallel: true\n", 1, "sequence_parallel needs tensor_parallel_size > 1");
  // Combinations not implemented yet say so.
  expect("finetuning_type: lora\npipeline_parallel_size: 2\n", 2, "finetuning_type lora with pipeline_parallel_size 2 is not implemented");
  expect("finetuning_type: lora\ntensor_parallel_size: 2\n", 2, "finetuning_type lora with tensor_parallel_size 2 is not implemented");
  expect("finetuning_type: freeze\ntensor_parallel_size: 2\n", 2, "finetuning_type freeze with tensor_parallel_size 2 is not implemented");
  expect("stage: dpo\ntensor_parallel_size: 2\n", 2, "stage dpo with tensor_parallel_size 2 and pipeline_parallel_size 1 is not implemented");
  expect("pipeline_schedule: zero_bubble\n", 1, "expected 1f1b or interleaved_1f1b");
}

// Context parallel: world = tp x cp x pp x dp; LLaMA-Factory v1's cp_size / cp_mode are aliases
// (ring and ulysses read as p2p and a2a); what it does not run with yet is refused by name.
TEST(ParallelLayout, ContextParallelTakesItsRanksAndAliases) {
  const ParallelLayout l = parallel_layout(config("context_parallel_size: 2\ncp_comm_type: all_gather\n"), model(2), 8);
  EXPECT_EQ(l.cp, 2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.cp_comm, "all_gather");
  EXPECT_EQ(l.sizes().cp, 2);
  const ParallelLayout v1 = parallel_layout(config("cp_size: 4\ncp_mode: ulysses\n"), model(2), 4);
  EXPECT_EQ(v1.cp, 4);
  EXPECT_EQ(v1.dp, 1);
  EXPECT_EQ(v1.cp_comm, "a2a");
  EXPECT_EQ(parallel_layout(config("cp_size: 2\ncp_mode: ring\n"), model(2), 2).cp_comm, "p2p");
}

TEST(ParallelLayout, ContextParallelRefusesWhatIsNotBuilt) {
  auto expect = [](const std::string& yaml, int world, const std::string& words) {
    const std::string e = error_of(config(yaml), model(2), world);
    EXPECT_NE(e.find(words), std::string::npos) << yaml << " -> " << e;
  };
  expect("context_parallel_size: 2\n", 3, "3 ranks is not a multiple of tensor_parallel_size 1 x context_parallel_size 2");
  const ParallelLayout with_tp = parallel_layout(config("context_parallel_size: 2\ntensor_parallel_size: 2\n"), model(2), 8);
  EXPECT_EQ(with_tp.tp, 2);
  EXPECT_EQ(with_tp.cp, 2);
  EXPECT_EQ(with_tp.dp, 2);
  EXPECT_EQ(parallel_layout(config("context_parallel_size: 2\npipeline_parallel_size: 2\n"), model(2), 4).pp, 2);
  EXPECT_EQ(parallel_layout(config("context_parallel_size: 2\nstage: dpo\n"), model(2), 2).cp, 2);  // kto, rm too
  expect("context_parallel_size: 2\nstage: grpo\nreward: exact_match\n", 2, "context_parallel_size 2 with stage grpo is not implemented");
  expect("context_parallel_size: 2\ndevice: cuda\n", 2, "context_parallel_size 2 with device cuda is not implemented");
  expect("context_parallel_size: 4\ncutoff_len: 7\n", 4, "cutoff_len 7 is shorter than 2 x context_parallel_size 4 = 8");
  expect("context_parallel_size: 2\ncp_comm_type: ring_attention\n", 2, "cp_comm_type \"ring_attention\": expected p2p");
  const ModelConfig three_heads = parse_model_config(
      R"({"model_type":"llama","vocab_size":64,"hidden_size":48,"intermediate_size":48,"num_hidden_layers":2,
          "num_attention_heads":6,"num_key_value_heads":3,"max_position_embeddings":64})",
      "config.json");
  EXPECT_NE(error_of(config("context_parallel_size: 4\ncp_comm_type: a2a\n"), three_heads, 4)
                .find("cp_comm_type a2a (Ulysses) with context_parallel_size 4: the attention heads 6 must be divisible"),
            std::string::npos);
  // Under tensor parallel Ulysses splits each rank's slice: 6 heads / tp 2 = 3, not divisible by cp 2.
  const ModelConfig six_heads = parse_model_config(
      R"({"model_type":"llama","vocab_size":64,"hidden_size":48,"intermediate_size":48,"num_hidden_layers":2,
          "num_attention_heads":6,"num_key_value_heads":2,"max_position_embeddings":64})",
      "config.json");
  EXPECT_NE(error_of(config("context_parallel_size: 2\ncp_comm_type: a2a\ntensor_parallel_size: 2\n"), six_heads, 4)
                .find("the attention heads 3 (per tensor-parallel rank of 2) must be divisible"),
            std::string::npos);
  EXPECT_EQ(parallel_layout(config("context_parallel_size: 4\ncp_comm_type: p2p\n"), three_heads, 4).cp, 4);
  const ModelConfig moe = parse_model_config(
      R"({"model_type":"qwen3_moe","vocab_size":64,"hidden_size":32,"intermediate_size":48,"moe_intermediate_size":16,
          "num_experts":4,"num_experts_per_tok":2,"num_hidden_layers":2,"num_attention_heads":4,
          "num_key_value_heads":2,"max_position_embeddings":64})",
      "config.json");
  EXPECT_EQ(parallel_layout(config("context_parallel_size: 2\n"), moe, 2).cp, 2);  // MoE: the router statistics summed over cp
  // Expert parallel folds into dp x cp: ep2 at cp2 x dp1, ep4 at cp2 x dp2; not ep4 at cp2 x dp1.
  EXPECT_EQ(parallel_layout(config("context_parallel_size: 2\nexpert_parallel_size: 2\n"), moe, 2).cp, 2);
  EXPECT_EQ(parallel_layout(config("context_parallel_size: 2\nexpert_parallel_size: 4\n"), moe, 4).dp, 2);
  EXPECT_NE(error_of(config("context_parallel_size: 2\nexpert_parallel_size: 4\n"), moe, 2)
                .find("expert_parallel_size 4 does not divide the 2 data-parallel ranks (data_parallel 1 x "
                      "context_parallel_size 2)"),
            std::string::npos);
}

}  // namespace
}  // namespace fab
