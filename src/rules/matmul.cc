// MatMul, Gemm and Einsum; the determinant.
#include <algorithm>
#include <climits>
#include <map>
#include <set>

#include "rules/batching.h"
#include "rules/derivative.h"
#include "rules/op_table.h"

namespace onnax {
namespace {

// MatMul broadcasts leading dims numpy-style; a batched operand needs its batch axis in
// front of every leading dim of the other operand, and 1-D operands (which MatMul treats as
// vectors) are first made matrices so the batch axis is never taken for a matrix dim.
BatchResult matmul_rule(BatchCtx& c) {
  int64_t ra = c.rank(0), rb = c.rank(1);
  V a = c.in[0], bm = c.in[1];
  // A batch of vectors times a shared matrix or vector is a matrix product as it stands:
  // [B, K] @ [K, N] is [B, N], [B, K] @ [K] is [B].
  if (ra == 1 && c.batched[0] && !c.batched[1] && rb <= 2) return all_batched(c.b.clone(c.node, {a, bm}));
  bool squeeze_m = false, squeeze_n = false;
  if (ra == 1 && c.batched[0]) {
    a = c.b.unsqueeze(a, {-2});
    ra = 2;
    squeeze_m = true;
  }
  if (rb == 1 && c.batched[1]) {
    bm = c.b.unsqueeze(bm, {-1});
    rb = 2;
    squeeze_n = true;
  }
  const int64_t r = std::max(ra, rb);
  auto pad = [&](V v, int64_t own, bool batched) {
    if (!batched || own >= r) return v;
    std::vector<int64_t> axes;
    for (int64_t k = 1; k <= r - own; ++k) axes.push_back(k);
    return c.b.unsqueeze(v, axes);
  };
  a = pad(a, ra, c.batched[0]);
  bm = pad(bm, rb, c.batched[1]);
  V y = c.b.clone(c.node, {a, bm})[0];  // (an unchanged node keeps its names)
  // A shared 1-D B already drops the trailing dim, leaving the added m axis last.
  const bool n_dropped = rb == 1 && !c.batched[1];
  if (squeeze_m && squeeze_n)
    y = c.b.squeeze(y, {-2, -1});
  else if (squeeze_m)
    y = c.b.squeeze(y, {n_dropped ? -1 : -2});
  else if (squeeze_n)
    y = c.b.squeeze(y, {-1});
  return all_batched({y});
}

// Gemm is 2-D only: batched operands turn it into MatMul plus scaled bias.
BatchResult gemm_rule(BatchCtx& c) {
  const float alpha = c.attr("alpha") ? c.attr("alpha")->f() : 1.0f;
  const float beta = c.attr("beta") ? c.attr("beta")->f() : 1.0f;
  const int32_t dt = c.dtype(0);
  V y;
  if (!c.batched[0] && !c.batched[1]) {
    // Only C is batched: the product is shared.
    y = c.b.clone(c.node, {c.in[0], c.in[1]}, {}, {"beta"})[0];
  } else {
    V a = c.in[0], bm = c.in[1];
    if (c.attr_i("transA", 0))
      a = c.b.transpose(a, c.batched[0] ? std::vector<int64_t>{0, 2, 1} : std::vector<int64_t>{1, 0});
    if (c.attr_i("transB", 0))
      bm = c.b.transpose(bm, c.batched[1] ? std::vector<int64_t>{0, 2, 1} : std::vector<int64_t>{1, 0});
    y = c.b.op1("MatMul", {a, bm});
    if (alpha != 1.0f) y = c.b.op1("Mul", {y, c.b.scalar(alpha, dt)});
  }
  if (c.has(2)) {
    V cc = c.pad_rank(2, 2);
    if (beta != 1.0f) cc = c.b.op1("Mul", {cc, c.b.scalar(beta, dt)});
    y = c.b.op1("Add", {y, cc});
  }
  return all_batched({y});
}

// Einsum: batched operands get a fresh letter in front of their subscripts; the output too.
BatchResult einsum_rule(BatchCtx& c) {
  const auto* eq_attr = c.attr("equation");
  std::string eq;
  for (char ch : eq_attr->s())
    if (ch != ' ') eq += ch;
  std::string lhs = eq, rhs;
  const auto arrow = eq.find("->");
  std::set<char> used;
  for (char ch : eq)
    if (std::isalpha(static_cast<unsigned char>(ch))) used.insert(ch);
  if (arrow != std::string::npos) {
    lhs = eq.substr(0, arrow);
    rhs = eq.substr(arrow + 2);
  } else {
    // Implicit output: broadcast dims, then letters used once, in alphabetical order.
    std::map<char, int> count;
    bool ellipsis = lhs.find("...") != std::string::npos;
    for (char ch : lhs)
      if (std::isalpha(static_cast<unsigned char>(ch))) ++count[ch];
    if (ellipsis) rhs = "...";
    for (auto& [ch, n] : count)
      if (n == 1) rhs += ch;
  }
  char letter = 0;
  for (const char* cand = "zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPONMLKJIHGFEDCBA"; *cand; ++cand)
    if (!used.count(*cand)) {
      letter = *cand;
      break;
    }
  if (!letter)
    c.unsupported("the equation uses all 52 letters, leaving none for the batch axis",
                  "split the Einsum into smaller ones");
  std::vector<std::string> terms;
  size_t start = 0;
  for (;;) {
    auto comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::string new_lhs;
  for (size_t i = 0; i < terms.size(); ++i) {
    if (i) new_lhs += ",";
    new_lhs += (static_cast<int>(i) < c.num_inputs() && c.batched[i] ? std::string(1, letter) : "") + terms[i];
  }
  const std::string new_eq = new_lhs + "->" + std::string(1, letter) + rhs;
  return all_batched(c.b.clone(c.node, c.in, {Attr::s("equation", new_eq)}));
}

}  // namespace

}  // namespace onnax

// ---------------------------------------------------------------------------------------
// Derivatives.
namespace onnax {
namespace {

using D = JvpCtx;

// Swaps the last two axes of a value of rank >= 2.
V swap_last(Builder& b, V v) {
  const int64_t r = b.rank(v);
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < r - 2; ++i) perm.push_back(i);
  perm.push_back(r - 1);
  perm.push_back(r - 2);
  return b.transpose(v, perm);
}

Vs matmul_transpose(TransposeCtx& c) {
  auto& b = c.b;
  if (c.linear(0) && c.linear(1)) c.unsupported("both operands are tangents (the product is not linear)");
  const int lin = c.linear(0) ? 0 : 1;
  V a = c.in(0), m = c.in(1), ct = c.ct();
  const int64_t ra = facts_or_twin(b, a).rank(), rb = facts_or_twin(b, m).rank();
  Vs out(2);
  if (ra < 0 || rb < 0) {
    // A rank is unknown: products whose shapes follow the unknown operand's, whatever its rank
    // (1-D included), where the other operand is a known matrix or vector.
    if (lin == 0 && ra < 0 && rb == 2) {
      out[0] = b.op1("MatMul", {ct, b.transpose(m, {1, 0})});  // ct [..., n] @ m^T
    } else if (lin == 0 && ra < 0 && rb == 1) {
      out[0] = b.op1("Mul", {b.unsqueeze(ct, {-1}), m});  // ct[..., None] * m
    } else if (lin == 1 && ra == 2 && rb < 0) {
      out[1] = b.op1("MatMul", {b.transpose(a, {1, 0}), ct});  // a^T @ ct
    } else if (lin == 1 && ra < 0 && rb >= 1) {
      // The weight of a product by an activation of unknown rank: its rows (all leading axes
      // flattened, a 1-D activation as one row) against the cotangent's.
      // (The weight's dims: static facts, else its primal twin's shape at run time.)
      const Facts& mf = b.facts(m);
      auto dim = [&](int64_t i) {
        if (mf.has_shape && mf.rank() == rb && mf.dims[static_cast<size_t>(i)].known())
          return b.i64s({mf.dims[static_cast<size_t>(i)].value()});
        if (!b.witness(m).valid()) c.unsupported("the shape of the tangent operand 1 is unknown");
        return b.shape_of(b.witness(m), i, i + 1);
      };
      const V rows = b.reshape(a, b.concat({b.i64s({-1}), dim(0)}, 0));
      if (rb == 2) {
        const V ct_rows = b.reshape(ct, b.concat({b.i64s({-1}), dim(1)}, 0));
        out[1] = b.op1("MatMul", {b.transpose(rows, {1, 0}), ct_rows});
      } else {
        out[1] = b.op1("MatMul", {b.reshape(ct, b.i64s({-1})), rows});
      }
    } else {
      c.unsupported("the rank of operand " + std::to_string(ra < 0 ? 0 : 1) +
                    " is unknown, and the other operand is not a known matrix or vector");
    }
    return out;
  }
  if (lin == 1 && rb == 2 && ra >= 3) {
    // A weight matrix shared by every row of a batched activation (a Linear layer over
    // [batch, seq, features]): one product of the flattened rows, [K, rows] @ [rows, N], not a
    // product per batch entry summed afterwards, which wrote batch-many [K, N] partials.
    const Facts& mf = facts_or_twin(b, m);
    if (mf.has_shape && mf.dims[0].known() && mf.dims[1].known()) {
      const V rows = b.reshape(a, b.i64s({-1, mf.dims[0].value()}));
      const V ct_rows = b.reshape(ct, b.i64s({-1, mf.dims[1].value()}));
      out[1] = b.op1("MatMul", {b.transpose(rows, {1, 0}), ct_rows});
      return out;
    }
  }
  // A vector times a matrix: the cotangents are products with a vector as they stand (MatMul
  // treats a 1-D operand as a row or a column), so no axis is added and removed.
  if (lin == 0 && ra == 1 && rb == 2) {
    out[0] = b.op1("MatMul", {ct, swap_last(b, m)});  // ct [N] @ m^T [N, K]
    return out;
  }
  if (lin == 1 && ra == 2 && rb == 1) {
    // ct [M] @ a [M, K] = a^T ct. (Not MatMul(Transpose(a), ct): ONNX Runtime 1.31's
    // MatmulTransposeFusion computes a transposed matrix times a 1-D vector wrongly.)
    out[1] = b.op1("MatMul", {ct, a});
    return out;
  }
  // Treat 1-D operands as matrices, as MatMul does, and restore the cotangent's axes.
  // Only the primal operand is materialised (the tangent exists only on the tape); a 1-D one
  // is unsqueezed straight into the transposed matrix (a row or a column).
  if (ra == 1 && rb == 1)
    ct = b.unsqueeze(ct, {0, 1});
  else if (ra == 1)
    ct = b.unsqueeze(ct, {-2});
  else if (rb == 1)
    ct = b.unsqueeze(ct, {-1});
  if (lin == 0) {
    V g = b.op1("MatMul", {ct, rb == 1 ? b.unsqueeze(m, {0}) : swap_last(b, m)});
    if (ra == 1) g = b.squeeze(g, {-2});
    out[0] = unbroadcast_to(b, g, a);
  } else {
    // (A 1-D activation as a column directly, not a row then transposed.)
    V g = b.op1("MatMul", {ra == 1 ? b.unsqueeze(a, {1}) : swap_last(b, a), ct});
    if (rb == 1) g = b.squeeze(g, {-1});
    out[1] = unbroadcast_to(b, g, m);
  }
  return out;
}

Vs gemm_jvp(D& c) {
  auto& b = c.b;
  auto op = [&](V v, const char* trans) { return v.valid() && c.attr_i(trans, 0) ? b.transpose(v, {1, 0}) : v; };
  V a = op(c.x(0), "transA"), m = op(c.x(1), "transB");
  V ta = op(c.t(0), "transA"), tm = op(c.t(1), "transB");
  V t;
  if (ta.valid()) t = b.op1("MatMul", {ta, m});
  if (tm.valid()) t = b.add(t, b.op1("MatMul", {a, tm}));
  const double alpha = c.attr_f("alpha", 1.0f), beta = c.attr_f("beta", 1.0f);
  if (t.valid() && alpha != 1.0) t = b.op1("Mul", {t, c.scalar(alpha)});
  if (c.t(2).valid()) t = b.add(t, c.like_out(beta != 1.0 ? b.op1("Mul", {c.t(2), c.scalar(beta)}) : c.t(2)));
  return {c.like_out(t)};
}

// Einsum: linear in each operand; the transpose for operand i is another Einsum mapping the
// output's subscripts (and the other operands') back to operand i's.
struct EinsumTerms {
  std::vector<std::string> in;
  std::string out;
};

EinsumTerms parse_einsum(std::string eq) {
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  EinsumTerms t;
  const auto arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  size_t start = 0;
  for (;;) {
    auto comma = lhs.find(',', start);
    t.in.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (arrow != std::string::npos) {
    t.out = eq.substr(arrow + 2);
  } else {
    std::map<char, int> count;
    for (const auto& term : t.in)
      for (char ch : term)
        if (std::isalpha(static_cast<unsigned char>(ch))) ++count[ch];
    if (lhs.find("...") != std::string::npos) t.out = "...";
    for (auto& [ch, n] : count)
      if (n == 1) t.out += ch;
  }
  return t;
}

Vs einsum_transpose(TransposeCtx& c) {
  auto& b = c.b;
  const EinsumTerms terms = parse_einsum(c.attr("equation")->s());
  Vs out(c.ins.size());
  for (size_t i = 0; i < c.ins.size(); ++i) {
    if (!c.linear(i)) continue;
    // A repeated subscript (a diagonal, "ii", "...ii", "iii") takes a fresh letter for each
    // repeat; the result is multiplied by an identity matrix per repeat to land on the
    // diagonal. Axis positions are counted from the end after an ellipsis.
    struct Repeat {
      char letter, fresh;
      int64_t first_axis, axis;  // negative: from the end
    };
    std::vector<Repeat> repeats;
    std::string target, diag_target;
    {
      const std::string& term = terms.in[i];
      const size_t ellipsis = term.find("...");
      std::set<char> all;
      for (const auto& t : terms.in) all.insert(t.begin(), t.end());
      all.insert(terms.out.begin(), terms.out.end());
      const char* candidates = "zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPONMLKJIHGFEDCBA";
      std::map<char, int64_t> first_axis;
      int64_t letters_after = 0;
      if (ellipsis != std::string::npos)
        for (size_t k = ellipsis + 3; k < term.size(); ++k) ++letters_after;
      int64_t axis = 0;
      for (size_t k = 0; k < term.size(); ++k) {
        const char ch = term[k];
        if (ch == '.') {
          if (k == ellipsis) {
            target += "...";
            diag_target += "...";
            axis = -letters_after;
            k += 2;
          }
          continue;
        }
        if (auto it = first_axis.find(ch); it != first_axis.end()) {
          while (*candidates && all.count(*candidates)) ++candidates;
          if (!*candidates)
            c.unsupported("the equation uses all 52 letters, leaving none for a repeated subscript",
                          "split the Einsum into smaller ones");
          all.insert(*candidates);
          repeats.push_back(Repeat{ch, *candidates, it->second, axis});
          diag_target += *candidates;
        } else {
          first_axis.emplace(ch, axis);
          target += ch;
          diag_target += ch;
        }
        ++axis;
      }
    }
    std::set<char> available(terms.out.begin(), terms.out.end());
    std::string lhs = terms.out;
    Vs operands{c.ct()};
    for (size_t j = 0; j < c.ins.size(); ++j) {
      if (j == i) continue;
      lhs += "," + terms.in[j];
      operands.push_back(c.in(j));
      available.insert(terms.in[j].begin(), terms.in[j].end());
    }
    // Subscripts only operand i has were summed away: compute the rest, then broadcast back.
    std::string kept;
    std::vector<int64_t> missing;
    int64_t pos = 0;
    for (size_t k = 0; k < target.size(); ++k) {
      const char ch = target[k];
      if (ch == '.') {
        if (target.compare(k, 3, "...") == 0) {
          if (target.find("...") != std::string::npos && kept.find("...") == std::string::npos) kept += "...";
          k += 2;
          pos = -1;  // positions after an ellipsis are not static
        }
        continue;
      }
      if (available.count(ch))
        kept += ch;
      else if (pos >= 0)
        missing.push_back(pos);
      else
        c.unsupported("a subscript summed away by operand " + std::to_string(i) + " follows an ellipsis");
      if (pos >= 0) ++pos;
    }
    V g = b.op1("Einsum", operands, {Attr::s("equation", lhs + "->" + kept)});
    // The operand's run-time shape, and that shape without the repeats' axes.
    const V full = missing.empty() && repeats.empty() ? V{} : tangent_shape(c, c.in(i));
    auto dim_at = [&](int64_t a) { return b.op1("Slice", {full, b.i64s({a}), b.i64s({a == -1 ? INT64_MAX : a + 1})}); };
    if (!missing.empty()) {
      V shape = full;
      // Removed from the right (positions from the start) or from the left (from the end), so
      // each removal leaves the positions still to remove unchanged.
      std::vector<int64_t> from_start, from_end;
      for (const Repeat& r : repeats) (r.axis >= 0 ? from_start : from_end).push_back(r.axis);
      std::sort(from_start.rbegin(), from_start.rend());
      std::sort(from_end.begin(), from_end.end());
      for (const std::vector<int64_t>* list : {&from_start, &from_end})
        for (int64_t a : *list) {
          const V before = b.op1("Slice", {shape, b.i64s({0}), b.i64s({a})});
          shape =
              a == -1 ? before : b.concat({before, b.op1("Slice", {shape, b.i64s({a + 1}), b.i64s({INT64_MAX})})}, 0);
        }
      g = b.expand(b.unsqueeze(g, missing), shape);
    }
    if (!repeats.empty()) {
      Vs operands_eye{g};
      std::string eq = target;
      for (const Repeat& r : repeats) {
        const V n = dim_at(r.first_axis);
        operands_eye.push_back(b.op1("EyeLike", {b.expand(b.scalar(0.0, b.facts(c.ct()).dtype), b.concat({n, n}, 0))}));
        eq += std::string(",") + r.letter + r.fresh;
      }
      g = b.op1("Einsum", operands_eye, {Attr::s("equation", eq + "->" + diag_target)});
    }
    out[i] = g;
  }
  return out;
}

// Det: d det(A) = sum_ij cof(A)_ij dA_ij, with cof_ij = (-1)^(i+j) det(A without row i and
// column j) (the adjugate transposed). The cofactors are determinants of minors, so no inverse
// is needed (ONNX has none), singular matrices are exact, and higher orders differentiate Det
// again. The matrix size must be static; O(n^2) minors of size n-1.
Vs det_jvp(D& c) {
  if (!c.t(0).valid()) return {V{}};
  auto& b = c.b;
  const int64_t r = c.rank(0);
  const Facts& f = b.facts(c.x(0));
  if (r < 2 || !f.dims[r - 1].known() || !f.dims[r - 2].known() || f.dims[r - 1].value() != f.dims[r - 2].value())
    c.unsupported("the matrix size is not static (" + f.shape_string() + ")",
                  "declare the matrix dims of '" + c.node.input(0) + "' (value_info)");
  const int64_t n = f.dims[r - 1].value();
  V cof;
  if (n == 1) {
    cof = b.op1("Expand", {c.scalar(1.0), b.shape_of(c.x(0))});
  } else {
    // others[i] = every index but i (n rows of n - 1).
    std::vector<int64_t> others;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < n; ++k)
        if (k != i) others.push_back(k);
    V idx = b.reshape(b.i64s(others), b.i64s({n, n - 1}));
    V rows = b.op1("Gather", {c.x(0), idx}, {Attr::i("axis", r - 2)});  // (..., i, n-1 rows, n)
    V minors = b.op1("Gather", {rows, idx}, {Attr::i("axis", r)});      // (..., i, n-1, j, n-1)
    std::vector<int64_t> perm;
    for (int64_t a = 0; a < r - 2; ++a) perm.push_back(a);
    for (int64_t a : {r - 2, r, r - 1, r + 1}) perm.push_back(a);  // (..., i, j, n-1, n-1)
    V dets = b.op1("Det", {b.transpose(minors, perm)});            // (..., i, j)
    std::vector<double> signs;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) signs.push_back((i + j) % 2 ? -1.0 : 1.0);
    onnx::TensorProto t;
    t.set_data_type(c.dtype(0));
    t.add_dims(n);
    t.add_dims(n);
    for (double v : signs) {
      if (c.dtype(0) == onnx::TensorProto::DOUBLE)
        t.add_double_data(v);
      else
        t.add_float_data(static_cast<float>(v));
    }
    cof = b.op1("Mul", {dets, b.tensor_const(t)});
  }
  V prod = b.op1("Mul", {cof, c.t(0)});
  return {b.op1("ReduceSum", {prod, b.i64s({-2, -1})}, {Attr::i("keepdims", 0)})};
}

Vs matmul_jvp(D& c) {
  // A tangent has its primal's shape, so each term has the output's shape (no broadcast to
  // undo, no Expand): its primal twin is the output.
  const V ta = c.t(0).valid() ? c.term(c.b.op1("MatMul", {c.t(0), c.x(1)})) : V{};
  const V tb = c.t(1).valid() ? c.term(c.b.op1("MatMul", {c.x(0), c.t(1)})) : V{};
  return {c.b.add(ta, tb)};
}

// Multilinear: one term per operand with a tangent, the others primal.
Vs einsum_jvp(D& c) {
  V sum;
  for (size_t i = 0; i < c.xs.size(); ++i) {
    if (!c.t(i).valid()) continue;
    Vs ins = c.xs;
    ins[i] = c.t(i);
    sum = c.b.add(sum, c.same_op(ins));
  }
  return {sum};
}

}  // namespace

void register_matmul(OpTable& table) {
  table.op("MatMul").batch(matmul_rule, 13).jvp(matmul_jvp).transpose(matmul_transpose);
  table.op("Gemm").batch(gemm_rule, 13).jvp(gemm_jvp);  // (its JVP emits MatMul and Add)
  table.op("Einsum").batch(einsum_rule, 12).jvp(einsum_jvp).transpose(einsum_transpose);
  table.op("Det").jvp(det_jvp);
}

}  // namespace onnax
