"""Run time of derivatives of the recurrent ops (benchmarks, not tests).

One RNN/GRU/LSTM op (batch 16, input 64, hidden 128, weights as initializers) followed by
loss = sum(Y^2), at two sequence lengths. For each: ONNX Runtime (one intra-op thread) time of
the forward pass, of grad(f) w.r.t. the weights, and of jvp(f) w.r.t. X, as ratios to the
forward pass, plus the onnax transform time. The derivatives run through the op's expansion
into a Loop (the op itself computes the primal outputs), so the ratios show what the Loop
machinery costs next to a fused kernel; growth from T to 4T shows that reverse mode stays linear
in the sequence length.

    python bench/recurrent_grad.py            # T = 32 and 128
    python bench/recurrent_grad.py --lengths 16,64 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnax
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

B, IN, H = 16, 64, 128
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def model(op: str, steps: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    g = GATES[op]
    inits = [
        numpy_helper.from_array((rng.standard_normal((1, g * H, IN)) * 0.1).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((1, g * H, H)) * 0.1).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((1, 2 * g * H)) * 0.1).astype(np.float32), "B"),
    ]
    nodes = [
        helper.make_node(op, ["X", "W", "R", "B"], ["Y", "Yh"], hidden_size=H),
        helper.make_node("ReduceSumSquare", ["Y"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, B, IN])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    m.ir_version = 10
    return m


def seconds(m: onnx.ModelProto, feeds: dict[str, np.ndarray], repeats: int, runs: int) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        s.run(None, feeds)
    means = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(runs):
            s.run(None, feeds)
        means.append((time.perf_counter() - t) / runs)
    return statistics.median(means)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="32,128")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    print(f"batch {B}, input {IN}, hidden {H}; ONNX Runtime {ort.__version__}, one thread")
    print(
        f"{'op':5} {'T':>4} {'forward ms':>11} {'grad ms':>9} {'grad/fwd':>9} {'jvp ms':>8} {'jvp/fwd':>8}"
        f" {'transform ms':>13}"
    )
    for op in GATES:
        for steps in (int(t) for t in args.lengths.split(",")):
            m = model(op, steps)
            x = rng.standard_normal((steps, B, IN)).astype(np.float32)
            t0 = time.perf_counter()
            gm = onnax.grad(m, inputs=["W", "R", "B"], output="loss")
            transform = time.perf_counter() - t0
            jm = onnax.jvp(m, inputs=["X"])
            fwd = seconds(m, {"X": x}, args.repeats, args.runs)
            grad = seconds(gm, {"X": x}, args.repeats, args.runs)
            jvp = seconds(jm, {"X": x, "X_tangent": x}, args.repeats, args.runs)
            print(
                f"{op:5} {steps:4d} {fwd * 1e3:11.2f} {grad * 1e3:9.2f} {grad / fwd:8.1f}x"
                f" {jvp * 1e3:8.2f} {jvp / fwd:7.1f}x {transform * 1e3:13.1f}"
            )


if __name__ == "__main__":
    main()
