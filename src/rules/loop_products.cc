#include "rules/loop_products.h"

#include <onnx/defs/tensor_proto_util.h>

#include <functional>
#include <optional>
#include <unordered_set>

#include "rules/derivative.h"
#include "rules/loop_residuals.h"
#include "transforms/subgraph.h"

namespace onnax {
namespace {

// A 2-D Transpose that swaps its axes (perm [1, 0], or none: reversed).
bool swaps_axes(const onnx::NodeProto& n) {
  if (n.op_type() != "Transpose" || !is_default_domain(n) || n.input_size() != 1) return false;
  for (const auto& a : n.attribute())
    if (a.name() == "perm") return a.ints_size() == 2 && a.ints(0) == 1 && a.ints(1) == 0;
  return true;
}

// Where each value of `g` is made, and how many times it is read (by nodes, as an output, or
// inside a nested subgraph, which counts as many reads).
struct Uses {
  std::unordered_map<std::string, int> producer;
  std::unordered_map<std::string, int> reads;
  explicit Uses(const onnx::GraphProto& g) {
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      for (const auto& o : n.output())
        if (!o.empty()) producer[o] = i;
      for (const auto& in : n.input())
        if (!in.empty()) ++reads[in];
      if (has_subgraphs(n))
        for (const auto& a : n.attribute()) {
          if (a.has_g())
            for (const auto& r : graph_outer_reads(a.g())) reads[r] += 2;
          for (const auto& sg : a.graphs())
            for (const auto& r : graph_outer_reads(sg)) reads[r] += 2;
        }
    }
    for (const auto& o : g.output()) ++reads[o.name()];
  }
  const onnx::NodeProto* made_by(const onnx::GraphProto& g, const std::string& v) const {
    const auto it = producer.find(v);
    return it == producer.end() ? nullptr : &g.node(it->second);
  }
  int count(const std::string& v) const {
    const auto it = reads.find(v);
    return it == reads.end() ? 0 : it->second;
  }
};

// A term of an accumulation: the value, and the Add that adds it (its input `side`).
struct Term {
  std::string value;
  int add = -1;
  int side = 0;
};

// The terms of the Add tree that computes `root` (Adds read once, by the tree).
std::vector<Term> add_terms(const onnx::GraphProto& g, const Uses& uses, const std::string& root) {
  std::vector<Term> terms;
  std::function<void(const std::string&, int, int)> walk = [&](const std::string& v, int add, int side) {
    const auto it = uses.producer.find(v);
    const onnx::NodeProto* n = it == uses.producer.end() ? nullptr : &g.node(it->second);
    const bool inner = add < 0 || uses.count(v) == 1;
    if (n && inner && n->op_type() == "Add" && is_default_domain(*n) && n->input_size() == 2) {
      walk(n->input(0), it->second, 0);
      walk(n->input(1), it->second, 1);
      return;
    }
    terms.push_back(Term{v, add, side});
  };
  walk(root, -1, 0);
  return terms;
}

// The Add that added term `t` keeps its other operand only.
void drop_term(onnx::GraphProto& g, const Term& t) {
  onnx::NodeProto& add = *g.mutable_node(t.add);
  const std::string other = add.input(1 - t.side);
  add.set_op_type("Identity");
  add.clear_input();
  add.add_input(other);
}

// The axes of a ReduceSum of `g` given by a Constant (non-negative for rank `rank`), and its
// keepdims; nullopt when they are not known or it reduces nothing or everything by default.
std::optional<std::pair<std::vector<int64_t>, bool>> reduce_sum_axes(const onnx::GraphProto& g, const Uses& uses,
                                                                     const onnx::NodeProto& n, int64_t rank) {
  if (n.input_size() != 2 || rank < 0) return std::nullopt;
  const onnx::NodeProto* c = uses.made_by(g, n.input(1));
  if (!c || c->op_type() != "Constant" || !is_default_domain(*c)) return std::nullopt;
  std::vector<int64_t> axes;
  for (const auto& a : c->attribute())
    if (a.name() == "value" && a.has_t() && a.t().data_type() == onnx::TensorProto::INT64)
      axes = onnx::ParseData<int64_t>(&a.t());
  if (axes.empty()) return std::nullopt;
  bool keepdims = true;
  for (const auto& a : n.attribute())
    if (a.name() == "keepdims") keepdims = a.i() != 0;
  for (int64_t& x : axes) {
    if (x < -rank || x >= rank) return std::nullopt;
    if (x < 0) x += rank;
  }
  return std::make_pair(axes, keepdims);
}

}  // namespace

