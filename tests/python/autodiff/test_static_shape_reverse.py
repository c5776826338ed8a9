"""Reverse mode on static shapes: shapes the facts know are constants (no Shape nodes), and a
ReduceMean's transpose scales by a constant 1/n when the reduced dims are known. Each path is
checked against float64 finite differences, with symbolic dims alongside (run-time shapes),
and on a transformer stack written as exporters write it (oracle: float64 NumPy)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from oracles import ad_oracle as ad
from oracles.vmap_oracle import node

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from exported_stack import numpy_loss, stack_loss_model, weights

D = TensorProto.DOUBLE


def mean_loss(shape: list[Any], axes: list[int], keepdims: int) -> onnx.ModelProto:
    """loss = sum(tanh(ReduceMean(x * x, axes)) * w): the mean's cotangent is not uniform."""
    nodes = [
        node("Mul", ["x", "x"], ["sq"]),
        node("ReduceMean", ["sq", "axes"], ["m"], keepdims=keepdims),
        node("Tanh", ["m"], ["t"]),
        node("ReduceSum", ["t"], ["loss"], keepdims=0),
    ]
    return ad.make_ad_model(
        nodes, [("x", D, shape)], ["loss"], initializers={"axes": np.array(axes, np.int64)}
    )


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize(
    ("shape", "axes"),
    [
        ([3, 4, 5], [1]),  # all static: constant shape and constant 1/n
        (["N", 4, 5], [2]),  # symbolic batch, static reduced dim: constant 1/n, run-time shape
        (["N", 4, 5], [0, 2]),  # a symbolic reduced dim: 1/n at run time
        ([3, 4, 5], [-1, 0]),  # negative and unsorted axes
    ],
)
def test_reduce_mean_reverse(shape: list[Any], axes: list[int], keepdims: int) -> None:
    gm = ad.check_grad(mean_loss(shape, axes, keepdims), gens={"x": ad.normal([3, 4, 5])})
    ops = {n.op_type for n in gm.graph.node}
    symbolic_reduced = any(isinstance(shape[a], str) for a in axes)
    # 1/n at run time only where a reduced dim is symbolic
    assert ("Size" in ops) == symbolic_reduced, ops
    if all(isinstance(d, int) for d in shape):
        assert "Shape" not in ops, ops


def test_reduce_mean_over_everything() -> None:
    nodes = [node("Mul", ["x", "x"], ["sq"]), node("ReduceMean", ["sq"], ["loss"], keepdims=0)]
    model = ad.make_ad_model(nodes, [("x", D, [2, 3])], ["loss"])
    ad.check_grad(model)


def test_reshape_back_with_a_zero_sized_dim() -> None:
    """The transposed Reshape spells a constant shape out exactly (allowzero): an empty axis
    stays empty instead of meaning "copy"."""
    nodes = [
        node("Reshape", ["x", "shape"], ["r"]),
        node("Tanh", ["r"], ["t"]),
        node("ReduceSum", ["t"], ["loss"], keepdims=0),
    ]
    model = ad.make_ad_model(
        nodes, [("x", D, [0, 6])], ["loss"], initializers={"shape": np.array([0, 2, 3], np.int64)}
    )
    gm = ad.grad(model, output="loss")
    sess = ort.InferenceSession(gm.SerializeToString())
    (x_grad,) = sess.run(["x_grad"], {"x": np.zeros((0, 6))})
    assert x_grad.shape == (0, 6)


def _stack_gradients(blocks: int, wrt: list[str] | None) -> dict[str, np.ndarray]:
    gm = ad.grad(stack_loss_model(blocks), inputs=wrt, output="loss")
    x = np.random.default_rng(4).standard_normal((2, 4, 16)).astype(np.float32)
    sess = ort.InferenceSession(gm.SerializeToString())
    return dict(zip([o.name for o in gm.graph.output], sess.run(None, {"x": x}), strict=True))


@pytest.mark.parametrize("wrt", [None, ["Wq", "W1", "ln1_g", "c2", "bk"]])
def test_exported_transformer_stack_gradient(wrt: list[str] | None) -> None:
    """Two blocks of the benchmark's exported-style stack (LayerNormalization, attention heads by
    Reshape/Transpose, Softmax, Gelu): gradients against central differences of the same
    function in float64 NumPy, along random directions."""
    blocks = 2
    got = _stack_gradients(blocks, wrt)
    rng = np.random.default_rng(4)
    base = {"x": rng.standard_normal((2, 4, 16)), **{k: v.astype(np.float64) for k, v in weights(16).items()}}
    assert got["loss"] == pytest.approx(numpy_loss(base["x"], base, blocks), rel=1e-5)
    eps = 1e-6
    for name in wrt or ["x"]:
        grad = np.asarray(got[f"{name}_grad"], dtype=np.float64)
        assert grad.shape == base[name].shape
        for _ in range(3):
            d = rng.standard_normal(base[name].shape)
            plus, minus = dict(base), dict(base)
            plus[name] = base[name] + eps * d
            minus[name] = base[name] - eps * d
            fd = (numpy_loss(plus["x"], plus, blocks) - numpy_loss(minus["x"], minus, blocks)) / (2 * eps)
            assert float(np.sum(grad * d)) == pytest.approx(fd, rel=2e-4, abs=1e-6), name


