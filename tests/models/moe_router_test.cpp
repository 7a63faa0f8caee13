// Megatron's router options on the tiny mixture-of-experts folders, against transformers' modeling
// code with Megatron's formulas added on its router logits (tests/reference/
// make_moe_router_reference.py, F/router_reference.safetensors): the per-layer aux_loss with the
// z-loss, the per-sequence seq_aux_loss with a capacity of 1.0 (dropping the least probable picks),
// and a capacity of 0.5 dropping the latest picks without a balancing term. Logits, the
// cross-entropy, the logged aux and z values and every gradient at 1e-5.
#include "models/decoder.h"
#include "models/hf_model.h"
#include "models/moe_fixture.h"
#include "test_util.h"

namespace fab {
namespace {

using test::moe_dir;
using test::MoeReference;

struct RouterCase {
  const char* name;
  RouterOptions options;
  double aux_weight;
};

const RouterCase kCases[] = {
    {"layer_z", {LoadBalancing::per_layer, 0.01, 0.0, false}, 0.05},
    {"seq_cap", {LoadBalancing::per_sequence, 0.0, 1.0, false}, 0.05},
    {"drop_position", {LoadBalancing::none, 0.0, 0.5, true}, 0.0},
};

class MoeRouterOptions : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeRouterOptions, MatchMegatronsFormulasOnTransformers) {
  MoeReference r(GetParam());
  const SafetensorsFile ref = SafetensorsFile::open(moe_dir(GetParam()) + "/router_reference.safetensors");
  auto model = load_model_folder(moe_dir(GetParam()), DecoderOptions(Precision::fp32, false, 16));
  for (const RouterCase& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::string p = std::string(c.name) + ".";
    model->set_router_options(c.options);
    model->set_aux_loss_weight(c.aux_weight);
    test::expect_close(test::masked_logits(*model, r), ref.tensor(p + "logits"), 1e-5, p + "logits");
    const double ce = test::ce_and_gradients(*model, r);
    const auto scalar = [&](const std::string& key) { return double(ref.tensor(p + key).data<float>()[0]); };
    EXPECT_NEAR(ce, scalar("loss_ce"), 1e-5 * scalar("loss_ce"));
    EXPECT_NEAR(model->router_statistics().aux_loss, scalar("aux"), 1e-5 * scalar("aux"));
    EXPECT_NEAR(model->router_statistics().z_loss, scalar("z"), 1e-5 * scalar("z"));
    for (const ParamInfo& info : model->params().params())
      test::expect_close(model->params().grads().view(info.offset, info.shape), ref.tensor(p + "grad." + info.name),
                         1e-5, p + "grad." + info.name);
  }
}

// A dropped pick changes the output: with capacity the logits differ from the dropless model's,
// and dropless (factor 0) gives the fixture's plain logits back.
TEST_P(MoeRouterOptions, CapacityDropsAndDroplessDoesNot) {
  MoeReference r(GetParam());
  auto model = load_model_folder(moe_dir(GetParam()), DecoderOptions(Precision::fp32, false, 16));
  RouterOptions capped;
  capped.capacity_factor = 0.5;
  model->set_router_options(capped);
  const Tensor dropped = test::masked_logits(*model, r);
  model->set_router_options({});
  const Tensor dropless = test::masked_logits(*model, r);
  test::expect_close(dropless, r.ref.tensor("logits"), 1e-5, "dropless logits");
  EXPECT_GT(test::norm_error(dropped, dropless), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Families, MoeRouterOptions, ::testing::Values("qwen3_moe", "qwen2_moe", "mixtral"));

}  // namespace
}  // namespace fab
