// ONNX Runtime's contrib ops that its transformer optimizer and many exports write, expanded
// into standard ONNX nodes before a transform: every transform (vmap, jvp, vjp and their
// compositions) then works on them through the standard ops' rules, and the result runs in any
// ONNX runtime. Covered: com.microsoft's Gelu, FastGelu, BiasGelu, QuickGelu, FusedMatMul,
// BiasAdd, SkipLayerNormalization and SkipSimplifiedLayerNormalization, and the
// SimplifiedLayerNormalization (RMS normalization) ONNX Runtime registers in the default domain,
// with ONNX Runtime's definitions (checked against its kernels in tests/python/conformance_suite/test_contrib_ops.py).
#pragma once

#include <string>

#include "transforms/prepare.h"

namespace onnax {

// Expands the covered contrib nodes of p's graph and its subgraphs; their input facts (from
// p.facts, when known) choose transposes and dtypes. True when the graph changed (its facts
// must then be inferred again). Fails with a diagnostic on a covered op whose attributes ask
// for what the expansion cannot do.
bool expand_contrib_ops(Prepared& p, const std::string& mode);

// Whether `domain`::`op` is a contrib op expand_contrib_ops covers.
bool is_expanded_contrib_op(const std::string& domain, const std::string& op);

// For a com.microsoft op onnax does not expand (Attention, MultiHeadAttention, ...): the reason
// and fix a refusal should give ("" for other domains).
std::string unexpanded_contrib_op_advice(const onnx::NodeProto& node);

}  // namespace onnax
