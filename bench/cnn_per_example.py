"""Per-example gradients of a small CNN (a benchmark, not a test): DP-SGD's case.

The model, per example: Conv(3->32, 3x3, pad 1) - Relu - Conv(32->64, 3x3, stride 2, pad 1) -
Relu - Conv(64->64, 3x3, pad 1) - Relu - GlobalAveragePool - Gemm(64->10), loss = sum((logits -
target)^2), on 32x32 RGB images; gradients w.r.t. every weight and bias. Three ways to the same
gradients, side by side in one run (ONNX Runtime, one intra-op and one inter-op thread):

* ``vmap(grad(f))`` over a batch of ``B`` examples (``in_axes=0``): every per-example gradient
  in one run. The weights' cotangents contract the forward windows (a Conv with one-hot
  kernels, shared) with the output cotangent (an Einsum), so vmap keeps them vectorized;
* ``B`` runs of ``grad(f)`` on one example each (the loop vmap replaces);
* for scale, one run of ``grad(f)`` on a minibatch of ``B`` (summed gradients, not per
  example: what a non-private training step computes).

The per-example gradients of the first two are checked equal before timing. Timing as
``grad_bench.time_ort``: two warm-up runs, then the median over ``--repeats`` of the mean of
``--runs`` calls.

    python bench/cnn_per_example.py                 # B = 32
    python bench/cnn_per_example.py --batch 8 --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# (Appended: a PYTHONPATH naming another build of onnax wins, for A/B runs.)
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnax
from grad_bench import ort_session, time_ort

F = TensorProto.FLOAT


def cnn_model(batch: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def init(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        init("w1", (32, 3, 3, 3), 0.2),
        init("b1", (32,), 0.1),
        init("w2", (64, 32, 3, 3), 0.06),
        init("b2", (64,), 0.1),
        init("w3", (64, 64, 3, 3), 0.04),
        init("b3", (64,), 0.1),
        init("wl", (64, 10), 0.1),
        init("bl", (10,), 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wl", "bl"], ["logits"]),
        helper.make_node("Sub", ["logits", "t"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [
            helper.make_tensor_value_info("x", F, [batch, 3, 32, 32]),
            helper.make_tensor_value_info("t", F, [batch, 10]),
        ],
        [helper.make_tensor_value_info("loss", F, [])],
        initializer=inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    b = args.batch
    one, mini = cnn_model(1), cnn_model(b)
    params = [t.name for t in one.graph.initializer]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a per-example Scan fallback would warn)
        g1 = onnax.grad(one, inputs=params, output="loss")
        per_example = onnax.vmap(g1, in_axes=0)
    gb = onnax.grad(mini, inputs=params, output="loss")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((b, 1, 3, 32, 32)).astype(np.float32)
    t = rng.standard_normal((b, 1, 10)).astype(np.float32)
    s_vmap, s_one = ort_session(per_example), ort_session(g1)
    names = [o.name for o in g1.graph.output]
    vm = dict(zip(names, s_vmap.run(None, {"x": x, "t": t}), strict=True))
    for k in range(b):
        loop = dict(zip(names, s_one.run(None, {"x": x[k], "t": t[k]}), strict=True))
        for p in params:
            got, want = vm[f"{p}_grad"][k], loop[f"{p}_grad"]
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * float(np.abs(want).max()), err_msg=p)
    xm, tm = x.reshape(b, 3, 32, 32), t.reshape(b, 10)

    def latency(model: onnx.ModelProto, run: Callable[[Any], object]) -> float:
        return time_ort(model, run, warmup=2, repeats=args.repeats, runs=args.runs)["latency_s"]

    t_vmap = latency(per_example, lambda s: s.run(None, {"x": x, "t": t}))
    t_loop = latency(g1, lambda s: [s.run(None, {"x": x[k], "t": t[k]}) for k in range(b)])
    t_mini = latency(gb, lambda s: s.run(None, {"x": xm, "t": tm}))
    ratio = t_loop / t_vmap
    print(f"B={b}: vmap(grad) {t_vmap * 1e3:.1f} ms, {b} runs of grad {t_loop * 1e3:.1f} ms ({ratio:.2f}x)")
    print(f"minibatch grad {t_mini * 1e3:.1f} ms (vmap(grad) takes {t_vmap / t_mini:.2f}x it)")


if __name__ == "__main__":
    main()