std::vector<LoopProduct> hoist_loop_products(onnx::GraphProto& g, const std::vector<int>& accumulated,
                                             const std::vector<std::string>& excluded, const Prepared& facts,
                                             NameScope& scope) {
  std::vector<LoopProduct> hoisted;
  if (accumulated.empty()) return hoisted;
  auto rank = [&](const std::string& v) { return facts.fact(v).rank(); };
  auto dim = [&](const std::string& v, size_t d) { return facts.fact(v).dims[d]; };
  const Uses uses(g);
  const IterationShapes shapes(g, facts);

  std::vector<std::pair<std::string, std::string>> factors;  // appended after the loop
  for (size_t i = 0; i < accumulated.size(); ++i) {
    const int out = accumulated[i];
    if (out < 0 || out >= g.output_size()) continue;
    const std::vector<Term> terms = add_terms(g, uses, g.output(out).name());
    std::unordered_set<std::string> dep;
    bool dep_known = false;
    std::unordered_set<int> rewritten;  // Adds already turned into Identity
    for (const Term& t : terms) {
      if (t.add < 0 || rewritten.count(t.add) || uses.count(t.value) != 1) continue;
      const onnx::NodeProto* mm = uses.made_by(g, t.value);
      if (!mm || mm->op_type() != "MatMul" || !is_default_domain(*mm) || mm->input_size() != 2) continue;
      const std::string& a = mm->input(0);
      const std::string& bv = mm->input(1);
      if (rank(a) != 2 || rank(bv) != 2 || rank(t.value) != 2) continue;
      if (!shapes.same_every_iteration(facts.fact(a)) || !shapes.same_every_iteration(facts.fact(bv))) continue;
      if (!dep_known) {
        dep = values_depending_on(g, {excluded[i]});
        dep_known = true;
      }
      if (dep.count(a) || dep.count(bv)) continue;
      LoopProduct p;
      p.output = out;
      std::string left = a;
      const onnx::NodeProto* ta = uses.made_by(g, a);
      if (ta && swaps_axes(*ta) && uses.count(a) == 1 && rank(ta->input(0)) == 2 && !dep.count(ta->input(0))) {
        p.left = LoopProduct::Left::kRows;
        left = ta->input(0);
      } else if (dim(a, 1).known() && dim(a, 1).value() == 1) {
        p.left = LoopProduct::Left::kColumn;
      }
      drop_term(g, t);
      rewritten.insert(t.add);
      p.left_facts = facts.fact(left);
      p.right_facts = facts.fact(bv);
      factors.emplace_back(left, bv);
      hoisted.push_back(std::move(p));
    }
  }
  for (const auto& [left, right] : factors) {
    add_output(g, left, typed_value_info(left, facts.fact(left)), scope);
    add_output(g, right, typed_value_info(right, facts.fact(right)), scope);
  }
  prune(g);
  return hoisted;
}

