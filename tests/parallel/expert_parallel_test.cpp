// expert_parallel_size's layouts: ep folded into data parallel divides dp and the experts; what
// does not fit, and what is not built (tp / pp, a device, a model without experts), is a UserError
// naming the sizes. The exchange of one process keeps every expert and copies the rows.
#include <gtest/gtest.h>

#include "core/error.h"
#include "nn/expert_exchange.h"
#include "parallel/expert_parallel.h"

namespace fab {
namespace {

ModelConfig moe_model(int64_t experts) {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.moe.num_experts = experts;
  c.moe.num_experts_per_tok = 2;
  return c;
}

void expect_refused(int64_t ep, const ModelConfig& model, const ParallelSizes& sizes, bool host,
                    const std::string& text) {
  try {
    check_expert_parallel(ep, model, sizes, host);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(ExpertParallelLayout, FoldedIntoDataParallel) {
  EXPECT_NO_THROW(check_expert_parallel(2, moe_model(8), {.dp = 4}, true));
  EXPECT_NO_THROW(check_expert_parallel(4, moe_model(8), {.dp = 4}, true));
  EXPECT_NO_THROW(check_expert_parallel(1, ModelConfig{}, {.tp = 2, .dp = 3}, false));  // off: nothing to check
  expect_refused(3, moe_model(8), {.dp = 6}, true, "expert_parallel_size 3 does not divide the 8 experts of qwen3_moe");
  expect_refused(4, moe_model(8), {.dp = 2}, true, "expert_parallel_size 4 does not divide the 2 data-parallel ranks");
  expect_refused(2, moe_model(8), {.tp = 2, .dp = 2}, true, "with tensor_parallel_size 2 / pipeline_parallel_size 1");
  expect_refused(2, moe_model(8), {.dp = 2, .pp = 2}, true, "pipeline_parallel_size 2 is not implemented");
  expect_refused(2, moe_model(8), {.dp = 2}, false, "on a device (NCCL all_to_all) is not implemented");
  ModelConfig dense;
  dense.model_type = "llama";
  expect_refused(2, dense, {.dp = 2}, true, "needs a mixture-of-experts model (llama has no experts)");
  expect_refused(0, moe_model(8), {.dp = 2}, true, "expert_parallel_size 0 must be at least 1");
}

TEST(ExpertParallelLayout, OneProcessPadsEachExpertsRows) {
  ExpertExchange alone(4, nullptr);
  EXPECT_EQ(alone.local_experts(), 4);
  EXPECT_EQ(alone.first_expert(), 0);
  const ExpertRoute route = alone.plan({2, 0, 1, 3}, 4);
  EXPECT_EQ(route.first, (std::vector<int64_t>{0, 4, 4, 8, 12}));
  EXPECT_EQ(route.packed_of_received, (std::vector<int64_t>{0, 1, 4, 8, 9, 10}));
  const std::vector<float> rows = {1, 2, 3, 4, 5, 6};
  const Tensor packed = alone.dispatch(route, rows.data(), 1);
  EXPECT_EQ(std::vector<float>(packed.data<float>(), packed.data<float>() + 12),
            (std::vector<float>{1, 2, 0, 0, 3, 0, 0, 0, 4, 5, 6, 0}));
  const Tensor back = alone.combine(route, packed.data<float>(), 1);
  EXPECT_EQ(std::vector<float>(back.data<float>(), back.data<float>() + 6), rows);
}

}  // namespace
}  // namespace fab
