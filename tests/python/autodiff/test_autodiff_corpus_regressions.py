"""Regression tests for the onnax bugs the real-model corpus (conformance/corpus) found.

* Reverse mode of ``Conv`` with ``auto_pad=SAME_UPPER`` / ``SAME_LOWER`` (Flax's
  ``padding="SAME"``) was refused; pads are now computed (at run time when sizes are symbolic).
* ``vmap(grad(f))`` failed when ``f`` has a symbolic batch: the gradient's run-time
  unbroadcast ``ReduceSum`` had no rank for vmap; it is now declared as value_info.
* jax2onnx 0.17.1's value_info declares NHWC shapes for NCHW values: copied into a result, it
  made ONNX Runtime refuse the new nodes; contradicting declarations are now rewritten.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto
from oracles.ad_oracle import check_grad, check_per_example_grad, check_vjp_dot, make_ad_model, normal
from oracles.vmap_oracle import node

D = TensorProto.DOUBLE
ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "conformance" / "corpus" / "models"
if str(ROOT) not in sys.path:  # (the corpus runner, for its references)
    sys.path.insert(0, str(ROOT))


def conv_same(mode: str, x_shape: tuple[int, ...], strides: list[int]) -> onnx.ModelProto:
    w_shape = (3, x_shape[1], 3, 2)  # a non-square kernel: the two axes pad differently
    return make_ad_model(
        [
            node("Conv", ["x", "w"], ["y"], auto_pad=mode, strides=strides),
            node("Mul", ["y", "y"], ["sq"]),
            node("ReduceSum", ["sq"], ["loss"], keepdims=0),
        ],
        [("x", D, list(x_shape)), ("w", D, list(w_shape))],
        ["loss", "y"],
    )


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize(("x_shape", "strides"), [((1, 2, 5, 6), [1, 1]), ((2, 1, 5, 7), [2, 2])])
def test_conv_same_padding_reverse_mode(
    onnax, mode: str, x_shape: tuple[int, ...], strides: list[int]
) -> None:
    model = conv_same(mode, x_shape, strides)
    check_grad(model, inputs=["x", "w"], output="loss")
    check_vjp_dot(model, inputs=["x", "w"], outputs=["y"])


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_same_padding_with_symbolic_spatial_sizes(onnax, mode: str) -> None:
    """SAME pads are computed at run time, so a symbolic image height differentiates too."""
    model = make_ad_model(
        [
            node("Conv", ["x", "w"], ["y"], auto_pad=mode, strides=[2, 1]),
            node("Mul", ["y", "y"], ["sq"]),
            node("ReduceSum", ["sq"], ["loss"], keepdims=0),
        ],
        [("x", D, [1, 1, "h", 4]), ("w", D, [1, 1, 3, 3])],
        ["loss", "y"],
    )
    gens = {"x": normal((1, 1, 5, 4))}
    check_grad(model, inputs=["x", "w"], output="loss", gens=gens)
    check_vjp_dot(model, inputs=["x", "w"], outputs=["y"], gens=gens)


def test_per_example_grad_with_symbolic_batch(onnax) -> None:
    """The corpus's jax2onnx MLP (batch ``B`` symbolic, MSE loss): vmap over examples of such
    batches of its parameter gradient, against a loop of the gradient model."""
    model = onnx.load(CORPUS / "jax_mlp.onnx")
    params = [t.name for t in model.graph.initializer if len(t.dims) > 0]
    gens = {"x": normal((4, 8)), "y": normal((4, 4))}
    check_per_example_grad(model, in_axes=(0, 0), inputs=params, output="loss", gens=gens)


def _with_nhwc_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every rank-4 intermediate declared in NHWC order, as jax2onnx 0.17.1
    writes the value_info of NCHW values (the corpus drops those declarations on export)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    for vi in inferred.graph.value_info:
        dims = list(vi.type.tensor_type.shape.dim)
        if len(dims) != 4:
            continue
        wrong = onnx.ValueInfoProto()
        wrong.CopyFrom(vi)
        for i, p in enumerate([0, 2, 3, 1]):
            d = wrong.type.tensor_type.shape.dim[i]
            d.Clear()
            if dims[p].dim_param:
                d.dim_param = dims[p].dim_param
            else:
                d.dim_value = dims[p].dim_value
        bad.graph.value_info.append(wrong)
    return bad


@pytest.mark.parametrize("transform", ["vmap", "grad", "jvp", "vjp", "vmap_grad", "jvp_grad"])
def test_contradicting_value_info_is_not_copied(onnax, transform: str) -> None:
    """Declared shapes that contradict inference (ONNX Runtime runs such a source, warning) used
    to be copied into the result, where ONNX Runtime inferred the new nodes from them and
    refused the model ("Incompatible dimensions"). Every transform of the corpus CNN with such
    declarations must now match the JAX float64 references, as the clean export does."""
    from conformance.corpus import artifacts, runner

    onnx_path, manifest_path, arrays_path = artifacts.paths("jax_cnn")
    clean = onnx.load(onnx_path)
    bad = _with_nhwc_value_info(clean)
    assert len(bad.graph.value_info) > len(clean.graph.value_info)
    row = runner.run_case(
        transform, bad, artifacts.read_manifest(manifest_path), artifacts.read_arrays(arrays_path)
    )
    assert row.status == "passed", row.message
    assert row.max_error is not None and row.tolerance is not None and row.max_error <= row.tolerance
