"""``validate`` on a small MLP (MatMul, Add, Tanh, Softmax, ReduceSum; weights as initializers)
in float32 and float64, over transforms and compositions beyond the README's: out_axes=-1,
vmap of jvp, jvp of vmap, vmap of an HVP. Every generated graph must pass against both
references (exact JAX float64, and finite differences), and a perturbed one must fail: the
reference replays each recorded chain independently of onnax."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles.validate_models import flip_sign

testing = pytest.importorskip("onnax.testing")
pytest.importorskip("onnxruntime")


def mlp(dtype: type) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    elem = TensorProto.FLOAT if dtype is np.float32 else TensorProto.DOUBLE
    inits = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(dtype), name)
        for name, shape in (("W1", (4, 8)), ("b1", (8,)), ("W2", (8, 3)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="add"),
        helper.make_node("Tanh", ["hb"], ["t"], name="tanh"),
        helper.make_node("MatMul", ["t", "W2"], ["y"], name="mm2"),
        helper.make_node("Softmax", ["y"], ["p"], axis=-1, name="softmax"),
        helper.make_node("Mul", ["p", "p"], ["pp"], name="square"),
        helper.make_node("ReduceSum", ["pp"], ["loss"], keepdims=0, name="loss"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", elem, [5, 4])],
        [helper.make_tensor_value_info("p", elem, [5, 3]), helper.make_tensor_value_info("loss", elem, [])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def cases() -> dict[str, Callable[[onnx.ModelProto], onnx.ModelProto]]:
    from onnax import grad, jvp, vjp, vmap

    def g(m: onnx.ModelProto) -> onnx.ModelProto:
        return grad(m, inputs=["x", "W1", "b1", "W2"], output="loss")

    return {
        "vmap_in1_out-1": lambda m: vmap(m, in_axes=1, out_axes=-1),
        "grad": g,
        "jvp": lambda m: jvp(m, inputs=["x", "W2"]),
        "vjp": lambda m: vjp(m, inputs=["x", "W1"], outputs=["p", "loss"]),
        "vmap_grad": lambda m: vmap(g(m), in_axes=0),
        "hvp": lambda m: jvp(g(m), inputs=["W2"]),
        "vmap_jvp": lambda m: vmap(jvp(m, inputs=["x"]), in_axes=0),
        "jvp_vmap": lambda m: jvp(vmap(m, in_axes=0), inputs=["x"]),
        "vmap_hvp": lambda m: vmap(jvp(g(m), inputs=["W2"]), in_axes=(0, None)),
    }


@pytest.mark.parametrize("reference", ["exact", "fd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", list(cases()))
def test_compositions_pass(name: str, dtype: type, reference: str) -> None:
    if reference == "exact":
        pytest.importorskip("jax")
    source = mlp(dtype)
    generated = cases()[name](source)
    report = testing.validate(source, generated, dims={"batch": 3}, exact=reference == "exact")
    assert report.ok, report.format()
    derivative = name not in ("vmap_in1_out-1",)
    method = "exact (JAX float64)" if reference == "exact" else "finite differences"
    assert any(c.method == method for c in report.outputs) == derivative
    assert not report.notes, report.notes


@pytest.mark.parametrize("name", ["vmap_grad", "hvp", "vmap_hvp"])
def test_perturbed_composition_fails(name: str) -> None:
    source = mlp(np.float64)
    generated = cases()[name](source)
    last = generated.graph.output[-1].name
    report = testing.validate(source, flip_sign(generated, last), dims={"batch": 3})
    assert report.failed_step == "numerical parity"
    assert f"output '{last}'" in report.message


def test_sampled_coordinates_are_masked() -> None:
    """With max_coords=3 the reverse-mode reference differentiates 3 coordinates per input; the
    report says so, the rest are not compared, and a wrong sampled coordinate still fails."""
    from onnax import grad

    source = mlp(np.float64)
    generated = grad(source, inputs=["W1", "b1"], output="loss")
    report = testing.validate(source, generated, max_coords=3, exact=False)
    assert report.ok, report.format()
    by_name = {c.name: c for c in report.outputs}
    assert (by_name["W1_grad"].checked, by_name["W1_grad"].total) == (3, 32)
    assert (by_name["b1_grad"].checked, by_name["b1_grad"].total) == (3, 8)
    assert "3 of 32 coordinates checked" in report.format()
    assert not testing.validate(source, flip_sign(generated, "W1_grad"), max_coords=3, exact=False).ok


def test_onnx_ir_models_are_accepted() -> None:
    import onnx_ir as ir
    from onnax import grad

    source = ir.serde.deserialize_model(mlp(np.float32))
    report = testing.validate(source, grad(source, inputs=["W2"], output="loss"))
    assert report.ok, report.format()
    assert report.source == "<Model>"
