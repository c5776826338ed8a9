"""Models for the validation tests: the seed README's linear_loss (built by
``examples/linear_loss.py``), its six transforms as the README writes them, a variant with a
symbolic batch dim and the weight as an initializer, and deliberately broken models."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT / "examples") not in sys.path:
    sys.path.insert(0, str(ROOT / "examples"))

F = TensorProto.FLOAT
README_TRANSFORMS = ("vmap", "grad", "jvp", "vjp", "vmap_grad", "hvp")


def linear_loss() -> onnx.ModelProto:
    import onnx_ir as ir
    from linear_loss import build_linear_loss

    return ir.serde.serialize_model(build_linear_loss())


def readme_transforms(model: onnx.ModelProto) -> dict[str, onnx.ModelProto]:
    """The README's calls (plus vmap of the forward), on a ModelProto."""
    from onnax import grad, jvp, vjp, vmap

    gradient = grad(model, inputs=["weight"], output="loss")
    return {
        "vmap": vmap(model, in_axes=(0, None)),
        "grad": gradient,
        "jvp": jvp(model, inputs=["x"], outputs=["loss"]),
        "vjp": vjp(model, inputs=["weight"], outputs=["loss"]),
        "vmap_grad": vmap(gradient, in_axes=(0, None)),
        "hvp": jvp(gradient, inputs=["weight"]),
    }


def embedded_loss(symbolic: bool = True) -> onnx.ModelProto:
    """loss = sum((x * weight)^2) with x: [N, 2] (symbolic N; [2] when not ``symbolic``) and
    weight an initializer."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "weight"], ["prediction"], name="prediction"),
            helper.make_node("Mul", ["prediction", "prediction"], ["squared"], name="squared"),
            helper.make_node("ReduceSum", ["squared"], ["loss"], keepdims=0, name="loss"),
        ],
        "embedded_loss",
        [helper.make_tensor_value_info("x", F, ["N", 2] if symbolic else [2])],
        [helper.make_tensor_value_info("loss", F, [])],
        initializer=[numpy_helper.from_array(np.array([0.5, -1.5], np.float32), name="weight")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def embedded_transform(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """One transform (or composition) touching the input ``x`` and the weight initializer."""
    from onnax import grad, jvp, vjp, vmap

    calls = {
        "vmap": lambda: vmap(model, in_axes=0),
        "grad": lambda: grad(model, inputs=["weight"]),
        "jvp": lambda: jvp(model, inputs=["x", "weight"]),
        "vjp": lambda: vjp(model, inputs=["x", "weight"]),
        "vmap_grad": lambda: vmap(grad(model, inputs=["weight"]), in_axes=0),
        "hvp": lambda: jvp(grad(model, inputs=["weight"]), inputs=["weight"]),
    }
    return calls[name]()


def _producer(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if name in n.output)


def reroute(model: onnx.ModelProto, output: str, node: onnx.NodeProto) -> onnx.ModelProto:
    """A copy in which graph output ``output`` is computed by ``node`` from the original value
    (renamed ``<output>_raw``)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    prod = _producer(out, output)
    raw = f"{output}_raw"
    prod.output[list(prod.output).index(output)] = raw
    for n in out.graph.node:
        for i, x in enumerate(n.input):
            if x == output:
                n.input[i] = raw
    del node.input[:]
    node.input.append(raw)
    del node.output[:]
    node.output.append(output)
    out.graph.node.append(node)
    return out


def flip_sign(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """A wrong-numbers model: ``output`` negated by an extra Neg node."""
    return reroute(model, output, helper.make_node("Neg", [], [], name="flip_sign"))


def with_custom_op(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """Valid for the checker and shape inference (custom domains are not checked), rejected by
    ONNX Runtime, which has no kernel for com.example:Foo."""
    out = reroute(model, output, helper.make_node("Foo", [], [], domain="com.example", name="foo"))
    out.opset_import.append(helper.make_opsetid("com.example", 1))
    return out


def dangling_input(model: onnx.ModelProto) -> onnx.ModelProto:
    """Invalid graph: the first node reads a value nothing defines."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.node[0].input[0] = "undefined_value"
    return out


def wrong_declared_shape(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """Passes the checker, fails strict shape inference: the declared shape of ``output`` has
    one more element than what the graph computes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    vi = next(o for o in out.graph.output if o.name == output)
    dims = vi.type.tensor_type.shape.dim
    dims[-1].dim_value = dims[-1].dim_value + 1
    return out


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def inferred_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[str],
    inits: dict[str, np.ndarray],
) -> onnx.ModelProto:
    """A model of `nodes` whose outputs carry the types ONNX's shape inference gives them."""
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
        initializer=[numpy_helper.from_array(v, name=k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model
