"""The Python front holds large float initializers back from the core (onnax._models): the
results must be byte for byte what the core makes from the whole model, for every transform and
both model kinds, with the input untouched; notices must point at the caller's line."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import onnax
import onnx
import onnx_ir
import pytest
from onnax import _core
from onnax._models import _HOLD_BACK_MIN_ELEMENTS, transform
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def mlp() -> onnx.ModelProto:
    """x [4, 64] -> Gemm(W1 64x48) -> Relu -> MatMul(W2 48x32) + b2 -> ReduceSum: W1 and W2
    are held back; the bias, the small Reshape-free scale and an int64 table stay in."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 48)).astype(np.float32)
    w2 = rng.standard_normal((48, 32)).astype(np.float64).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "W1"),
        numpy_helper.from_array(w2, "W2"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b2"),
        numpy_helper.from_array(np.asarray(0.5, np.float32), "scale"),
        numpy_helper.from_array(np.arange(2048, dtype=np.int64), "table"),
    ]
    # W2 stored as float_data rather than raw_data: holding back must not care.
    stored = inits[1]
    stored.float_data.extend(w2.ravel().tolist())
    stored.ClearField("raw_data")
    nodes = [
        helper.make_node("Gemm", ["x", "W1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["m"]),
        helper.make_node("Add", ["m", "b2"], ["y"]),
        helper.make_node("Mul", ["y", "scale"], ["ys"]),
        helper.make_node("ReduceSum", ["ys"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", F, [4, 64])],
        [helper.make_tensor_value_info("loss", F, [])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def whole(model: onnx.ModelProto, name: str) -> bytes:
    """The core's result on the whole model (nothing held back)."""
    data = model.SerializeToString()
    if name == "vmap":
        return _core.vmap(data, 0, None, None, [0], "")  # type: ignore[no-any-return]
    if name == "jvp":
        return _core.jvp(data, ["x", "W1"], None)  # type: ignore[no-any-return]
    if name == "vjp":
        return _core.vjp(data, ["x", "W2"], None)  # type: ignore[no-any-return]
    return _core.grad(data, ["W1", "W2", "b2"], "loss")  # type: ignore[no-any-return]


def public(model: onnx.ModelProto | onnx_ir.Model, name: str) -> object:
    if name == "vmap":
        return onnax.vmap(model)
    if name == "jvp":
        return onnax.jvp(model, inputs=["x", "W1"])
    if name == "vjp":
        return onnax.vjp(model, inputs=["x", "W2"])
    return onnax.grad(model, inputs=["W1", "W2", "b2"], output="loss")


TRANSFORMS = ["vmap", "jvp", "vjp", "grad"]


def recording_vmap(seen: list[onnx.ModelProto]) -> Callable[[bytes], bytes]:
    """The core's vmap, recording each model it is given."""

    def call(data: bytes) -> bytes:
        seen.append(onnx.ModelProto.FromString(data))
        return _core.vmap(data, 0, None, None, [0], "")  # type: ignore[no-any-return]

    return call


def test_the_model_has_weights_to_hold_back() -> None:
    sizes = {t.name: int(np.prod(t.dims)) for t in mlp().graph.initializer}
    assert sizes["W1"] >= _HOLD_BACK_MIN_ELEMENTS and sizes["W2"] >= _HOLD_BACK_MIN_ELEMENTS
    assert sizes["b2"] < _HOLD_BACK_MIN_ELEMENTS


def test_the_core_sees_stand_ins_for_the_large_weights() -> None:
    model = mlp()
    seen: list[onnx.ModelProto] = []
    call = recording_vmap(seen)
    got = transform(model, call)
    assert len(seen) == 1
    stand_ins = {t.name for t in seen[0].graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert stand_ins == {"W1", "W2"}
    weights = sum(t.ByteSize() for t in model.graph.initializer if t.name in stand_ins)
    assert seen[0].ByteSize() < model.ByteSize() - weights + 200
    assert got.SerializeToString() == whole(model, "vmap")


def test_a_stand_in_outside_the_initializers_falls_back_to_the_whole_model() -> None:
    model = mlp()
    calls: list[bytes] = []

    def call(data: bytes) -> bytes:
        calls.append(data)
        out = _core.vmap(data, 0, None, None, [0], "")
        if len(calls) > 1:
            return out  # type: ignore[no-any-return]
        # A core that copied a stand-in elsewhere (say, into a doc string).
        result = onnx.ModelProto.FromString(out)
        result.doc_string = next(
            t.external_data[0].value for t in result.graph.initializer if t.external_data
        )
        return result.SerializeToString()

    got = transform(model, call)
    assert len(calls) == 2 and calls[1] == model.SerializeToString()
    assert got.SerializeToString() == whole(model, "vmap")


@pytest.mark.parametrize("name", TRANSFORMS)
def test_result_is_byte_identical_to_the_whole_model_path(name: str) -> None:
    model = mlp()
    before = model.SerializeToString()
    got = public(model, name)
    assert isinstance(got, onnx.ModelProto)
    assert got.SerializeToString() == whole(model, name)
    assert model.SerializeToString() == before  # the input is untouched
    # and the weights are the originals, storage included; the int64 table, read by no node,
    # is not in the result
    by_name = {t.name: t for t in got.graph.initializer}
    assert "table" not in by_name
    for t in model.graph.initializer:
        if t.name != "table":
            assert by_name[t.name] == t


@pytest.mark.parametrize("name", TRANSFORMS)
def test_onnx_ir_models_get_the_same_result(name: str) -> None:
    model = mlp()
    source = onnx_ir.serde.deserialize_model(model)
    before = onnx_ir.serde.serialize_model(source)
    got = public(source, name)
    assert isinstance(got, onnx_ir.Model)
    # The held-back weights are the source's tensor objects, shared rather than copied; the
    # source is unchanged.
    for w in ("W1", "W2"):
        assert got.graph.initializers[w].const_value is source.graph.initializers[w].const_value
    assert onnx_ir.serde.serialize_model(source) == before
    expected = onnx.ModelProto()
    expected.ParseFromString(whole(model, name))
    assert onnx_ir.serde.serialize_model(got) == onnx_ir.serde.serialize_model(
        onnx_ir.serde.deserialize_model(expected)
    )


def test_grad_values_with_held_back_weights() -> None:
    # The gradient of W1 against float64 central differences of the loss (numerical oracle).
    model = mlp()
    g = onnax.grad(model, inputs=["W1"], output="loss")
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    import onnxruntime as ort

    sess = ort.InferenceSession(g.SerializeToString(), providers=["CPUExecutionProvider"])
    grad_w1 = sess.run(["W1_grad"], {"x": x})[0]
    inits = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}

    def loss(w1: np.ndarray) -> float:
        h = np.maximum(x.astype(np.float64) @ w1, 0)
        return float(((h @ inits["W2"] + inits["b2"]) * inits["scale"]).sum())

    rng = np.random.default_rng(2)
    for _ in range(3):
        i, j = rng.integers(64), rng.integers(48)
        e = np.zeros((64, 48))
        e[i, j] = 1e-6
        fd = (loss(inits["W1"] + e) - loss(inits["W1"] - e)) / 2e-6
        assert abs(grad_w1[i, j] - fd) <= 1e-4 * max(1.0, abs(fd)), (i, j, grad_w1[i, j], fd)


def test_notices_point_at_the_callers_line() -> None:
    # An opset upgrade notice, raised while the core runs, is attributed to this file.
    model = mlp()
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", 13))
    model.graph.node[-1].CopyFrom(helper.make_node("ReduceSum", ["ys"], ["loss"], keepdims=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        onnax.vmap(model)
    upgraded = [w for w in caught if "upgraded the model" in str(w.message)]
    assert upgraded, [str(w.message) for w in caught]
    assert upgraded[0].filename == __file__


def shared_output_model() -> onnx.ModelProto:
    """A weight that is also a graph output: vmap renames it (it must return it batched)."""
    w = numpy_helper.from_array(np.arange(2048, dtype=np.float32).reshape(32, 64) / 2048, "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "shared_output",
        [helper.make_tensor_value_info("x", F, [4, 32])],
        [helper.make_tensor_value_info("y", F, [4, 64]), helper.make_tensor_value_info("W", F, [32, 64])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_a_renamed_weight_keeps_its_new_name() -> None:
    model = shared_output_model()
    expected = _core.vmap(model.SerializeToString(), 0, None, None, [0], "")
    assert "W" not in {t.name for t in onnx.ModelProto.FromString(expected).graph.initializer}  # (renamed)
    assert onnax.vmap(model).SerializeToString() == expected
    # onnx_ir: the renamed tensor is copied, not shared (onnx_ir would rename the source's).
    source = onnx_ir.serde.deserialize_model(model)
    got = onnax.vmap(source)
    assert onnx_ir.serde.serialize_model(got) == onnx_ir.serde.serialize_model(
        onnx_ir.serde.deserialize_model(onnx.ModelProto.FromString(expected))
    )
    tensor = source.graph.initializers["W"].const_value
    assert tensor is not None and tensor.name == "W"
    x = np.random.default_rng(0).standard_normal((3, 4, 32)).astype(np.float32)
    import onnxruntime as ort

    sess = ort.InferenceSession(onnax.vmap(model).SerializeToString(), providers=["CPUExecutionProvider"])
    y, w = sess.run(None, {"x": x})
    weight = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(y, x @ weight, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(w, np.broadcast_to(weight, (3, 32, 64)))


def test_a_weight_that_is_also_a_graph_input() -> None:
    # (IR < 4 style: the initializer is the input's default value.)
    model = mlp()
    model.graph.input.append(helper.make_tensor_value_info("W1", F, [64, 48]))
    for name in TRANSFORMS:
        got = public(model, name)
        assert isinstance(got, onnx.ModelProto)
        assert got.SerializeToString() == whole(model, name), name


def test_a_reshaped_stand_in_falls_back_to_the_whole_model() -> None:
    model = mlp()
    calls: list[bytes] = []

    def call(data: bytes) -> bytes:
        calls.append(data)
        result = onnx.ModelProto.FromString(_core.vmap(data, 0, None, None, [0], ""))
        if len(calls) == 1:  # a core that changed a stand-in's shape
            stand_in = next(t for t in result.graph.initializer if t.external_data)
            stand_in.dims[0] += 1
        return result.SerializeToString()

    got = transform(model, call)
    assert len(calls) == 2
    assert got.SerializeToString() == whole(model, "vmap")


def test_fields_of_a_newer_schema_survive() -> None:
    # A model-level field the onnx package does not know (number 999): the core keeps it, so
    # the result must too.
    model = onnx.ModelProto.FromString(mlp().SerializeToString() + bytes([0xF8, 0x3E, 0x01]))
    got = onnax.vmap(model)
    assert got.SerializeToString() == whole(model, "vmap")
    assert bytes([0xF8, 0x3E, 0x01]) in got.SerializeToString()


def test_onnx_ir_models_are_serialized_with_stand_ins() -> None:
    # The core gets stand-ins straight from onnx_ir's serializer: the weights' bytes are never
    # copied into a proto, and the result is the whole-model result.
    model = mlp()
    source = onnx_ir.serde.deserialize_model(model)
    seen: list[onnx.ModelProto] = []
    call = recording_vmap(seen)
    got = transform(source, call)
    assert len(seen) == 1
    stand_ins = {t.name: t for t in seen[0].graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert set(stand_ins) == {"W1", "W2"}
    assert list(stand_ins["W1"].dims) == [64, 48] and stand_ins["W1"].data_type == F
    assert not any(t.raw_data or t.float_data for t in stand_ins.values())
    full = onnx_ir.serde.serialize_model(source)
    weights = sum(t.ByteSize() for t in full.graph.initializer if t.name in stand_ins)
    assert seen[0].ByteSize() < full.ByteSize() - weights + 200
    expected = onnx_ir.serde.deserialize_model(onnx.ModelProto.FromString(whole(model, "vmap")))
    assert onnx_ir.serde.serialize_model(got) == onnx_ir.serde.serialize_model(expected)


def test_onnx_ir_weight_annotations_survive_holding_back() -> None:
    # A held-back weight's value keeps its doc string, metadata and quantization annotation in
    # what the core sees (they are the value's, not the tensor's).
    model = mlp()
    source = onnx_ir.serde.deserialize_model(model)
    w1 = source.graph.initializers["W1"]
    w1.doc_string = "first layer"
    w1.metadata_props["origin"] = "test"
    w1.meta["quant_parameter_tensor_names"] = {"SCALE_TENSOR": "scale"}
    seen: list[onnx.ModelProto] = []
    call = recording_vmap(seen)
    got = transform(source, call)
    full = onnx_ir.serde.serialize_model(source)
    light = seen[0]
    assert [vi for vi in light.graph.value_info] == [vi for vi in full.graph.value_info]
    assert light.graph.quantization_annotation == full.graph.quantization_annotation
    assert len(light.graph.quantization_annotation) == 1
    expected = onnx_ir.serde.deserialize_model(
        onnx.ModelProto.FromString(_core.vmap(full.SerializeToString(), 0, None, None, [0], ""))
    )
    assert onnx_ir.serde.serialize_model(got) == onnx_ir.serde.serialize_model(expected)
