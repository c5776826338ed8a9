"""The floor of an AdamW update written in standard ONNX ops, in ONNX Runtime (a benchmark, not
a test).

onnax's training step writes AdamW as elementwise ops (13 per parameter); ONNX Runtime
training runs one fused kernel. This times the update alone, for 4 parameters of 512 x 512
(the MLP of bench/train_step.py), in two formulations side by side, interleaved, one thread:

* ``standard``: onnax's form, the moments as optax keeps them (13 ops per parameter);
* ``scaled``: the fewest ops found, with the moments stored pre-divided by (1 - beta)
  (m' = beta1 m + g, v' = beta2 v + g^2; 11 ops per parameter).

    python bench/adamw_floor.py [--repeats 7] [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

PARAMS, SHAPE = 4, [512, 512]


def constant(name: str, value: float) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.float32))
    )


def update_model(variant: str) -> onnx.ModelProto:
    nodes = [constant(k, v) for k, v in {"b1": 0.9, "nb1": 0.1, "b2": 0.999, "nb2": 0.001}.items()]
    nodes += [constant("eps", 1e-8), constant("step", 1e-3), constant("keep", 1 - 1e-5)]
    inputs, outputs = [], []
    for i in range(PARAMS):
        p, g, m, v = (f"{k}{i}" for k in "pgmv")
        inputs += [helper.make_tensor_value_info(x, TensorProto.FLOAT, SHAPE) for x in (p, g, m, v)]
        outputs += [helper.make_tensor_value_info(f"{x}_new", TensorProto.FLOAT, SHAPE) for x in (p, m, v)]
        if variant == "standard":
            nodes += [
                helper.make_node("Mul", [m, "b1"], [f"{m}a"]),
                helper.make_node("Mul", [g, "nb1"], [f"{m}b"]),
                helper.make_node("Add", [f"{m}a", f"{m}b"], [f"{m}_new"]),
                helper.make_node("Mul", [g, g], [f"{g}2"]),
                helper.make_node("Mul", [v, "b2"], [f"{v}a"]),
                helper.make_node("Mul", [f"{g}2", "nb2"], [f"{v}b"]),
                helper.make_node("Add", [f"{v}a", f"{v}b"], [f"{v}_new"]),
            ]
        else:
            nodes += [
                helper.make_node("Mul", [m, "b1"], [f"{m}a"]),
                helper.make_node("Add", [f"{m}a", g], [f"{m}_new"]),
                helper.make_node("Mul", [g, g], [f"{g}2"]),
                helper.make_node("Mul", [v, "b2"], [f"{v}a"]),
                helper.make_node("Add", [f"{v}a", f"{g}2"], [f"{v}_new"]),
            ]
        nodes += [
            helper.make_node("Sqrt", [f"{v}_new"], [f"{v}s"]),
            helper.make_node("Add", [f"{v}s", "eps"], [f"{v}d"]),
            helper.make_node("Div", [f"{m}_new", f"{v}d"], [f"{p}u"]),
            helper.make_node("Mul", [f"{p}u", "step"], [f"{p}us"]),
            helper.make_node("Mul", [p, "keep"], [f"{p}k"]),
            helper.make_node("Sub", [f"{p}k", f"{p}us"], [f"{p}_new"]),
        ]
    used = {i for n in nodes for i in n.input}
    nodes = [n for n in nodes if n.op_type != "Constant" or n.output[0] in used]
    graph = helper.make_graph(nodes, f"adamw_{variant}", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    rng = np.random.default_rng(0)
    feeds = {f"{k}{i}": rng.random(SHAPE, dtype=np.float32) for i in range(PARAMS) for k in "pgmv"}
    sessions = {
        v: ort.InferenceSession(update_model(v).SerializeToString(), so, providers=["CPUExecutionProvider"])
        for v in ("standard", "scaled")
    }
    times: dict[str, list[float]] = {v: [] for v in sessions}
    for _ in range(args.repeats):
        for v, sess in sessions.items():
            for _ in range(3):
                sess.run(None, feeds)
            t0 = time.perf_counter()
            for _ in range(args.runs):
                sess.run(None, feeds)
            times[v].append((time.perf_counter() - t0) / args.runs * 1e3)
    for v, ts in times.items():
        print(
            f"{v:9s} {statistics.median(ts):6.2f} ms per update ({PARAMS} x {SHAPE[0]}x{SHAPE[1]} parameters)"
        )
    ratio = statistics.median(times["standard"]) / statistics.median(times["scaled"])
    print(f"standard / scaled: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
