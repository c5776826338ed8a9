// The helpers that let transforms treat a Loop/Scan/If body as a model of its own: outer-scope
// reads, dependence of outputs on values, pruning, and renaming a derived body into the names of
// the model it goes back into. Checked on small graphs with a nested subgraph, against the
// expected results written out by hand.
#include "transforms/subgraph.h"

#include <gtest/gtest.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace onnax {
namespace {

onnx::NodeProto node(const std::string& type, std::vector<std::string> in, std::vector<std::string> out) {
  onnx::NodeProto n;
  n.set_op_type(type);
  for (auto& i : in) n.add_input(i);
  for (auto& o : out) n.add_output(o);
  return n;
}

void add_output(onnx::GraphProto& g, const std::string& name) {
  g.add_output()->set_name(name);
}

// inputs a, b; reads w (outer); t = a * w; u = Sin(b); inner graph of an If reads t and k (outer);
// outputs t, u, r (the If's output), and d (dead code's output is not an output).
onnx::GraphProto sample() {
  onnx::GraphProto g;
  g.add_input()->set_name("a");
  g.add_input()->set_name("b");
  *g.add_node() = node("Mul", {"a", "w"}, {"t"});
  *g.add_node() = node("Sin", {"b"}, {"u"});
  *g.add_node() = node("Cos", {"b"}, {"dead"});
  onnx::GraphProto branch;
  *branch.add_node() = node("Add", {"t", "k"}, {"inner"});
  add_output(branch, "inner");
  onnx::NodeProto iff = node("If", {"u"}, {"r"});
  auto* attr = iff.add_attribute();
  attr->set_name("then_branch");
  attr->set_type(onnx::AttributeProto::GRAPH);
  *attr->mutable_g() = branch;
  *g.add_node() = iff;
  add_output(g, "t");
  add_output(g, "u");
  add_output(g, "r");
  return g;
}

TEST(Subgraph, OuterReadsIncludeNestedOnesOnce) {
  EXPECT_EQ(graph_outer_reads(sample()), (std::vector<std::string>{"w", "k"}));
}

TEST(Subgraph, OutputsDependOnValuesThroughNestedReads) {
  const onnx::GraphProto g = sample();
  // w reaches t directly and r through the branch's read of t.
  EXPECT_EQ(outputs_depending_on(g, {"w"}), (std::vector<char>{1, 0, 1}));
  // k is read only inside the branch.
  EXPECT_EQ(outputs_depending_on(g, {"k"}), (std::vector<char>{0, 0, 1}));
  // b reaches u, and r through the If's condition.
  EXPECT_EQ(outputs_depending_on(g, {"b"}), (std::vector<char>{0, 1, 1}));
  EXPECT_EQ(outputs_depending_on(g, {"nothing"}), (std::vector<char>{0, 0, 0}));
}

TEST(Subgraph, PruneKeepsWhatOutputsNeedIncludingNestedReads) {
  onnx::GraphProto g = sample();
  prune(g);
  std::vector<std::string> kept;
  for (const auto& n : g.node()) kept.push_back(n.output(0));
  EXPECT_EQ(kept, (std::vector<std::string>{"t", "u", "r"}));  // Cos is gone
  g.clear_output();
  add_output(g, "r");
  prune(g);
  kept.clear();
  for (const auto& n : g.node()) kept.push_back(n.output(0));
  // r needs u (condition) and t (read by the branch).
  EXPECT_EQ(kept, (std::vector<std::string>{"t", "u", "r"}));
  g.clear_output();
  add_output(g, "u");
  prune(g);
  ASSERT_EQ(g.node_size(), 1);
  EXPECT_EQ(g.node(0).output(0), "u");
}

TEST(Subgraph, RenameDefinitionsKeepsOuterReadsAndAvoidsTakenNames) {
  onnx::GraphProto g = sample();
  NameScope values, nodes;
  for (const char* taken : {"a", "t", "w", "k", "inner"}) values.reserve(taken);
  rename_definitions(g, values, nodes);
  std::unordered_set<std::string> defined;
  for (const auto& vi : g.input()) defined.insert(vi.name());
  for (const auto& n : g.node())
    for (const auto& o : n.output()) defined.insert(o);
  // Every definition is new in the scope (a and t were taken), reads of w and k are unchanged.
  EXPECT_FALSE(defined.count("a"));
  EXPECT_FALSE(defined.count("t"));
  EXPECT_EQ(g.node(0).input(1), "w");
  const onnx::GraphProto& branch = g.node(3).attribute(0).g();
  EXPECT_EQ(branch.node(0).input(1), "k");
  // Reads follow their definitions, in nested graphs and outputs too.
  EXPECT_EQ(g.node(0).input(0), g.input(0).name());
  EXPECT_EQ(branch.node(0).input(0), g.node(0).output(0));
  EXPECT_NE(branch.node(0).output(0), "inner");
  EXPECT_EQ(branch.output(0).name(), branch.node(0).output(0));
  EXPECT_EQ(g.output(2).name(), g.node(3).output(0));
  for (const auto& name : defined) EXPECT_TRUE(values.contains(name)) << name;
}

}  // namespace
}  // namespace onnax
