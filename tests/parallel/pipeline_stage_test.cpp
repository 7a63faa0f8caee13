// What each pipeline stage holds: the layout's chunks mapped onto stages (chunk c of stage s is
// virtual stage c * p + s), the stage model's parameters and units (embedding first, head last,
// a tied head's own copy of the embedding), the layout accepting pipeline sizes, and a stage
// refusing whole-model calls.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/layout.h"
#include "parallel/pipeline_parallel.h"

namespace fab {
namespace {

ModelConfig qwen3_tied(int64_t layers) {
  return parse_model_config(R"({"model_type":"qwen3","vocab_size":64,"hidden_size":32,"intermediate_size":48,
    "num_hidden_layers":)" + std::to_string(layers) +
                                R"(,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,
    "max_position_embeddings":64,"tie_word_embeddings":true})",
                            "config.json");
}

TEST(PipelineStage, ChunksInterleaveOverTheStages) {
  const PipelineStage first = pipeline_stage({1, 2, 3, 2}, 2, 0), last = pipeline_stage({1, 2, 3, 2}, 2, 1);
  using Chunks = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(first.chunks, (Chunks{{0, 1}, {3, 6}}));
  EXPECT_EQ(last.chunks, (Chunks{{1, 3}, {6, 8}}));
  EXPECT_TRUE(first.has_embedding && !first.has_head);
  EXPECT_TRUE(!last.has_embedding && last.has_head);
  EXPECT_EQ(pipeline_stage({3, 5}, 2, 1).chunks, (Chunks{{3, 8}}));
}

TEST(PipelineStage, StageModelsHoldTheirPartsAndATiedCopy) {
  const ModelConfig c = qwen3_tied(4);
  DecoderModel whole(c);
  DecoderOptions options;
  options.stage = pipeline_stage({1, 1, 1, 1}, 2, 0);
  DecoderModel first(c, options);
  options.stage = pipeline_stage({1, 1, 1, 1}, 2, 1);
  DecoderModel last(c, options);
  EXPECT_EQ(first.num_units(), 3);  // embedding, layers 0 and 2
  EXPECT_EQ(last.num_units(), 3);   // layers 1 and 3, head
  EXPECT_TRUE(first.params().contains("model.layers.2.mlp.down_proj.weight"));
  EXPECT_FALSE(first.params().contains("model.layers.1.input_layernorm.weight"));
  EXPECT_FALSE(first.params().contains("model.norm.weight"));
  EXPECT_TRUE(last.params().contains("model.embed_tokens.weight"));  // the tied head's copy
  EXPECT_EQ(last.unit_range(2).second, last.params().numel());
  // Seeded from-scratch weights: each stage keeps the whole model's values of its parameters.
  whole.init_random(3);
  first.init_random(3);
  last.init_random(3);
  for (DecoderModel* stage : {&first, &last})
    for (const ParamInfo& p : stage->params().params())
      for (int64_t i = 0; i < p.numel(); i += 7)
        ASSERT_EQ(stage->params().values().data<float>()[p.offset + i],
                  whole.params().values().data<float>()[whole.params().info(p.name).offset + i])
            << p.name;
  Tensor ids = Tensor::zeros({1, 4}, DType::i64, MemoryCategory::activations);
  EXPECT_THROW(first.logits(ids), Error);
}

TEST(PipelineStage, LayoutsWithStagesAreAccepted) {
  const TrainConfig c = parse_train_config("output_dir: out\npipeline_parallel_size: 2\n", "run.yaml");
  const ParallelLayout l = parallel_layout(c, qwen3_tied(4), 4);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.chunk_layers.size(), 2u);
  EXPECT_EQ(l.chunk_layers[0] + l.chunk_layers[1], 4);
  const TrainConfig tp_pp =
      parse_train_config("output_dir: out\npipeline_parallel_size: 2\ntensor_parallel_size: 2\n", "run.yaml");
  const ParallelLayout both = parallel_layout(tp_pp, qwen3_tied(4), 4);
  EXPECT_EQ(both.tp, 2);
  EXPECT_EQ(both.pp, 2);
  EXPECT_EQ(both.dp, 1);
  const TrainConfig zero2 = parse_train_config("output_dir: out\npipeline_parallel_size: 2\nzero_stage: 2\n", "run.yaml");
  try {
    parallel_layout(zero2, qwen3_tied(4), 4);
    ADD_FAILURE() << "ZeRO-2 with a tied embedding across stages";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_stage 2 with pipeline_parallel_size 2 and tie_word_embeddings"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fab
