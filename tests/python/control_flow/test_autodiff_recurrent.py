"""Derivatives of RNN, GRU and LSTM (differentiated through their expansion into a Loop).

Each model is one recurrent op in float32 (ONNX Runtime has no float64 LSTM or RNN kernel)
with weights as initializers, followed by a loss weighting every output element differently.
The oracle is an independent float64 model of the same function written here: the recurrence
unrolled step by step in elementary ops, sequence lengths as 0/1 masks. It is checked against
the op as ONNX Runtime runs it, then every case runs the battery of ``ad_oracle``: jvp against
central finite differences of the oracle, vjp by the dot-product test, grad against finite
differences, Hessian-vector products against finite differences of the oracle's gradient, and
per-example gradients against a loop. The cases cover the attributes exporters write:
directions, batch-first layout, biases, initial states, sequence_lens (sequences shorter than
the batch's), peepholes, linear_before_reset, input_forget, clip and non-default activation
lists with alpha/beta.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles.ad_oracle import (
    as_float,
    battery,
    check_per_example_grad,
    make_ad_model,
    make_feeds,
    run,
)
from oracles.vmap_oracle import assert_vmap_matches

D = int(TensorProto.DOUBLE)
T_STEPS, BATCH, IN, HID = 4, 2, 3, 3
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


@dataclass
class Spec:
    op: str
    direction: str = "forward"
    batch_first: bool = False
    bias: bool = True
    initial: bool = False
    lens: Sequence[int] | None = None
    peepholes: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def dirs(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def outputs(self) -> list[str]:
        return ["Y", "Yh"] + (["Yc"] if self.op == "LSTM" else [])


def values(spec: Spec, seed: int = 0) -> dict[str, np.ndarray]:
    """The initializers: weights, biases, peepholes, lengths and the loss coefficients."""
    rng = np.random.default_rng(seed)
    g, d = GATES[spec.op], spec.dirs
    inits: dict[str, np.ndarray] = {
        "W": rng.standard_normal((d, g * HID, IN)) * 0.6,
        "R": rng.standard_normal((d, g * HID, HID)) * 0.6,
    }
    if spec.bias:
        inits["B"] = rng.standard_normal((d, 2 * g * HID)) * 0.3
    if spec.lens is not None:
        inits["lens"] = np.asarray(spec.lens, dtype=np.int32)
    if spec.peepholes:
        inits["P"] = rng.standard_normal((d, 3 * HID)) * 0.5
    state = [BATCH, d, HID] if spec.batch_first else [d, BATCH, HID]
    y = [BATCH, T_STEPS, d, HID] if spec.batch_first else [T_STEPS, d, BATCH, HID]
    for o in spec.outputs:
        inits["c_" + o] = rng.standard_normal(y if o == "Y" else state)
    return inits


def runtime_inputs(spec: Spec) -> list[tuple[str, int, list[int]]]:
    x = [BATCH, T_STEPS, IN] if spec.batch_first else [T_STEPS, BATCH, IN]
    state = [BATCH, spec.dirs, HID] if spec.batch_first else [spec.dirs, BATCH, HID]
    out = [("X", D, x)]
    if spec.initial:
        out.append(("h0", D, state))
        if spec.op == "LSTM":
            out.append(("c0", D, state))
    return out


def loss_nodes(spec: Spec) -> list[onnx.NodeProto]:
    """loss = sum over outputs o of sum(o * c_o)."""
    nodes, terms = [], []
    for o in spec.outputs:
        nodes.append(helper.make_node("Mul", [o, "c_" + o], [o + "_w"]))
        nodes.append(helper.make_node("ReduceSum", [o + "_w"], [o + "_s"], keepdims=0))
        terms.append(o + "_s")
    total = terms[0]
    for t in terms[1:]:
        nodes.append(helper.make_node("Add", [total, t], [total + "+" + t]))
        total = total + "+" + t
    nodes.append(helper.make_node("Identity", [total], ["loss"]))
    return nodes


def op_model(spec: Spec) -> onnx.ModelProto:
    """The op itself, in float32."""
    names = ["X", "W", "R", "B" if spec.bias else "", "lens" if spec.lens is not None else ""]
    names.append("h0" if spec.initial else "")
    if spec.op == "LSTM":
        names += ["c0" if spec.initial else "", "P" if spec.peepholes else ""]
    while names[-1] == "":
        names.pop()
    node = helper.make_node(
        spec.op,
        names,
        spec.outputs,
        hidden_size=HID,
        direction=spec.direction,
        layout=1 if spec.batch_first else 0,
        **spec.attrs,
    )
    m = make_ad_model(
        [node, *loss_nodes(spec)],
        runtime_inputs(spec),
        [("loss", D, []), *spec.outputs],
        initializers=values(spec),
        opset=22,
    )
    return as_float(m)


class Unrolled:
    """Writes the float64 oracle: nodes with fresh names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    def op(self, op: str, *inputs: str, **attrs: Any) -> str:
        self.count += 1
        out = f"u{self.count}_{op.lower()}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def const(self, value: Any, dtype: Any = np.float64) -> str:
        self.count += 1
        name = f"u{self.count}_const"
        self.nodes.append(
            helper.make_node(
                "Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
            )
        )
        return name

    def rows(self, x: str, start: int, stop: int, axis: int) -> str:
        return self.op(
            "Slice",
            x,
            self.const([start], np.int64),
            self.const([stop], np.int64),
            self.const([axis], np.int64),
        )

    def pick(self, x: str, index: int, axis: int = 0) -> str:
        return self.op("Squeeze", self.rows(x, index, index + 1, axis), self.const([axis], np.int64))

    def activation(self, name: str, x: str, alpha: float, beta: float) -> str:
        name = name.lower()
        if name == "sigmoid":
            return self.op("Sigmoid", x)
        if name == "tanh":
            return self.op("Tanh", x)
        if name == "softsign":
            return self.op("Div", x, self.op("Add", self.const(1.0), self.op("Abs", x)))
        if name == "scaledtanh":
            return self.op("Mul", self.const(alpha), self.op("Tanh", self.op("Mul", self.const(beta), x)))
        if name == "affine":
            return self.op("Add", self.op("Mul", self.const(alpha), x), self.const(beta))
        if name == "hardsigmoid":
            lin = self.op("Add", self.op("Mul", self.const(alpha), x), self.const(beta))
            return self.op("Max", self.const(0.0), self.op("Min", self.const(1.0), lin))
        raise AssertionError(f"oracle lacks activation {name}")


