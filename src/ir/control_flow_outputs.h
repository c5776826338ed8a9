// Outputs of Loops and Ifs that nothing needs, removed with what computes them. A loop that
// reverse mode builds from a JVP loop carries everything the JVP loop did (first-order tangents,
// say) although only part of it is read; left in place, each nesting level would run the next
// level's tangents too, and its primal part would still read the tangent inputs. Likewise a
// JVP If's branches compute tangents of every order below the one a transpose needs.
#pragma once

#include <onnx/onnx_pb.h>

namespace onnax {

// Removes the nodes of `g` nothing needs (as prune does); from each Loop that stays, the states
// and scan outputs nothing needs (a state goes when its final value is unread and no needed
// output of the body depends on it over the iterations); from each If, the outputs nothing reads
// (from both branches). Then the same inside the bodies that remain. `g`'s outputs and inputs
// are unchanged.
void drop_unread_control_flow_outputs(onnx::GraphProto& g);

// Whether a Loop body gives back the condition it got (directly or through an Identity), so
// only the trip count and the condition entering the loop decide how many times it runs.
bool passes_condition_along(const onnx::GraphProto& body);

}  // namespace onnax
