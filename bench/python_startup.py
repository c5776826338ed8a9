"""Benchmark (not a test): start-up of the `onnax` command through Python against the C++
binary, and the onnx_ir path against the ModelProto path on node-heavy graphs.

* ``onnax version`` through ``.venv/bin/onnax`` (Python) and ``build/onnax`` (C++), best of
  ``--repeats`` runs each, interleaved;
* vmap of a chain of Tanh/Mul nodes (1,068 and 10,000 nodes) given as an ``onnx.ModelProto`` and
  as an ``onnx_ir.Model``, with onnx_ir's own serialize (source) and deserialize (result) timed
  alone: the floor of the onnx_ir path through onnx_ir's public API.

    python bench/python_startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnax
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]


def chain(pairs: int) -> onnx.ModelProto:
    nodes, prev = [], "x"
    for i in range(pairs):
        nodes += [
            helper.make_node("Tanh", [prev], [f"t{i}"]),
            helper.make_node("Mul", [f"t{i}", "w"], [f"m{i}"]),
        ]
        prev = f"m{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.ones(8, np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def median_ms(f: Callable[[], object], repeats: int) -> float:
    f()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    commands = {
        "python": [str(ROOT / ".venv/bin/onnax"), "version"],
        "c++": [str(ROOT / "build/onnax"), "version"],
    }
    best = dict.fromkeys(commands, float("inf"))
    for _ in range(args.repeats):
        for name, cmd in commands.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            best[name] = min(best[name], time.perf_counter() - t0)
    print(
        f"onnax version: python {best['python'] * 1e3:.0f} ms, c++ {best['c++'] * 1e3:.0f} ms, "
        f"difference {(best['python'] - best['c++']) * 1e3:.0f} ms"
    )
    for pairs in (534, 5000):
        model = chain(pairs)
        as_ir = ir.serde.deserialize_model(model)
        result = onnax.vmap(model)
        proto_ms = median_ms(partial(onnax.vmap, model), args.repeats)
        ir_ms = median_ms(partial(onnax.vmap, as_ir), args.repeats)
        ser_ms = median_ms(partial(ir.serde.serialize_model, as_ir), args.repeats)
        de_ms = median_ms(partial(ir.serde.deserialize_model, result), args.repeats)
        print(
            f"{2 * pairs} nodes: vmap ModelProto {proto_ms:.1f} ms, onnx_ir {ir_ms:.1f} ms "
            f"({ir_ms / proto_ms:.0f}x); onnx_ir serialize {ser_ms:.1f} ms + deserialize {de_ms:.1f} ms "
            f"= {ser_ms + de_ms:.1f} ms floor"
        )


if __name__ == "__main__":
    main()
