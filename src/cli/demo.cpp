#include "cli/demo.h"

#include <chrono>
#include <cstdio>
#include <string>

#include "core/rng.h"
#include "models/decoder.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"

namespace fab {
namespace {

// Built-in training text (written for this demo); tokens are its bytes.
constexpr const char* kText =
    "The river runs past the mill and under the old stone bridge. In spring the water is high and "
    "fast, and the miller opens the gate so the wheel can turn all day. In summer the water is low "
    "and slow, and children wade across to the meadow where the cows graze. In autumn the leaves "
    "fall on the water and drift past the mill, red and gold and brown. In winter the river "
    "freezes at the edges, the wheel stands still, and the miller mends his nets by the fire. "
    "Every year the river runs past the mill, and every year the seasons turn like the wheel. ";

Tensor batch_of(const std::string& text, Rng& rng, int64_t batch, int64_t seq) {
  Tensor ids = Tensor::empty({batch, seq}, DType::i64, MemoryCategory::activations);
  for (int64_t b = 0; b < batch; ++b) {
    const size_t start = size_t(rng.next_u64() % (text.size() - size_t(seq)));
    for (int64_t t = 0; t < seq; ++t) ids.data<int64_t>()[b * seq + t] = (unsigned char)text[start + size_t(t)];
  }
  return ids;
}

std::string greedy_continue(DecoderModel& model, std::string prompt, int64_t new_tokens, int64_t max_seq) {
  for (int64_t i = 0; i < new_tokens; ++i) {
    const std::string window = prompt.size() > size_t(max_seq) ? prompt.substr(prompt.size() - size_t(max_seq)) : prompt;
    Tensor ids = Tensor::empty({1, int64_t(window.size())}, DType::i64, MemoryCategory::activations);
    for (size_t t = 0; t < window.size(); ++t) ids.data<int64_t>()[t] = (unsigned char)window[t];
    Tensor logits = model.logits(ids);
    const float* last = logits.data<float>() + (int64_t(window.size()) - 1) * model.config().vocab_size;
    int64_t best = 0;
    for (int64_t v = 1; v < model.config().vocab_size; ++v)
      if (last[v] > last[best]) best = v;
    prompt.push_back(char(best));
  }
  return prompt;
}

}  // namespace

int run_demo(int steps) {
  ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.vocab_size = 256;
  cfg.hidden_size = 128;
  cfg.intermediate_size = 352;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.head_dim = 32;
  cfg.rope_theta = 10000;
  const int64_t batch = 16, seq = 64;
  DecoderModel model(cfg, {Precision::fp32, false, seq});
  model.init_random(0);
  AdamW optimizer(model.params(), {0.9f, 0.95f, 1e-8f, 0.01f});
  LrSchedule schedule;
  schedule.type = "cosine";
  schedule.base_lr = 3e-3;
  schedule.warmup_steps = steps / 10;
  schedule.total_steps = steps;

  std::printf("demo: byte-level llama, %lld parameters, batch %lld x %lld tokens, %d steps\n",
              (long long)cfg.num_parameters(), (long long)batch, (long long)seq, steps);
  const std::string text = kText;
  Rng rng(1);
  auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    Tensor ids = batch_of(text, rng, batch, seq);
    const int64_t targets = DecoderModel::count_targets(ids);
    model.params().grads().zero_();
    const double loss = model.forward_backward(ids, ids, 1.0f / float(targets)) / double(targets);
    const double norm = clip_grad_norm(model.params(), 1.0);
    const double lr = schedule.lr(step);
    optimizer.step(float(lr));
    if (step % 20 == 0 || step == steps - 1) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("step %4d/%d  loss %.4f  grad_norm %.3f  lr %.2e  tokens/s %.0f\n", step + 1, steps, loss, norm, lr,
                  double(batch * seq) * (step + 1) / seconds);
    }
  }
  std::printf("greedy continuation of \"In winter the\":\n  %s\n",
              greedy_continue(model, "In winter the", 60, seq).c_str());
  return 0;
}

}  // namespace fab
