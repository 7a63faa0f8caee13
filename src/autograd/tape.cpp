#include "autograd/tape.h"

namespace fab {

Var make_var(Tensor value, bool requires_grad) {
  auto v = std::make_shared<Variable>();
  v->value = std::move(value);
  v->requires_grad = requires_grad;
  return v;
}

Tensor& grad_of(const Var& v) {
  if (!v->grad.defined())
    v->grad = Tensor::zeros(v->value.shape(), DType::f32, MemoryCategory::activations, v->value.device());
  return v->grad;
}

GradTarget grad_target(const Var& v) {
  if (v->grad.defined()) return {v->grad.data<float>(), true};
  v->grad = Tensor::empty(v->value.shape(), DType::f32, MemoryCategory::activations, v->value.device());
  return {v->grad.data<float>(), false};
}

void Tape::push(std::function<void()> backward_fn) {
  if (recording_) nodes_.push_back(std::move(backward_fn));
}

void Tape::backward() {
  while (!nodes_.empty()) {
    nodes_.back()();
    nodes_.pop_back();
  }
}

Var checkpoint(Tape& tape, const Var& input, const std::function<Var(Tape&, const Var&)>& fn) {
  if (!tape.recording()) return fn(tape, input);
  Tape no_record(false);
  Var out = fn(no_record, input);
  tape.push([input, out, fn] {
    Tape replay;
    Var in = make_var(input->value);
    in->grad = grad_of(input);  // the replay accumulates straight into the input's gradient
    Var again = fn(replay, in);
    again->grad = grad_of(out);
    replay.backward();
  });
  return out;
}

}  // namespace fab
