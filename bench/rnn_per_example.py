"""Per-example gradients of a recurrent model exported as one ``Loop`` (a benchmark, not a test).

The model: ``h <- tanh(h @ Wh + xs[t] @ Wx)`` for ``T`` steps in an ONNX ``Loop`` (the weights
read from the enclosing graph, the sequence carried and gathered by the iteration number, as
whole-sequence exports write it), then ``loss = sum((h - target)^2)``. ``grad(f)`` w.r.t. the
two weights is the per-example gradient; ``vmap(grad(f), in_axes=0)`` computes it for a batch
of ``B`` examples in one run: the loops that grad writes (the forward loop, which stacks the
state and replaces the source loop, and the reverse loop) have shared trip counts, so vmap
batches their bodies and runs each loop once. The baseline is ``B`` ONNX Runtime runs of
``grad(f)``, one per example. Both give every per-example gradient; they are checked equal
before timing.

ORT: one intra-op and one inter-op thread, default optimizations; each variant runs once to
warm up, then the median of ``--repeats`` timed calls is reported.

    python bench/rnn_per_example.py                       # widths 64 and 256, T 16, B 64
    python bench/rnn_per_example.py --widths 32 --steps 8 --batch 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# (Appended: a PYTHONPATH naming another build of onnax wins, for A/B runs.)
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))
import onnax
from grad_bench import ort_session

F = TensorProto.FLOAT


def rnn_model(width: int, steps: int) -> onnx.ModelProto:
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["xs_in", "it"], ["xt"], axis=0),
            helper.make_node("MatMul", ["h_in", "Wh"], ["hw"]),
            helper.make_node("MatMul", ["xt", "Wx"], ["xw"]),
            helper.make_node("Add", ["hw", "xw"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h_out"]),
            helper.make_node("Identity", ["xs_in"], ["xs_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("it", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", F, [width]),
            helper.make_tensor_value_info("xs_in", F, [steps, width]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", F, [width]),
            helper.make_tensor_value_info("xs_out", F, [steps, width]),
        ],
    )
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(width)
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["M"], value=numpy_helper.from_array(np.array(steps, np.int64))),
            helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(np.array(True))),
            helper.make_node("Loop", ["M", "go", "h0", "xs"], ["hT", "xsT"], body=body),
            helper.make_node("Sub", ["hT", "target"], ["d"]),
            helper.make_node("ReduceSumSquare", ["d"], ["loss"], keepdims=0),
        ],
        "rnn",
        [
            helper.make_tensor_value_info("h0", F, [width]),
            helper.make_tensor_value_info("xs", F, [steps, width]),
            helper.make_tensor_value_info("target", F, [width]),
        ],
        [helper.make_tensor_value_info("loss", F, [])],
        [
            numpy_helper.from_array((rng.standard_normal((width, width)) * scale).astype(np.float32), "Wh"),
            numpy_helper.from_array((rng.standard_normal((width, width)) * scale).astype(np.float32), "Wx"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(width: int, steps: int, batch: int, repeats: int) -> dict[str, float | bool]:
    grad = onnax.grad(rnn_model(width, steps), inputs=["Wh", "Wx"], output="loss")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batched = onnax.vmap(grad, in_axes=0)
    per_example_map = any("per-example" in str(w.message) for w in caught)
    one, many = ort_session(grad), ort_session(batched)
    rng = np.random.default_rng(1)
    feeds = {
        "h0": rng.standard_normal((batch, width)).astype(np.float32),
        "xs": rng.standard_normal((batch, steps, width)).astype(np.float32),
        "target": rng.standard_normal((batch, width)).astype(np.float32),
    }

    def loop() -> list[list[np.ndarray]]:
        return [one.run(None, {k: v[i] for k, v in feeds.items()}) for i in range(batch)]

    def vectorized() -> list[np.ndarray]:
        return many.run(None, feeds)

    ref, got = loop(), vectorized()
    for i in range(batch):
        for j, r in enumerate(ref[i]):
            np.testing.assert_allclose(got[j][i], r, rtol=1e-4, atol=1e-4)
    t_loop = median_seconds(loop, repeats)
    t_vmap = median_seconds(vectorized, repeats)
    return {
        "loop_s": t_loop,
        "vmap_s": t_vmap,
        "speedup": t_loop / t_vmap,
        "per_example_map": per_example_map,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", default="64,256", help="hidden widths (comma-separated)")
    p.add_argument("--steps", type=int, default=16, help="sequence length T")
    p.add_argument("--batch", type=int, default=64, help="examples B")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per variant (median)")
    args = p.parse_args(argv)
    head = f"per-example gradients of an RNN Loop: T={args.steps}, B={args.batch}"
    print(f"{head}, ORT {ort.__version__}, 1 thread")
    print(" width  B runs of grad  vmap(grad)  speedup  loops batched in place")
    for width in (int(w) for w in args.widths.split(",")):
        r = measure(width, args.steps, args.batch, args.repeats)
        print(
            f"{width:6d}  {r['loop_s'] * 1e3:11.2f} ms  {r['vmap_s'] * 1e3:7.2f} ms  {r['speedup']:6.1f}x"
            f"  {'no (per-example map)' if r['per_example_map'] else 'yes'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
