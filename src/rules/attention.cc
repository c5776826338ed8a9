// Attention (opset 23+). Until it has a vectorized rule, batched Attention takes the
// per-example Scan (registered here so the family has its own file).
#include "rules/batching.h"

namespace onnax {

void register_attention_rules(BatchRules& r) { r.add("", "Attention", 23, scan_fallback); }

}  // namespace onnax