ACT_DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
TAKES = {"scaledtanh": (True, True), "affine": (True, True), "hardsigmoid": (True, True)}


def oracle_model(spec: Spec) -> onnx.ModelProto:
    """The same function unrolled in float64 elementary ops."""
    u = Unrolled()
    inits = values(spec)
    per = len(ACT_DEFAULTS[spec.op])
    acts = list(spec.attrs.get("activations", ACT_DEFAULTS[spec.op]))
    if len(acts) == per and spec.dirs == 2:
        acts = acts * 2
    alphas, betas = list(spec.attrs.get("activation_alpha", [])), list(spec.attrs.get("activation_beta", []))
    params = []
    for a in acts:
        ta, tb = TAKES.get(a.lower(), (False, False))
        params.append((alphas.pop(0) if ta else 0.0, betas.pop(0) if tb else 0.0))
    clip = spec.attrs.get("clip")
    x = u.op("Transpose", "X", perm=[1, 0, 2]) if spec.batch_first else "X"
    h0 = c0 = None
    if spec.initial:
        h0 = u.op("Transpose", "h0", perm=[1, 0, 2]) if spec.batch_first else "h0"
        if spec.op == "LSTM":
            c0 = u.op("Transpose", "c0", perm=[1, 0, 2]) if spec.batch_first else "c0"
    lens = np.asarray(spec.lens if spec.lens is not None else [T_STEPS] * BATCH)
    ys, hs, cs = [], [], []
    for d in range(spec.dirs):
        w, r = u.pick("W", d), u.pick("R", d)
        g = GATES[spec.op]
        wg = [u.rows(w, k * HID, (k + 1) * HID, 0) for k in range(g)]
        rg = [u.rows(r, k * HID, (k + 1) * HID, 0) for k in range(g)]
        zeros = u.const(np.zeros(HID))
        wb = rb = [zeros] * g
        if spec.bias:
            b = u.pick("B", d)
            wb = [u.rows(b, k * HID, (k + 1) * HID, 0) for k in range(g)]
            rb = [u.rows(b, (g + k) * HID, (g + k + 1) * HID, 0) for k in range(g)]
        p = [u.rows(u.pick("P", d), k * HID, (k + 1) * HID, 0) for k in range(3)] if spec.peepholes else None
        fa = [(acts[d * per + k], *params[d * per + k]) for k in range(per)]

        def act(k: int, v: str, fa: list = fa) -> str:
            if clip is not None:
                v = u.op("Clip", v, u.const(-clip), u.const(clip))
            name, a, bt = fa[k]
            return u.activation(name, v, a, bt)

        def lin(xt: str, h: str, k: int, wg: list = wg, rg: list = rg, wb: list = wb, rb: list = rb) -> str:
            xw = u.op("MatMul", xt, u.op("Transpose", wg[k]))
            hr = u.op("MatMul", h, u.op("Transpose", rg[k]))
            return u.op("Add", u.op("Add", xw, hr), u.op("Add", wb[k], rb[k]))

        h = u.pick(h0, d) if h0 else u.const(np.zeros((BATCH, HID)))
        c = (u.pick(c0, d) if c0 else u.const(np.zeros((BATCH, HID)))) if spec.op == "LSTM" else None
        reverse = spec.direction == "reverse" or d == 1
        y_at: dict[int, str] = {}
        for t in reversed(range(T_STEPS)) if reverse else range(T_STEPS):
            xt = u.pick(x, t)
            mask = u.const((t < lens).astype(np.float64).reshape(BATCH, 1))
            keep = u.const((t >= lens).astype(np.float64).reshape(BATCH, 1))
            if spec.op == "RNN":
                h_new, c_new = act(0, lin(xt, h, 0)), None
            elif spec.op == "GRU":
                z = act(0, lin(xt, h, 0))
                rr = act(0, lin(xt, h, 1))
                xh = u.op("Add", u.op("MatMul", xt, u.op("Transpose", wg[2])), wb[2])
                if spec.attrs.get("linear_before_reset"):
                    hr = u.op("Add", u.op("MatMul", h, u.op("Transpose", rg[2])), rb[2])
                    hh = act(1, u.op("Add", xh, u.op("Mul", rr, hr)))
                else:
                    hr = u.op("MatMul", u.op("Mul", rr, h), u.op("Transpose", rg[2]))
                    hh = act(1, u.op("Add", xh, u.op("Add", hr, rb[2])))
                one_minus_z = u.op("Sub", u.const(1.0), z)
                h_new, c_new = u.op("Add", u.op("Mul", one_minus_z, hh), u.op("Mul", z, h)), None
            else:
                assert c is not None
                pre_i, pre_o, pre_f, pre_c = (lin(xt, h, k) for k in range(4))
                if p:
                    pre_i = u.op("Add", pre_i, u.op("Mul", p[0], c))
                    pre_f = u.op("Add", pre_f, u.op("Mul", p[2], c))
                i = act(0, pre_i)
                f = u.op("Sub", u.const(1.0), i) if spec.attrs.get("input_forget") else act(0, pre_f)
                c_new = u.op("Add", u.op("Mul", f, c), u.op("Mul", i, act(1, pre_c)))
                if p:
                    pre_o = u.op("Add", pre_o, u.op("Mul", p[1], c_new))
                name, a, bt = fa[2]
                h_new = u.op("Mul", act(0, pre_o), u.activation(name, c_new, a, bt))
            y_at[t] = u.op("Mul", mask, h_new)
            h = u.op("Add", y_at[t], u.op("Mul", keep, h))
            if c is not None and c_new is not None:
                c = u.op("Add", u.op("Mul", mask, c_new), u.op("Mul", keep, c))
        steps = [u.op("Unsqueeze", y_at[t], u.const([0, 1], np.int64)) for t in range(T_STEPS)]
        ys.append(u.op("Concat", *steps, axis=0))
        hs.append(u.op("Unsqueeze", h, u.const([0], np.int64)))
        if c is not None:
            cs.append(u.op("Unsqueeze", c, u.const([0], np.int64)))
    finals = {"Y": (ys, 1, [2, 0, 1, 3]), "Yh": (hs, 0, [1, 0, 2]), "Yc": (cs, 0, [1, 0, 2])}
    for o in spec.outputs:
        parts, axis, perm = finals[o]
        v = parts[0] if len(parts) == 1 else u.op("Concat", *parts, axis=axis)
        if spec.batch_first:
            v = u.op("Transpose", v, perm=perm)
        u.nodes.append(helper.make_node("Identity", [v], [o]))
    return make_ad_model(
        [*u.nodes, *loss_nodes(spec)],
        runtime_inputs(spec),
        [("loss", D, []), *spec.outputs],
        initializers=inits,
        opset=22,
    )


