"""vmap of windows whose position differs between examples (``lax.dynamic_slice``,
``x[i:i + k]`` with a per-example ``i``, sliding windows, ``Range(i, i + k)``).

Each example's window has the same length, so a batch holds them: the definition
``vmap(f)(X)[i] == f(X[i])`` is checked against ONNX Runtime running the source once per
example. Windows of different lengths cannot be batched; the vmapped graph then fails when run,
at a node that says why, rather than returning numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnax
import onnx
import onnxruntime as ort
import pytest
from jax import lax
from onnx import TensorProto as T
from oracles.training_oracle import run
from oracles.vmap_oracle import assert_vmap_matches, make_model

jax.config.update("jax_enable_x64", True)

F, I64 = T.FLOAT, T.INT64


def node(op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> onnx.NodeProto:
    """A node named after its first output (unique in these models)."""
    return onnx.helper.make_node(op, inputs, outputs, name=f"{op}_{outputs[0]}", **attrs)


def ints(low: int, high: int) -> Callable[[np.random.Generator], np.ndarray]:
    """A per-example 1-element int64 vector in [low, high]."""
    return lambda rng: np.array([rng.integers(low, high + 1)], np.int64)


def const(name: str, values: list[int]) -> onnx.NodeProto:
    return node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.array(values, np.int64)))


def window_model(length: int, step: int = 1, axis: int = 0) -> onnx.ModelProto:
    """y = x[start : start + length*step : step] along `axis`, start a model input."""
    nodes = [
        const("span", [length * step]),
        node("Add", ["start", "span"], ["end"]),
        const("axes", [axis]),
        const("steps", [step]),
        node("Slice", ["x", "start", "end", "axes", "steps"], ["y"]),
    ]
    return make_model(nodes, [("x", F, [8, 4]), ("start", I64, [1])], ["y"])


@pytest.mark.parametrize(
    ("length", "step", "axis", "start"),
    [
        (3, 1, 0, (0, 5)),  # forward, inside
        (3, 1, 0, (-8, -4)),  # counted from the back
        (2, 2, 0, (0, 4)),  # strided
        (3, -1, 0, (3, 7)),  # backward
        (2, 1, 1, (0, 2)),  # another axis
    ],
)
def test_per_example_window_matches_each_example(
    length: int, step: int, axis: int, start: tuple[int, int]
) -> None:
    model = window_model(length, step, axis)
    assert_vmap_matches(model, in_axes=0, gens={"start": ints(*start)})


def test_per_example_window_into_shared_data() -> None:
    # The data is the same for every example; only the window moves.
    assert_vmap_matches(window_model(3), in_axes={"x": None, "start": 0}, gens={"start": ints(0, 5)})


def test_per_example_and_shared_axes_together() -> None:
    # Rows [s, s+4) step 2 per example, columns [1, 5) for all.
    nodes = [
        const("lo", [1]),
        const("hi", [5]),
        const("four", [4]),
        node("Add", ["start", "four"], ["row_end"]),
        node("Concat", ["start", "lo"], ["starts"], axis=0),
        node("Concat", ["row_end", "hi"], ["ends"], axis=0),
        const("axes", [0, 1]),
        const("steps", [2, 1]),
        node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"]),
    ]
    model = make_model(nodes, [("x", F, [8, 6]), ("start", I64, [1])], ["y"])
    assert_vmap_matches(model, in_axes=0, gens={"start": ints(0, 4)})


def test_per_example_end_that_clamps_to_one_length() -> None:
    # Ends differ per example but all clamp to the end of the axis: one shared window.
    nodes = [node("Slice", ["x", "start", "end"], ["y"])]
    model = make_model(nodes, [("x", F, [8, 4]), ("start", I64, [1]), ("end", I64, [1])], ["y"])
    assert_vmap_matches(
        model, in_axes={"x": 0, "start": None, "end": 0}, gens={"start": ints(2, 2), "end": ints(8, 1000)}
    )


def test_int32_bounds_without_axes() -> None:
    nodes = [
        node("Constant", [], ["span"], value=onnx.numpy_helper.from_array(np.array([2, 3], np.int32))),
        node("Add", ["start", "span"], ["end"]),
        node("Slice", ["x", "start", "end"], ["y"]),
    ]
    model = make_model(nodes, [("x", F, [5, 6]), ("start", T.INT32, [2])], ["y"])
    gen = lambda rng: rng.integers(0, 3, size=2).astype(np.int32)  # noqa: E731
    assert_vmap_matches(model, in_axes=0, gens={"start": gen})


def test_windows_of_different_lengths_fail_when_run_with_a_named_reason() -> None:
    model = window_model(3)
    batched = onnax.vmap(model, in_axes=0)
    x = np.zeros((2, 8, 4), np.float32)
    same = run(batched, {"x": x, "start": np.array([[0], [5]], np.int64)})
    assert next(iter(same.values())).shape == (2, 3, 4)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="examples_must_agree_on_this_length"):
        # The second example's window is clipped to 2 rows: ragged.
        run(batched, {"x": x, "start": np.array([[0], [6]], np.int64)})


@pytest.mark.parametrize("dtype", [I64, T.INT32])
def test_range_from_a_per_example_start_gathers_its_window(dtype: int) -> None:
    nodes = [
        node("Constant", [], ["k"], value=onnx.helper.make_tensor("k", dtype, [], [3])),
        node("Constant", [], ["one"], value=onnx.helper.make_tensor("one", dtype, [], [1])),
        node("Add", ["i", "k"], ["limit"]),
        node("Range", ["i", "limit", "one"], ["positions"]),
        node("Gather", ["x", "positions"], ["y"], axis=0),
    ]
    model = make_model(nodes, [("x", F, [9, 2]), ("i", dtype, [])], ["y", "positions"])
    np_dtype = np.int64 if dtype == I64 else np.int32
    assert_vmap_matches(
        model, in_axes={"x": None, "i": 0}, gens={"i": lambda rng: np.array(rng.integers(0, 6), np_dtype)}
    )


def test_float_range_with_a_per_example_delta() -> None:
    nodes = [
        node("Constant", [], ["lo"], value=onnx.helper.make_tensor("lo", F, [], [0.0])),
        node("Constant", [], ["hi"], value=onnx.helper.make_tensor("hi", F, [], [1.0])),
        node("Range", ["lo", "hi", "d"], ["y"]),
    ]
    model = make_model(nodes, [("d", F, [])], ["y"])
    # ceil(1 / d) is 4 for every d in [0.26, 0.33].
    gen = lambda rng: np.array(rng.uniform(0.26, 0.33), np.float32)  # noqa: E731
    assert_vmap_matches(model, in_axes=0, gens={"d": gen})


def slice_loss_model() -> onnx.ModelProto:
    """loss = sum(tanh(x * w)[start : start + 3] ** 2); x [8, 4], w [4], start [1]."""
    nodes = [
        node("Mul", ["x", "w"], ["xw"]),
        node("Tanh", ["xw"], ["h"]),
        const("span", [3]),
        node("Add", ["start", "span"], ["end"]),
        const("axes", [0]),
        node("Slice", ["h", "start", "end", "axes"], ["window"]),
        node("Mul", ["window", "window"], ["sq"]),
        node("ReduceSum", ["sq"], ["loss"], keepdims=0),
    ]
    return make_model(nodes, [("x", F, [8, 4]), ("w", F, [4]), ("start", I64, [1])], ["loss"])


def jax_slice_loss(x: Any, w: Any, start: Any) -> Any:
    return jnp.sum(lax.dynamic_slice_in_dim(jnp.tanh(x * w), start[0], 3, axis=0) ** 2)


def test_per_example_gradients_through_a_per_example_window_match_jax() -> None:
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(5, 8, 4)).astype(np.float32)
    w = rng.normal(size=4).astype(np.float32)
    starts = rng.integers(0, 6, size=(5, 1)).astype(np.int64)
    grads = onnax.grad(slice_loss_model(), inputs=["x", "w"])
    model = onnax.vmap(grads, in_axes={"x": 0, "w": None, "start": 0})
    got = run(model, {"x": xs, "w": w, "start": starts})
    want_x, want_w = jax.vmap(jax.grad(jax_slice_loss, argnums=(0, 1)), in_axes=(0, None, 0))(
        xs.astype(np.float64), w.astype(np.float64), starts
    )
    np.testing.assert_allclose(got["x_grad"], want_x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["w_grad"], want_w, rtol=1e-4, atol=1e-5)


def test_reverse_mode_of_the_vmapped_window_matches_jax() -> None:
    # vjp(vmap(f)): the per-example gather is itself differentiated.
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(4, 8, 4)).astype(np.float32)
    w = rng.normal(size=4).astype(np.float32)
    starts = rng.integers(0, 6, size=(4, 1)).astype(np.int64)
    batched = onnax.vmap(slice_loss_model(), in_axes={"x": 0, "w": None, "start": 0})
    model = onnax.vjp(batched, inputs=["x", "w"])
    ct = rng.normal(size=4).astype(np.float32)
    got = run(model, {"x": xs, "w": w, "start": starts, "loss_cotangent": ct})

    def total(x: Any, w_: Any) -> Any:
        return jnp.dot(jax.vmap(jax_slice_loss, in_axes=(0, None, 0))(x, w_, starts), ct.astype(np.float64))

    want_x, want_w = jax.grad(total, argnums=(0, 1))(xs.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(got["x_cotangent"], want_x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["w_cotangent"], want_w, rtol=1e-4, atol=1e-5)


def test_jax2onnx_dynamic_slice_and_update_slice_as_exported() -> None:
    jax2onnx = pytest.importorskip("jax2onnx")

    def f(x: Any, u: Any, i: Any) -> Any:
        zero = jnp.zeros_like(i)  # (index dtypes must agree under x64)
        window = lax.dynamic_slice(x, (i, zero), (3, 4))
        return jnp.sum(jnp.tanh(lax.dynamic_update_slice(x, u * window[:2, :2], (i, zero + 1))) ** 2)

    spec = [
        jax.ShapeDtypeStruct((8, 4), jnp.float32),
        jax.ShapeDtypeStruct((2, 2), jnp.float32),
        jax.ShapeDtypeStruct((), jnp.int32),
    ]
    with jax.enable_x64(False):
        exported = jax2onnx.to_onnx(f, spec, model_name="dynamic_windows")
    model = onnx.load_from_string(exported.SerializeToString())
    x_name, u_name, i_name = [i.name for i in model.graph.input]
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(6, 8, 4)).astype(np.float32)
    us = rng.normal(size=(6, 2, 2)).astype(np.float32)
    # (Starts whose window fits: jax2onnx 0.17 exports no clamping of the start, as JAX does.)
    idx = np.array([0, 3, 5, 2, 1, 4], np.int32)
    feeds = {x_name: xs, u_name: us, i_name: idx}
    x64, u64 = xs.astype(np.float64), us.astype(np.float64)

    got = run(onnax.vmap(model, in_axes=0), feeds)
    np.testing.assert_allclose(next(iter(got.values())), jax.vmap(f)(x64, u64, idx), rtol=1e-5, atol=1e-5)

    per_example = run(onnax.vmap(onnax.grad(model, inputs=[x_name, u_name]), in_axes=0), feeds)
    want_x, want_u = jax.vmap(jax.grad(f, argnums=(0, 1)))(x64, u64, idx)
    np.testing.assert_allclose(per_example[f"{x_name}_grad"], want_x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(per_example[f"{u_name}_grad"], want_u, rtol=1e-4, atol=1e-5)
