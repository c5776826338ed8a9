"""Interface and diagnostics tests for ``onnax.vmap``: model kinds, purity, determinism,
names, axis_name, initializers, and the error messages for bad axes and unsupported ops."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnx_ir
import pytest
from onnx import TensorProto, helper
from oracles.vmap_oracle import assert_vmap_matches, make_model, node, run_model, to_proto, vmap_error

onnax = pytest.importorskip("onnax")

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def two_input_model() -> onnx.ModelProto:
    """out = MatMul(x, w) + y ; second output depends on y only."""
    return make_model(
        [node("MatMul", ["x", "w"], ["h"]), node("Add", ["h", "y"], ["out"]), node("Neg", ["y"], ["ny"])],
        [("x", F, ["N", 4]), ("y", F, [3])],
        ["out", "ny"],
        initializers={"w": np.arange(12, dtype=np.float32).reshape(4, 3) / 10},
    )


def batch_params(model: onnx.ModelProto) -> dict[str, list[str]]:
    """dim_params of every graph input/output, by name."""
    out: dict[str, list[str]] = {}
    for vi in list(model.graph.input) + list(model.graph.output):
        out[vi.name] = [d.dim_param for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")]
    return out


# ---- model kinds, purity, determinism --------------------------------------------------------


def test_onnax_error_is_value_error() -> None:
    assert issubclass(onnax.OnnaxError, ValueError)


def test_modelproto_in_modelproto_out_and_source_unchanged() -> None:
    m = two_input_model()
    before = m.SerializeToString()
    out = onnax.vmap(m, in_axes=(0, None))
    assert isinstance(out, onnx.ModelProto)
    assert m.SerializeToString() == before
    assert out is not m


def test_onnx_ir_in_onnx_ir_out_and_source_unchanged() -> None:
    m = two_input_model()
    ir_model = onnx_ir.serde.deserialize_model(m)
    before = onnx_ir.serde.serialize_model(ir_model).SerializeToString()
    out = onnax.vmap(ir_model, in_axes=(0, None))
    assert isinstance(out, onnx_ir.Model)
    assert out is not ir_model
    assert onnx_ir.serde.serialize_model(ir_model).SerializeToString() == before


def test_onnx_ir_numerics() -> None:
    assert_vmap_matches(two_input_model(), (0, None), 0, dims={"N": 2}, as_ir=True)
    assert_vmap_matches(two_input_model(), (1, 0), (0, 1), dims={"N": 2}, as_ir=True)


def test_onnx_ir_and_proto_give_same_model() -> None:
    m = two_input_model()
    a = onnax.vmap(m, in_axes=(0, None))
    b = to_proto(onnax.vmap(onnx_ir.serde.deserialize_model(m), in_axes=(0, None)))
    ra = run_model(a, {"x": np.ones((2, 5, 4), np.float32), "y": np.ones(3, np.float32)})
    rb = run_model(b, {"x": np.ones((2, 5, 4), np.float32), "y": np.ones(3, np.float32)})
    for x, y in zip(ra, rb, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("in_axes", [0, (0, None), (None, 0), (1, -1)])
def test_deterministic_bytes(in_axes: object) -> None:
    m = two_input_model()
    a = onnax.vmap(m, in_axes=in_axes, out_axes=(0, 1))
    b = onnax.vmap(m, in_axes=in_axes, out_axes=(0, 1))
    assert a.SerializeToString() == b.SerializeToString()
    c = onnax.vmap(onnx.load_from_string(m.SerializeToString()), in_axes=in_axes, out_axes=(0, 1))
    assert a.SerializeToString() == c.SerializeToString()


def test_deterministic_bytes_onnx_ir() -> None:
    m = two_input_model()
    a = onnax.vmap(onnx_ir.serde.deserialize_model(m), in_axes=(0, None))
    b = onnax.vmap(onnx_ir.serde.deserialize_model(m), in_axes=(0, None))
    assert (
        onnx_ir.serde.serialize_model(a).SerializeToString()
        == onnx_ir.serde.serialize_model(b).SerializeToString()
    )


def test_in_axes_spellings_are_equivalent() -> None:
    m = two_input_model()
    by_int = onnax.vmap(m, in_axes=0).SerializeToString()
    by_seq = onnax.vmap(m, in_axes=[0, 0]).SerializeToString()
    by_tuple = onnax.vmap(m, in_axes=(0, 0)).SerializeToString()
    by_dict = onnax.vmap(m, in_axes={"x": 0, "y": 0}).SerializeToString()
    assert by_int == by_seq == by_tuple == by_dict


def test_in_axes_dict_unnamed_inputs_are_shared() -> None:
    m = two_input_model()
    out = onnax.vmap(m, in_axes={"x": 0})
    assert out.SerializeToString() == onnax.vmap(m, in_axes=[0, None]).SerializeToString()
    y_in = next(v for v in out.graph.input if v.name == "y")
    assert [d.dim_value for d in y_in.type.tensor_type.shape.dim] == [3]
    assert_vmap_matches(m, {"x": 1, "y": None}, (0, 0), dims={"N": 2})
    assert_vmap_matches(m, {"y": -1}, (1, 0), dims={"N": 2})


# ---- names, dims, initializers ---------------------------------------------------------------


def test_names_and_order_unchanged() -> None:
    m = two_input_model()
    out = onnax.vmap(m, in_axes=(0, 0))
    inits = {t.name for t in out.graph.initializer}
    assert [v.name for v in out.graph.input if v.name not in inits] == ["x", "y"]
    assert [v.name for v in out.graph.output] == ["out", "ny"]


def test_axis_name_is_used_for_inputs_and_outputs() -> None:
    m = two_input_model()
    out = onnax.vmap(m, in_axes=(0, 0), out_axes=(1, 0), axis_name="examples")
    params = batch_params(out)
    assert params["x"] == ["examples", "N"]
    assert params["y"] == ["examples"]
    out_dims = out.graph.output[0].type.tensor_type.shape.dim
    assert out_dims[1].dim_param == "examples"
    assert out.graph.output[1].type.tensor_type.shape.dim[0].dim_param == "examples"
    assert_vmap_matches(m, (0, 0), (1, 0), dims={"N": 2}, axis_name="examples")


def test_default_axis_name_is_batch() -> None:
    out = onnax.vmap(two_input_model(), in_axes=(None, 0))
    assert batch_params(out)["y"] == ["batch"]
    assert out.graph.output[1].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_default_axis_name_does_not_clash_with_existing_dim_param() -> None:
    m = make_model([node("Relu", ["x"], ["out"])], [("x", F, ["batch", 3])], ["out"])
    out = onnax.vmap(m, in_axes=1)
    dims = out.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch"
    assert dims[1].HasField("dim_param") and dims[1].dim_param not in ("", "batch")
    assert_vmap_matches(m, 1, 0, dims={"batch": 2})


def test_symbolic_dims_preserved() -> None:
    m = make_model([node("Relu", ["x"], ["out"])], [("x", F, ["N", "M"])], ["out"])
    out = onnax.vmap(m, in_axes=-1, out_axes=1, axis_name="B")
    assert [d.dim_param for d in out.graph.input[0].type.tensor_type.shape.dim] == ["N", "M", "B"]
    assert_vmap_matches(m, -1, 1, dims={"N": 2, "M": 3}, axis_name="B")


def test_initializers_stay_initializers() -> None:
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    b = np.arange(3, dtype=np.float32)
    m = make_model(
        [node("MatMul", ["x", "w"], ["h"]), node("Add", ["h", "b"], ["out"])],
        [("x", F, [2, 4])],
        ["out"],
        initializers={"w": w, "b": b},
    )
    out = onnax.vmap(m, in_axes=0)
    inits = {t.name: t for t in out.graph.initializer}
    assert {"w", "b"} <= set(inits)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(inits["w"]), w)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(inits["b"]), b)
    assert [v.name for v in out.graph.input] == ["x"]
    assert_vmap_matches(m, 0, 0)


def test_initializer_not_counted_in_in_axes_sequence() -> None:
    m = two_input_model()
    # Two runtime inputs (x, y); w is an initializer and is always shared.
    assert_vmap_matches(m, (0, 0), 0, dims={"N": 2})


def test_unbatched_output_is_broadcast() -> None:
    m = two_input_model()
    out = assert_vmap_matches(m, (0, None), (0, 0), dims={"N": 2})
    ny = out.graph.output[1].type.tensor_type.shape.dim
    assert len(ny) == 2 and ny[0].HasField("dim_param")


def test_stale_value_info_is_handled() -> None:
    rng = np.random.default_rng(0)
    m = make_model(
        [
            node("MatMul", ["x", "w"], ["h"]),
            node("Relu", ["h"], ["r"]),
            node("ReduceSum", ["r", "axes"], ["s"], keepdims=1),
            node("Div", ["r", "s"], ["out"]),
        ],
        [("x", F, [3, 4])],
        ["out"],
        initializers={"w": rng.standard_normal((4, 5)).astype(np.float32), "axes": np.array([-1], np.int64)},
        keep_value_info=True,
    )
    assert len(m.graph.value_info) >= 3
    assert_vmap_matches(
        m,
        1,
        0,
        gens={"x": lambda r: np.abs(r.standard_normal((3, 4))).astype(np.float32) + 0.1},
        rtol=1e-4,
        atol=1e-5,
    )


def test_opset_13_is_upgraded_and_the_result_comes_back_at_13() -> None:
    m = make_model([node("ReduceMean", ["x"], ["out"], axes=[0])], [("x", F, [2, 3])], ["out"], opset=13)
    with pytest.warns(UserWarning, match="13"):
        out = onnax.vmap(m, in_axes=1)
    versions = {o.domain: o.version for o in out.opset_import}
    assert versions.get("", versions.get("ai.onnx")) == 13
    assert_vmap_matches(m, in_axes=1)


@pytest.mark.parametrize("opset", [18, 21, 23, 25, 26, 27, 28])
def test_opset_preserved(opset: int) -> None:
    m = make_model([node("Relu", ["x"], ["out"])], [("x", F, [2, 3])], ["out"], opset=opset)
    out = onnax.vmap(m)
    versions = {o.domain: o.version for o in out.opset_import}
    assert versions.get("", versions.get("ai.onnx")) == opset
    assert_vmap_matches(m)


def test_unsupported_op_on_shared_inputs_is_kept() -> None:
    m = make_model(
        [node("Foo", ["y"], ["fy"], name="my_foo", domain="com.example"), node("Relu", ["x"], ["out"])],
        [("x", F, [3]), ("y", F, [3])],
        [("fy", F, [3]), ("out", F, [3])],
        extra_opsets={"com.example": 1},
        infer=False,
    )
    out = onnax.vmap(m, in_axes=(0, None))
    foo = [n for n in out.graph.node if n.op_type == "Foo"]
    assert len(foo) == 1 and foo[0].domain == "com.example" and list(foo[0].input) == ["y"]


def test_control_flow_on_shared_inputs_passes_through() -> None:
    then_g = helper.make_graph(
        [node("Neg", ["y"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, [3])]
    )
    else_g = helper.make_graph(
        [node("Abs", ["y"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [3])]
    )
    m = make_model(
        [
            node("If", ["c"], ["z"], name="the_if", then_branch=then_g, else_branch=else_g),
            node("Add", ["x", "z"], ["out"]),
        ],
        [("x", F, [3]), ("y", F, [3]), ("c", B, [])],
        ["out"],
    )
    assert_vmap_matches(m, (0, None, None), 0, gens={"c": lambda rng: np.array(True)})
    assert_vmap_matches(m, (1, None, None), 0, gens={"c": lambda rng: np.array(False)})


def test_if_capturing_batched_value_raises_or_is_correct() -> None:
    then_g = helper.make_graph(
        [node("Neg", ["x"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, [3])]
    )
    else_g = helper.make_graph(
        [node("Abs", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [3])]
    )
    m = make_model(
        [node("If", ["c"], ["out"], name="capturing_if", then_branch=then_g, else_branch=else_g)],
        [("x", F, [3]), ("c", B, [])],
        ["out"],
    )
    try:
        onnax.vmap(m, in_axes=(0, None))
    except onnax.OnnaxError as err:
        assert "If" in str(err) and "capturing_if" in str(err)
    else:
        assert_vmap_matches(m, (0, None), 0, gens={"c": lambda rng: np.array(True)})


# ---- unsupported ops and control flow with batched inputs ------------------------------------


def _assert_names_node(msg: str, op: str, node_name: str) -> None:
    assert "vmap" in msg, msg
    assert op in msg, msg
    assert node_name in msg, msg


def test_unknown_custom_op_raises() -> None:
    m = make_model(
        [node("Foo", ["feature_x"], ["out"], name="my_foo", domain="com.example")],
        [("feature_x", F, [3, 4])],
        [("out", F, [3, 4])],
        extra_opsets={"com.example": 1},
        infer=False,
    )
    msg = vmap_error(m, in_axes=0)
    _assert_names_node(msg, "Foo", "my_foo")
    assert "com.example" in msg, msg
    assert "feature_x" in msg, f"offending input not named in: {msg}"


def test_random_op_with_batched_input_raises() -> None:
    m = make_model(
        [node("RandomNormalLike", ["x"], ["out"], name="rnd", seed=1.0)], [("x", F, [3, 4])], ["out"]
    )
    msg = vmap_error(m, in_axes=0)
    _assert_names_node(msg, "RandomNormalLike", "rnd")
    assert "18" in msg, msg


def test_random_op_downstream_of_batched_value_raises() -> None:
    m = make_model(
        [node("Relu", ["x"], ["r"]), node("RandomUniformLike", ["r"], ["out"], name="rnd2", seed=2.0)],
        [("x", F, [3, 4])],
        ["out"],
    )
    msg = vmap_error(m, in_axes=0)
    _assert_names_node(msg, "RandomUniformLike", "rnd2")


def test_if_with_batched_condition_runs_per_example() -> None:
    """A batched If condition picks a branch per example (via the per-example Scan)."""
    then_g = helper.make_graph(
        [node("Identity", ["y"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, [3])]
    )
    else_g = helper.make_graph(
        [node("Neg", ["y"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [3])]
    )
    m = make_model(
        [node("If", ["c"], ["out"], name="branchy", then_branch=then_g, else_branch=else_g)],
        [("c", B, []), ("y", F, [3])],
        ["out"],
    )
    assert_vmap_matches(m, (0, None), 0)


def test_loop_with_batched_input_runs_per_example() -> None:
    body = helper.make_graph(
        [node("Identity", ["cond_in"], ["cond_out"]), node("Add", ["v_in", "v_in"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("cond_in", B, []),
            helper.make_tensor_value_info("v_in", F, [3]),
        ],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("v_out", F, [3])],
    )
    m = make_model(
        [node("Loop", ["trip", "", "x"], ["out"], name="looper", body=body)],
        [("x", F, [3])],
        ["out"],
        initializers={"trip": np.array(3, np.int64)},
    )
    # The loop-carried output's rank is unknown to ONNX inference, so the per-example map is
    # a Loop (not a Scan); the numbers must match a per-example loop of the source.
    assert_vmap_matches(m, 0, 0)


def test_unsupported_error_mentions_offending_input() -> None:
    m = make_model(
        [node("Relu", ["x"], ["r"]), node("Bar", ["r"], ["out"], name="bar_node", domain="my.domain")],
        [("x", F, [2, 5])],
        [("out", F, [2, 5])],
        extra_opsets={"my.domain": 1},
        infer=False,
    )
    msg = vmap_error(m, in_axes=1)
    _assert_names_node(msg, "Bar", "bar_node")
    assert "my.domain" in msg, msg
    assert re.search(r"\b5\b", msg) and re.search(r"\b2\b", msg), f"per-example shape [2, 5] not in: {msg}"


# ---- bad in_axes / out_axes ------------------------------------------------------------------


def _rank_range_in(msg: str, rank: int) -> None:
    assert str(rank) in msg, f"rank {rank} not in: {msg}"
    assert str(-(rank + 1)) in msg, f"lower bound {-(rank + 1)} not in: {msg}"


@pytest.mark.parametrize("bad", [3, 7, -4, -10])
def test_in_axes_out_of_range(bad: int) -> None:
    m = make_model([node("Add", ["xin", "yin"], ["out"])], [("xin", F, [2, 3]), ("yin", F, [3])], ["out"])
    msg = vmap_error(m, in_axes=(bad, None))
    assert "xin" in msg, msg
    assert str(bad) in msg, msg
    _rank_range_in(msg, 2)


def test_in_axes_out_of_range_second_input_by_dict() -> None:
    m = make_model([node("Add", ["xin", "yin"], ["out"])], [("xin", F, [2, 3]), ("yin", F, [3])], ["out"])
    msg = vmap_error(m, in_axes={"yin": 2})
    assert "yin" in msg, msg
    _rank_range_in(msg, 1)


def test_in_axes_int_out_of_range_for_scalar_input() -> None:
    m = make_model([node("Add", ["xin", "s"], ["out"])], [("xin", F, [2, 3]), ("s", F, [])], ["out"])
    msg = vmap_error(m, in_axes=1)
    assert "'s'" in msg or '"s"' in msg or " s " in msg or "s:" in msg or "input s" in msg, msg
    _rank_range_in(msg, 0)


@pytest.mark.parametrize("axes", [[0], [0, 0, 0], []])
def test_in_axes_wrong_count(axes: list[int]) -> None:
    m = make_model([node("Add", ["xin", "yin"], ["out"])], [("xin", F, [2, 3]), ("yin", F, [3])], ["out"])
    msg = vmap_error(m, in_axes=axes)  # one entry per graph input is required
    assert "in_axes" in msg, msg
    assert str(len(axes)) in msg and "2" in msg, msg


def test_in_axes_unknown_name_lists_available() -> None:
    m = make_model([node("Add", ["xin", "yin"], ["out"])], [("xin", F, [2, 3]), ("yin", F, [3])], ["out"])
    msg = vmap_error(m, in_axes={"nope": 0})
    assert "nope" in msg, msg
    assert "xin" in msg and "yin" in msg, msg


def test_in_axes_can_batch_an_initializer() -> None:
    # (An ensemble: tests/python/vmap/test_ensembles.py has the numbers; here the interface.)
    m = make_model(
        [node("Add", ["xin", "w"], ["out"])],
        [("xin", F, [2, 3])],
        ["out"],
        initializers={"w": np.ones(3, np.float32)},
    )
    out = onnax.vmap(m, in_axes={"w": 0})
    assert [i.name for i in out.graph.input] == ["xin", "w"]
    assert not out.graph.initializer
    # None for an initializer keeps it shared, as it is anyway; an unknown name is an error.
    assert [t.name for t in onnax.vmap(m, in_axes={"xin": 0, "w": None}).graph.initializer] == ["w"]
    msg = vmap_error(m, in_axes={"v": 0})
    assert "'v'" in msg and "xin" in msg, msg


def test_in_axes_all_none_raises() -> None:
    m = make_model([node("Relu", ["xin"], ["out"])], [("xin", F, [2, 3])], ["out"])
    msg = vmap_error(m, in_axes=None)
    assert "in_axes" in msg, msg


@pytest.mark.parametrize("bad", [4, -5])
def test_out_axes_out_of_range(bad: int) -> None:
    m = make_model([node("Relu", ["xin"], ["result"])], [("xin", F, [2, 3, 4])], ["result"])
    msg = vmap_error(m, in_axes=0, out_axes=bad)
    assert "result" in msg, msg
    assert str(bad) in msg, msg
    _rank_range_in(msg, 3)


def test_out_axes_wrong_count() -> None:
    m = make_model(
        [node("Relu", ["xin"], ["o1"]), node("Neg", ["xin"], ["o2"])], [("xin", F, [2])], ["o1", "o2"]
    )
    msg = vmap_error(m, in_axes=0, out_axes=[0, 0, 0])
    assert "out_axes" in msg, msg
    assert "3" in msg and "2" in msg, msg


@pytest.mark.parametrize("bad", [1.5, "0", True, [1.5], {"xin": "0"}])
def test_in_axes_bad_type(bad: object) -> None:
    m = make_model([node("Relu", ["xin"], ["out"])], [("xin", F, [2, 3])], ["out"])
    with pytest.raises(TypeError, match=r"in_axes.* must be an int"):
        onnax.vmap(m, in_axes=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [1.5, "0", [0.5], [True]])
def test_out_axes_bad_type(bad: object) -> None:
    m = make_model([node("Relu", ["xin"], ["out"])], [("xin", F, [2, 3])], ["out"])
    with pytest.raises(TypeError, match=r"out_axes.* must be an int"):
        onnax.vmap(m, out_axes=bad)  # type: ignore[arg-type]


def test_unsupported_old_opset_raises() -> None:
    m = make_model([node("Relu", ["xin"], ["out"])], [("xin", F, [2, 3])], ["out"], opset=6)
    msg = vmap_error(m, in_axes=0)
    assert "opset is 6" in msg and "7-17 are upgraded" in msg and "Fix:" in msg, msg


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_old_opsets_are_upgraded(opset: int) -> None:
    # BatchNormalization, then a nearest 2x upsampling in each opset's spelling (Upsample by
    # attribute, Upsample by input, Resize with a roi): the result matches a loop of the source.
    inits = {
        "s": np.array([1.5, 0.5], np.float32),
        "b": np.array([0.1, -0.2], np.float32),
        "m": np.array([0.3, -0.1], np.float32),
        "v": np.array([1.2, 0.8], np.float32),
        "scales": np.array([1.0, 1.0, 2.0, 2.0], np.float32),
        "roi": np.zeros((0,), np.float32),
    }
    if opset < 9:
        up = node("Upsample", ["h"], ["out"], scales=[1.0, 1.0, 2.0, 2.0])
    elif opset < 10:
        up = node("Upsample", ["h", "scales"], ["out"])
    else:
        up = node("Resize", ["h", "roi", "scales"], ["out"])
    used = {i for n in (up,) for i in n.input} | {"s", "b", "m", "v"}
    nodes = [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["h"]), up]
    m = make_model(
        nodes,
        [("x", F, [1, 2, 2, 3])],
        ["out"],
        initializers={k: v for k, v in inits.items() if k in used},
        opset=opset,
    )
    with pytest.warns(UserWarning, match=f"upgraded the model from ai.onnx opset {opset} to 18") as caught:
        out = assert_vmap_matches(m, 0, 0)
    # The result comes back at opset 11, the model's own; an opset-7 or -9 Upsample was upgraded
    # to a Resize with a roi input (11+), so that result lands at 11 and a notice says why.
    versions = {o.domain: o.version for o in out.opset_import}
    assert versions.get("", versions.get("ai.onnx")) == 11
    landed = [str(w.message) for w in caught if "is at ai.onnx opset 11, not the model's" in str(w.message)]
    assert bool(landed) == (opset != 11), landed


def test_opset_8_scan_is_refused() -> None:
    # The version converter does not upgrade Scan-8 (batch axis, sequence_lens) correctly.
    body = onnx.helper.make_graph(
        [node("Add", ["s_in", "x_in"], ["s_out"]), node("Identity", ["s_out"], ["y_out"])],
        "body",
        [onnx.helper.make_tensor_value_info(n, F, [2]) for n in ("s_in", "x_in")],
        [onnx.helper.make_tensor_value_info(n, F, [2]) for n in ("s_out", "y_out")],
    )
    scan = node("Scan", ["", "s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1)
    m = make_model([scan], [("s0", F, [1, 2]), ("xs", F, [1, 3, 2])], ["s", "ys"], opset=8)
    msg = vmap_error(m, in_axes=0)
    assert "opset is 8" in msg and "Scan" in msg and "Fix: re-export the model at opset 9" in msg, msg


def test_in_axes_accepts_boundary_values() -> None:
    m = make_model([node("Relu", ["xin"], ["out"])], [("xin", F, [2, 3])], ["out"])
    for axis in (-3, -1, 0, 2):
        assert_vmap_matches(m, axis, 0)
    for axis in (-3, 2):
        assert_vmap_matches(m, 0, axis)


# ---- batched inputs that decide a shape: the result would be ragged, so vmap must refuse -----

RAGGED_CASES: list[tuple[str, str, list[tuple[str, int, list[int]]], str, dict[str, object]]] = [
    ("Reshape", "shape_in", [("data", F, [2, 3]), ("shape_in", I64, [2])], "shape_in", {}),
    ("Expand", "shape_in", [("data", F, [3, 1]), ("shape_in", I64, [2])], "shape_in", {}),
    ("Tile", "reps", [("data", F, [2, 3]), ("reps", I64, [2])], "reps", {}),
    ("ConstantOfShape", "shape_in", [("shape_in", I64, [2])], "shape_in", {}),
    ("ReduceSum", "red_axes", [("data", F, [2, 3]), ("red_axes", I64, [1])], "red_axes", {}),
    # (Per-example starts and ends are batched when the window's length is shared:
    # test_dynamic_slices.py; per-example axes are not.)
    (
        "Slice",
        "sl_axes",
        [("data", F, [4, 3]), ("starts", I64, [1]), ("ends", I64, [1]), ("sl_axes", I64, [1])],
        "sl_axes",
        {},
    ),
    ("TopK", "kval", [("data", F, [2, 5]), ("kval", I64, [1])], "kval", {}),
    ("Pad", "pads", [("data", F, [2, 3]), ("pads", I64, [4])], "pads", {}),
    ("Squeeze", "sq_axes", [("data", F, [2, 1]), ("sq_axes", I64, [1])], "sq_axes", {}),
    ("Unsqueeze", "sq_axes", [("data", F, [2, 1]), ("sq_axes", I64, [1])], "sq_axes", {}),
    ("OneHot", "depth", [("idx", I64, [3]), ("depth", I64, []), ("vals", F, [2])], "depth", {}),
]


@pytest.mark.parametrize(
    ("op", "batched", "inputs", "name", "attrs"), RAGGED_CASES, ids=[f"{c[0]}-{c[1]}" for c in RAGGED_CASES]
)
def test_batched_shape_parameter_raises(
    op: str, batched: str, inputs: list[tuple[str, int, list[int]]], name: str, attrs: dict[str, object]
) -> None:
    node_name = f"the_{op.lower()}"
    outputs = ["values", "indices"] if op == "TopK" else ["out"]
    m = make_model(
        [node(op, [n for n, _, _ in inputs], outputs, name=node_name, **attrs)],
        inputs,
        outputs,
    )
    msg = vmap_error(m, in_axes={batched: 0})
    _assert_names_node(msg, op, node_name)
    assert name in msg, f"batched input {name!r} not named in: {msg}"


def test_nonzero_batched_raises_or_is_correct_for_equal_counts() -> None:
    """NonZero's per-example output length depends on values: vmap may refuse it, or (e.g. via a
    per-example loop) compute it; when every example has the same count it must then be right."""
    m = make_model([node("NonZero", ["data"], ["out"], name="nz")], [("data", F, [2, 3])], ["out"])

    def three_nonzeros(rng: np.random.Generator) -> np.ndarray:
        flat = np.zeros(6, np.float32)
        flat[rng.permutation(6)[:3]] = rng.uniform(1.0, 2.0, 3)
        return flat.reshape(2, 3)

    try:
        onnax.vmap(m, in_axes=0)
    except onnax.OnnaxError as err:
        _assert_names_node(str(err), "NonZero", "nz")
    else:
        assert_vmap_matches(m, 0, 0, gens={"data": three_nonzeros})
        assert_vmap_matches(m, 1, 1, gens={"data": three_nonzeros})


# ---- numerics of control flow when vmap does batch it (e.g. with a per-example Loop) ----------


def _if_model() -> onnx.ModelProto:
    then_g = helper.make_graph(
        [node("Mul", ["y", "y"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, [3])]
    )
    else_g = helper.make_graph(
        [node("Neg", ["y"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [3])]
    )
    return make_model(
        [node("If", ["c"], ["out"], name="branchy", then_branch=then_g, else_branch=else_g)],
        [("c", B, []), ("y", F, [3])],
        ["out"],
    )


def _loop_model() -> onnx.ModelProto:
    body = helper.make_graph(
        [node("Identity", ["cond_in"], ["cond_out"]), node("Mul", ["v_in", "k"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("cond_in", B, []),
            helper.make_tensor_value_info("v_in", F, [3]),
        ],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("v_out", F, [3])],
    )
    return make_model(
        [node("Loop", ["trip", "", "x"], ["out"], name="looper", body=body)],
        [("x", F, [3]), ("k", F, [3])],
        [("out", F, [3])],
        initializers={"trip": np.array(3, np.int64)},
    )


@pytest.mark.parametrize("in_axes", [(0, None), (0, 0), (None, 1)], ids=["cond", "cond_and_y", "y_in1"])
def test_if_batched_numerics(in_axes: tuple[int | None, int | None]) -> None:
    assert_vmap_matches(_if_model(), in_axes, 0)


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (-1, 0)], ids=["x", "captured_k", "both"])
def test_loop_batched_numerics_when_supported(in_axes: tuple[int | None, int | None]) -> None:
    m = _loop_model()
    try:
        onnax.vmap(m, in_axes=in_axes)
    except onnax.OnnaxError as err:
        _assert_names_node(str(err), "Loop", "looper")
        return
    assert_vmap_matches(m, in_axes, (1,))


def test_axis_name_clashing_with_existing_dim_param_raises() -> None:
    """axis_name 'N' on a model that already has a dim 'N' would declare batch == N."""
    m = make_model([node("Relu", ["xin"], ["out"])], [("xin", F, ["N", 3])], ["out"])
    msg = vmap_error(m, in_axes=0, axis_name="N")
    assert "axis_name" in msg and "'N'" in msg, msg
