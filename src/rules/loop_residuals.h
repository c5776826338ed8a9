// Reverse mode through a Loop: the reverse loop's body (the vjp of the JVP body) recomputes the
// primal values its linear part reads (a recurrent cell's gates) from the state stacked for
// that iteration. The stacking loop computes those same values anyway, under the same names (it
// runs the same body's primal part), so it can stack them too: the reverse body then reads them
// (residuals) instead of running the forward step again.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "facts/facts.h"
#include "transforms/prepare.h"

namespace onnax {

// Which values a loop body computes can be stacked over iterations: stacking needs one shape for
// every iteration. A dim that inference could not compute, and the body's inputs do not carry
// (onnax's own symbol for an unknown size, made inside the body: an inner loop's trip count, a
// Range, a computed Reshape), comes from the data and may differ between iterations; such a
// value stays per iteration (the reverse body recomputes or accumulates it).
class IterationShapes {
 public:
  // `g` a body, `facts` it prepared as a model of its own.
  IterationShapes(const onnx::GraphProto& g, const Prepared& facts);
  bool same_every_iteration(const Facts& f) const;

 private:
  std::unordered_set<std::string_view> invariant_;  // onnax's symbols on the body's inputs
};

struct LoopResidual {
  std::string name;  // in the reverse body, and in the forward body that computes it
  Facts facts;       // per iteration
};

// The residuals of the reverse body `g`: floating-point values computed from `primal_inputs`
// alone (iteration number, condition, non-linear state: what the stacking loop's body has) by
// nodes `forward_defined` names the outputs of too, and read by g's other nodes or outputs.
// Each becomes an input of g appended after its present ones (so g must be given it by the
// reverse loop: a row of the stack), and the nodes only it needed are pruned. (`facts`: g
// prepared as a model of its own.)
// `any_type`: values stacked whatever their element type (what a hoisted loop defines: its
// stacks of iteration numbers too).
std::vector<LoopResidual> take_loop_residuals(onnx::GraphProto& g, const std::unordered_set<std::string>& primal_inputs,
                                              const std::unordered_set<std::string>& forward_defined,
                                              const Prepared& facts,
                                              const std::unordered_set<std::string>& any_type = {});

// Nested loops: the reverse body `g` runs a stacking loop for each inner loop (the inner loop's
// forward part, stacking what the inner reverse loop reads), which took the place of that loop
// in g. Run there, it would repeat the inner forward pass in every reverse iteration, and one
// level further in, that repetition's own inner loops again: time and size doubling per nesting
// level. Such a loop is copied into `forward_body` in place of the loop whose outputs it took
// (it computes them too), so the enclosing stacking loop runs it once per iteration and stacks
// its stacks, which take_loop_residuals then takes from g as residuals (as JAX's scan keeps an
// inner scan's residuals). Only loops that read nothing but values `forward_body` has are
// copied, and with them g's primal nodes (not reading `primal_inputs`' complement) that compute
// from their outputs (a tanh's derivative from the stacked tanh), placed after them. Returns the
// names the copies define.
std::unordered_set<std::string> hoist_inner_stacking_loops(const onnx::GraphProto& g,
                                                           const std::unordered_set<std::string>& primal_inputs,
                                                           onnx::GraphProto& forward_body);

// Residuals that need not be stacked: elementwise functions of the other (stacked) residuals
// and of values every iteration reads alike (`invariant`: a name and its rank; the forward body's
// Constants are too), a sigmoid's derivative s (1 - s) of the stacked s, say. Computed after the
// stacking loop on the whole stacks, they cost one node for all iterations instead of one per
// iteration. `derived[q]` says whether residuals[q] is one; `nodes` gets the forward body's
// nodes that compute them, in order (Constants included). A residual computed from one value the
// body computes anyway (a tanh's derivative 1 - y^2 from y, carried on as state) is derived from
// that value, which `stacked` lists (of the residual's facts) to be stacked instead.
struct DerivedResiduals {
  std::vector<char> derived;
  std::vector<const onnx::NodeProto*> nodes;
  std::vector<LoopResidual> stacked;
};
DerivedResiduals derivable_residuals(const onnx::GraphProto& forward_body, const std::vector<LoopResidual>& residuals,
                                     const std::unordered_map<std::string, int64_t>& invariant);

}  // namespace onnax
