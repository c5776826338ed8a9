"""Interface tests for ``onnax.jvp``, ``onnax.vjp`` and ``onnax.grad``: names, order, default
selections, initializers, composition defaults, diagnostics, source isolation, determinism,
model kinds and checker validity."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from oracles import ad_oracle as ad
from oracles.ad_oracle import ad_error, check_grad, check_jvp, check_vjp_dot, run, runtime_inputs
from oracles.ad_oracle import make_ad_model as make_model
from oracles.vmap_oracle import node, to_proto

onnax = pytest.importorskip("onnax")

F = TensorProto.FLOAT
D = TensorProto.DOUBLE
I64 = TensorProto.INT64


def two_output_model(elem: int = D) -> onnx.ModelProto:
    """a = x * w; b = sin(x) + w; s = ReduceSum(a) (scalar); also an int input k."""
    return make_model(
        [
            node("Mul", ["x", "w"], ["a"]),
            node("Sin", ["x"], ["sx"]),
            node("Add", ["sx", "w"], ["b"]),
            node("ReduceSum", ["a"], ["s"], keepdims=0),
            node("Cast", ["k"], ["kf"], to=elem),
            node("Mul", ["s", "kf"], ["sk"]),
        ],
        [("x", elem, [3]), ("k", I64, []), ("w", elem, [3])],
        ["a", "b", "s", "sk"],
    )


def param_model() -> onnx.ModelProto:
    """loss = ReduceSum(tanh(x @ weight + bias)^2), weight/bias initializers."""
    rng = np.random.default_rng(1)
    return make_model(
        [
            node("MatMul", ["x", "weight"], ["h"]),
            node("Add", ["h", "bias"], ["z"]),
            node("Tanh", ["z"], ["t"]),
            node("Mul", ["t", "t"], ["tt"]),
            node("ReduceSum", ["tt"], ["loss"], keepdims=0),
        ],
        [("x", D, [2, 3])],
        ["loss"],
        initializers={"weight": rng.standard_normal((3, 2)), "bias": rng.standard_normal(2)},
    )


def names(vis: Any) -> list[str]:
    return [v.name for v in vis]


def input_names(model: onnx.ModelProto) -> list[str]:
    return names(runtime_inputs(model))


def meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


FEEDS = {
    "x": np.array([0.3, -1.2, 0.8]),
    "w": np.array([1.5, 0.4, -0.7]),
    "k": np.array(2, dtype=np.int64),
}

# --------------------------------------------------------------------------------------------
# Names and order


def test_jvp_names_and_order_default() -> None:
    jm = ad.jvp(two_output_model())
    assert input_names(jm) == ["x", "k", "w", "x_tangent", "w_tangent"]
    assert names(jm.graph.output) == [
        "a",
        "b",
        "s",
        "sk",
        "a_tangent",
        "b_tangent",
        "s_tangent",
        "sk_tangent",
    ]


def test_jvp_names_follow_selection_order() -> None:
    jm = ad.jvp(two_output_model(), inputs=["w", "x"], outputs=["s", "a"])
    assert input_names(jm) == ["x", "k", "w", "w_tangent", "x_tangent"]
    assert names(jm.graph.output) == ["a", "b", "s", "sk", "s_tangent", "a_tangent"]
    out = run(jm, {**FEEDS, "w_tangent": np.array([1.0, 0.0, 0.0]), "x_tangent": np.zeros(3)})
    # d s / d w_0 = x_0
    np.testing.assert_allclose(out["s_tangent"], FEEDS["x"][0])
    np.testing.assert_allclose(out["a_tangent"], [FEEDS["x"][0], 0.0, 0.0])


def test_jvp_tangent_types_match_primal() -> None:
    for elem in (F, D):
        jm = ad.jvp(two_output_model(elem))
        by_name = {v.name: v for v in jm.graph.input}
        for n in ("x", "w"):
            assert by_name[f"{n}_tangent"].type == by_name[n].type
        outs = {o.name: o for o in jm.graph.output}
        for n in ("a", "b", "s"):
            assert outs[f"{n}_tangent"].type.tensor_type.elem_type == elem


def test_vjp_names_and_order() -> None:
    vm = ad.vjp(two_output_model(), inputs=["w", "x"], outputs=["s", "b"])
    assert input_names(vm) == ["x", "k", "w", "s_cotangent", "b_cotangent"]
    assert names(vm.graph.output) == ["a", "b", "s", "sk", "w_cotangent", "x_cotangent"]
    by_name = {v.name: v for v in vm.graph.input}
    assert len(by_name["s_cotangent"].type.tensor_type.shape.dim) == 0
    assert [d.dim_value for d in by_name["b_cotangent"].type.tensor_type.shape.dim] == [3]
    out = run(vm, {**FEEDS, "s_cotangent": np.array(2.0), "b_cotangent": np.array([1.0, 2.0, 3.0])})
    np.testing.assert_allclose(out["w_cotangent"], 2.0 * FEEDS["x"] + [1.0, 2.0, 3.0])
    np.testing.assert_allclose(out["x_cotangent"], 2.0 * FEEDS["w"] + np.cos(FEEDS["x"]) * [1.0, 2.0, 3.0])


def test_vjp_default_selections() -> None:
    vm = ad.vjp(two_output_model())
    assert input_names(vm) == ["x", "k", "w", "a_cotangent", "b_cotangent", "s_cotangent", "sk_cotangent"]
    assert names(vm.graph.output) == ["a", "b", "s", "sk", "x_cotangent", "w_cotangent"]


def test_grad_names_and_order() -> None:
    gm = ad.grad(two_output_model(), inputs=["w", "x"], output="s")
    assert input_names(gm) == ["x", "k", "w"]
    assert names(gm.graph.output) == ["a", "b", "s", "sk", "w_grad", "x_grad"]
    out = run(gm, FEEDS)
    np.testing.assert_allclose(out["w_grad"], FEEDS["x"])
    np.testing.assert_allclose(out["x_grad"], FEEDS["w"])


def test_grad_default_output_is_the_only_scalar() -> None:
    gm = ad.grad(param_model())
    assert names(gm.graph.output) == ["loss", "x_grad"]


def test_name_collisions_are_resolved() -> None:
    m = make_model(
        [node("Mul", ["x", "x_tangent"], ["y"]), node("Identity", ["y"], ["y_tangent"])],
        [("x", D, [2]), ("x_tangent", D, [2])],
        ["y", "y_tangent"],
    )
    jm = ad.jvp(m, inputs=["x"], outputs=["y"])
    ins = input_names(jm)
    outs = names(jm.graph.output)
    assert ins[:2] == ["x", "x_tangent"] and len(ins) == 3
    assert outs[:2] == ["y", "y_tangent"] and len(outs) == 3
    assert len(set(ins + outs)) == len(ins + outs)
    new_in, new_out = ins[2], outs[2]
    assert new_in.startswith("x_tangent") and new_in != "x_tangent"
    assert new_out.startswith("y_tangent") and new_out != "y_tangent"
    existing = {v for n in m.graph.node for v in list(n.input) + list(n.output)}
    assert new_in not in existing and new_out not in existing
    out = run(
        jm, {"x": np.array([1.0, 2.0]), "x_tangent": np.array([3.0, 4.0]), new_in: np.array([1.0, 1.0])}
    )
    np.testing.assert_allclose(out[new_out], [3.0, 4.0])
    check_jvp(m, inputs=["x"], outputs=["y"])


def test_grad_name_collision_with_existing_output() -> None:
    m = make_model(
        [node("Mul", ["x", "x"], ["x_grad"]), node("ReduceSum", ["x_grad"], ["loss"], keepdims=0)],
        [("x", D, [2])],
        ["loss", "x_grad"],
    )
    gm = ad.grad(m, output="loss")
    outs = names(gm.graph.output)
    assert outs[:2] == ["loss", "x_grad"] and len(outs) == 3
    assert outs[2] != "x_grad" and outs[2].startswith("x_grad")
    out = run(gm, {"x": np.array([1.0, -2.0])})
    np.testing.assert_allclose(out[outs[2]], [2.0, -4.0])


def _all_node_names(graph: onnx.GraphProto) -> list[str]:
    out = []
    for n in graph.node:
        out.append(n.name)
        for a in n.attribute:
            for g in [a.g] if a.HasField("g") else list(a.graphs):
                out.extend(_all_node_names(g))
    return out


def test_generated_node_names_are_unique_beside_source_names_like_them() -> None:
    # Generated nodes take their first output's name (y_tangent_mul, ...); source nodes already
    # named so keep their names and the generated ones move aside.
    nodes = [
        node("Tanh", ["x"], ["y"]),
        node("Sigmoid", ["y"], ["z"]),
        node("ReduceSum", ["z"], ["loss"], keepdims=0),
    ]
    taken = ["y_tangent_mul", "z_tangent_sub", "loss_ct_shape", "z_ct_mul"]
    for n, name in zip(nodes, taken[:3], strict=True):
        n.name = name
    m = make_model(nodes, [("x", D, [2, 3])], [("loss", D, [])])
    for result in (ad.jvp(m), ad.vjp(m), ad.grad(m), onnax.vmap(ad.grad(m), in_axes=0)):
        names = [n for n in _all_node_names(result.graph) if n]
        assert len(names) == len(set(names)), sorted(names)
    for result in (ad.jvp(m), ad.vjp(m), ad.grad(m)):  # (vmap renames the nodes it rewrites)
        assert set(taken[:3]) <= set(_all_node_names(result.graph))
    check_grad(m, None, "loss")


# --------------------------------------------------------------------------------------------
# Default selections and initializers


def test_default_inputs_are_float_runtime_inputs_not_initializers() -> None:
    m = param_model()
    jm = ad.jvp(m)
    assert input_names(jm) == ["x", "x_tangent"]
    assert {t.name for t in jm.graph.initializer} >= {"weight", "bias"}


def test_default_inputs_include_float_and_double() -> None:
    m = make_model(
        [node("Cast", ["a"], ["ad"], to=D), node("Mul", ["ad", "b"], ["y"])],
        [("a", F, [2]), ("i", I64, [2]), ("b", D, [2])],
        [("y", D, [2])],
    )
    jm = ad.jvp(m)
    assert input_names(jm) == ["a", "i", "b", "a_tangent", "b_tangent"]
    tan = {v.name: v.type.tensor_type.elem_type for v in jm.graph.input}
    assert tan["a_tangent"] == F and tan["b_tangent"] == D


def test_initializer_selected_by_name_keeps_stored_value() -> None:
    m = param_model()
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    jm = ad.jvp(m, inputs=["weight"])
    assert input_names(jm) == ["x", "weight_tangent"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in jm.graph.initializer}
    np.testing.assert_array_equal(inits["weight"], stored["weight"])
    np.testing.assert_array_equal(inits["bias"], stored["bias"])
    x = np.random.default_rng(0).standard_normal((2, 3))
    out = run(jm, {"x": x, "weight_tangent": np.zeros((3, 2))})
    expected = np.sum(np.tanh(x @ stored["weight"] + stored["bias"]) ** 2)
    np.testing.assert_allclose(out["loss"], expected)
    np.testing.assert_allclose(out["loss_tangent"], 0.0)
    check_jvp(m, inputs=["weight"])
    check_vjp_dot(m, inputs=["bias", "weight", "x"])
    check_grad(m, inputs=["weight", "bias"], output="loss")


def test_grad_wrt_initializers_by_name() -> None:
    gm = ad.grad(param_model(), inputs=["bias", "weight"])
    assert names(gm.graph.output) == ["loss", "bias_grad", "weight_grad"]
    assert input_names(gm) == ["x"]


# --------------------------------------------------------------------------------------------
# Composition defaults and provenance


def test_jvp_of_grad_keeps_loss_and_gradient_and_appends_hvp() -> None:
    gm = ad.grad(param_model(), inputs=["weight"])
    hm = ad.jvp(gm, inputs=["weight"])
    assert input_names(hm) == ["x", "weight_tangent"]
    assert names(hm.graph.output) == ["loss", "weight_grad", "weight_grad_tangent"]
    # The HVP is not the loss tangent: check it against FD of the gradient.
    from oracles.ad_oracle import check_hvp

    check_hvp(param_model(), ["weight"], ["weight"], "loss")


def test_jvp_of_jvp_defaults_to_generated_tangents() -> None:
    m = make_model([node("Sin", ["x"], ["y"])], [("x", D, [3])], ["y"])
    j1 = ad.jvp(m)
    j2 = ad.jvp(j1, inputs=["x"])
    assert names(j2.graph.output) == ["y", "y_tangent", "y_tangent_tangent"]
    tangent_in = input_names(j2)[-1]
    assert tangent_in == "x_tangent_tangent"  # (paired with the output y_tangent_tangent)
    x = FEEDS["x"]
    res = run(j2, {"x": x, "x_tangent": np.full(3, 2.0), tangent_in: np.full(3, 3.0)})
    np.testing.assert_allclose(res["y_tangent_tangent"], -np.sin(x) * 6.0)


def test_second_order_names_say_what_they_are() -> None:
    # f(w) = w^3: grad of grad is the second derivative, named for it; the chain's record maps
    # every generated name to its source value.
    m = make_model(
        [node("Mul", ["w", "w"], ["ww"]), node("Mul", ["ww", "w"], ["loss"])], [("w", D, [])], ["loss"]
    )
    g2 = ad.grad(ad.grad(m), inputs=["w"], output="w_grad")
    assert names(g2.graph.output) == ["loss", "w_grad", "w_grad_grad"]
    g3 = ad.grad(g2, inputs=["w"], output="w_grad_grad")
    assert names(g3.graph.output)[-1] == "w_grad_grad_grad"
    np.testing.assert_allclose(run(g3, {"w": np.array(1.5)})["w_grad_grad_grad"], 6.0)
    w = np.array(1.5)
    np.testing.assert_allclose(run(g2, {"w": w})["w_grad_grad"], 6 * w)
    steps = json.loads(meta(g2)["onnax.transforms"])
    assert [s["derivatives"] for s in steps] == [["w_grad"], ["w_grad_grad"]]
    assert steps[1]["inputs"] == ["w"] and steps[1]["outputs"] == ["w_grad"] and steps[1]["seeds"] == []
    v = ad.vjp(m)
    assert json.loads(meta(v)["onnax.transforms"])[0]["seeds"] == ["loss_cotangent"]


def test_jvp_of_vjp_defaults_to_generated_cotangents() -> None:
    m = make_model([node("Sin", ["x"], ["y"])], [("x", D, [3])], ["y"])
    vm = ad.vjp(m)
    jm = ad.jvp(vm, inputs=["x"])
    assert names(jm.graph.output) == ["y", "x_cotangent", "x_cotangent_tangent"]


def test_derivative_outputs_are_recorded() -> None:
    gm = ad.grad(param_model(), inputs=["weight", "bias"])
    md = meta(gm)
    assert json.loads(md["onnax.derivative_outputs"]) == ["weight_grad", "bias_grad"]
    jm = ad.jvp(two_output_model(), outputs=["s"])
    assert json.loads(meta(jm)["onnax.derivative_outputs"]) == ["s_tangent"]


def test_explicit_outputs_override_derivative_default() -> None:
    gm = ad.grad(param_model(), inputs=["weight"])
    hm = ad.jvp(gm, inputs=["weight"], outputs=["loss"])
    assert names(hm.graph.output) == ["loss", "weight_grad", "loss_tangent"]


# --------------------------------------------------------------------------------------------
# Errors


def _assert_fix(msg: str, mode: str) -> None:
    assert mode in msg, f"message does not name the mode {mode!r}: {msg}"
    assert "Fix" in msg, f"message gives no remedy: {msg}"


@pytest.mark.parametrize("mode", ["jvp", "vjp", "grad"])
def test_unknown_input_lists_available_names(mode: str) -> None:
    kwargs: dict[str, Any] = {"inputs": ["nope"]}
    if mode == "grad":
        kwargs["output"] = "s"
    msg = ad_error(getattr(ad, mode), two_output_model(), **kwargs)
    _assert_fix(msg, mode)
    assert "'nope'" in msg
    for name in ("x", "k", "w"):
        assert f"'{name}'" in msg, f"available input {name!r} not listed: {msg}"


def test_unknown_input_lists_initializers() -> None:
    msg = ad_error(onnax.jvp, param_model(), inputs=["weights"])
    assert "'weights'" in msg and "'weight'" in msg and "'bias'" in msg and "'x'" in msg, msg


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
def test_unknown_output_lists_available_names(mode: str) -> None:
    msg = ad_error(getattr(ad, mode), two_output_model(), outputs=["nope"])
    _assert_fix(msg, mode)
    assert "'nope'" in msg
    for name in ("a", "b", "s", "sk"):
        assert f"'{name}'" in msg, f"available output {name!r} not listed: {msg}"


def test_grad_unknown_output_lists_available_names() -> None:
    msg = ad_error(onnax.grad, two_output_model(), output="nope")
    _assert_fix(msg, "grad")
    assert "'nope'" in msg and "'s'" in msg, msg


@pytest.mark.parametrize("mode", ["jvp", "vjp", "grad"])
def test_int_input_selected(mode: str) -> None:
    kwargs: dict[str, Any] = {"inputs": ["x", "k"]}
    if mode == "grad":
        kwargs["output"] = "s"
    msg = ad_error(getattr(ad, mode), two_output_model(), **kwargs)
    _assert_fix(msg, mode)
    assert "'k'" in msg and "int64" in msg.lower(), msg


def test_int_output_selected() -> None:
    m = make_model(
        [node("Mul", ["x", "x"], ["y"]), node("Shape", ["y"], ["shp"])],
        [("x", D, [3])],
        ["y", "shp"],
    )
    for mode in ("jvp", "vjp"):
        msg = ad_error(getattr(ad, mode), m, outputs=["shp"])
        _assert_fix(msg, mode)
        assert "'shp'" in msg, msg


def test_grad_of_non_scalar_output() -> None:
    msg = ad_error(onnax.grad, two_output_model(), output="a")
    _assert_fix(msg, "grad")
    assert "'a'" in msg and "[3]" in msg, msg


def test_grad_without_output_and_several_scalars() -> None:
    msg = ad_error(onnax.grad, two_output_model())
    _assert_fix(msg, "grad")
    assert "'s'" in msg and "'sk'" in msg, msg


def test_grad_without_any_scalar_output() -> None:
    m = make_model([node("Sin", ["x"], ["y"])], [("x", D, [3])], ["y"])
    msg = ad_error(onnax.grad, m)
    _assert_fix(msg, "grad")
    assert "'y'" in msg, msg


def test_duplicate_selection() -> None:
    msg = ad_error(onnax.jvp, two_output_model(), inputs=["x", "x"])
    _assert_fix(msg, "jvp")
    assert "'x'" in msg


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
def test_empty_selection_lists_the_choices(mode: str) -> None:
    # An explicit empty list is a selection of nothing, not "no float inputs in the model".
    msg = ad_error(getattr(onnax, mode), two_output_model(), inputs=[])
    _assert_fix(msg, mode)
    assert "inputs=[] selects nothing" in msg and "'x'" in msg, msg
    msg = ad_error(getattr(onnax, mode), two_output_model(), outputs=[])
    _assert_fix(msg, mode)
    assert "outputs=[] selects nothing" in msg and "'s'" in msg, msg


def test_string_instead_of_sequence_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        onnax.jvp(two_output_model(), inputs="x")
    with pytest.raises(TypeError):
        onnax.vjp(two_output_model(), outputs="s")


@pytest.mark.parametrize("mode", ["jvp", "vjp", "grad"])
def test_unsupported_op_on_active_path_names_op_and_node(mode: str) -> None:
    m = make_model(
        [
            node("Foo", ["x"], ["f"], name="my_custom_foo", domain="my.domain"),
            node("ReduceSum", ["f"], ["y"], keepdims=0),
        ],
        [("x", D, [3])],
        [("y", D, [])],
        extra_opsets={"my.domain": 1},
        infer=False,
    )
    msg = ad_error(getattr(ad, mode), m)
    _assert_fix(msg, mode)
    assert "Foo" in msg and "my_custom_foo" in msg, msg


@pytest.mark.parametrize("mode", ["jvp", "vjp", "grad"])
def test_random_op_on_active_path_names_op_and_node(mode: str) -> None:
    m = make_model(
        [
            node("RandomNormalLike", ["x"], ["r"], name="noise_node"),
            node("Add", ["r", "x"], ["s"]),
            node("ReduceSum", ["s"], ["y"], keepdims=0),
        ],
        [("x", D, [3])],
        ["y"],
    )
    msg = ad_error(getattr(ad, mode), m)
    _assert_fix(msg, mode)
    assert "RandomNormalLike" in msg and "noise_node" in msg, msg


def test_unsupported_op_off_the_active_path_is_fine() -> None:
    # the custom op only sees an input that is not differentiated
    m = make_model(
        [
            node("Foo", ["c"], ["f"], name="my_custom_foo", domain="my.domain"),
            node("Mul", ["x", "x"], ["y"]),
        ],
        [("x", D, [3]), ("c", D, [3])],
        [("y", D, [3]), ("f", D, [3])],
        extra_opsets={"my.domain": 1},
        infer=False,
    )
    jm = to_proto(ad.jvp(m, inputs=["x"], outputs=["y"]))
    assert names(jm.graph.output) == ["y", "f", "y_tangent"]
    assert any(n.op_type == "Foo" for n in jm.graph.node)


def test_dropout_in_training_mode_is_consistent_or_refused() -> None:
    """A training-mode Dropout is random: either refused with a diagnostic naming it, or its
    derivative uses the same mask as the primal (grad == mask / (1 - ratio))."""
    m = make_model(
        [
            node("Dropout", ["x", "r", "t"], ["y", "mask"], name="train_dropout", seed=3),
            node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        [("x", D, [64])],
        ["loss", "mask"],
        initializers={"r": np.array(0.5), "t": np.array(True)},
    )
    try:
        gm = to_proto(ad.grad(m, output="loss"))
    except onnax.OnnaxError as err:
        assert "Dropout" in str(err) and "train_dropout" in str(err), str(err)
        return
    x = np.linspace(0.5, 2.0, 64)
    out = run(gm, {"x": x})
    mask = out["mask"].astype(np.float64)
    np.testing.assert_allclose(out["loss"], np.sum(x * mask * 2.0))
    np.testing.assert_allclose(out["x_grad"], mask * 2.0)


# --------------------------------------------------------------------------------------------
# Source isolation, determinism, model kinds, checker


TRANSFORMS = [
    ("jvp", lambda m: onnax.jvp(m)),
    ("jvp-sel", lambda m: onnax.jvp(m, inputs=["w"], outputs=["b", "s"])),
    ("vjp", lambda m: onnax.vjp(m)),
    ("vjp-sel", lambda m: onnax.vjp(m, inputs=["x"], outputs=["s"])),
    ("grad", lambda m: onnax.grad(m, output="s")),
    ("hvp", lambda m: onnax.jvp(onnax.grad(m, output="s", inputs=["w"]), inputs=["w"])),
]


@pytest.mark.parametrize("fn", [t[1] for t in TRANSFORMS], ids=[t[0] for t in TRANSFORMS])
def test_source_unchanged_and_deterministic(fn: Any) -> None:
    m = two_output_model()
    before = m.SerializeToString()
    r1 = fn(m)
    assert m.SerializeToString() == before, "transform mutated its source"
    r2 = fn(m)
    assert isinstance(r1, onnx.ModelProto)
    assert r1.SerializeToString() == r2.SerializeToString(), "two runs are not byte-identical"


@pytest.mark.parametrize("fn", [t[1] for t in TRANSFORMS], ids=[t[0] for t in TRANSFORMS])
def test_onnx_ir_in_onnx_ir_out(fn: Any) -> None:
    import onnx_ir as ir

    proto = two_output_model()
    model = ir.serde.deserialize_model(proto)
    before = ir.serde.serialize_model(model).SerializeToString()
    r = fn(model)
    assert isinstance(r, ir.Model), f"onnx_ir.Model in, {type(r).__name__} out"
    assert ir.serde.serialize_model(model).SerializeToString() == before, "onnx_ir source mutated"
    assert r is not model
    from_proto = to_proto(fn(proto))
    rp = to_proto(r)
    assert input_names(rp) == input_names(from_proto)
    assert names(rp.graph.output) == names(from_proto.graph.output)
    feeds = dict(FEEDS)
    rng = np.random.default_rng(0)
    for v in runtime_inputs(rp)[3:]:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        feeds[v.name] = rng.standard_normal(shape)
    a, b = run(rp, feeds), run(from_proto, feeds)
    for k in a:
        np.testing.assert_allclose(a[k], b[k])


@pytest.mark.parametrize("fn", [t[1] for t in TRANSFORMS], ids=[t[0] for t in TRANSFORMS])
def test_result_passes_full_check(fn: Any) -> None:
    for m in (two_output_model(D), two_output_model(F)):
        onnx.checker.check_model(to_proto(fn(m)), full_check=True)


def test_full_check_param_model_grad_and_hvp() -> None:
    gm = ad.grad(param_model(), inputs=["weight", "bias", "x"])
    onnx.checker.check_model(gm, full_check=True)
    onnx.checker.check_model(ad.jvp(gm, inputs=["weight"]), full_check=True)
    onnx.checker.check_model(ad.vjp(param_model(), inputs=["weight"]), full_check=True)


def test_source_initializers_are_not_converted_to_inputs() -> None:
    m = param_model()
    for r in (
        ad.jvp(m, inputs=["weight"]),
        ad.vjp(m, inputs=["weight"]),
        ad.grad(m, inputs=["bias"]),
    ):
        assert {t.name for t in r.graph.initializer} >= {"weight", "bias"}
        assert "weight" not in names(r.graph.input) or "weight" in {t.name for t in r.graph.initializer}


def test_opset_and_ir_version_preserved() -> None:
    for opset in (18, 21, 24):
        m = make_model(
            [node("Tanh", ["x"], ["t"]), node("ReduceSum", ["t"], ["y"], keepdims=0)],
            [("x", D, [3])],
            ["y"],
            opset=opset,
        )
        for r in (ad.jvp(m), ad.vjp(m), ad.grad(m)):
            ops = {o.domain: o.version for o in r.opset_import}
            assert ops.get("", ops.get("ai.onnx")) == opset
            assert r.ir_version == m.ir_version