def test_exported_transformer_stack_needs_no_shape_nodes() -> None:
    """Every shape in the stack is static: its gradient graph computes none at run time."""
    gm = ad.grad(stack_loss_model(3), output="loss")
    ops = [n.op_type for n in gm.graph.node]
    assert not {"Shape", "Size", "ReduceProd"} & set(ops)
    # Nothing is computed in vain: LayerNormalization's statistics outputs, absent here, get no
    # derivative, and constants only tangent nodes read (Softmax's axis) are dropped.
    consumed = {i for n in gm.graph.node for i in n.input} | {o.name for o in gm.graph.output}
    dead = [n.op_type for n in gm.graph.node if not any(o in consumed for o in n.output)]
    assert dead == []


F = TensorProto.FLOAT


def layer_norm_loss(elem: int, statistics_outputs: bool, stash_type: int | None = None) -> onnx.ModelProto:
    """loss = sum(tanh(LayerNorm(x * 1.5 + 0.3)) ** 2) over the last two axes of x[N, 3, 4];
    with ``statistics_outputs`` the model also returns LayerNormalization's Mean and InvStdDev."""
    attrs: dict[str, Any] = {"axis": -2, "epsilon": 1e-3}
    if stash_type is not None:
        attrs["stash_type"] = stash_type
    outs = ["ln", "mean", "inv"] if statistics_outputs else ["ln"]
    nodes = [
        node("Mul", ["x", "k"], ["xs"]),
        node("Add", ["xs", "c"], ["xa"]),
        node("LayerNormalization", ["xa", "g", "b"], outs, **attrs),
        node("Tanh", ["ln"], ["t"]),
        node("ReduceSumSquare", ["t"], ["loss"], keepdims=0),
    ]
    dtype = np.float64 if elem == D else np.float32
    inits = {"k": np.array(1.5, dtype), "c": np.array(0.3, dtype)}
    outputs: list[Any] = ["loss", "mean", "inv"] if statistics_outputs else ["loss"]
    return ad.make_ad_model(
        nodes,
        [("x", elem, ["N", 3, 4]), ("g", elem, [3, 4]), ("b", elem, [3, 4])],
        outputs,
        initializers=inits,
    )


LN_GENS = {"x": ad.normal([2, 3, 4]), "g": ad.normal([3, 4]), "b": ad.normal([3, 4])}


@pytest.mark.parametrize("statistics_outputs", [False, True])
def test_layer_norm_reuses_its_statistics(statistics_outputs: bool) -> None:
    """A float LayerNormalization's reverse mode reads the node's own Mean and InvStdDev (named
    on the forward node when the model does not) instead of recomputing them; gradients match
    float64 finite differences, and the source model keeps its single output."""
    model = layer_norm_loss(F, statistics_outputs)
    # (the float64 oracle computes the loss alone: statistics outputs would be float in it)
    oracle = layer_norm_loss(D, False)
    source = model.SerializeToString()
    gm = ad.check_grad(model, output="loss", gens=LN_GENS, oracle_model=oracle)
    assert model.SerializeToString() == source
    (ln,) = [n for n in gm.graph.node if n.op_type == "LayerNormalization"]
    assert len(ln.output) == 3 and all(ln.output)
    ops = [n.op_type for n in gm.graph.node]
    assert "ReduceMean" not in ops and "Sqrt" not in ops  # nothing recomputes them


@pytest.mark.parametrize(("elem", "stash_type"), [(D, None), (F, TensorProto.DOUBLE)])
def test_layer_norm_recomputes_statistics_of_another_type(elem: int, stash_type: int | None) -> None:
    """Statistics in another element type than x (double x with float stash, or a float x with a
    double stash) are recomputed in x's type, not read from the node."""
    model = layer_norm_loss(elem, False, stash_type)
    gm = ad.check_grad(model, output="loss", gens=LN_GENS, oracle_model=ad.as_double(model))
    (ln,) = [n for n in gm.graph.node if n.op_type == "LayerNormalization"]
    assert list(ln.output) == ["ln"]