@dataclass
class Case:
    id: str
    spec: Spec
    inputs: list[str]
    hvp_wrt: list[str]

    @property
    def model(self) -> onnx.ModelProto:
        return op_model(self.spec)

    @property
    def oracle(self) -> onnx.ModelProto:
        return oracle_model(self.spec)


def case(id: str, op: str, hvp_wrt: Sequence[str] = ("W",), **kw: Any) -> Case:
    fields = {
        k: kw.pop(k) for k in ("direction", "batch_first", "bias", "initial", "lens", "peepholes") if k in kw
    }
    spec = Spec(op, attrs=kw, **fields)
    runtime = [name for name, _, _ in runtime_inputs(spec)]
    weights = ["W", "R"] + (["B"] if spec.bias else []) + (["P"] if spec.peepholes else [])
    return Case(id, spec, runtime + weights, list(hvp_wrt))


CASES = [
    case("rnn", "RNN"),
    case("rnn-reverse-initial-state", "RNN", direction="reverse", initial=True, hvp_wrt=["R", "h0"]),
    case(
        "rnn-bidirectional-activations",
        "RNN",
        direction="bidirectional",
        activations=["Softsign", "ScaledTanh"],
        activation_alpha=[0.9],
        activation_beta=[1.3],
    ),
    case("rnn-sequence-lens", "RNN", lens=[4, 2], hvp_wrt=["R"]),
    case("rnn-batch-first", "RNN", batch_first=True, initial=True, hvp_wrt=["h0"]),
    case("gru", "GRU"),
    case("gru-linear-before-reset", "GRU", linear_before_reset=1, initial=True, hvp_wrt=["R", "B"]),
    case("gru-no-bias-linear-before-reset", "GRU", linear_before_reset=1, bias=False, hvp_wrt=["R"]),
    case("gru-bidirectional-sequence-lens", "GRU", direction="bidirectional", lens=[3, 4], hvp_wrt=["R"]),
    case(
        "gru-reverse-activations",
        "GRU",
        direction="reverse",
        activations=["HardSigmoid", "Affine"],
        activation_alpha=[0.3, 0.7],
        activation_beta=[0.4, 0.1],
        hvp_wrt=["X"],
    ),
    case("gru-batch-first", "GRU", batch_first=True, hvp_wrt=["R"]),
    case("lstm", "LSTM", hvp_wrt=["W", "R"]),
    case(
        "lstm-peepholes-initial-state-sequence-lens",
        "LSTM",
        direction="reverse",
        peepholes=True,
        initial=True,
        lens=[2, 4],
        hvp_wrt=["P", "c0"],
    ),
    case(
        "lstm-bidirectional-batch-first", "LSTM", direction="bidirectional", batch_first=True, hvp_wrt=["R"]
    ),
    case("lstm-input-forget-clip", "LSTM", input_forget=1, clip=0.9, peepholes=True, hvp_wrt=["W"]),
]
IDS = [c.id for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_oracle_matches_the_op(case: Case) -> None:
    # The oracle is only as good as its agreement with ONNX Runtime's op.
    feeds = make_feeds(case.model, {}, np.random.default_rng(3))
    got = run(case.model, feeds)
    want = run(case.oracle, {k: v.astype(np.float64) for k, v in feeds.items()})
    for name in ["loss", *case.spec.outputs]:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5, err_msg=name)


