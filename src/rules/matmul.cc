// MatMul, Gemm and Einsum.
#include <set>

#include "rules/batching.h"

namespace onnax {
namespace {

// MatMul broadcasts leading dims numpy-style; a batched operand needs its batch axis in
// front of every leading dim of the other operand, and 1-D operands (which MatMul treats as
// vectors) are first made matrices so the batch axis is never taken for a matrix dim.
BatchResult matmul_rule(BatchCtx& c) {
  int64_t ra = c.rank(0), rb = c.rank(1);
  V a = c.in[0], bm = c.in[1];
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
  V y = c.b.op1("MatMul", {a, bm});
  // A shared 1-D B already drops the trailing dim, leaving the added m axis last.
  const bool n_dropped = rb == 1 && !c.batched[1];
  if (squeeze_m && squeeze_n) y = c.b.squeeze(y, {-2, -1});
  else if (squeeze_m) y = c.b.squeeze(y, {n_dropped ? -1 : -2});
  else if (squeeze_n) y = c.b.squeeze(y, {-1});
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
    if (c.attr_i("transA", 0)) a = c.b.transpose(a, c.batched[0] ? std::vector<int64_t>{0, 2, 1} : std::vector<int64_t>{1, 0});
    if (c.attr_i("transB", 0)) bm = c.b.transpose(bm, c.batched[1] ? std::vector<int64_t>{0, 2, 1} : std::vector<int64_t>{1, 0});
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
  if (!letter) c.unsupported("the equation uses all 52 letters, leaving none for the batch axis",
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

void register_matmul_rules(BatchRules& r) {
  r.add("", "MatMul", 13, matmul_rule);
  r.add("", "Gemm", 13, gemm_rule);
  r.add("", "Einsum", 12, einsum_rule);
}

}  // namespace onnax
