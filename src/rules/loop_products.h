// Reverse mode through a Loop: the cotangent of a value every iteration reads unchanged (a
// weight) is a sum over iterations. When a term of it is a matrix product of per-iteration
// factors, x_t^T dy_t (a recurrent weight's gradient), adding it to an accumulator at every
// iteration writes a whole weight-sized matrix per step, and per example once vmapped (B x W x W
// per step, out of cache). Stacking the factors instead and multiplying once after the loop,
// X^T dY over all steps, is one matrix product over the sequence.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "emit/builder.h"
#include "ir/names.h"
#include "transforms/prepare.h"

namespace onnax {

// One product taken out of a reverse body: its two factors became scan outputs of the loop.
struct LoopProduct {
  enum class Left {
    kRows,     // the left factor's transpose was stacked: [T, M, K] (x_t^T dy_t with x_t [M, K])
    kColumn,   // the left factor itself, a column [K, 1] per iteration: [T, K, 1]
    kGeneral,  // the left factor itself, [K, M] per iteration: [T, K, M]
  };
  int output = 0;  // index among the body's outputs of the accumulated cotangent
  Left left = Left::kGeneral;
  Facts left_facts, right_facts;  // of the factors, per iteration
};

// Takes the products out of the accumulations that outputs `accumulated` of the reverse body
// `g` compute: each output's value is an Add tree over terms; a term that is a MatMul of two
// rank-2 per-iteration factors (not depending on `excluded[i]`, the cotangent the output
// accumulates into, and read by nothing else) leaves the tree, and its factors become outputs
// of `g` after its present ones (left, right, per product, in the returned order). (`facts`: g
// prepared as a model of its own.)
std::vector<LoopProduct> hoist_loop_products(onnx::GraphProto& g, const std::vector<int>& accumulated,
                                             const std::vector<std::string>& excluded, const Prepared& facts,
                                             NameScope& scope);

// The sum over iterations of one product, from its stacked factors (the loop's scan outputs):
// a rank-2 value.
V sum_of_loop_product(Builder& b, const LoopProduct& product, V stacked_left, V stacked_right);

// One other term taken out of a reverse body's accumulation (a bias's cotangent): the value it
// adds per iteration, or the input of the ReduceSum that makes it (then reduced after the loop),
// became a scan output of the loop, summed over the iterations after the loop.
struct LoopSum {
  int output = 0;  // index among the body's outputs of the accumulated cotangent
  Facts facts;     // of the stacked value, per iteration
  bool reduce = false;
  std::vector<int64_t> axes;  // of the ReduceSum (reduce), non-negative
  bool keepdims = true;
  int stacked_output = -1;  // when the stacked value is one of g's outputs already (a factor): its index
};

// After hoist_loop_products: the remaining terms of the same accumulations that depend on no
// `excluded[i]` and have a known shape leave the Add trees; each
// stacked value becomes an output of `g` after its present ones, in the returned order, unless
// it is one already, from `first_stacked` on (the outputs the loop stacks): stacked_output.
std::vector<LoopSum> hoist_loop_sums(onnx::GraphProto& g, const std::vector<int>& accumulated,
                                     const std::vector<std::string>& excluded, int first_stacked, const Prepared& facts,
                                     NameScope& scope);

// The sum over iterations of one term, from its stack (the loop's scan output).
V sum_of_loop_sum(Builder& b, const LoopSum& sum, V stacked);

}  // namespace onnax
