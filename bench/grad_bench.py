"""Benchmarks of ``onnax.grad`` (and ``vmap(grad(f))``): transform cost and run-time cost.

Three measurements, side by side in one run (benchmarks, not tests):

(a) **grad transform time vs the I/O floor.** The chain models of ``bench/vmap_scaling.py``
    (MatMul -> Add -> Tanh -> Mul -> Sigmoid -> Sub over a [4, 8] input, shared [8, 8]/[8]
    initializers) followed by ``ReduceSum`` to a scalar ``loss``.  For each N: the median over
    ``--repeats`` of ``onnax._core.parse_serialize_seconds`` (C++ ParseFromString +
    SerializeToString) and of ``onnax._core.grad_seconds`` (the C++ grad transform alone on
    parsed input, w.r.t. the runtime input ``x`` by default, ``--wrt weights`` for the four
    shared initializers).  Reports grad / (parse + serialize) (target <= 3x) and the growth
    per 10x of N (target ~10x, linear).  Beside it, ``onnax._core.grad_serialized_seconds``:
    serialized model to serialized result (parse, transform, serialize and free, on one
    arena), the path the Python package takes, against the same parse + serialize.

(b) **ONNX Runtime run time of grad(f) vs a hand-written forward+backward graph**, one
    intra-op thread.  (1) a 4-layer MLP (MatMul + Add + Relu on the hidden layers, linear output
    layer; loss = mean((y - target)^2)), width 1024, batch 256; (2) a pre-LN transformer block
    (LayerNormalization, Q/K/V/output projections, 4-head Softmax attention, erf-GELU MLP of
    width 4x, residuals; same loss), batch 8, seq 128, width 256.  Weights are initializers and
    onnax differentiates w.r.t. them (``inputs=[weight names]``).  The hand-written backward is
    standard backprop written with ``onnx.helper`` (dW = h^T @ dy by ``Gemm(transA=1)``,
    dh = dy @ W^T by ``Gemm(transB=1)``, Relu/GELU/LayerNorm/Softmax backward by formula).  The
    onnax gradients are checked against the hand-written ones before timing.

(c) **vmap(grad(f)) at batch B vs B separate runs of grad(f)**: per-example gradients of the
    MLP loss (width 256, one example x:[256], target:[256]) w.r.t. the weight initializers;
    ``vmap(grad(f), in_axes=0)`` batches the data inputs only (initializers are shared).  The
    loop is B ``session.run`` calls of grad(f); both produce every per-example gradient.
    Reports the speedup (target >= 10x) and checks the vmapped gradients equal the loop's.
    The full run adds width 64: at width 256 both variants write B x 1 MB of per-example
    gradients, which bounds the speedup; at width 64 the loop's per-call overhead dominates.

ORT methodology (b, c): ``intra_op_num_threads=1``, ``inter_op_num_threads=1``, sequential
execution, default graph optimizations.  Session creation and the first run are single
samples; then ``--warmup`` runs, then ``--repeats`` repeats of ``--runs`` runs each; the
reported latency is the median of the per-repeat means.

    python bench/grad_bench.py                          # full run (~1 min on 2 cores)
    python bench/grad_bench.py --quick                  # smoke mode, small models (~5 s)
    python bench/grad_bench.py --sizes 10000,100000,1000000 --output grad_bench.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exported_stack import blocks_for, numpy_loss, stack_loss_model, weights
from vmap_scaling import chain_model

F = TensorProto.FLOAT
RTOL = 1e-4


# --------------------------------------------------------------------------------------------
# Environment


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count() or 0
    return {"cpu": cpu, "nproc": nproc, "platform": platform.platform(), "python": sys.version.split()[0]}


def versions() -> dict[str, str]:
    import onnax
    import onnxruntime

    return {
        "onnax": getattr(onnax, "__version__", "?"),
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
    }


# --------------------------------------------------------------------------------------------
# A tiny graph builder


class Builder:
    """Appends nodes with fresh output names; keeps initializers, inputs and outputs."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._n = 0

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def op(self, op_type: str, inputs: Sequence[str], out: str | None = None, **attrs: Any) -> str:
        name = out or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    def op_n(self, op_type: str, inputs: Sequence[str], outs: Sequence[str], **attrs: Any) -> list[str]:
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outs), **attrs))
        return list(outs)

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        return self.init(self.fresh("const"), np.asarray(value, dtype=dtype))

    def input(self, name: str, shape: Sequence[int], elem: int = F) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, name: str, shape: Sequence[int] | None, elem: int = F) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def model(self, name: str, opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 10
        return m


def _mse_loss(b: Builder, y: str, target: str) -> tuple[str, str]:
    """loss = mean((y - target)^2); returns (loss, d = y - target)."""
    d = b.op("Sub", [y, target], "diff")
    sq = b.op("Mul", [d, d], "sq")
    b.op("ReduceMean", [sq], "loss", keepdims=0)
    return "loss", d


# --------------------------------------------------------------------------------------------
# (b1, c) MLP


def mlp_weights(width: int, layers: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w: dict[str, np.ndarray] = {}
    for i in range(1, layers + 1):
        w[f"W{i}"] = (rng.standard_normal((width, width)) * math.sqrt(2.0 / width)).astype(np.float32)
        w[f"b{i}"] = (rng.standard_normal(width) * 0.1).astype(np.float32)
    return w


def mlp_model(
    width: int, batch: int | None, layers: int = 4, seed: int = 0, hand_backward: bool = False
) -> onnx.ModelProto:
    """x:[batch, width] (or [width] when batch is None), target like x -> scalar loss.

    With ``hand_backward`` the model also returns ``<param>_grad`` for every weight, computed by
    hand-written backprop (batch must be given).
    """
    b = Builder()
    shape = [width] if batch is None else [batch, width]
    x = b.input("x", shape)
    t = b.input("target", shape)
    weights = mlp_weights(width, layers, seed)
    for name, value in weights.items():
        b.init(name, value)
    h = [x]  # layer inputs
    z = []  # pre-activations
    for i in range(1, layers + 1):
        a = b.op("MatMul", [h[-1], f"W{i}"], f"mm{i}")
        zi = b.op("Add", [a, f"b{i}"], f"z{i}")
        z.append(zi)
        if i < layers:
            h.append(b.op("Relu", [zi], f"h{i}"))
    count = int(np.prod(shape))
    loss, d = _mse_loss(b, z[-1], t)
    b.output(loss, [])
    if hand_backward:
        assert batch is not None
        dz = b.op("Mul", [d, b.const(2.0 / count)], "dz_out")
        zero = b.const(0.0)
        for i in range(layers, 0, -1):
            b.op("Gemm", [h[i - 1], dz], f"W{i}_grad", transA=1)
            b.op("ReduceSum", [dz, b.const([0], np.int64)], f"b{i}_grad", keepdims=0)
            if i > 1:
                dh = b.op("Gemm", [dz, f"W{i}"], transB=1)
                pos = b.op("Greater", [z[i - 2], zero])
                dz = b.op("Where", [pos, dh, zero], f"dz{i - 1}")
        for name, value in weights.items():
            b.output(f"{name}_grad", list(value.shape))
    return b.model("mlp", 18)


# --------------------------------------------------------------------------------------------
# (b2) transformer block


def transformer_weights(width: int, ff: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def mat(r: int, c: int) -> np.ndarray:
        return (rng.standard_normal((r, c)) / math.sqrt(r)).astype(np.float32)

    def vec(n: int, scale: float = 0.1, base: float = 0.0) -> np.ndarray:
        return (base + rng.standard_normal(n) * scale).astype(np.float32)

    return {
        "ln1_g": vec(width, base=1.0),
        "ln1_b": vec(width),
        "Wq": mat(width, width),
        "bq": vec(width),
        "Wk": mat(width, width),
        "bk": vec(width),
        "Wv": mat(width, width),
        "bv": vec(width),
        "Wo": mat(width, width),
        "bo": vec(width),
        "ln2_g": vec(width, base=1.0),
        "ln2_b": vec(width),
        "W1": mat(width, ff),
        "c1": vec(ff),
        "W2": mat(ff, width),
        "c2": vec(width),
    }


def transformer_model(
    batch: int, seq: int, width: int, heads: int, seed: int = 0, hand_backward: bool = False
) -> onnx.ModelProto:
    """Pre-LN block: r = x + Attn(LN1(x)); out = r + MLP(LN2(r)); loss = mean((out - t)^2)."""
    ff = 4 * width
    dh = width // heads
    b = Builder()
    shape = [batch, seq, width]
    x = b.input("x", shape)
    t = b.input("target", shape)
    weights = transformer_weights(width, ff, seed)
    for name, value in weights.items():
        b.init(name, value)

    def layernorm(inp: str, g: str, beta: str, tag: str) -> tuple[str, str, str]:
        if hand_backward:
            y, mean, inv = b.op_n(
                "LayerNormalization", [inp, g, beta], [f"{tag}", f"{tag}_mean", f"{tag}_inv"], axis=-1
            )
            return y, mean, inv
        return b.op("LayerNormalization", [inp, g, beta], tag, axis=-1), "", ""

    heads_shape = b.const([batch, seq, heads, dh], np.int64)
    ln1, ln1_mean, ln1_inv = layernorm(x, "ln1_g", "ln1_b", "ln1")
    q = b.op("Add", [b.op("MatMul", [ln1, "Wq"]), "bq"], "q")
    k = b.op("Add", [b.op("MatMul", [ln1, "Wk"]), "bk"], "k")
    v = b.op("Add", [b.op("MatMul", [ln1, "Wv"]), "bv"], "v")
    qh = b.op("Transpose", [b.op("Reshape", [q, heads_shape])], "qh", perm=[0, 2, 1, 3])
    kt = b.op("Transpose", [b.op("Reshape", [k, heads_shape])], "kt", perm=[0, 2, 3, 1])
    vh = b.op("Transpose", [b.op("Reshape", [v, heads_shape])], "vh", perm=[0, 2, 1, 3])
    scale = 1.0 / math.sqrt(dh)
    s = b.op("Mul", [b.op("MatMul", [qh, kt]), b.const(scale)], "scores")
    p = b.op("Softmax", [s], "probs", axis=-1)
    o = b.op("MatMul", [p, vh], "attn_heads")
    flat_shape = b.const([batch, seq, width], np.int64)
    oc = b.op("Reshape", [b.op("Transpose", [o], perm=[0, 2, 1, 3]), flat_shape], "attn_concat")
    attn = b.op("Add", [b.op("MatMul", [oc, "Wo"]), "bo"], "attn_out")
    r1 = b.op("Add", [x, attn], "resid1")
    ln2, ln2_mean, ln2_inv = layernorm(r1, "ln2_g", "ln2_b", "ln2")
    f1 = b.op("Add", [b.op("MatMul", [ln2, "W1"]), "c1"], "ff1")
    gl = b.op("Gelu", [f1], "gelu")
    f2 = b.op("Add", [b.op("MatMul", [gl, "W2"]), "c2"], "ff2")
    out = b.op("Add", [r1, f2], "block_out")
    count = batch * seq * width
    loss, d = _mse_loss(b, out, t)
    b.output(loss, [])

    if hand_backward:
        bt = batch * seq
        two_d = b.const([bt, width], np.int64)
        two_d_ff = b.const([bt, ff], np.int64)
        stat_2d = b.const([bt, 1], np.int64)
        axis0 = b.const([0], np.int64)
        last = b.const([-1], np.int64)

        def flat(name: str, shp: str = two_d) -> str:
            return b.op("Reshape", [name, shp])

        def linear_back(inp2d: str, dy2d: str, w: str, bias: str, need_dx: bool = True) -> str:
            b.op("Gemm", [inp2d, dy2d], f"{w}_grad", transA=1)
            b.op("ReduceSum", [dy2d, axis0], f"{bias}_grad", keepdims=0)
            return b.op("Gemm", [dy2d, w], transB=1) if need_dx else ""

        def layernorm_back(inp: str, mean: str, inv: str, g: str, beta: str, dy2d: str) -> str:
            inv2 = flat(inv, stat_2d)
            xhat = b.op("Mul", [b.op("Sub", [flat(inp), flat(mean, stat_2d)]), inv2])
            b.op("ReduceSum", [b.op("Mul", [dy2d, xhat]), axis0], f"{g}_grad", keepdims=0)
            b.op("ReduceSum", [dy2d, axis0], f"{beta}_grad", keepdims=0)
            dxhat = b.op("Mul", [dy2d, g])
            m1 = b.op("ReduceMean", [dxhat, last], keepdims=1)
            m2 = b.op("ReduceMean", [b.op("Mul", [dxhat, xhat]), last], keepdims=1)
            inner = b.op("Sub", [b.op("Sub", [dxhat, m1]), b.op("Mul", [xhat, m2])])
            return b.op("Mul", [inv2, inner])

        dout = flat(b.op("Mul", [d, b.const(2.0 / count)], "dout"))
        # MLP: out = r1 + f2, f2 = gelu(f1) W2 + c2, f1 = ln2 W1 + c1
        dgl = linear_back(flat(gl, two_d_ff), dout, "W2", "c2")
        f1f = flat(f1, two_d_ff)
        erf = b.op("Erf", [b.op("Mul", [f1f, b.const(math.sqrt(0.5))])])
        cdf = b.op("Mul", [b.const(0.5), b.op("Add", [b.const(1.0), erf])])
        pdf = b.op(
            "Mul",
            [
                b.op("Exp", [b.op("Mul", [b.op("Mul", [f1f, f1f]), b.const(-0.5)])]),
                b.const(1.0 / math.sqrt(2.0 * math.pi)),
            ],
        )
        df1 = b.op("Mul", [dgl, b.op("Add", [cdf, b.op("Mul", [f1f, pdf])])])
        dln2 = linear_back(flat(ln2), df1, "W1", "c1")
        dr1 = b.op("Add", [dout, layernorm_back(r1, ln2_mean, ln2_inv, "ln2_g", "ln2_b", dln2)])
        # attention output projection
        doc = linear_back(flat(oc), dr1, "Wo", "bo")
        do = b.op("Transpose", [b.op("Reshape", [doc, heads_shape])], perm=[0, 2, 1, 3])
        dp = b.op("MatMul", [do, b.op("Transpose", [vh], perm=[0, 1, 3, 2])])
        dvh = b.op("MatMul", [b.op("Transpose", [p], perm=[0, 1, 3, 2]), do])
        rowdot = b.op("ReduceSum", [b.op("Mul", [dp, p]), last], keepdims=1)
        ds = b.op("Mul", [b.op("Mul", [p, b.op("Sub", [dp, rowdot])]), b.const(scale)])
        dqh = b.op("MatMul", [ds, b.op("Transpose", [kt], perm=[0, 1, 3, 2])])
        dkh = b.op("MatMul", [b.op("Transpose", [ds], perm=[0, 1, 3, 2]), qh])

        def merge(dhd: str) -> str:
            return flat(b.op("Transpose", [dhd], perm=[0, 2, 1, 3]))

        ln1f = flat(ln1)
        dq_in = linear_back(ln1f, merge(dqh), "Wq", "bq")
        dk_in = linear_back(ln1f, merge(dkh), "Wk", "bk")
        dv_in = linear_back(ln1f, merge(dvh), "Wv", "bv")
        dln1 = b.op("Add", [b.op("Add", [dq_in, dk_in]), dv_in])
        layernorm_back(x, ln1_mean, ln1_inv, "ln1_g", "ln1_b", dln1)
        for name, value in weights.items():
            b.output(f"{name}_grad", list(value.shape))
    return b.model("transformer_block", 20)


# --------------------------------------------------------------------------------------------
# ORT timing


def ort_session(model: onnx.ModelProto | bytes) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def time_ort(
    model: onnx.ModelProto, run: Callable[[Any], object], warmup: int, repeats: int, runs: int
) -> dict[str, Any]:
    """Session init and first run (single samples), then the median of per-repeat means."""
    data = model.SerializeToString()
    gc.collect()
    t0 = time.perf_counter()
    sess = ort_session(data)
    init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run(sess)
    first_s = time.perf_counter() - t0
    for _ in range(warmup):
        run(sess)
    means = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(runs):
            run(sess)
        means.append((time.perf_counter() - t0) / runs)
    return {
        "session_init_s": init_s,
        "first_run_s": first_s,
        "latency_s": statistics.median(means),
        "repeat_means_s": means,
        "nodes": len(model.graph.node),
    }


def compare(got: np.ndarray, want: np.ndarray, rtol: float = RTOL) -> dict[str, Any]:
    """allclose with rtol and an atol of rtol * max|want| (float32 cancellation near zero)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return {"ok": False, "error": f"shape {list(got.shape)} != {list(want.shape)}"}
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    ok = bool(np.allclose(got, want, rtol=rtol, atol=rtol * scale)) and bool(np.all(np.isfinite(got)))
    return {"ok": ok, "max_abs_err": err, "max_abs_ref": scale, "rel_err": err / scale if scale else err}


def _error_record(stage: str, exc: BaseException) -> dict[str, str]:
    return {
        "stage": stage,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(limit=4),
    }


# --------------------------------------------------------------------------------------------
# (a) transform scaling


def chain_loss_model(n_nodes: int) -> onnx.ModelProto:
    """``vmap_scaling.chain_model`` (n_nodes) followed by ReduceSum to a scalar ``loss``."""
    m = chain_model(n_nodes)
    g = m.graph
    g.node.append(helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("loss", F, []))
    return m


def _median(fn: Callable[[], float], repeats: int, warmup: bool) -> tuple[float, list[float]]:
    if warmup:
        fn()
    samples = []
    for _ in range(repeats):
        gc.collect()
        samples.append(float(fn()))
    return statistics.median(samples), samples


def verify_chain_grad(n_nodes: int, wrt: list[str] | None) -> dict[str, Any]:
    """grad of a small chain in ORT: loss unchanged, gradient vs central differences (float64)."""
    import onnax

    m = chain_loss_model(n_nodes)
    gm = onnax.grad(m, inputs=wrt, output="loss")
    names = wrt or ["x"]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    sess = ort_session(gm)
    outs = sess.run(None, {"x": x})
    out_names = [o.name for o in gm.graph.output]
    res = dict(zip(out_names, outs, strict=True))
    # float64 copy of the forward for central differences
    m64 = onnx.ModelProto()
    m64.CopyFrom(m)
    for vi in itertools.chain(m64.graph.input, m64.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    inits64 = {}
    for t in m64.graph.initializer:
        inits64[t.name] = numpy_helper.to_array(t).astype(np.float64)
    del m64.graph.initializer[:]
    m64.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits64.items())
    for name in names:
        if name != "x":
            m64.graph.initializer.remove(next(t for t in m64.graph.initializer if t.name == name))
            m64.graph.input.append(helper.make_tensor_value_info(name, TensorProto.DOUBLE, None))
    s64 = ort_session(m64)
    base = {"x": x.astype(np.float64)}
    for name in names:
        if name != "x":
            base[name] = inits64[name]
    loss64 = float(s64.run(["loss"], base)[0])
    worst = 0.0
    ok = abs(float(res["loss"]) - loss64) <= 1e-4 * max(1.0, abs(loss64))
    ok = ok and all(float(np.max(np.abs(res[f"{n}_grad"]))) > 1e-6 for n in names)  # not vacuous
    eps = 1e-6
    for name in names:
        g = np.asarray(res[f"{name}_grad"], dtype=np.float64)
        direction = rng.standard_normal(base[name].shape)
        plus = dict(base)
        plus[name] = base[name] + eps * direction
        minus = dict(base)
        minus[name] = base[name] - eps * direction
        fd = (float(s64.run(["loss"], plus)[0]) - float(s64.run(["loss"], minus)[0])) / (2 * eps)
        an = float(np.sum(g * direction))
        rel = abs(an - fd) / max(1e-8, abs(fd))
        worst = max(worst, rel)
        ok = ok and rel < 1e-3
    return {"nodes": n_nodes, "wrt": names, "ok": ok, "loss": float(res["loss"]), "fd_rel_err": worst}


def verify_stack_grad(blocks: int, wrt: list[str] | None) -> dict[str, Any]:
    """grad of a small exported-style transformer stack in ORT (float32) against central
    differences of the same function in float64 NumPy (exported_stack.numpy_loss)."""
    import onnax

    m = stack_loss_model(blocks)
    gm = onnax.grad(m, inputs=wrt, output="loss")
    names = wrt or ["x"]
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 16)).astype(np.float32)
    outs = ort_session(gm).run(None, {"x": x})
    res = dict(zip([o.name for o in gm.graph.output], outs, strict=True))
    base = {"x": x.astype(np.float64), **{k: v.astype(np.float64) for k, v in weights(16).items()}}

    def loss(point: dict[str, np.ndarray]) -> float:
        return numpy_loss(point["x"], point, blocks)

    ok = abs(float(res["loss"]) - loss(base)) <= 1e-4 * max(1.0, abs(loss(base)))
    ok = ok and all(float(np.max(np.abs(res[f"{n}_grad"]))) > 1e-6 for n in names)  # not vacuous
    worst, eps = 0.0, 1e-6
    for name in names:
        direction = rng.standard_normal(base[name].shape)
        fd = (
            loss({**base, name: base[name] + eps * direction})
            - loss({**base, name: base[name] - eps * direction})
        ) / (2 * eps)
        an = float(np.sum(np.asarray(res[f"{name}_grad"], dtype=np.float64) * direction))
        rel = abs(an - fd) / max(1e-8, abs(fd))
        worst = max(worst, rel)
        ok = ok and rel < 1e-3
    return {
        "nodes": len(m.graph.node),
        "wrt": names,
        "ok": ok,
        "loss": float(res["loss"]),
        "fd_rel_err": worst,
    }


# The models of (a): how to build one of about N nodes, what to select for --wrt weights, and
# the small cases checked numerically before timing (nodes or blocks, selection).
SCALING_FAMILIES: dict[str, dict[str, Any]] = {
    "chain": {
        "model": "vmap_scaling.chain_model(N) + ReduceSum -> loss",
        "build": chain_loss_model,
        "weights": ["W", "b", "s", "c"],
        # The chain contracts: d loss / d x vanishes after a few layers, so x is checked on a
        # 2-layer chain and the shared weights (whose gradient does not vanish) on N=600.
        "checks": ((12, None), (600, ["W", "b", "s", "c"])),
        "verify": verify_chain_grad,
    },
    "stack": {
        "model": "exported_stack.stack_loss_model (pre-LN transformer blocks, exporter-style names)",
        "build": lambda n: stack_loss_model(blocks_for(n)),
        "weights": ["Wq", "Wk", "Wv", "Wo", "W1", "W2", "ln1_g", "ln2_g"],
        "checks": ((2, None), (2, ["Wq", "W1", "ln1_g", "c2"])),
        "verify": verify_stack_grad,
    },
}


def bench_scaling(sizes: list[int], repeats: int, wrt_mode: str, family: str = "chain") -> dict[str, Any]:
    from onnax import _core as core

    fam = SCALING_FAMILIES[family]
    wrt = fam["weights"] if wrt_mode == "weights" else None
    out: dict[str, Any] = {
        "family": family,
        "model": fam["model"],
        "wrt": wrt or ["x"],
        "repeats": repeats,
        "rows": [],
    }
    checks = []
    for n_check, wrt_check in fam["checks"]:
        try:
            v = fam["verify"](n_check, wrt_check)
        except Exception as exc:  # report, do not hide
            v = {"nodes": n_check, "ok": False, **_error_record(f"verify {family} grad", exc)}
            print(f"  verify {family} {n_check} FAILED: {type(exc).__name__}: {exc}", flush=True)
        else:
            print(
                f"  verify grad({family}, {v['nodes']} nodes) w.r.t. {v['wrt']} in ORT vs float64 central "
                f"differences: {'OK' if v['ok'] else 'MISMATCH'} (rel err {v['fd_rel_err']:.1e})",
                flush=True,
            )
        checks.append(v)
    out["verification"] = {"ok": all(v["ok"] for v in checks), "checks": checks}
    for n in sizes:
        t0 = time.perf_counter()
        model = fam["build"](n)
        data = model.SerializeToString()
        gen_s = time.perf_counter() - t0
        row: dict[str, Any] = {"n": n, "nodes": len(model.graph.node), "bytes": len(data)}
        del model
        try:
            ps, ps_samples = _median(functools.partial(core.parse_serialize_seconds, data), repeats, True)
            # a warm-up grad only for the small sizes (it costs a full transform)
            gs, gs_samples = _median(
                functools.partial(core.grad_seconds, data, wrt, "loss"), repeats, n <= 100_000
            )
            bs, bs_samples = _median(
                functools.partial(core.grad_serialized_seconds, data, wrt, "loss"), repeats, False
            )
            # The result is several times the source (a forward copy plus tangent and
            # cotangent nodes): parse+serialize of the result is the floor of building it.
            result = core.grad(data, wrt, "loss")
            rps, _ = _median(functools.partial(core.parse_serialize_seconds, result), repeats, False)
            row.update(
                parse_serialize_s=ps,
                grad_s=gs,
                ratio=gs / ps if ps > 0 else float("nan"),
                result_bytes=len(result),
                result_parse_serialize_s=rps,
                ratio_to_result=gs / rps if rps > 0 else float("nan"),
                grad_serialized_s=bs,
                ratio_serialized=bs / ps if ps > 0 else float("nan"),
                parse_serialize_samples=ps_samples,
                grad_samples=gs_samples,
                grad_serialized_samples=bs_samples,
            )
            del result
            print(
                f"  N={_fmt_n(n)} ({row['nodes']} nodes, {len(data) / 1e6:.1f} MB, made in {gen_s:.1f} s): "
                f"parse+serialize {ps:.4f} s, grad {gs:.4f} s ({gs / ps:.1f}x); result "
                f"{row['result_bytes'] / len(data):.1f}x the bytes, its parse+serialize {rps:.4f} s "
                f"(grad = {gs / rps:.1f}x that); bytes to bytes {bs:.4f} s ({bs / ps:.1f}x)",
                flush=True,
            )
        except Exception as exc:
            row["error"] = _error_record(f"grad N={n}", exc)
            print(f"  N={_fmt_n(n)}: FAILED {type(exc).__name__}: {exc}", flush=True)
        out["rows"].append(row)
        del data
        gc.collect()
    rows = [r for r in out["rows"] if "grad_s" in r]
    for key in ("parse_serialize_s", "grad_s"):
        for prev, row in itertools.pairwise(rows):
            decades = math.log10(row["n"] / prev["n"])
            if decades > 0 and prev[key] > 0:
                row[f"{key}_growth_per_10x"] = (row[key] / prev[key]) ** (1.0 / decades)
    return out


# --------------------------------------------------------------------------------------------
# (b) run time of grad(f) vs hand-written


def _grad_names(weights: dict[str, np.ndarray]) -> list[str]:
    return ["loss"] + [f"{k}_grad" for k in weights]


def bench_runtime(
    label: str,
    build: Callable[[bool], onnx.ModelProto],
    weights: dict[str, np.ndarray],
    feeds: dict[str, np.ndarray],
    timing: dict[str, int],
    known_zero: Sequence[str] = (),
) -> dict[str, Any]:
    """``known_zero``: gradients that are 0 analytically (both sides are float32 rounding
    noise); they are checked as max|value| <= 1e-6 * the largest gradient entry instead."""
    import onnax

    out: dict[str, Any] = {"model": label}
    forward = build(False)
    out["forward_nodes"] = len(forward.graph.node)
    hand: onnx.ModelProto | None = None
    try:
        hand = build(True)
        onnx.checker.check_model(hand)
    except Exception as exc:
        out["hand_error"] = _error_record("build hand-written backward", exc)
        hand = None
    try:
        t0 = time.perf_counter()
        gm = onnax.grad(forward, inputs=list(weights), output="loss")
        out["onnax_grad_transform_s"] = time.perf_counter() - t0
        out["onnax_grad_nodes"] = len(gm.graph.node)
    except Exception as exc:
        out["onnax_error"] = _error_record("onnax.grad", exc)
        print(f"  onnax.grad FAILED: {type(exc).__name__}: {exc}", flush=True)
        gm = None
    names = _grad_names(weights)

    # numerical check: onnax vs hand-written (both in ORT, same feeds)
    if gm is not None and hand is not None:
        try:
            got = dict(zip(names, ort_session(gm).run(names, feeds), strict=True))
            want = dict(zip(names, ort_session(hand).run(names, feeds), strict=True))
            checks = {k: compare(got[k], want[k]) for k in names if k not in known_zero}
            scale = max(float(np.max(np.abs(want[k]))) for k in names if k != "loss")
            for k in known_zero:
                noise = max(float(np.max(np.abs(got[k]))), float(np.max(np.abs(want[k]))))
                checks[k] = {
                    "ok": noise <= 1e-6 * scale,
                    "analytically_zero": True,
                    "max_abs_onnax": float(np.max(np.abs(got[k]))),
                    "max_abs_hand": float(np.max(np.abs(want[k]))),
                    "rel_err": noise / scale,
                }
            out["check_vs_hand"] = {
                "ok": all(c["ok"] for c in checks.values()),
                "worst_rel_err": max(c.get("rel_err", float("inf")) for c in checks.values()),
                "per_output": checks,
            }
            bad = [k for k, c in checks.items() if not c["ok"]]
            print(
                f"  check onnax grad vs hand-written (rtol {RTOL}): "
                f"{'OK' if not bad else 'MISMATCH ' + ', '.join(bad)} "
                f"(worst max|err|/max|ref| {out['check_vs_hand']['worst_rel_err']:.1e})",
                flush=True,
            )
        except Exception as exc:
            out["check_vs_hand"] = {"ok": False, **_error_record("run/compare", exc)}
            print(f"  check FAILED: {type(exc).__name__}: {exc}", flush=True)

    def runner(outputs: list[str]) -> Callable[[Any], object]:
        return lambda sess: sess.run(outputs, feeds)

    variants: list[tuple[str, onnx.ModelProto | None, list[str]]] = [
        ("forward", forward, ["loss"]),
        ("onnax_grad", gm, names),
        ("hand_grad", hand, names),
    ]
    for key, model, outputs in variants:
        if model is None:
            continue
        try:
            out[key] = time_ort(model, runner(outputs), **timing)
            print(
                f"  {key:<11} {out[key]['latency_s'] * 1e3:9.2f} ms/run "
                f"(init {out[key]['session_init_s']:.2f} s, first run "
                f"{out[key]['first_run_s'] * 1e3:.1f} ms, {out[key]['nodes']} nodes)",
                flush=True,
            )
        except Exception as exc:
            out[f"{key}_error"] = _error_record(f"ORT {key}", exc)
            print(f"  {key}: FAILED {type(exc).__name__}: {exc}", flush=True)
    fwd = out.get("forward", {}).get("latency_s")
    og = out.get("onnax_grad", {}).get("latency_s")
    hg = out.get("hand_grad", {}).get("latency_s")
    if fwd and og:
        out["onnax_grad_over_forward"] = og / fwd
    if fwd and hg:
        out["hand_grad_over_forward"] = hg / fwd
    if og and hg:
        out["onnax_grad_over_hand"] = og / hg
    return out


# --------------------------------------------------------------------------------------------
# (c) per-example gradients


def bench_per_example(width: int, batch: int, timing: dict[str, int]) -> dict[str, Any]:
    import onnax

    out: dict[str, Any] = {
        "model": f"4-layer MLP, width {width}, one example x:[{width}]",
        "width": width,
        "batch": batch,
    }
    weights = mlp_weights(width, 4, 0)
    # every per-example gradient is materialized by both variants: the memory-traffic floor
    out["per_example_grad_bytes"] = batch * 4 * sum(int(v.size) for v in weights.values())
    f = mlp_model(width, None)
    try:
        gm = onnax.grad(f, inputs=list(weights), output="loss")
        t0 = time.perf_counter()
        vm = onnax.vmap(gm, in_axes={"x": 0, "target": 0})
        out["onnax_vmap_transform_s"] = time.perf_counter() - t0
    except Exception as exc:
        out["onnax_error"] = _error_record("onnax.grad / onnax.vmap", exc)
        print(f"  onnax FAILED: {type(exc).__name__}: {exc}", flush=True)
        return out
    names = _grad_names(weights)
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((batch, width)).astype(np.float32)
    ts = rng.standard_normal((batch, width)).astype(np.float32)
    try:
        loop_sess = ort_session(gm)
        loop = [loop_sess.run(names, {"x": xs[i], "target": ts[i]}) for i in range(batch)]
        want = {k: np.stack([r[j] for r in loop]) for j, k in enumerate(names)}
        got = dict(zip(names, ort_session(vm).run(names, {"x": xs, "target": ts}), strict=True))
        checks = {k: compare(got[k], want[k]) for k in names}
        out["check_vs_loop"] = {
            "ok": all(c["ok"] for c in checks.values()),
            "worst_rel_err": max(c.get("rel_err", float("inf")) for c in checks.values()),
            "per_output": checks,
        }
        bad = [k for k, c in checks.items() if not c["ok"]]
        print(
            f"  check vmap(grad(f)) vs loop of grad(f) (rtol {RTOL}): "
            f"{'OK' if not bad else 'MISMATCH ' + ', '.join(bad)} "
            f"(worst max|err|/max|ref| {out['check_vs_loop']['worst_rel_err']:.1e})",
            flush=True,
        )
    except Exception as exc:
        out["check_vs_loop"] = {"ok": False, **_error_record("run/compare", exc)}
        print(f"  check FAILED: {type(exc).__name__}: {exc}", flush=True)

    def run_loop(sess: Any) -> object:
        return [sess.run(names, {"x": xs[i], "target": ts[i]}) for i in range(batch)]

    def run_vmapped(sess: Any) -> object:
        return sess.run(names, {"x": xs, "target": ts})

    for key, model, fn in (("loop_grad", gm, run_loop), ("vmap_grad", vm, run_vmapped)):
        try:
            out[key] = time_ort(model, fn, **timing)
            print(
                f"  {key:<9} {out[key]['latency_s'] * 1e3:9.2f} ms per {batch} examples "
                f"(init {out[key]['session_init_s']:.2f} s, {out[key]['nodes']} nodes)",
                flush=True,
            )
        except Exception as exc:
            out[f"{key}_error"] = _error_record(f"ORT {key}", exc)
            print(f"  {key}: FAILED {type(exc).__name__}: {exc}", flush=True)
    if out.get("loop_grad") and out.get("vmap_grad"):
        out["speedup"] = out["loop_grad"]["latency_s"] / out["vmap_grad"]["latency_s"]
        out["vmap_grad_output_GB_per_s"] = out["per_example_grad_bytes"] / out["vmap_grad"]["latency_s"] / 1e9
    return out


# --------------------------------------------------------------------------------------------
# Report


def _fmt_n(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = [tuple(header), *[tuple(r) for r in rows]]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for j, row in enumerate(table):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if j == 0:
            print("  ".join("-" * w for w in widths))


def _ms(rec: dict[str, Any], key: str) -> str:
    v = rec.get(key, {})
    return f"{v['latency_s'] * 1e3:.2f}" if v else "-"


def _x(rec: dict[str, Any], key: str) -> str:
    v = rec.get(key)
    return f"{v:.2f}x" if v is not None else "-"


def _report_scaling(a: dict[str, Any] | None, part: str) -> list[str]:
    """Prints one (a) table; returns the targets missed."""
    problems: list[str] = []
    if not a:
        return problems
    print(
        f"\n{part} grad transform vs parse+serialize, {a['model']}\n"
        f"(C++, median of {a['repeats']}; wrt {a['wrt']})"
    )
    rows: list[tuple[str, ...]] = []
    for r in a["rows"]:
        if "grad_s" not in r:
            rows.append((_fmt_n(r["n"]), "-", "ERROR", "-", "-", "-", "-", "-", "-"))
            problems.append(f"{part} N={r['n']}: {r['error']['message']}")
            continue
        g1 = r.get("parse_serialize_s_growth_per_10x")
        g2 = r.get("grad_s_growth_per_10x")
        rows.append(
            (
                _fmt_n(r["n"]),
                f"{r['parse_serialize_s']:.4f}",
                f"{r['grad_s']:.4f}",
                f"{r['ratio']:.1f}x",
                f"{r['ratio_to_result']:.1f}x",
                f"{r['grad_serialized_s']:.4f}",
                f"{r['ratio_serialized']:.1f}x",
                "-" if g1 is None else f"{g1:.1f}x",
                "-" if g2 is None else f"{g2:.1f}x",
            )
        )
        if r["ratio"] > 3:
            problems.append(f"{part} N={_fmt_n(r['n'])}: grad/parse = {r['ratio']:.1f}x > 3x target")
        if g2 is not None and g2 > 12:
            problems.append(f"{part} N={_fmt_n(r['n'])}: grad growth {g2:.1f}x per 10x N (> ~10x)")
    _print_table(
        (
            "N",
            "parse+ser s",
            "grad s",
            "grad/parse",
            "grad/result parse",
            "bytes->bytes s",
            "bytes/parse",
            "growth/10x parse",
            "growth/10x grad",
        ),
        rows,
    )
    if not a.get("verification", {}).get("ok", False):
        problems.append(f"{part} grad({a['family']}) verification failed")
    return problems


def finish(
    result: dict[str, Any], problems: list[str], t_start: float, output: Path | None, all_good: str
) -> None:
    """Records the total time and the problems in `result`, prints them, writes `output`."""
    result["total_s"] = time.perf_counter() - t_start
    result["targets_missed_or_failures"] = problems
    print(f"\ntotal {result['total_s']:.0f} s")
    if problems:
        print("targets missed / failures:")
        for s in problems:
            print(f"  - {s}")
    else:
        print(all_good)
    if output is not None:
        output.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {output}")


def report(result: dict[str, Any]) -> list[str]:
    """Prints the tables; returns the list of targets missed or checks failed."""
    problems: list[str] = []
    for key, part in (("scaling", "(a)"), ("scaling_stack", "(a2)")):
        problems += _report_scaling(result.get(key), part)
    for key, title in (("mlp", "(b1) MLP"), ("transformer", "(b2) transformer block")):
        rec = result.get(key)
        if not rec:
            continue
        print(f"\n{title}: {rec['model']} (ORT, 1 thread, ms/run = median of per-repeat means)")
        _print_table(
            ("forward ms", "onnax grad ms", "hand grad ms", "grad/fwd", "hand/fwd", "grad/hand", "check"),
            [
                (
                    _ms(rec, "forward"),
                    _ms(rec, "onnax_grad"),
                    _ms(rec, "hand_grad"),
                    _x(rec, "onnax_grad_over_forward"),
                    _x(rec, "hand_grad_over_forward"),
                    _x(rec, "onnax_grad_over_hand"),
                    "-"
                    if "check_vs_hand" not in rec
                    else ("OK" if rec["check_vs_hand"]["ok"] else "MISMATCH"),
                )
            ],
        )
        for err_key in ("onnax_error", "hand_error", "forward_error", "onnax_grad_error", "hand_grad_error"):
            if err_key in rec:
                problems.append(f"{title}: {err_key}: {rec[err_key]['message']}")
        if "check_vs_hand" in rec and not rec["check_vs_hand"]["ok"]:
            problems.append(f"{title}: onnax gradients differ from hand-written")
        ratio = rec.get("onnax_grad_over_hand")
        if ratio is not None and ratio > 1.1:
            problems.append(f"{title}: onnax grad {ratio:.2f}x hand-written (> 1.1x target)")
    pe = result.get("per_example")
    if pe:
        print("\n(c) per-example gradients of a 4-layer MLP loss w.r.t. its weights (ORT, 1 thread)")
        rows = []
        for c in pe:
            rows.append(
                (
                    str(c["width"]),
                    str(c["batch"]),
                    f"{c['per_example_grad_bytes'] / 1e6:.1f}",
                    _ms(c, "loop_grad"),
                    _ms(c, "vmap_grad"),
                    _x(c, "speedup"),
                    "-" if "check_vs_loop" not in c else ("OK" if c["check_vs_loop"]["ok"] else "MISMATCH"),
                )
            )
            tag = f"(c) width {c['width']}"
            if "onnax_error" in c:
                problems.append(f"{tag}: {c['onnax_error']['message']}")
            if "check_vs_loop" in c and not c["check_vs_loop"]["ok"]:
                problems.append(f"{tag}: vmap(grad(f)) differs from the loop of grad(f)")
            if c.get("speedup") is not None and c["speedup"] < 10:
                problems.append(f"{tag}: speedup {c['speedup']:.1f}x < 10x target")
        _print_table(
            ("width", "B", "grads MB", "loop of B grad ms", "vmap(grad) ms", "speedup", "check"), rows
        )
    return problems


# --------------------------------------------------------------------------------------------
# Main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke mode: small models, few repeats")
    p.add_argument("--sizes", default=None, help="(a) chain node counts (default 10000,100000)")
    p.add_argument("--wrt", choices=("input", "weights"), default="input", help="(a) differentiate w.r.t.")
    p.add_argument(
        "--repeats", type=int, default=None, help="timed repeats: (a) default 3, ORT default 7; quick 2 and 3"
    )
    p.add_argument("--runs", type=int, default=None, help="ORT runs per repeat (default 5; quick 2)")
    p.add_argument("--warmup", type=int, default=None, help="ORT warm-up runs (default 3; quick 1)")
    p.add_argument(
        "--only", default="a,a2,b1,b2,c", help="comma-separated subset of the parts a, a2, b1, b2, c to run"
    )
    p.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)

    q = args.quick
    sizes_arg = args.sizes or ("1000,10000" if q else "10000,100000")
    sizes = [int(s.replace("_", "")) for s in sizes_arg.split(",") if s.strip()]
    repeats = args.repeats or (2 if q else 3)
    timing = {
        "warmup": args.warmup if args.warmup is not None else (1 if q else 3),
        "repeats": args.repeats or (3 if q else 7),
        "runs": args.runs or (2 if q else 5),
    }
    parts = {s.strip() for s in args.only.split(",") if s.strip()}
    mlp_cfg = {"width": 256, "batch": 64} if q else {"width": 1024, "batch": 256}
    tf_cfg = (
        {"batch": 2, "seq": 32, "width": 64, "heads": 4}
        if q
        else {"batch": 8, "seq": 128, "width": 256, "heads": 4}
    )
    # width 256 is the measurement; width 64 (full run only) shows the overhead-bound regime
    pe_widths = [64] if q else [256, 64]
    pe_batch = 64

    result: dict[str, Any] = {
        "quick": q,
        "machine": machine_info(),
        "versions": versions(),
        "ort_timing": timing,
    }
    print(f"machine: {result['machine']['cpu']}, nproc {result['machine']['nproc']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()))
    t_start = time.perf_counter()

    if "a" in parts:
        print(f"\n(a) grad transform scaling, sizes {sizes}", flush=True)
        result["scaling"] = bench_scaling(sizes, repeats, args.wrt)
    if "a2" in parts:
        print(f"\n(a2) grad transform scaling, exported-style transformer stack, sizes {sizes}", flush=True)
        result["scaling_stack"] = bench_scaling(sizes, repeats, args.wrt, family="stack")
    if "b1" in parts:
        w, bs = mlp_cfg["width"], mlp_cfg["batch"]
        print(f"\n(b1) MLP 4x{w}, batch {bs}", flush=True)
        rng = np.random.default_rng(1)
        feeds = {
            "x": rng.standard_normal((bs, w)).astype(np.float32),
            "target": rng.standard_normal((bs, w)).astype(np.float32),
        }
        result["mlp"] = bench_runtime(
            f"4-layer MLP (MatMul+Add+Relu), width {w}, batch {bs}, loss = mean((y - t)^2)",
            lambda hand: mlp_model(w, bs, hand_backward=hand),
            mlp_weights(w, 4, 0),
            feeds,
            timing,
        )
        result["mlp"]["config"] = mlp_cfg
    if "b2" in parts:
        cfg = tf_cfg
        print(
            f"\n(b2) transformer block: batch {cfg['batch']}, seq {cfg['seq']}, width {cfg['width']}, "
            f"{cfg['heads']} heads",
            flush=True,
        )
        rng = np.random.default_rng(2)
        shape = (cfg["batch"], cfg["seq"], cfg["width"])
        feeds = {
            "x": rng.standard_normal(shape).astype(np.float32),
            "target": rng.standard_normal(shape).astype(np.float32),
        }
        result["transformer"] = bench_runtime(
            f"pre-LN transformer block, batch {cfg['batch']}, seq {cfg['seq']}, width {cfg['width']}, "
            f"{cfg['heads']} heads, GELU MLP x4",
            lambda hand: transformer_model(**cfg, hand_backward=hand),
            transformer_weights(cfg["width"], 4 * cfg["width"], 0),
            feeds,
            timing,
            # softmax is invariant to q . bk (constant along the key axis): d loss / d bk = 0
            known_zero=["bk_grad"],
        )
        result["transformer"]["config"] = cfg
    if "c" in parts:
        result["per_example"] = []
        for width in pe_widths:
            print(f"\n(c) per-example gradients: MLP 4x{width}, batch {pe_batch}", flush=True)
            result["per_example"].append(bench_per_example(width, pe_batch, timing))

    finish(result, report(result), t_start, args.output, "all targets met, all checks passed")
    checked = [
        (result.get("scaling", {}), "verification"),
        (result.get("mlp", {}), "check_vs_hand"),
        (result.get("transformer", {}), "check_vs_hand"),
        *[(rec, "check_vs_loop") for rec in result.get("per_example", [])],
    ]
    failed = any(not rec.get(k, {"ok": True}).get("ok", False) for rec, k in checked) or any(
        "onnax_error" in rec for rec, _ in checked
    )
    return 1 if failed else 0  # 1 = onnax failed or computed wrong numbers (missed targets: 0)


if __name__ == "__main__":
    sys.exit(main())