# (float64 oracle models: ONNX Runtime has no float64 LSTM or RNN)
test_jvp, test_vjp_dot, test_grad, test_hvp, test_per_example_grad = battery(
    CASES,
    IDS,
    inputs=lambda c: c.inputs,
    hvp_wrt=lambda c: c.hvp_wrt,
    per_example_axes=lambda c: (0,) * len(runtime_inputs(c.spec)),
    oracle=lambda c: c.oracle,
)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_primal_outputs_come_from_the_loops(direction: str) -> None:
    # The expansion's loops run anyway, so they compute the primal outputs too and the fused op
    # is not run besides: forward mode runs one JVP loop per direction, reverse mode a stacking
    # loop and a reverse loop per direction. The primal outputs still match the op's (the float64
    # oracle checks the derivatives, in the battery above).
    m = op_model(Spec("LSTM", direction=direction, peepholes=True, lens=[3, 4]))
    per_direction = 2 if direction == "bidirectional" else 1
    feeds = make_feeds(m, {}, np.random.default_rng(5))
    want = run(m, feeds)
    for transform, loops in (
        (onnax.jvp(m, inputs=["X"]), 1),
        (onnax.grad(m, inputs=["W"], output="loss"), 2),
    ):
        ops = [n.op_type for n in transform.graph.node]
        assert ops.count("LSTM") == 0 and ops.count("Loop") == loops * per_direction, ops
        if loops == 2:
            # The gates' derivatives s (1 - s) and 1 - tanh^2 are computed from the stacked
            # activations after the stacking loops, not at every step.
            for n in transform.graph.node:
                body = [x.op_type for x in n.attribute[0].g.node] if n.op_type == "Loop" else []
                assert "Sigmoid" not in body or "Sub" not in body, body
        onnx.checker.check_model(transform, full_check=True)
        tangents = {"X_tangent": np.ones_like(feeds["X"])}
        got = run(transform, {**feeds, **tangents})
        for o in m.graph.output:
            np.testing.assert_allclose(got[o.name], want[o.name], rtol=1e-5, atol=1e-6)


VMAP_CASES = [
    c
    for c in CASES
    if c.id
    in (
        "rnn-reverse-initial-state",
        "gru-bidirectional-sequence-lens",
        "lstm-peepholes-initial-state-sequence-lens",
        "gru-batch-first",
    )
]


@pytest.mark.parametrize("case", VMAP_CASES, ids=[c.id for c in VMAP_CASES])
def test_vmap_is_vectorized(case: Case) -> None:
    # Shared weights: the vmap batch merges into the op's batch axis (one op for the whole
    # batch, no per-example Scan), for the op and for vmap(grad) (ReverseSequence included).
    runtime = [name for name, _, _ in runtime_inputs(case.spec)]
    axes = (0,) * len(runtime)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ReferenceEvaluator.*")
        warnings.filterwarnings("error", message=".*per-example.*")
        vm = assert_vmap_matches(case.model, axes, 0, rtol=1e-5, atol=1e-5)
        assert "Scan" not in [n.op_type for n in vm.graph.node]
        check_per_example_grad(case.model, axes, case.inputs, "loss")
