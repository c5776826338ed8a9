"""Loops whose iteration count differs between examples, or between iterations of an enclosing
loop: reverse mode stacks one row per iteration, so those stacks have different lengths.

- ``vmap(grad(f))`` and ``vjp(vmap(f))`` of a Loop with a per-example trip count or early exit
  give each example's gradient (checked against a float64 numpy backward pass);
- ``grad`` of a Loop inside a Loop whose inner trip count changes with the outer iteration;
- ``vmap`` of a Loop whose own stacked output is ragged cannot be batched: it runs when the
  examples agree and fails when run (ONNX Runtime's error) when they do not.
"""

from __future__ import annotations

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from oracles.training_oracle import run


def cell_body(stack: bool = False, stop_above: float | None = None) -> onnx.GraphProto:
    """One step h <- tanh(h * w); optionally stacks h, or stops once sum(h) > stop_above."""
    nodes = [h.make_node("Mul", ["h_in", "w"], ["hw"]), h.make_node("Tanh", ["hw"], ["h_out"])]
    outputs = [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("h_out", T.FLOAT, [3])]
    if stop_above is None:
        nodes.append(h.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        nodes += [
            h.make_node("ReduceSum", ["h_out"], ["total"], keepdims=0),
            h.make_node("Constant", [], ["limit"], value=h.make_tensor("limit", T.FLOAT, [], [stop_above])),
            h.make_node("LessOrEqual", ["total", "limit"], ["c_out"]),
        ]
    if stack:
        nodes.append(h.make_node("Identity", ["h_out"], ["h_row"]))
        outputs.append(h.make_tensor_value_info("h_row", T.FLOAT, [3]))
    inputs = [
        h.make_tensor_value_info("i", T.INT64, []),
        h.make_tensor_value_info("c_in", T.BOOL, []),
        h.make_tensor_value_info("h_in", T.FLOAT, [3]),
    ]
    return h.make_graph(nodes, "cell", inputs, outputs)


def loop_model(
    nodes: list[onnx.NodeProto], trips: str, outputs: list[onnx.ValueInfoProto]
) -> onnx.ModelProto:
    """A model of `nodes` with inputs `trips` (int64), h0 and w (float [3])."""
    inputs = [
        h.make_tensor_value_info(trips, T.INT64, []),
        h.make_tensor_value_info("h0", T.FLOAT, [3]),
        h.make_tensor_value_info("w", T.FLOAT, [3]),
    ]
    model = h.make_model(
        h.make_graph(nodes, "loops", inputs, outputs), opset_imports=[h.make_opsetid("", 18)]
    )
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


LOSS = [h.make_tensor_value_info("loss", T.FLOAT, [])]


def recurrence(stop_above: float | None = None) -> onnx.ModelProto:
    """loss = sum(h_M), h_0 = h0, h_{t+1} = tanh(h_t * w), for M steps (or until the stop)."""
    nodes = [
        h.make_node("Constant", [], ["go"], value=h.make_tensor("go", T.BOOL, [], [True])),
        h.make_node("Loop", ["M", "go", "h0"], ["hT"], body=cell_body(stop_above=stop_above)),
        h.make_node("ReduceSum", ["hT"], ["loss"], keepdims=0),
    ]
    return loop_model(nodes, "M", LOSS)


def numpy_grads(
    m: int, h0: np.ndarray, w: np.ndarray, stop_above: float | None = None
) -> tuple[float, np.ndarray, np.ndarray]:
    """loss, d loss/d h0, d loss/d w in float64, by a hand-written backward pass."""
    hs = [h0.astype(np.float64)]
    w64 = w.astype(np.float64)
    for _ in range(m):
        hs.append(np.tanh(hs[-1] * w64))
        if stop_above is not None and hs[-1].sum() > stop_above:
            break
    g, gw = np.ones(3), np.zeros(3)
    for t in range(len(hs) - 2, -1, -1):
        d = g * (1 - hs[t + 1] ** 2)
        gw += d * hs[t]
        g = d * w64
    return float(hs[-1].sum()), g, gw


def examples(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    trips = np.array([2, 5, 1, 0, 3], np.int64)  # zero iterations too
    h0 = rng.normal(size=(5, 3)).astype(np.float32)
    w = (rng.normal(size=3) * 1.5).astype(np.float32)
    return trips, h0, w


@pytest.mark.parametrize("stop_above", [None, 0.3])
def test_per_example_gradients_through_per_example_trip_counts(stop_above: float | None) -> None:
    trips, h0, w = examples()
    grads = onnax.grad(recurrence(stop_above), inputs=["h0", "w"])
    with pytest.warns(UserWarning, match="run example by example"):
        batched = onnax.vmap(grads, in_axes={"M": 0, "h0": 0, "w": None})
    got = run(batched, {"M": trips, "h0": h0, "w": w})
    for b in range(len(trips)):
        loss, g_h0, g_w = numpy_grads(int(trips[b]), h0[b], w, stop_above)
        np.testing.assert_allclose(got["loss"][b], loss, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["h0_grad"][b], g_h0, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got["w_grad"][b], g_w, rtol=1e-4, atol=1e-6)


def test_reverse_mode_of_the_vmapped_loop_with_per_example_trip_counts() -> None:
    trips, h0, w = examples(1)
    batched = onnax.vmap(recurrence(), in_axes={"M": 0, "h0": 0, "w": None})
    model = onnax.vjp(batched, inputs=["h0", "w"])
    ct = np.random.default_rng(2).normal(size=5).astype(np.float32)
    got = run(model, {"M": trips, "h0": h0, "w": w, "loss_cotangent": ct})
    want_w = np.zeros(3)
    for b in range(len(trips)):
        _, g_h0, g_w = numpy_grads(int(trips[b]), h0[b], w)
        np.testing.assert_allclose(got["h0_cotangent"][b], ct[b] * g_h0, rtol=1e-4, atol=1e-6)
        want_w += ct[b] * g_w
    np.testing.assert_allclose(got["w_cotangent"], want_w, rtol=1e-4, atol=1e-6)


def nested_recurrence() -> onnx.ModelProto:
    """Outer iteration i runs the cell i + 1 times: loss = sum(h after 1 + 2 + ... + N steps)."""
    outer = h.make_graph(
        [
            h.make_node("Add", ["i", "one"], ["steps"]),
            h.make_node("Loop", ["steps", "", "h_in"], ["h_out"], body=cell_body()),
            h.make_node("Identity", ["k_in"], ["k_out"]),
        ],
        "outer",
        [
            h.make_tensor_value_info("i", T.INT64, []),
            h.make_tensor_value_info("k_in", T.BOOL, []),
            h.make_tensor_value_info("h_in", T.FLOAT, [3]),
        ],
        [h.make_tensor_value_info("k_out", T.BOOL, []), h.make_tensor_value_info("h_out", T.FLOAT, [3])],
    )
    nodes = [
        h.make_node("Constant", [], ["one"], value=h.make_tensor("one", T.INT64, [], [1])),
        h.make_node("Loop", ["N", "", "h0"], ["hT"], body=outer),
        h.make_node("ReduceSum", ["hT"], ["loss"], keepdims=0),
    ]
    return loop_model(nodes, "N", LOSS)


@pytest.mark.parametrize("outer_trips", [0, 1, 4])
def test_gradient_of_an_inner_loop_whose_trip_count_changes_each_outer_iteration(outer_trips: int) -> None:
    _, h0, w = examples(3)
    grads = onnax.grad(nested_recurrence(), inputs=["h0", "w"])
    got = run(grads, {"N": np.array(outer_trips, np.int64), "h0": h0[0], "w": w})
    loss, g_h0, g_w = numpy_grads(outer_trips * (outer_trips + 1) // 2, h0[0], w)
    np.testing.assert_allclose(got["loss"], loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["h0_grad"], g_h0, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["w_grad"], g_w, rtol=1e-4, atol=1e-6)


def test_per_example_gradients_through_nested_loops_with_per_example_trip_counts() -> None:
    trips, h0, w = examples(4)
    trips = np.minimum(trips, 3)
    grads = onnax.grad(nested_recurrence(), inputs=["h0", "w"])
    with pytest.warns(UserWarning, match="run example by example"):
        batched = onnax.vmap(grads, in_axes={"N": 0, "h0": 0, "w": None})
    got = run(batched, {"N": trips, "h0": h0, "w": w})
    for b in range(len(trips)):
        n = int(trips[b])
        _, g_h0, g_w = numpy_grads(n * (n + 1) // 2, h0[b], w)
        np.testing.assert_allclose(got["h0_grad"][b], g_h0, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got["w_grad"][b], g_w, rtol=1e-4, atol=1e-6)


def test_a_stacked_output_of_per_example_length_runs_only_when_the_examples_agree() -> None:
    model = loop_model(
        [h.make_node("Loop", ["M", "", "h0"], ["hT", "rows"], body=cell_body(stack=True))],
        "M",
        [h.make_tensor_value_info("hT", T.FLOAT, [3]), h.make_tensor_value_info("rows", T.FLOAT, ["T", 3])],
    )
    with pytest.warns(UserWarning, match="run example by example"):
        batched = onnax.vmap(model, in_axes={"M": 0, "h0": 0, "w": None})
    _, h0, w = examples(5)
    same = run(batched, {"M": np.full(5, 3, np.int64), "h0": h0, "w": w})
    for b in range(5):
        want = run(model, {"M": np.array(3, np.int64), "h0": h0[b], "w": w})
        np.testing.assert_allclose(same["rows"][b], want["rows"], rtol=1e-6)
        np.testing.assert_allclose(same["hT"][b], want["hT"], rtol=1e-6)
    with pytest.raises(Exception, match="shape"):
        run(batched, {"M": np.array([3, 2, 3, 3, 3], np.int64), "h0": h0, "w": w})
