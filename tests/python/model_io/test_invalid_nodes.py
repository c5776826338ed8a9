"""Nodes their schema rules out (a required input missing or left empty, a Transpose perm that
is not a permutation, a GatherND batch_dims, reduced axes or an axis attribute out of range)
get the diagnostic contract's error from every transform, where they used to crash the process
or yield an invalid model: rules read the inputs and attributes the schema guarantees. Each defect
is paired with the same model repaired, whose transforms must still match an independent
oracle (finite differences, a per-example loop), so the check cannot reject valid nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles.ad_oracle import Tol, ad_error, check_grad, uniform
from oracles.vmap_oracle import assert_vmap_matches, node

onnax = pytest.importorskip("onnax")

D = TensorProto.DOUBLE
TRANSFORMS = ["vmap", "jvp", "vjp", "grad"]


def chain(
    middle: onnx.NodeProto,
    x_shape: list[int],
    extra_inputs: list[tuple[str, int, list[int]]],
    initializers: dict[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    """x -> middle -> Tanh -> ReduceSum: a scalar loss through the node under test. Built
    without onnx.checker, which rejects the defective nodes as these transforms must."""
    nodes = [middle, node("Tanh", [middle.output[0]], ["t"]), node("ReduceSum", ["t"], ["loss"], keepdims=0)]
    inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in [("x", D, x_shape), *extra_inputs]]
    inits = [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("loss", D, [])], initializer=inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def matmul(inputs: list[str]) -> onnx.ModelProto:
    return chain(node("MatMul", inputs, ["y"], name="mm"), [2, 3], [("w", D, [3, 4])])


def gemm(inputs: list[str]) -> onnx.ModelProto:
    return chain(node("Gemm", inputs, ["y"], name="gm"), [2, 3], [("w", D, [3, 4])])


def gemm_outputs(outputs: list[str]) -> onnx.ModelProto:
    return chain(node("Gemm", ["x", "w"], outputs, name="gm"), [2, 3], [("w", D, [3, 4])])


def power(inputs: list[str]) -> onnx.ModelProto:
    return chain(node("Pow", inputs, ["y"], name="pw"), [2, 3], [("w", D, [])])


def gather_nd(batch_dims: int) -> onnx.ModelProto:
    rows = {"rows": np.array([[2], [0]], dtype=np.int64)}  # one row of x per batch entry
    return chain(
        node("GatherND", ["x", "rows"], ["y"], name="gn", batch_dims=batch_dims), [2, 3, 4], [], rows
    )


def reduce_sum(axes: list[int], keepdims: int = 1) -> onnx.ModelProto:
    """Sums x [2, 3, 4] over constant axes (an input since opset 13)."""
    axes_init = {"axes": np.array(axes, dtype=np.int64)}
    return chain(
        node("ReduceSum", ["x", "axes"], ["y"], name="rs", keepdims=keepdims), [2, 3, 4], [], axes_init
    )


def total(inputs: list[str]) -> onnx.ModelProto:
    return chain(node("Sum", inputs, ["y"], name="sm"), [2, 3], [])


def log_softmax(axis: int) -> onnx.ModelProto:
    return chain(node("LogSoftmax", ["x"], ["y"], name="ls", axis=axis), [2, 3], [])


def stft(frame_length: bool) -> onnx.ModelProto:
    """STFT of a real signal [1, 32, 1], frame step 4, and a frame length of 8 if given."""
    ints = {"step": np.asarray(4, dtype=np.int64), "length": np.asarray(8, dtype=np.int64)}
    inputs = ["x", "step", "", "length" if frame_length else ""]
    return chain(node("STFT", inputs, ["y"], name="st"), [1, 32, 1], [], ints)


def transpose(perm: list[int]) -> onnx.ModelProto:
    return chain(node("Transpose", ["x"], ["y"], name="tp", perm=perm), [2, 3, 4], [])


# (model with the defect, words the message must contain, the repaired model)
DEFECTS: dict[str, tuple[Callable[[], onnx.ModelProto], list[str], Callable[[], onnx.ModelProto]]] = {
    "MatMul with one input": (
        lambda: matmul(["x"]),
        ["ai.onnx::MatMul", "'mm'", "has 1 input(s)", "at least 2"],
        lambda: matmul(["x", "w"]),
    ),
    "Gemm with two outputs": (
        lambda: gemm_outputs(["y", "extra"]),
        ["ai.onnx::Gemm", "'gm'", "has 2 output(s); its schema allows 1"],
        lambda: gemm_outputs(["y"]),
    ),
    "Gemm with an empty B": (
        lambda: gemm(["x", ""]),
        ["ai.onnx::Gemm", "'gm'", "required input 1 ('B')", "empty name"],
        lambda: gemm(["x", "w"]),
    ),
    "Pow with an empty exponent": (
        lambda: power(["x", ""]),
        ["ai.onnx::Pow", "'pw'", "required input 1 ('Y')"],
        lambda: power(["x", "w"]),
    ),
    "Transpose perm with a negative axis": (
        lambda: transpose([1, -1, 0]),
        ["ai.onnx::Transpose", "'tp'", "perm [1, -1, 0]", "not a permutation", "rank 3"],
        lambda: transpose([1, 2, 0]),
    ),
    "Transpose perm with a repeated axis": (
        lambda: transpose([0, 0, 1]),
        ["perm [0, 0, 1]", "not a permutation"],
        lambda: transpose([0, 2, 1]),
    ),
    "Transpose perm of the wrong length": (
        lambda: transpose([1, 0]),
        ["perm [1, 0]", "not a permutation of the axes 0..2", "rank 3"],
        lambda: transpose([2, 1, 0]),
    ),
    "GatherND batch_dims beyond the indices' rank": (
        lambda: gather_nd(2),
        ["ai.onnx::GatherND", "'gn'", "batch_dims 2", "data (3) and indices (2)"],
        lambda: gather_nd(1),
    ),
    "ReduceSum over an axis beyond the rank": (
        lambda: reduce_sum([1, 3]),
        ["ai.onnx::ReduceSum", "'rs'", "reduces axes [1, 3]", "[-3, 3)"],
        lambda: reduce_sum([1, 2]),
    ),
    "STFT with neither a window nor a frame_length": (
        lambda: stft(False),
        ["ai.onnx::STFT", "'st'", "neither a window (input 2) nor a frame_length (input 3)"],
        lambda: stft(True),
    ),
    # ONNX accepts an empty name among variadic inputs; no rule can read it.
    "Sum with an empty variadic input": (
        lambda: total(["x", "", "x"]),
        ["ai.onnx::Sum", "'sm'", "variadic input 1 ('data_0')", "Fix: drop the empty names"],
        lambda: total(["x", "x"]),
    ),
    "LogSoftmax axis beyond the rank": (
        lambda: log_softmax(-3),
        ["ai.onnx::LogSoftmax", "'ls'", "axis -3", "outside [-2, 1]"],
        lambda: log_softmax(-2),
    ),
    # ONNX's own GatherND shape inference crashes on this one (onnx 1.23 in Python too).
    "GatherND with a negative batch_dims": (
        lambda: gather_nd(-5),
        ["ai.onnx::GatherND", "batch_dims -5", "at least 0"],
        lambda: gather_nd(1),
    ),
}


def call(mode: str, model: onnx.ModelProto) -> Any:
    fn = getattr(onnax, mode)
    return fn(model, output="loss") if mode == "grad" else fn(model)


@pytest.mark.parametrize("mode", TRANSFORMS)
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_defective_node_is_reported(defect: str, mode: str) -> None:
    broken, words, _ = DEFECTS[defect]
    msg = ad_error(lambda m: call(mode, m), broken())
    assert msg.startswith(f"{mode}: invalid model: "), msg
    for word in [*words, "Fix:"]:
        assert word in msg, f"{word!r} missing from: {msg}"
    assert msg.count("Fix:") == 1, msg


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_repaired_node_transforms_correctly(defect: str) -> None:
    _, _, repaired = DEFECTS[defect]
    model = repaired()
    ins = [v.name for v in model.graph.input]  # (float runtime inputs only)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    positive = {"x": uniform(shape, 0.5, 1.5)}  # (Pow: a real power of a positive base)
    check_grad(model, ins, "loss", gens=positive)
    # The other inputs stay shared across the batch.
    assert_vmap_matches(
        model, in_axes=[0] + [None] * (len(ins) - 1), gens={"x": lambda r: r.uniform(0.5, 1.5, shape)}
    )


def test_cli_exits_with_the_diagnostic(tmp_path: Any) -> None:
    import subprocess
    from pathlib import Path

    exe = Path(__file__).resolve().parents[3] / "build" / "onnax"
    if not exe.exists():
        pytest.skip("build/onnax is missing (run ./setup.sh)")
    src = tmp_path / "broken.onnx"
    onnx.save(transpose([1, -1, 0]), src)
    for mode in TRANSFORMS:
        r = subprocess.run(
            [str(exe), mode, str(src), "-o", str(tmp_path / "out.onnx")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode not in (0,) and r.returncode > 0, (mode, r.returncode, r.stderr)
        assert "not a permutation" in r.stderr and "Fix:" in r.stderr, r.stderr
        assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("keepdims", [0, 1])
def test_an_axis_reduced_twice_is_reduced_once(keepdims: int) -> None:
    # ONNX's checks and ONNX Runtime accept ReduceSum axes naming an axis twice: not a defect.
    model = reduce_sum([-1, 2, 0], keepdims)
    check_grad(model, ["x"], "loss")
    assert_vmap_matches(model)
    vjp = onnax.vjp(model, inputs=["x"], outputs=["loss"])
    assert [o.name for o in vjp.graph.output] == ["loss", "x_cotangent"]


def test_valid_default_perm_and_optional_inputs_pass() -> None:
    """No perm (reverse the axes) and an omitted optional input (Gemm's C) are valid."""
    model = chain(node("Transpose", ["x"], ["y"], name="tp"), [2, 3, 4], [])
    check_grad(model, ["x"], "loss")
    gemm_model = chain(node("Gemm", ["x", "w", ""], ["y"], name="gm"), [2, 3], [("w", D, [3, 4])])
    check_grad(gemm_model, ["x", "w"], "loss")


@pytest.mark.parametrize("mode", TRANSFORMS)
def test_constant_whose_data_disagrees_with_its_dims(mode: str) -> None:
    # Axes [1, 2] stored with dims [3]: rules would index by two axes of a three-axis claim
    # (a mutant like this crashed vjp while unsqueezing the reduced cotangent).
    model = reduce_sum([1, 2])
    axes = next(t for t in model.graph.initializer if t.name == "axes")
    axes.dims[0] = 3
    msg = ad_error(lambda m: call(mode, m), model)
    for word in ["int64 tensor 'axes'", "dims [3]", "holds 2", "16 bytes of raw_data", "Fix:"]:
        assert word in msg, f"{word!r} missing from: {msg}"


@pytest.mark.parametrize("mode", TRANSFORMS)
def test_a_node_below_opset_18_is_checked_before_the_version_converter(mode: str) -> None:
    # ONNX's version converter segfaults on a ReduceMax with two `axes` attributes (opset 13).
    model = reduce_max_13(["axes", "axes"])
    msg = ad_error(lambda m: call(mode, m), model)
    for word in ["invalid model: ai.onnx::ReduceMax (opset 13)", "'axes' appeared multiple times", "Fix:"]:
        assert word in msg, f"{word!r} missing from: {msg}"
    # The same model with one `axes` is upgraded and transformed.
    check_grad(reduce_max_13(["axes"]), ["x"], "loss")


def reduce_max_13(axes_attributes: list[str]) -> onnx.ModelProto:
    middle = node("ReduceMax", ["x"], ["y"], name="rm", keepdims=1)
    middle.attribute.extend(helper.make_attribute(name, [1]) for name in axes_attributes)
    model = chain(middle, [2, 3, 4], [])
    model.opset_import[0].version = 13
    return model


def linear_attention(update_rule: str | None) -> onnx.ModelProto:
    """LinearAttention (opset 27) without past_state and decay, with beta; loss = sum(tanh(y))."""
    attrs: dict[str, object] = {"q_num_heads": 4, "kv_num_heads": 4}
    if update_rule is not None:
        attrs["update_rule"] = update_rule
    middle = node("LinearAttention", ["x", "k", "v", "", "", "beta"], ["y", "state"], name="la", **attrs)
    model = chain(middle, [2, 4, 32], [("k", D, [2, 4, 32]), ("v", D, [2, 4, 32]), ("beta", D, [2, 4, 4])])
    model.opset_import[0].version = 27
    model.ir_version = 13
    return model


def test_a_function_body_needing_an_input_the_node_left_out() -> None:
    # The default update rule (gated_delta) needs decay: its ONNX function body reads it.
    msg = ad_error(lambda m: onnax.grad(m, inputs=["x"], output="loss"), linear_attention(None))
    for word in [
        "ai.onnx::LinearAttention",
        "function body",
        "leaves out its input(s) 3, 4",
        "Fix: give the node",
    ]:
        assert word in msg, f"{word!r} missing from: {msg}"
    # The delta rule needs no decay: differentiated through the same body, against finite
    # differences (beta in (0, 1), as a gate). ONNX's reference LinearAttention rounds to about
    # 1e-7 relative, which swamps steps of 1e-6: a step of 1e-3 and a tolerance to match.
    check_grad(
        linear_attention("delta"),
        ["x", "k", "v"],
        "loss",
        gens={"beta": uniform([2, 4, 4], 0.1, 0.9)},
        eps=1e-3,
        tol=Tol(1e-3, 1e-3),
    )
