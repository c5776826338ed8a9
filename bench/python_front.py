"""Benchmark (not a test): the Python API on a weight-heavy model, with and without holding the
weights back from the core.

A 4-layer MLP whose weights total ``--megabytes`` (default 256 MB, AlexNet-sized; a handful of
nodes). For vmap and grad (w.r.t. every weight) it times, side by side in one run:

* ``onnax.vmap`` / ``onnax.grad`` as users call them: large float initializers are held back
  from the core and put back into the result (``onnax._models``);
* the whole-model path the API took before: serialize the whole model, the core's transform on
  it, parse the whole result (``_core.vmap`` / ``_core.grad`` on the full bytes);
* the Python I/O floor: ``SerializeToString`` + ``ParseFromString`` of the source model;

and the same for the model as an ``onnx_ir.Model``. (The byte-identity of the two paths' results
is tested in tests/python/model_io/test_held_back_weights.py.)

Each figure is the median of ``--repeats`` runs after one warm-up run.

    python bench/python_front.py
    python bench/python_front.py --megabytes 64 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnax
import onnx
import onnx_ir as ir
from onnax import _core
from onnx import TensorProto, helper, numpy_helper


def weighty_mlp(megabytes: float) -> onnx.ModelProto:
    width = int(np.sqrt(megabytes * 1e6 / 4 / 4))
    rng = np.random.default_rng(0)
    inits, nodes = [], []
    h = "x"
    for k in range(4):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"W{k}"))
        nodes.append(helper.make_node("MatMul", [h, f"W{k}"], [f"m{k}"]))
        nodes.append(helper.make_node("Tanh", [f"m{k}"], [f"h{k}"]))
        h = f"h{k}"
    nodes.append(helper.make_node("ReduceSum", [h], ["loss"], keepdims=0))
    graph = helper.make_graph(
        nodes,
        "weighty_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, width])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=256.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = weighty_mlp(args.megabytes)
    weights = [t.name for t in model.graph.initializer]
    print(f"model: {model.ByteSize() / 1e6:.0f} MB, {len(model.graph.node)} nodes")

    def whole(call: Callable[[bytes], bytes]) -> onnx.ModelProto:
        return onnx.ModelProto.FromString(call(model.SerializeToString()))

    floor = median_seconds(lambda: onnx.ModelProto.FromString(model.SerializeToString()), args.repeats)
    print(f"python serialize + parse of the source: {floor:.3f} s")
    print("| transform | onnax API | whole-model path | API / whole | API / python I/O |")
    print("|---|---:|---:|---:|---:|")
    ir_model = ir.serde.deserialize_model(model)

    def whole_ir(call: Callable[[bytes], bytes]) -> ir.Model:
        data = ir.serde.serialize_model(ir_model).SerializeToString()
        return ir.serde.deserialize_model(onnx.ModelProto.FromString(call(data)))

    vmap_core = lambda d: _core.vmap(d, 0, None, None, [0], "")  # noqa: E731
    grad_core = lambda d: _core.grad(d, weights, "loss")  # noqa: E731
    for name, api, core, path in [
        ("vmap", lambda: onnax.vmap(model), vmap_core, whole),
        ("grad", lambda: onnax.grad(model, inputs=weights, output="loss"), grad_core, whole),
        ("vmap (onnx_ir model)", lambda: onnax.vmap(ir_model), vmap_core, whole_ir),
        (
            "grad (onnx_ir model)",
            lambda: onnax.grad(ir_model, inputs=weights, output="loss"),
            grad_core,
            whole_ir,
        ),
    ]:
        t_api = median_seconds(api, args.repeats)
        t_whole = median_seconds(lambda core=core, path=path: path(core), args.repeats)  # type: ignore[misc]
        print(f"| {name} | {t_api:.3f} s | {t_whole:.3f} s | {t_api / t_whole:.2f}x | {t_api / floor:.2f}x |")


if __name__ == "__main__":
    main()
