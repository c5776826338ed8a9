"""``assert_symbolic_lengths`` / ``assert_embedded_weights`` (and ``onnax check --symbolic /
--embedded``, the same C++ checks): every transform keeps a symbolic batch dim symbolic and a
weight initializer embedded, and the generated models also pass ``validate`` (which must lift
the selected initializer to differentiate it)."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper
from oracles.validate_models import README_TRANSFORMS, embedded_loss, embedded_transform

testing = pytest.importorskip("onnax.testing")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def source() -> onnx.ModelProto:
    return embedded_loss()


@pytest.mark.parametrize("name", README_TRANSFORMS)
def test_transforms_keep_lengths_symbolic_and_weights_embedded(source, name: str) -> None:
    model = embedded_transform(source, name)
    axes = [0, 1] if name.startswith("vmap") else [0]  # vmap adds the batch axis in front
    testing.assert_symbolic_lengths(model, {"x": axes})
    testing.assert_embedded_weights(model, ["weight"])
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == (["batch", "N", ""] if name.startswith("vmap") else ["N", ""])
    for tangent in (i for i in model.graph.input if i.name == "x_tangent"):
        testing.assert_symbolic_lengths(model, {tangent.name: [0]})
    report = testing.validate(source, model, dims={"N": 4, "batch": 2})
    assert report.ok, report.format()


@pytest.mark.parametrize("name", README_TRANSFORMS)
def test_transforms_of_static_source_keep_batch_symbolic_and_weights_embedded(name: str) -> None:
    """x: [2]; the batch dim vmap adds must be symbolic, the weight stays an initializer."""
    static = embedded_loss(symbolic=False)
    model = embedded_transform(static, name)
    testing.assert_embedded_weights(model, ["weight"])
    if name.startswith("vmap"):
        testing.assert_symbolic_lengths(model, {"x": [0]})
        for out in model.graph.output:
            testing.assert_symbolic_lengths(model, {out.name: [0]})
    report = testing.validate(static, model, dims={"batch": 5})
    assert report.ok, report.format()


def test_baked_length_fails(source) -> None:
    baked = onnx.ModelProto()
    baked.CopyFrom(source)
    baked.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    with pytest.raises(AssertionError) as info:
        testing.assert_symbolic_lengths(baked, {"x": [0]})
    msg = str(info.value)
    assert "axis 0 of 'x' is baked to 3 (shape [3, 2])" in msg and "Fix:" in msg
    with pytest.raises(AssertionError, match=r"'y' is not a graph input or output; available: \[x, loss\]"):
        testing.assert_symbolic_lengths(source, {"y": [0]})
    with pytest.raises(AssertionError, match=r"axis 5 of 'x' is out of range for rank 2"):
        testing.assert_symbolic_lengths(source, {"x": [5]})
    testing.assert_symbolic_lengths(source, {"x": [-2]})  # negative axes count from the end


def test_weight_as_graph_input_fails(source) -> None:
    lifted = onnx.ModelProto()
    lifted.CopyFrom(source)
    del lifted.graph.initializer[:]
    lifted.graph.input.append(helper.make_tensor_value_info("weight", onnx.TensorProto.FLOAT, [2]))
    with pytest.raises(AssertionError, match="'weight' is a runtime graph input, expected an initializer"):
        testing.assert_embedded_weights(lifted, ["weight"])
    both = onnx.ModelProto()
    both.CopyFrom(source)
    both.graph.input.append(helper.make_tensor_value_info("weight", onnx.TensorProto.FLOAT, [2]))
    with pytest.raises(AssertionError, match="also a graph input"):
        testing.assert_embedded_weights(both, ["weight"])
    with pytest.raises(AssertionError, match=r"'bias' is neither .* initializers: \[weight\]"):
        testing.assert_embedded_weights(source, ["bias"])
    with pytest.raises(TypeError):
        testing.assert_embedded_weights(source, "weight")