def test_layer_norm_statistics_compose() -> None:
    """grad's LayerNormalization with its statistics named is differentiated again (Hessian-vector
    products through Mean and InvStdDev) and batched (per-example gradients)."""
    model = layer_norm_loss(F, False)
    ad.check_hvp(model, wrt=["x"], output="loss", gens=LN_GENS, oracle_model=ad.as_double(model))
    ad.check_per_example_grad(model, in_axes=[0, None, None], output="loss", gens=LN_GENS)


@pytest.mark.parametrize("x_shape", [[2, 3, 4], ["N", 3, 4], [2, 2, 3, 4]])
def test_weight_gradient_of_a_batched_linear_layer(x_shape: list[Any]) -> None:
    """d loss / d W for y = x @ W with x of rank >= 3 and W [4, 5]: one product of the flattened
    rows (no per-batch partial products summed afterwards), against float64 finite
    differences; differentiated again (HVP) and batched over examples."""
    nodes = [
        node("MatMul", ["x", "w"], ["y"]),
        node("Tanh", ["y"], ["t"]),
        node("ReduceSumSquare", ["t"], ["loss"], keepdims=0),
    ]
    model = ad.make_ad_model(nodes, [("x", D, x_shape), ("w", D, [4, 5])], ["loss"])
    concrete = [d if isinstance(d, int) else 3 for d in x_shape]
    gens = {"x": ad.normal(concrete), "w": ad.normal([4, 5])}
    gm = ad.check_grad(model, inputs=["x", "w"], output="loss", gens=gens)
    # w's gradient is the product itself, not a sum of batch-many partial products
    (producer,) = [n.op_type for n in gm.graph.node if "w_grad" in n.output]
    assert producer == "MatMul"
    ad.check_hvp(model, wrt=["w"], inputs=["x", "w"], output="loss", gens=gens)
    ad.check_per_example_grad(model, in_axes=[0, None], inputs=["w"], output="loss", gens=gens)


def test_square_is_one_linear_term() -> None:
    """x * x: its tangent is t * (x + x), bit for bit t * x + x * t, and reverse mode computes
    ct * x once. Checked in float32 against NumPy's own products, and against float64 FD."""
    nodes = [
        node("Mul", ["x", "x"], ["sq"]),
        node("Sin", ["sq"], ["s"]),
        node("ReduceSum", ["s"], ["loss"], keepdims=0),
    ]
    model = ad.make_ad_model(nodes, [("x", F, [3, 4])], ["loss", "sq"])
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    t = rng.normal(size=(3, 4)).astype(np.float32)
    jm = ad.jvp(model, outputs=["sq"])
    got = ad.run(jm, {"x": x, "x_tangent": t})
    np.testing.assert_array_equal(got[jm.graph.output[-1].name], t * x + x * t)
    gm = ad.check_grad(model, output="loss", gens={"x": ad.normal([3, 4])}, oracle_model=ad.as_double(model))
    # x * x; Sin's ct * cos(sq); ct * (x + x) (no second ct * x)
    assert [n.op_type for n in gm.graph.node].count("Mul") == 3
    ad.check_hvp(
        model, wrt=["x"], output="loss", gens={"x": ad.normal([3, 4])}, oracle_model=ad.as_double(model)
    )


@pytest.mark.parametrize("shapes", [([4], [4, 5]), ([4, 5], [5]), ([4], [4])])
def test_vector_matmul_transposes_without_transposes(shapes: tuple[list[int], list[int]]) -> None:
    """A 1-D operand of MatMul is unsqueezed straight into the row or column its transpose
    needs (no Transpose node of it), and both operands' cotangents share one unsqueeze of the
    output's cotangent. Against float64 FD, HVP and per-example gradients."""
    a_shape, b_shape = shapes
    nodes = [
        node("MatMul", ["a", "b"], ["y"]),
        node("Tanh", ["y"], ["t"]),
        node("ReduceSum", ["t"], ["loss"], keepdims=0),
    ]
    model = ad.make_ad_model(nodes, [("a", D, a_shape), ("b", D, b_shape)], ["loss"])
    gens = {"a": ad.normal(a_shape), "b": ad.normal(b_shape)}
    gm = ad.check_grad(model, inputs=["a", "b"], output="loss", gens=gens)
    vectors = {name for name, shape in (("a", a_shape), ("b", b_shape)) if len(shape) == 1}
    transposed = [n.input[0] for n in gm.graph.node if n.op_type == "Transpose"]
    assert not vectors & set(transposed), transposed
    unsqueezes = [tuple(n.input) for n in gm.graph.node if n.op_type == "Unsqueeze"]
    assert len(unsqueezes) == len(set(unsqueezes)), unsqueezes
    ad.check_hvp(model, wrt=["a"], inputs=["a", "b"], output="loss", gens=gens)
    ad.check_per_example_grad(model, in_axes=[0, None], inputs=["b"], output="loss", gens=gens)
