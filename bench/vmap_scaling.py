"""How the cost of ``onnax.vmap`` grows with model size, next to the protobuf I/O floor.

Builds chain models of N nodes (a repeating MatMul -> Add -> Tanh -> Mul -> Sigmoid -> Sub
chain over a [4, 8] float input, with small [8, 8] / [8] initializers shared by all layers or
one set per layer), writes them to a temporary directory and measures, for each N, the median
over ``--repeats`` runs of

* parse + serialize of the model: ``onnax._core.parse_serialize_seconds`` (C++ protobuf,
  ParseFromString + SerializeToString) when available, else the ``onnx`` Python package's
  ``ModelProto.ParseFromString`` + ``SerializeToString`` (labelled as such);
* vmap: ``onnax._core.vmap_seconds`` (the C++ transform alone on already-parsed input) when
  available, else the wall time of ``onnax.vmap(model_proto, in_axes=0)`` (labelled: includes
  the Python-boundary serialization costs).

The ratio column is vmap / (parse + serialize); the growth columns are the factor by which a
time grows per 10x of N (about 10 means linear).  Before timing, the N=10k model (or the smallest
size) is vmapped once and checked in ONNX Runtime against a per-example loop, so the benchmark
measures a correct transform.

    python bench/vmap_scaling.py                       # N = 10k, 100k, 1M
    python bench/vmap_scaling.py --sizes 10000,100000 --repeats 5 --output bench.json
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
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PATTERN = ("MatMul", "Add", "Tanh", "Mul", "Sigmoid", "Sub")
IN_SHAPE = (4, 8)
OPSET = 18
IR_VERSION = 10


# --------------------------------------------------------------------------------------------
# Model generation


def _weights(rng: np.random.Generator, suffix: str) -> list[onnx.TensorProto]:
    w = (rng.standard_normal((8, 8)) * (0.5 / math.sqrt(8))).astype(np.float32)
    b = (rng.standard_normal(8) * 0.1).astype(np.float32)
    s = (1.0 + rng.standard_normal(8) * 0.1).astype(np.float32)
    c = (rng.standard_normal(8) * 0.1).astype(np.float32)
    return [
        numpy_helper.from_array(w, f"W{suffix}"),
        numpy_helper.from_array(b, f"b{suffix}"),
        numpy_helper.from_array(s, f"s{suffix}"),
        numpy_helper.from_array(c, f"c{suffix}"),
    ]


def chain_model(n_nodes: int, per_layer_weights: bool = False, seed: int = 0) -> onnx.ModelProto:
    """A chain of ``n_nodes`` nodes cycling through PATTERN: x:[4,8] -> y:[4,8]."""
    rng = np.random.default_rng(seed)
    initializers = [] if per_layer_weights else _weights(rng, "")
    nodes = []
    prev = "x"
    for i in range(n_nodes):
        op = PATTERN[i % len(PATTERN)]
        layer = i // len(PATTERN)
        if per_layer_weights and i % len(PATTERN) == 0:
            initializers.extend(_weights(rng, f"_{layer}"))
        sfx = f"_{layer}" if per_layer_weights else ""
        out = "y" if i == n_nodes - 1 else f"h{i}"
        if op == "MatMul":
            inputs = [prev, f"W{sfx}"]
        elif op == "Add":
            inputs = [prev, f"b{sfx}"]
        elif op == "Mul":
            inputs = [prev, f"s{sfx}"]
        elif op == "Sub":
            inputs = [prev, f"c{sfx}"]
        else:
            inputs = [prev]
        nodes.append(helper.make_node(op, inputs, [out]))
        prev = out
    graph = helper.make_graph(
        nodes,
        f"chain{n_nodes}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(IN_SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(IN_SHAPE))],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


# --------------------------------------------------------------------------------------------
# Timers


def _median_seconds(fn: Callable[[], float], repeats: int) -> tuple[float, list[float]]:
    fn()  # warm-up (schema registries, allocator); not counted
    samples = []
    for _ in range(repeats):
        gc.collect()
        samples.append(float(fn()))
    return statistics.median(samples), samples


def _wall(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def make_timers() -> tuple[dict[str, str], Callable[[bytes], float], Callable[[bytes], float]]:
    """(labels, parse_serialize(bytes) -> s, vmap(bytes) -> s) using the best available API."""
    import onnax

    core = getattr(onnax, "_core", None)
    labels = {}
    if core is not None and hasattr(core, "parse_serialize_seconds"):
        labels["parse_serialize"] = "C++ protobuf ParseFromString + SerializeToString"

        def parse_serialize(data: bytes) -> float:
            return core.parse_serialize_seconds(data)

    else:
        labels["parse_serialize"] = (
            "FALLBACK: onnx Python package ModelProto.ParseFromString + SerializeToString "
            "(onnax._core.parse_serialize_seconds not available)"
        )

        def parse_serialize(data: bytes) -> float:
            def work() -> None:
                m = onnx.ModelProto()
                m.ParseFromString(data)
                m.SerializeToString()

            return _wall(work)

    if core is not None and hasattr(core, "vmap_seconds"):
        labels["vmap"] = (
            "C++ vmap transform alone (onnax._core.vmap_seconds, in_axes=[0] for the single input)"
        )

        def vmap(data: bytes) -> float:
            return core.vmap_seconds(data, 0)

    else:
        labels["vmap"] = (
            "FALLBACK: wall time of onnax.vmap(model_proto, in_axes=0), including Python "
            "boundary costs (onnax._core.vmap_seconds not available)"
        )

        def vmap(data: bytes) -> float:
            m = onnx.ModelProto()
            m.ParseFromString(data)
            return _wall(lambda: onnax.vmap(m, in_axes=0))

    return labels, parse_serialize, vmap


# --------------------------------------------------------------------------------------------
# Correctness check


def verify(model: onnx.ModelProto, batch: int = 3, seed: int = 1) -> dict:
    """vmap the model, run it in ONNX Runtime on a batch, compare with a per-example loop."""
    import onnax
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    t0 = time.perf_counter()
    vm = onnax.vmap(model, in_axes=0)
    vmap_wall = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((batch, *IN_SHAPE)).astype(np.float32)
    src = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want = np.stack([src.run(["y"], {"x": xs[b]})[0] for b in range(batch)])
    sess = ort.InferenceSession(vm.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = sess.run(["y"], {"x": xs})[0]
    ok = got.shape == want.shape and bool(np.allclose(got, want, rtol=1e-4, atol=1e-5))
    err = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("nan")
    return {
        "nodes": len(model.graph.node),
        "vmapped_nodes": len(vm.graph.node),
        "batch": batch,
        "ok": ok,
        "max_abs_err": err,
        "vmapped_output_shape": list(got.shape),
        "onnax_vmap_wall_s": vmap_wall,
    }


# --------------------------------------------------------------------------------------------
# Main


def _fmt_n(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def _growth(rows: list[dict], key: str) -> None:
    for prev, row in itertools.pairwise(rows):
        decades = math.log10(row["n"] / prev["n"])
        if decades > 0 and prev[key] > 0:
            row[f"{key}_growth_per_10x"] = (row[key] / prev[key]) ** (1.0 / decades)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated node counts")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per size (median)")
    p.add_argument(
        "--weights",
        choices=("shared", "per-layer"),
        default="shared",
        help="one weight set for all layers, or one [8,8]+3x[8] set per 6-node layer",
    )
    p.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--workdir", type=Path, default=None, help="directory for the generated models")
    p.add_argument("--no-verify", action="store_true", help="skip the ORT correctness check")
    args = p.parse_args(argv)

    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    labels, parse_serialize, vmap = make_timers()
    print(f"parse+serialize: {labels['parse_serialize']}")
    print(f"vmap:            {labels['vmap']}")

    tmp_ctx = None
    workdir = args.workdir
    if workdir is None:
        tmp_ctx = tempfile.TemporaryDirectory(prefix="onnax-vmap-scaling-")
        workdir = Path(tmp_ctx.name)
    workdir.mkdir(parents=True, exist_ok=True)

    result: dict = {
        "labels": labels,
        "weights": args.weights,
        "repeats": args.repeats,
        "pattern": list(PATTERN),
        "input_shape": list(IN_SHAPE),
        "opset": OPSET,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "rows": [],
    }
    try:
        import onnax

        result["onnax_version"] = getattr(onnax, "__version__", "?")
        verify_n = 10_000 if 10_000 in sizes else min(sizes)
        for n in sizes:
            t0 = time.perf_counter()
            model = chain_model(n, per_layer_weights=args.weights == "per-layer")
            path = workdir / f"chain_{n}.onnx"
            data = model.SerializeToString()
            path.write_bytes(data)
            gen_s = time.perf_counter() - t0
            print(
                f"N={_fmt_n(n)}: generated {len(data) / 1e6:.1f} MB in {gen_s:.1f} s -> {path}",
                flush=True,
            )
            if n == verify_n and not args.no_verify:
                check = verify(model)
                result["verification"] = check
                status = "OK" if check["ok"] else "MISMATCH"
                print(
                    f"  verify N={_fmt_n(n)}: vmapped model in ORT vs per-example loop (B="
                    f"{check['batch']}): {status}, max abs err {check['max_abs_err']:.2e}",
                    flush=True,
                )
                if not check["ok"]:
                    print("  WARNING: the transform is wrong; timings below are suspect", flush=True)
            del model
            data = path.read_bytes()
            ps, ps_samples = _median_seconds(functools.partial(parse_serialize, data), args.repeats)
            vm, vm_samples = _median_seconds(functools.partial(vmap, data), args.repeats)
            result["rows"].append(
                {
                    "n": n,
                    "bytes": len(data),
                    "parse_serialize_s": ps,
                    "vmap_s": vm,
                    "ratio": vm / ps if ps > 0 else float("nan"),
                    "parse_serialize_samples": ps_samples,
                    "vmap_samples": vm_samples,
                }
            )
            print(f"  parse+serialize {ps:.4f} s, vmap {vm:.4f} s", flush=True)
            del data
            gc.collect()
    finally:
        if tmp_ctx is not None:
            tmp_ctx.cleanup()

    rows = result["rows"]
    _growth(rows, "parse_serialize_s")
    _growth(rows, "vmap_s")
    print()
    header = ("N", "parse+serialize s", "vmap s", "vmap/parse", "growth/10x parse", "growth/10x vmap")
    table = [header]
    for r in rows:
        g1 = r.get("parse_serialize_s_growth_per_10x")
        g2 = r.get("vmap_s_growth_per_10x")
        table.append(
            (
                _fmt_n(r["n"]),
                f"{r['parse_serialize_s']:.4f}",
                f"{r['vmap_s']:.4f}",
                f"{r['ratio']:.2f}",
                "-" if g1 is None else f"{g1:.1f}x",
                "-" if g2 is None else f"{g2:.1f}x",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for j, row in enumerate(table):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.output}")
    ok = result.get("verification", {}).get("ok", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
