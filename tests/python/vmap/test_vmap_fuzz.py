"""Seeded random multi-node graphs for ``onnax.vmap``.

Each seed builds a chain of 4-7 shape-manipulating and arithmetic nodes over two runtime inputs
(plus initializers), picks random in_axes/out_axes, and checks the vmapped model against a
per-example loop. Random graphs put the batch axis in places the one-node cases do not (after a
Transpose, a keepdims=0 reduction, a Reshape, ...), which is where axis bookkeeping goes wrong.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.vmap_oracle import assert_vmap_matches, make_model, node

pytest.importorskip("onnax")

F = TensorProto.FLOAT
N_GRAPHS = int(os.environ.get("ONNAX_FUZZ_GRAPHS", "200"))


class GraphBuilder:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}
        self.shapes: dict[str, list[int]] = {}
        self.count = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, value: np.ndarray, stem: str = "c") -> str:
        name = self.fresh(stem)
        self.inits[name] = value
        return name

    def emit(self, op: str, inputs: list[str], out_shape: list[int], **attrs: object) -> str:
        out = self.fresh("v")
        self.nodes.append(node(op, inputs, [out], name=f"n{self.count}_{op}", **attrs))
        self.shapes[out] = out_shape
        return out

    def pick_axis(self, rank: int) -> int:
        axis = int(self.rng.integers(0, rank))
        return axis - rank if self.rng.random() < 0.5 else axis


def _unary(b: GraphBuilder, v: str) -> str:
    op = str(b.rng.choice(["Relu", "Neg", "Tanh", "Sigmoid", "Abs", "Softsign"]))
    return b.emit(op, [v], list(b.shapes[v]))


def _binary_with_const(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    k = int(b.rng.integers(0, len(shape) + 1))
    cshape = [d if b.rng.random() < 0.7 else 1 for d in shape[len(shape) - k :]]
    c = b.const(b.rng.standard_normal(cshape).astype(np.float32))
    op = str(b.rng.choice(["Add", "Mul", "Sub", "Max"]))
    ins = [v, c] if b.rng.random() < 0.5 else [c, v]
    return b.emit(op, ins, list(shape))


def _transpose(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if len(shape) < 2:
        return _unary(b, v)
    perm = [int(p) for p in b.rng.permutation(len(shape))]
    return b.emit("Transpose", [v], [shape[p] for p in perm], perm=perm)


def _reduce(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if len(shape) < 2:
        return _unary(b, v)
    axis = b.pick_axis(len(shape))
    keep = int(b.rng.integers(0, 2))
    op = str(b.rng.choice(["ReduceSum", "ReduceMax", "ReduceMean"]))
    pos = axis % len(shape)
    out = list(shape)
    if keep:
        out[pos] = 1
    else:
        del out[pos]
    axes = b.const(np.array([axis], np.int64), "axes")
    return b.emit(op, [v, axes], out, keepdims=keep)


def _softmax(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    return b.emit("Softmax", [v], list(shape), axis=b.pick_axis(len(shape)))


def _reshape(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if len(shape) >= 2 and b.rng.random() < 0.6:
        # merge two adjacent dims: 0 copies the leading dims in place, -1 is the merged one
        i = int(b.rng.integers(0, len(shape) - 1))
        spec = [0] * i + [-1] + list(shape[i + 2 :])
        out = [*shape[:i], shape[i] * shape[i + 1], *shape[i + 2 :]]
    else:
        i = int(b.rng.integers(0, len(shape) + 1))
        spec = [*list(shape[:i]), 1, *list(shape[i:])]
        out = list(spec)
    target = b.const(np.array(spec, np.int64), "shape")
    return b.emit("Reshape", [v, target], out)


def _unsqueeze_squeeze(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    ones = [i for i, d in enumerate(shape) if d == 1]
    if ones and b.rng.random() < 0.6:
        i = int(b.rng.choice(ones))
        ax = i - len(shape) if b.rng.random() < 0.5 else i
        axes = b.const(np.array([ax], np.int64), "axes")
        return b.emit("Squeeze", [v, axes], shape[:i] + shape[i + 1 :])
    if len(shape) >= 4:
        return _unary(b, v)
    i = int(b.rng.integers(0, len(shape) + 1))
    axes = b.const(np.array([i], np.int64), "axes")
    return b.emit("Unsqueeze", [v, axes], [*shape[:i], 1, *shape[i:]])


def _slice(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    cands = [i for i, d in enumerate(shape) if d >= 2]
    if not cands:
        return _unary(b, v)
    i = int(b.rng.choice(cands))
    d = shape[i]
    if b.rng.random() < 0.5:
        start, end, step = 1, d, 1
        n = d - 1
    else:
        start, end, step = d - 1, -d - 1, -1
        n = d
    ax = i - len(shape) if b.rng.random() < 0.5 else i
    ins = [v, b.const(np.array([start], np.int64)), b.const(np.array([end], np.int64))]
    ins += [b.const(np.array([ax], np.int64)), b.const(np.array([step], np.int64))]
    out = list(shape)
    out[i] = n
    return b.emit("Slice", ins, out)


def _concat(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    axis = b.pick_axis(len(shape))
    out = list(shape)
    out[axis % len(shape)] *= 2
    return b.emit("Concat", [v, v], out, axis=axis)


def _matmul(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    k = int(b.rng.integers(1, 4))
    w = b.const(b.rng.standard_normal((shape[-1], k)).astype(np.float32), "w")
    return b.emit("MatMul", [v, w], [*shape[:-1], k])


def _gather(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    axis = b.pick_axis(len(shape))
    d = shape[axis % len(shape)]
    idx = b.const(b.rng.integers(-d, d, size=(2,)).astype(np.int64), "idx")
    out = list(shape)
    out[axis % len(shape)] = 2
    return b.emit("Gather", [v, idx], out, axis=axis)


def _flatten(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    axis = int(b.rng.integers(0, len(shape) + 1))
    lead = int(np.prod(shape[:axis])) if axis else 1
    return b.emit("Flatten", [v], [lead, int(np.prod(shape[axis:]))], axis=axis)


def _cumsum(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    axis = b.const(np.array(b.pick_axis(len(shape)), np.int64), "axis")
    return b.emit("CumSum", [v, axis], list(shape), reverse=int(b.rng.integers(0, 2)))


def _pad(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    i = b.pick_axis(len(shape))
    lo, hi = int(b.rng.integers(0, 3)), int(b.rng.integers(0, 3))
    mode = str(b.rng.choice(["constant", "edge"]))
    ins = [v, b.const(np.array([lo, hi], np.int64), "pads"), "", b.const(np.array([i], np.int64), "axes")]
    out = list(shape)
    out[i % len(shape)] += lo + hi
    return b.emit("Pad", ins, out, mode=mode)


def _tile(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    reps = [int(r) for r in b.rng.integers(1, 3, size=len(shape))]
    out = [d * r for d, r in zip(shape, reps, strict=True)]
    return b.emit("Tile", [v, b.const(np.array(reps, np.int64), "reps")], out)


def _expand(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if len(shape) >= 4:
        return _unary(b, v)
    target = [int(b.rng.integers(1, 3))] + [d if d != 1 else int(b.rng.integers(1, 3)) for d in shape]
    return b.emit("Expand", [v, b.const(np.array(target, np.int64), "shape")], target)


def _topk(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    axis = b.pick_axis(len(shape))
    k = int(b.rng.integers(1, shape[axis % len(shape)] + 1))
    out = list(shape)
    out[axis % len(shape)] = k
    values = b.fresh("v")
    indices = b.fresh("i")
    kname = b.const(np.array([k], np.int64), "k")
    b.nodes.append(node("TopK", [v, kname], [values, indices], name=f"n{b.count}_TopK", axis=axis))
    b.shapes[values] = out
    return values


def _split(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    cands = [i for i, d in enumerate(shape) if d >= 2]
    if not cands:
        return _unary(b, v)
    i = int(b.rng.choice(cands))
    first = int(b.rng.integers(1, shape[i]))
    parts = b.const(np.array([first, shape[i] - first], np.int64), "split")
    a, c = b.fresh("v"), b.fresh("v")
    axis = i - len(shape) if b.rng.random() < 0.5 else i
    b.nodes.append(node("Split", [v, parts], [a, c], name=f"n{b.count}_Split", axis=axis))
    out = list(shape)
    out[i] = shape[i] - first
    b.shapes[c] = out
    return c


def _layernorm(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if not shape:
        return _unary(b, v)
    axis = b.pick_axis(len(shape))
    norm_shape = shape[axis % len(shape) :]
    scale = b.const(b.rng.uniform(0.5, 1.5, norm_shape).astype(np.float32), "scale")
    return b.emit("LayerNormalization", [v, scale], list(shape), axis=axis)


def _argmax_cast(b: GraphBuilder, v: str) -> str:
    shape = b.shapes[v]
    if len(shape) < 2:
        return _unary(b, v)
    axis = b.pick_axis(len(shape))
    out = list(shape)
    out[axis % len(shape)] = 1
    am = b.emit("ArgMax", [v], out, axis=axis)
    return b.emit("Cast", [am], out, to=F)


STEPS: list[Callable[[GraphBuilder, str], str]] = [
    _unary,
    _binary_with_const,
    _transpose,
    _reduce,
    _softmax,
    _reshape,
    _unsqueeze_squeeze,
    _slice,
    _concat,
    _matmul,
    _gather,
    _flatten,
    _cumsum,
    _pad,
    _tile,
    _expand,
    _topk,
    _split,
    _layernorm,
    _argmax_cast,
]


def random_case(seed: int) -> tuple[onnx.ModelProto, list[int | None], list[int]]:
    rng = np.random.default_rng(seed)
    b = GraphBuilder(rng)
    xs = [int(d) for d in rng.integers(1, 4, size=int(rng.integers(1, 4)))]
    ys = xs[int(rng.integers(0, len(xs) + 1)) :]
    b.shapes["x"], b.shapes["y"] = xs, ys
    v = "x"
    mixed = False
    for _ in range(int(rng.integers(4, 8))):
        step = STEPS[int(rng.integers(0, len(STEPS)))]
        v = step(b, v)
        if not mixed and rng.random() < 0.4 and _broadcastable(b.shapes["y"], b.shapes[v]):
            v = b.emit(str(rng.choice(["Add", "Mul"])), [v, "y"], list(b.shapes[v]))
            mixed = True
    if not mixed:
        yy = b.emit("Neg", ["y"], list(ys))
        outputs = [v, yy]
    else:
        outputs = [v]
    model = make_model(
        b.nodes,
        [("x", F, xs), ("y", F, ys)],
        [(o, F, b.shapes[o]) for o in outputs],
        initializers=b.inits,
    )
    onnx.checker.check_model(model, full_check=True)
    choices: list[list[int | None]] = [
        [int(rng.integers(-len(xs) - 1, len(xs) + 1)), None],
        [None, int(rng.integers(-len(ys) - 1, len(ys) + 1))],
        [int(rng.integers(0, len(xs) + 1)), int(rng.integers(0, len(ys) + 1))],
    ]
    in_axes = choices[int(rng.integers(0, 3))]
    out_axes = [int(rng.integers(-len(b.shapes[o]) - 1, len(b.shapes[o]) + 1)) for o in outputs]
    return model, in_axes, out_axes


def _broadcastable(small: list[int], big: list[int]) -> bool:
    if len(small) > len(big):
        return False
    return all(s in (1, g) for s, g in zip(small[::-1], big[::-1], strict=False))


def _describe(model: onnx.ModelProto) -> str:
    return helper.printable_graph(model.graph)


@pytest.mark.parametrize("seed", range(N_GRAPHS))
def test_random_graph(seed: int) -> None:
    model, in_axes, out_axes = random_case(seed)
    try:
        assert_vmap_matches(model, in_axes, out_axes, rtol=1e-4, atol=1e-5, seed=seed)
    except AssertionError as err:
        raise AssertionError(f"{err}\nin_axes={in_axes} out_axes={out_axes}\n{_describe(model)}") from err
