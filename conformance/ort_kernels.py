"""Do onnax's results run in ONNX Runtime wherever their source does, in every float dtype?

The backend conformance runs (``backend_vmap``, ``backend_ad``) use the node tests' own
dtypes, nearly all float32. A rule may emit an op ONNX Runtime has no kernel for in another
dtype (an int64 gather of positions, Erf or a reduction in float64), and the result then fails
to load although its source runs. This sweep takes every single-op node test with a float32
input, makes a float64 copy of it (every float32 type, initializer and Constant, and Cast
targets), keeps the variants whose source ONNX Runtime loads and runs, transforms each with
vmap, jvp and vjp, and loads and runs the result in ONNX Runtime. A result that ONNX Runtime
rejects for a missing kernel ("NOT_IMPLEMENTED", "Could not find an implementation") is a
failure; a transform that refuses the model is not this sweep's concern (the conformance runs
judge those).

Usage::

    python -m conformance.ort_kernels             # all single-op node tests, in three dtypes
    python -m conformance.ort_kernels -k 'gelu|erf'
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnax
import onnx
import onnxruntime as ort

from conformance import backend_vmap as bv

FLOAT, DOUBLE, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16
MISSING_KERNEL = re.compile(r"NOT_IMPLEMENTED|Could not find an implementation", re.IGNORECASE)


@dataclass
class Outcome:
    test: str
    op: str
    dtype: str
    transform: str
    problem: str  # "" when the result ran


def _retype(t: onnx.TypeProto, to: int) -> None:
    kind = t.WhichOneof("value")
    if kind == "tensor_type" and t.tensor_type.elem_type == FLOAT:
        t.tensor_type.elem_type = to
    elif kind == "sequence_type":
        _retype(t.sequence_type.elem_type, to)
    elif kind == "optional_type":
        _retype(t.optional_type.elem_type, to)


def _retensor(t: onnx.TensorProto, to: int) -> None:
    if t.data_type == FLOAT:
        with np.errstate(over="ignore"):  # (float16 saturates to inf, which is its value)
            values = onnx.numpy_helper.to_array(t).astype(onnx.helper.tensor_dtype_to_np_dtype(to))
        t.CopyFrom(onnx.numpy_helper.from_array(values, t.name))


def _regraph(g: onnx.GraphProto, to: int) -> None:
    for vi in [*g.input, *g.output, *g.value_info]:
        _retype(vi.type, to)
    for t in g.initializer:
        _retensor(t, to)
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                _retensor(a.t, to)
            elif a.type == onnx.AttributeProto.GRAPH:
                _regraph(a.g, to)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    _regraph(sub, to)
            elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == FLOAT:
                a.i = to


def retyped(model: onnx.ModelProto, to: int) -> onnx.ModelProto:
    """The model with every float32 value made `to` (float64 or float16)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _regraph(out.graph, to)
    return out


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _feeds(
    sess: ort.InferenceSession, model: onnx.ModelProto, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    declared = {vi.name: vi for vi in model.graph.input}
    feeds: dict[str, np.ndarray] = {}
    for i in sess.get_inputs():
        vi = declared[i.name]
        elem = vi.type.tensor_type.elem_type
        dims = [d.dim_value if d.dim_value > 0 else 2 for d in vi.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        if dtype.kind == "f":
            feeds[i.name] = rng.uniform(0.1, 0.9, size=dims).astype(dtype)
        elif dtype.kind == "b":
            feeds[i.name] = rng.integers(0, 2, size=dims).astype(bool)
        else:
            feeds[i.name] = np.zeros(dims, dtype)
    return feeds


def _runs(model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None) -> str:
    """ "" when ONNX Runtime loads and runs the model, else the first line of its error."""
    try:
        sess = _session(model)
        given = feeds or _feeds(sess, model, np.random.default_rng(0))
        wanted = {i.name for i in sess.get_inputs()}
        sess.run(None, {k: v for k, v in given.items() if k in wanted})
    except Exception as e:  # (any runtime failure is the finding)
        return str(e).strip().splitlines()[0][:300]
    return ""


def _transforms(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.ModelProto | None]]:
    floats = [
        vi.name
        for vi in model.graph.input
        if vi.type.tensor_type.elem_type in (FLOAT, DOUBLE)
        and vi.name not in {t.name for t in model.graph.initializer}
    ]
    for name, fn in [
        ("vmap", lambda m: onnax.vmap(m, in_axes=0)),
        ("jvp", lambda m: onnax.jvp(m, inputs=floats)),
        ("vjp", lambda m: onnax.vjp(m, inputs=floats)),
    ]:
        if name != "vmap" and not floats:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield name, fn(model)
        except Exception:  # (refusals are judged by the conformance runs)
            yield name, None


def _with_feeds_for(result: onnx.ModelProto, source_feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds for a transformed model: the source's, plus random values for new inputs."""
    sess = _session(result)
    feeds = _feeds(sess, result, np.random.default_rng(1))
    feeds.update({k: v for k, v in source_feeds.items() if k in feeds and feeds[k].shape == v.shape})
    return feeds


def sweep(pattern: str | None = None) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for info in bv.discover_models(bv.ensure_node_data(verbose=False), pattern):
        if info.skip_reason:
            continue
        source = onnx.load(str(Path(info.path) / "model.onnx"))
        if len(source.graph.node) != 1 or not any(
            vi.type.tensor_type.elem_type == FLOAT for vi in source.graph.input
        ):
            continue
        variants = [
            ("float32", source),
            ("float64", retyped(source, DOUBLE)),
            ("float16", retyped(source, FLOAT16)),
        ]
        for dtype, model in variants:
            if _runs(model):
                continue  # ONNX Runtime does not run the source in this dtype
            source_feeds = _feeds(_session(model), model, np.random.default_rng(0))
            for name, result in _transforms(model):
                if result is None:
                    continue
                try:
                    problem = _runs(result, _with_feeds_for(result, source_feeds))
                except Exception as e:
                    problem = str(e).splitlines()[0][:300]
                if problem and not MISSING_KERNEL.search(problem):
                    problem = ""  # (shape or value problems: the conformance runs judge those)
                outcomes.append(Outcome(info.name, info.op, dtype, name, problem))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.ort_kernels", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-k", dest="pattern", help="only node tests whose name matches this regex")
    args = parser.parse_args(argv)
    outcomes = sweep(args.pattern)
    failed = [o for o in outcomes if o.problem]
    for o in failed:
        print(f"{o.test} ({o.op}, {o.dtype}) {o.transform}: {o.problem}")
    ran = len(outcomes) - len(failed)
    print(f"{ran} of {len(outcomes)} results run in ONNX Runtime where their source does")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
