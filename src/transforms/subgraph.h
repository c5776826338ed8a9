// Subgraphs (Loop, Scan and If bodies) handled as models of their own, so the graph-level
// transforms (jvp, vjp) differentiate a body exactly as they differentiate a model, and the
// result is put back into a node of the enclosing graph under collision-free names.
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "facts/facts.h"
#include "ir/graph_edit.h"
#include "ir/names.h"

namespace onnax {

// A model whose graph is `body` with every input typed: an input the body leaves untyped gets
// `input_facts[i]` (element type and rank; its dims unknown, since a loop-carried value may
// change shape from one iteration to the next). With `keep_dims`, the input gets the dims of
// `input_facts[i]` too (where the body's declaration has a dim unknown or no shape): for facts
// that hold in every iteration (loop_carried_facts). `extra_inputs` become graph inputs after
// the body's own (values the body reads from enclosing scopes, by the same names).
// `known_values` are inputs whose value is the same in every run of the body (constants it reads
// from outside, state a loop passes through unchanged): they also become initializers of the
// same names, so inference inside the body sees them (an Unsqueeze by outer-scope axes keeps
// its rank). Strip them from the derived graph with strip_known_values.
onnx::ModelProto standalone_model(const onnx::GraphProto& body, const std::vector<const Facts*>& input_facts,
                                  const std::vector<std::pair<std::string, Facts>>& extra_inputs,
                                  const std::unordered_map<std::string, int>& opsets,
                                  const std::vector<onnx::TensorProto>& known_values = {}, bool keep_dims = false);

// The facts of a Loop body's inputs that hold in every iteration. `input_facts` are those of
// the values entering the body (iteration number, condition, then `states` loop-carried values,
// then any other inputs). A carried value keeps a dim only when the body gives it back as it got
// it (the same size or symbol), checked by inferring the body until nothing changes (a fixed
// point: dims only become unknown), so a recurrent state or a weight the loop passes along has
// static dims inside the body, while one that grows keeps only its rank. Other inputs keep their
// facts. Any failure to infer leaves every carried value with its rank only. `grows` (when
// given) gets, per carried value, the shape the body provably gives back instead of the one it
// got (a known dim of another size, or another rank), empty when none is known.
// `body_outputs` (when given) gets the facts of the body's outputs inferred from the result
// (empty when no fixed point was reached).
std::vector<Facts> loop_carried_facts(const onnx::GraphProto& body, int states,
                                      const std::vector<const Facts*>& input_facts,
                                      const std::vector<std::pair<std::string, Facts>>& extra_inputs,
                                      const std::unordered_map<std::string, int>& opsets,
                                      const std::vector<onnx::TensorProto>& known_values = {},
                                      std::vector<std::string>* grows = nullptr,
                                      std::vector<Facts>* body_outputs = nullptr);

// The facts of a Loop's outputs from those of its inputs (`input_facts`, one per input of
// `loop`): each final state with the dims it keeps (loop_carried_facts), each scan output the
// body's per-iteration facts stacked over `trips` iterations (Dim{} when not known). Values the
// body reads from the enclosing graph have the facts `outer` gives by name (nullptr: unknown);
// without `outer`, such a body gives nothing. Empty when the body cannot be inferred.
std::vector<Facts> loop_output_facts(const onnx::NodeProto& loop, const std::vector<const Facts*>& input_facts,
                                     Dim trips, const std::unordered_map<std::string, int>& opsets,
                                     const std::function<const Facts*(std::string_view)>& outer = nullptr);

// A ValueInfo named `name` with `facts`' element type and shape (rank only when `rank_only`).
onnx::ValueInfoProto typed_value_info(const std::string& name, const Facts& facts, bool rank_only = false);

}  // namespace onnax
