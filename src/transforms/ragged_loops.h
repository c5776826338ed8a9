// vmap of a Loop whose examples may run different numbers of iterations (a per-example trip
// count or condition) and that stacks per-iteration values (scan outputs; reverse mode adds
// them for its residuals): each example's stack has its own length, which no batch holds, so
// the vectorized rules, and a per-example map of the Loop alone, would write a graph that fails
// when run. The Loop and everything computed from it run example by example instead, as one
// node the per-example map takes whole, so the stacks never leave their example: what reaches
// the rest of the graph (a gradient, a final state) has one shape for all examples.
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "transforms/prepare.h"

namespace onnax {

// Wraps each such Loop of p's graph, with the nodes that depend on it, into an If whose
// condition is always true (its then-branch holds them; the else-branch is a renamed copy), and
// reindexes p when it changed anything. `batched_inputs`: the runtime inputs vmap batches.
// Returns the names of the If nodes, which vmap must give to the per-example map.
std::unordered_set<std::string> wrap_ragged_loops(Prepared& p, const std::unordered_set<std::string>& batched_inputs);

}  // namespace onnax