std::vector<LoopSum> hoist_loop_sums(onnx::GraphProto& g, const std::vector<int>& accumulated,
                                     const std::vector<std::string>& excluded, int first_stacked, const Prepared& facts,
                                     NameScope& scope) {
  std::vector<LoopSum> hoisted;
  const Uses uses(g);
  const IterationShapes shapes(g, facts);
  std::vector<std::string> stacked;
  for (size_t i = 0; i < accumulated.size(); ++i) {
    const int out = accumulated[i];
    if (out < 0 || out >= g.output_size()) continue;
    const std::unordered_set<std::string> dep = values_depending_on(g, {excluded[i]});
    std::unordered_set<int> rewritten;
    for (const Term& t : add_terms(g, uses, g.output(out).name())) {
      // (A term read elsewhere too is still computed per iteration; stacking it drops the Add.)
      if (t.add < 0 || rewritten.count(t.add) || dep.count(t.value)) continue;
      const Facts& f = facts.fact(t.value);
      if (!shapes.same_every_iteration(f) || !differentiable_dtype(f.dtype)) continue;
      LoopSum sum;
      sum.output = out;
      std::string value = t.value;
      // A ReduceSum's input is stacked instead (it reduces after the loop), unless something
      // else reads it too (then it is computed per iteration anyway).
      const onnx::NodeProto* r = uses.count(t.value) == 1 ? uses.made_by(g, t.value) : nullptr;
      if (r && r->op_type() == "ReduceSum" && is_default_domain(*r) && r->input_size() == 2 &&
          !dep.count(r->input(0)) && shapes.same_every_iteration(facts.fact(r->input(0))))
        if (const auto axes = reduce_sum_axes(g, uses, *r, facts.fact(r->input(0)).rank())) {
          sum.reduce = true;
          sum.axes = axes->first;
          sum.keepdims = axes->second;
          value = r->input(0);
        }
      sum.facts = facts.fact(value);
      drop_term(g, t);
      rewritten.insert(t.add);
      for (int o = first_stacked; o < g.output_size() && sum.stacked_output < 0; ++o)
        if (g.output(o).name() == value) sum.stacked_output = o;
      if (sum.stacked_output < 0) stacked.push_back(value);
      hoisted.push_back(std::move(sum));
    }
  }
  for (const auto& v : stacked) add_output(g, v, typed_value_info(v, facts.fact(v)), scope);
  prune(g);
  return hoisted;
}

V sum_of_loop_sum(Builder& b, const LoopSum& sum, V stacked) {
  V total = b.op1("ReduceSum", {stacked, b.i64s({0})}, {Attr::i("keepdims", 0)});
  if (sum.reduce) total = b.op1("ReduceSum", {total, b.i64s(sum.axes)}, {Attr::i("keepdims", sum.keepdims ? 1 : 0)});
  return total;
}

V sum_of_loop_product(Builder& b, const LoopProduct& product, V stacked_left, V stacked_right) {
  // Stacked over iterations t: the left factor [T, ...], the right [T, M, N] -> [T*M, N].
  const V minus_one = b.i64s({-1});
  const V right = b.reshape(stacked_right, b.concat({minus_one, b.shape_of(stacked_right, 2, 3)}, 0));
  switch (product.left) {
    case LoopProduct::Left::kRows: {
      // x_t [M, K] stacked: [T*M, K]; the sum is its transpose times the right rows.
      const V rows = b.reshape(stacked_left, b.concat({minus_one, b.shape_of(stacked_left, 2, 3)}, 0));
      return b.op1("MatMul", {b.transpose(rows, {1, 0}), right});
    }
    case LoopProduct::Left::kColumn: {
      // [T, K, 1] is [T, K]: rows again.
      const V rows = b.reshape(stacked_left, b.concat({minus_one, b.shape_of(stacked_left, 1, 2)}, 0));
      return b.op1("MatMul", {b.transpose(rows, {1, 0}), right});
    }
    case LoopProduct::Left::kGeneral: break;
  }
  // [T, K, M] -> [K, T, M] -> [K, T*M].
  const V moved = b.transpose(stacked_left, {1, 0, 2});
  const V left = b.reshape(moved, b.concat({b.shape_of(stacked_left, 1, 2), minus_one}, 0));
  return b.op1("MatMul", {left, right});
}

}  // namespace onnax
