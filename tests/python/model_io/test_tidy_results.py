"""Results leave nothing behind: no initializer that no node reads (ONNX Runtime warns about each),
no value_info for a value the graph no longer has, no opset import or model-local function that
nothing uses. Checked on every exporter-corpus model x transform (whose numbers
test_exporter_corpus.py checks) and on patterns built here, whose results also run against the
source in ONNX Runtime."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import exporter_corpus as ec

onnax = pytest.importorskip("onnax")


def leftovers(model: onnx.ModelProto) -> list[str]:
    read: set[str] = set()
    defined: set[str] = set()
    domains: set[str] = set()

    def walk(g: onnx.GraphProto) -> None:
        defined.update(v.name for v in g.input)
        defined.update(t.name for t in g.initializer)
        for n in g.node:
            domains.add("" if n.domain == "ai.onnx" else n.domain)
            read.update(i for i in n.input if i)
            defined.update(o for o in n.output if o)
            for a in n.attribute:
                for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    walk(sg)

    def value_infos(g: onnx.GraphProto) -> list[str]:
        names = [v.name for v in g.value_info]
        for n in g.node:
            for a in n.attribute:
                for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    names += value_infos(sg)
        return names

    walk(model.graph)
    for f in model.functions:
        domains.update("" if n.domain == "ai.onnx" else n.domain for n in f.node)
    read.update(o.name for o in model.graph.output)
    inputs = {v.name for v in model.graph.input}
    problems = [
        f"unused initializer {t.name}" for t in model.graph.initializer if t.name not in read | inputs
    ]
    problems += [f"value_info of missing value {n}" for n in value_infos(model.graph) if n not in defined]
    problems += [
        f"unused opset import {o.domain}" for o in model.opset_import if o.domain not in domains | {""}
    ]
    called = {(n.domain, n.op_type) for n in model.graph.node}
    problems += [
        f"uncalled function {f.domain}.{f.name}" for f in model.functions if (f.domain, f.name) not in called
    ]
    return problems


@pytest.mark.parametrize("kind", ec.TRANSFORMS)
@pytest.mark.parametrize("name", [n for n in ec.NAMES if n != "jax2onnx_vit"])
def test_exporter_corpus_results_leave_nothing_behind(name: str, kind: str) -> None:
    case = ec.load(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = ec.transform(case, kind)
    assert leftovers(result) == []
    onnx.checker.check_model(result)


def test_vmap_drops_the_shape_constant_it_replaced_and_matches_per_example_runs() -> None:
    """tf2onnx's const-folded Reshape target (an initializer spelling the batch size) is replaced
    under vmap; the old initializer must go, the result must equal the source per example."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "const_fold_opt__1"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [
            numpy_helper.from_array(np.array([2, 6], np.int64), "const_fold_opt__1"),
            numpy_helper.from_array(w, "w"),
        ],
        value_info=[helper.make_tensor_value_info("flat", TensorProto.FLOAT, [2, 6])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    batched = onnax.vmap(model)
    assert leftovers(batched) == []
    xs = rng.standard_normal((4, 2, 3, 2)).astype(np.float32)
    sess = ort.InferenceSession(batched.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": xs})[0]
    for b in range(4):
        np.testing.assert_allclose(got[b], xs[b].reshape(2, 6) @ w, rtol=1e-6)


def test_an_input_with_a_default_initializer_stays_an_input() -> None:
    """An initializer that is also a graph input is part of the interface even when unread."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("unused", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array([1.0], np.float32), "unused")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    jvp = onnax.jvp(model, inputs=["x"])
    assert [i.name for i in jvp.graph.initializer] == ["unused"]
    x = np.array([1.0, -2.0, 3.0], np.float32)
    t = np.array([0.5, 1.0, -1.0], np.float32)
    sess = ort.InferenceSession(jvp.SerializeToString(), providers=["CPUExecutionProvider"])
    out = dict(
        zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x, "x_tangent": t}), strict=True)
    )
    np.testing.assert_allclose(out["y_tangent"], 2 * x * t)
