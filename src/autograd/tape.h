#pragma once
// A small tape over coarse ops. Each op computes its output and, when the tape records, pushes
// one closure that maps the output's gradient to its inputs' gradients. backward() runs the
// closures newest first and drops each after it runs, so saved activations are freed as the
// backward pass walks down the model.
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace fab {

struct Variable {
  Tensor value;
  Tensor grad;  // allocated (zeroed) on first use, or a view into a flat gradient buffer
  bool requires_grad = true;
};
using Var = std::shared_ptr<Variable>;

Var make_var(Tensor value, bool requires_grad = true);
// The gradient tensor of v, created zero-filled (accounted as activations) the first time.
Tensor& grad_of(const Var& v);

// Where a backward kernel should put v's gradient: a fresh (uninitialised) buffer to overwrite
// the first time, the existing one to accumulate into after that. Saves the zero-fill and the
// read of zeros for the many gradients that have a single producer.
struct GradTarget {
  float* data;
  bool accumulate;
};
GradTarget grad_target(const Var& v);

class Tape {
 public:
  explicit Tape(bool recording = true) : recording_(recording) {}
  bool recording() const { return recording_; }
  void push(std::function<void()> backward_fn);
  // Runs every recorded closure, newest first, and empties the tape.
  void backward();
  void clear() { nodes_.clear(); }
  size_t size() const { return nodes_.size(); }

 private:
  bool recording_;
  std::vector<std::function<void()>> nodes_;
};

// Activation recomputation: runs `fn` without saving anything for backward; in backward, runs it
// again on a private tape from the same input and back-propagates through that.
Var checkpoint(Tape& tape, const Var& input, const std::function<Var(Tape&, const Var&)>& fn);

}  // namespace fab
