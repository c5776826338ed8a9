// Attention (opset 23+). Attention already carries a leading batch dim N on every input and
// output that has one (Q, K, V, past_key, past_value, nonpad_kv_seqlen; Y, present_key,
// present_value, qk_matmul_output), and examples along N never interact, so the vmap axis is
// merged into it: (B, N, ...) -> (B*N, ...) -> Attention -> (B, N, ...). Everything that
// depends on other dims (heads, GQA grouping, scale from head_size, causal offset from
// past_sequence_length or per-row nonpad_kv_seqlen, softcap, the mask's padding of the kv
// dim) sees the same per-row values as in each example's own run.
//
// attn_mask broadcasts against (N, q_num_heads, q_seq, total_seq) and is the one input whose
// N dim may be absent or 1. A shared mask that has no N dim of its own to merge (rank < 4, or
// rank 4 with a static dim 0 of 1) broadcasts over B*N as it did over N and is passed as is.
// Any other mask is made batched, padded to rank 4 after the batch axis, given its full N dim
// (Expand) and merged like the rest, so merged row b*N+n reads example b's mask row n.
#include "diagnostics/error.h"
#include "rules/batching.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

constexpr int kQ = 0, kMask = 3;

// (B, N, ...) -> (B*N, ...), rows = [B*N]. Spelled out, not -1, so an empty batch reshapes too.
V merge_batch(BatchCtx& c, V x, V rows) {
  return c.b.reshape(x, c.b.concat({rows, c.b.shape_of(x, 2)}, 0));
}

// (B*N, d1..dk) -> (B, N, d1..dk) for a merged output of rank k+1, with N as a 1-D int64
// [N]. ONNX's inference cannot always type Attention's outputs here (present_key needs
// static sequence lengths), so nothing reads the output's rank: Unsqueeze makes it
// (B*N, 1, d1..dk) and Reshape to [B, N, 0 x k] copies d1..dk from the same positions
// (allowzero=0). For an empty batch B is 0 and copies B*N, which is 0 too.
V split_batch(BatchCtx& c, V y, V n, int64_t merged_rank) {
  V x = c.b.unsqueeze(y, {1});
  return c.b.reshape(x, c.b.concat({c.batch_size(), n, c.b.i64s(std::vector<int64_t>(merged_rank - 1, 0))}, 0));
}

// ONNX Runtime's Attention kernel rejects a batch dim of 0 ("Batch size must be greater than
// 0"), which the merged B*N is for an empty vmap batch. So the merged inputs get one row of
// zeros appended exactly when B*N == 0 (pads [0, p] on axis 0 with p = (B*N == 0)), and the
// outputs are sliced back to their first B*N rows. For a non-empty batch both are no-ops;
// the padding row's result (whatever it is) is never read.
struct EmptyGuard {
  V rows;   // [B*N]
  V pads;   // [0, B*N == 0]
  V axis0;  // [0]
};

EmptyGuard empty_guard(BatchCtx& c, V q, V n) {
  EmptyGuard g;
  g.rows = c.b.op1("Mul", {c.b.shape_of(q, 0, 1), n});
  V empty = c.b.op1("Equal", {g.rows, c.b.i64s({0})});
  V p = c.b.op1("Cast", {empty}, {Attr::i("to", onnx::TensorProto::INT64)});
  g.axis0 = c.b.i64s({0});
  g.pads = c.b.concat({g.axis0, p}, 0);
  return g;
}

// Facts of x with dim 0 made unknown.
Facts rows_unknown(const Facts& x) {
  Facts f = x;
  if (f.has_shape && !f.dims.empty()) f.dims[0] = Dim{};
  return f;
}

V pad_rows(BatchCtx& c, const EmptyGuard& g, V x) {
  V y = c.b.op1("Pad", {x, g.pads, V{}, g.axis0});
  c.b.set_facts(y, rows_unknown(c.b.facts(x)));
  return y;
}

V take_rows(BatchCtx& c, const EmptyGuard& g, V y) {
  V s = c.b.op1("Slice", {y, g.axis0, g.rows, g.axis0});
  c.b.set_facts(s, rows_unknown(c.b.facts(y)));
  return s;
}

// A shared mask that broadcasts over the merged B*N dim exactly as it did over N.
bool mask_stays_shared(BatchCtx& c) {
  if (c.batched[kMask]) return false;
  const int64_t r = c.rank(kMask);
  if (r < 4) return true;
  const Facts* f = c.facts[kMask];
  return r == 4 && f->dims[0].known() && f->dims[0].value() == 1;
}

// The mask as (B*N, heads or 1, q_seq, kv), example b's rows at b*N .. b*N+N-1.
V merged_mask(BatchCtx& c, V n, V rows) {
  const int64_t r = c.rank(kMask);
  V m = c.materialize(kMask);
  if (r < 4) {
    std::vector<int64_t> axes;
    for (int64_t k = 1; k <= 4 - r; ++k) axes.push_back(k);
    m = c.b.unsqueeze(m, axes);
  }
  // (B, 1 or N, ...) -> (B, N, ...): Expand against [1, N, 1, 1, 1] leaves every other dim as is.
  m = c.b.expand(m, c.b.concat({c.b.i64s({1}), n, c.b.i64s({1, 1, 1})}, 0));
  return merge_batch(c, m, rows);
}

BatchResult attention_rule(BatchCtx& c) {
  // Without a static mask rank we cannot tell whether the mask has an N dim to merge; the
  // per-example Scan is exact whatever the mask's rank.
  if (c.has(kMask) && !(c.facts[kMask] && c.facts[kMask]->has_shape)) return scan_fallback(c);
  const int64_t q_rank = c.rank(kQ);
  // (node_defect refuses declared ranks other than 3 or 4; this is a rank only inference found.)
  if (q_rank != 3 && q_rank != 4)
    diag::fail(Error::Kind::kInvalidModel, "vmap: invalid model: " + diag::op_at(c.node, c.opset) +
                                               " reads a query (input 0) of rank " + std::to_string(q_rank) +
                                               "; Attention needs rank 3 or 4. Fix: repair the node");
  const V q = c.materialize(kQ);
  const V n = c.b.shape_of(q, 1, 2);  // per-example batch size N, [N]
  const EmptyGuard g = empty_guard(c, q, n);
  Vs ins(c.in.size());
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has(i)) continue;
    if (i == kMask && mask_stays_shared(c))
      ins[i] = c.in[i];
    else if (i == kMask)
      ins[i] = pad_rows(c, g, merged_mask(c, n, g.rows));
    else
      ins[i] = pad_rows(c, g, merge_batch(c, i == kQ ? q : c.materialize(i), g.rows));
  }
  Vs outs = c.b.clone(c.node, ins);
  // Y has Q's rank; present_key, present_value and qk_matmul_output are always 4-D.
  for (size_t o = 0; o < outs.size(); ++o)
    if (outs[o].valid()) outs[o] = split_batch(c, take_rows(c, g, outs[o]), n, o == 0 ? q_rank : 4);
  return all_batched(outs);
}

}  // namespace

void register_attention(OpTable& table) {
  table.op("Attention").batch(attention_rule, 23);
}

}  // namespace onnax
