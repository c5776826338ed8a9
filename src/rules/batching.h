// Batching rules (vmap): given which inputs carry the batch axis, emit the batched op.
//
// Convention: inside a vmap, a batched value always carries its batch axis at position 0
// (the transform moves user axes there on entry and back on exit), so rules only ever
// deal with "batched at 0" or "not batched".
#pragma once

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "emit/builder.h"
#include "facts/facts.h"
#include "ir/small_vec.h"
#include "rules/body_transforms.h"

namespace onnax {

class BatchCtx {
 public:
  Builder& b;
  const onnx::NodeProto& node;
  int64_t opset;                         // effective default-domain opset of the model
  std::vector<V> in;                     // current values of the node's inputs (invalid = absent)
  std::vector<bool> batched;             // whether in[i] carries the batch axis at 0
  std::vector<const Facts*> facts;       // per-example facts of each input (nullptr if absent)
  std::vector<const Facts*> out_facts;   // per-example facts of each output (as the source knows them)
  const std::function<V()>& batch_size;  // 1-D int64 tensor [B]
  // Set when the rule fell back to a per-example Scan (the driver reports it).
  bool used_scan = false;
  const onnx::OpSchema* schema = nullptr;  // the node's schema at the model's opset
  // Every value the node's subgraphs read from enclosing scopes (batched or shared), with its
  // per-example facts: the per-example map slices the batched ones, the control-flow rules make
  // bodies models of their own from them.
  struct Read {
    std::string name;
    V v;
    bool batched = false;
    const Facts* facts = nullptr;
  };
  std::vector<Read> reads;
  // The batch dimension (for the types of batched subgraph inputs).
  Dim batch_dim;
  // How control-flow rules have bodies batched (given by the transform).
  const BodyTransforms* bodies = nullptr;

  int num_inputs() const { return static_cast<int>(in.size()); }
  bool has(int i) const { return i < num_inputs() && in[i].valid(); }
  bool any_batched() const;
  // Per-example rank of input i; fails with a diagnostic if it is unknown.
  int64_t rank(int i) const;
  int32_t dtype(int i) const { return facts[i] ? facts[i]->dtype : 0; }

  // Attributes of the source node.
  const onnx::AttributeProto* attr(const std::string& name) const;
  int64_t attr_i(const std::string& name, int64_t fallback) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;

  // Input i with the batch axis at 0: broadcast to the batch if it is not batched.
  V materialize(int i);
  // Batched input i padded with size-1 axes after the batch axis up to per-example rank r.
  V pad_rank(int i, int64_t r);
  // Input i holds per-example axes (int32/int64, scalar or 1-D, shared): the same axes of the
  // batched tensor (non-negative ones shift by one; folded when they are constants).
  V shifted_axes(int i);
  // The int64 values of input i when they are known when transforming (constants).
  const std::vector<int64_t>* known_i64(int i) const { return b.known_i64(in[i]); }

  // Element type of output o: from the facts, else from the schema when the output shares a
  // type variable with an input of known type (0 if neither tells).
  int32_t out_dtype(int o) const;
  // Fails with the diagnostic contract's operator message.
  [[noreturn]] void unsupported(const std::string& what, const std::string& fix) const;
  // "input 'X' (shape [batch, 3], float32, batched at axis 0)".
  std::string describe_input(int i) const;
};

struct BatchResult {
  Vs out;
  SmallVec<bool, 8> batched;  // whether out[i] carries the batch axis at 0
};

using BatchRule = std::function<BatchResult(BatchCtx&)>;

// The fallback every op with a schema has: a Scan over the batch whose body receives each
// batched input (and each batched value a subgraph captures), applies the node to one
// example and stacks the results. Correct for any deterministic op with equal-shaped
// per-example outputs; slower than a vectorized rule.
BatchResult scan_fallback(BatchCtx& c);

// All outputs batched.
BatchResult all_batched(Vs outs);

// Loop, Scan and If (control_flow_batching.cc): with a shared trip count and condition,
// their bodies batched by vmap itself; per-example ones by the fallback.
BatchResult loop_batch(BatchCtx& c);
BatchResult scan_batch(BatchCtx& c);
BatchResult if_batch(BatchCtx& c);

// The Loop body's outputs that depend on batched values, given which loop-carried states are
// batched on entry (`state_batched`, one per state; widened to those the body makes depend on a
// batched value) and which outer values it reads are batched. Entry 0 is the condition: when it
// depends on one, examples end at different iterations.
std::vector<char> loop_batched_state(const onnx::GraphProto& body, std::vector<char>& state_batched,
                                     const std::unordered_set<std::string>& batched_reads);

// Refusals with the diagnostic contract's message, for ops no batch can represent.
[[noreturn]] void refuse_ragged(BatchCtx& c);
[[noreturn]] void refuse_random(BatchCtx& c);
// Fails with a diagnostic when input i is batched: `role` says what the node uses it for.
void require_shared(BatchCtx& c, int i, const char* role);

// The one length every example computed (`lengths`: 1-D int64, one entry per example) as an
// int64 scalar. Examples that disagree would give ragged results, which a batch cannot hold,
// and which lengths they compute is known only at run time: the graph then fails when run, at
// a Reshape whose name says so, instead of returning wrong numbers.
V common_length(Builder& b, V lengths);

// Gather along per-example axis `axis` (non-negative) when data, indices or both are batched
// (per-example ranks `data_rank` and `index_rank`): each example indexes its own data with its
// own indices. The result is batched when either is.
V gather_per_example(Builder& b, V data, bool data_batched, int64_t data_rank, V index, bool index_batched,
                     int64_t index_rank, int64_t axis);

// Axis helpers shared by rules.
// A per-example axis attribute a (valid for a rank-r tensor) as an axis of the batched tensor.
inline int64_t shift_axis(int64_t a) {
  return a < 0 ? a : a + 1;
}
std::vector<int64_t> shift_axes(const std::vector<int64_t>& axes);

}  // namespace onnax
