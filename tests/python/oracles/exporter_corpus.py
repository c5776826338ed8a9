"""The exporter corpus (``tests/python/models/exporters``): models from tf2onnx, onnxscript,
skl2onnx, Keras 3 (JAX backend) and jax2onnx's shipped GPT/ViT examples, as exported, with the
exporting framework's float64 references (``generate.py``, ``generate_jax.py``).

Every model goes through vmap, grad, jvp, vjp, vmap(grad) and jvp(grad) with onnax's Python API;
each result runs in ONNX Runtime and is compared with the references:

* vmap: the per-example loss of every stacked example (``vmap_loss``);
* grad: the loss and its gradient; jvp: the loss's tangent along the stored direction;
* vjp: the dot-product identity ``<vjp(c), t> = c <grad, t>`` against the reference JVP, and the
  cotangents against ``c`` times the reference gradient (the output is a scalar loss);
* vmap(grad): the per-example gradients; jvp(grad): the HVP along the stored direction.

Differentiated: the float input (``x``) or, for jax2onnx's GPT (int tokens), its weights, which
jax2onnx writes as Constant nodes inside ``@onnx_function`` bodies: ``onnax.constants_to_initializers``
makes them initializers and each is matched to its reference by value.

``python tests/python/oracles/exporter_corpus.py`` prints the table model x transform -> passed /
refused (op, reason) / failed, and the counts (``--counts`` only the counts).
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

MODELS = Path(__file__).resolve().parents[1] / "models" / "exporters"
# (source, model) in table order; the source names the exporter and the reference framework.
SOURCES = {
    "tf_cnn": "tf2onnx (Keras on TensorFlow), vs TensorFlow float64",
    "tf_mlp": "tf2onnx (Keras on TensorFlow), vs TensorFlow float64",
    "script_loop": "onnxscript (local function, Loop), vs TensorFlow float64",
    "skl_mlp": "skl2onnx (MLPRegressor), vs NumPy float64",
    "keras_jax_cnn": "Keras 3 on JAX (model.export), vs JAX float64",
    "jax2onnx_gpt": "jax2onnx GPT example (@onnx_function), vs JAX float64",
    "jax2onnx_vit": "jax2onnx ViT example (@onnx_function), vs JAX float64",
}
NAMES = tuple(SOURCES)
TRANSFORMS = ("vmap", "grad", "jvp", "vjp", "vmap_grad", "jvp_grad")
COTANGENT = 0.75  # the loss cotangent fed to vjp

# Normalized error bounds: max |actual - expected| / max |expected| of each checked quantity.
TOL_LOSS = 1e-5
TOL_FIRST = 1e-4
TOL_SECOND = 1e-3


@dataclass
class Case:
    name: str
    model: onnx.ModelProto  # as exported (weights promoted to initializers where differentiated)
    wrt: list[str]  # differentiated names: runtime inputs or (promoted) initializers
    feeds: dict[str, np.ndarray]
    vmap_feeds: dict[str, np.ndarray]  # batched inputs; the other feeds are shared
    ref: dict[str, Any] = field(default_factory=dict)  # loss, grad, tangent, jvp_loss, hvp, ...


def _arrays(name: str) -> dict[str, np.ndarray]:
    with np.load(MODELS / f"{name}.npz") as data:
        return {k: data[k] for k in data.files}


def load(name: str) -> Case:
    """The model as exported and its references, in one layout for both generators."""
    model = onnx.load(MODELS / f"{name}.onnx")
    a = _arrays(name)
    if "wrt" not in a:  # generate.py's layout: one float input x
        x = model.graph.input[0].name
        a = {
            f"feed/{x}": a["x"],
            f"vmap/{x}": a["xs"],
            "wrt": np.asarray([x]),
            "grad/0": a["grad_x"],
            "tangent/0": a["v"],
            "hvp/0": a["hvp_x"],
            "vmap_grad/0": a["vmap_grad_x"],
            **{k: a[k] for k in ("loss", "jvp_loss", "vmap_loss")},
        }
    wrt = [str(w) for w in a["wrt"]]
    if any(w.startswith("param:") for w in wrt):
        from onnax import constants_to_initializers

        model = constants_to_initializers(model)
        inits = {
            t.name: numpy_helper.to_array(t)
            for t in model.graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT
        }
        resolved = []
        for w in wrt:
            if not w.startswith("param:"):
                resolved.append(w)
                continue
            value = a[f"param/{w.split(':', 1)[1]}"]
            hits = [n for n, v in inits.items() if v.shape == value.shape and np.array_equal(v, value)]
            if len(hits) != 1:
                raise LookupError(f"{name}: weight {w} {value.shape} matches {len(hits)} initializers")
            resolved.append(hits[0])
        wrt = resolved
    n = len(wrt)
    ref = {
        "loss": a["loss"],
        "jvp_loss": a["jvp_loss"],
        "vmap_loss": a["vmap_loss"],
        **{k: [a[f"{k}/{j}"] for j in range(n)] for k in ("grad", "tangent", "hvp", "vmap_grad")},
    }
    return Case(
        name=name,
        model=model,
        wrt=wrt,
        feeds={k[5:]: v for k, v in a.items() if k.startswith("feed/")},
        vmap_feeds={k[5:]: v for k, v in a.items() if k.startswith("vmap/")},
        ref=ref,
    )


def loss_name(case: Case) -> str:
    return case.model.graph.output[0].name


def transform(case: Case, kind: str) -> onnx.ModelProto:
    """The onnax transform ``kind`` of the case's model (raises onnax.OnnaxError if refused)."""
    from onnax import grad, jvp, vjp, vmap

    m, wrt, axes = case.model, case.wrt, dict.fromkeys(case.vmap_feeds, 0)
    if kind == "vmap":
        return vmap(m, in_axes=axes)
    if kind == "jvp":
        return jvp(m, inputs=wrt)
    if kind == "vjp":
        return vjp(m, inputs=wrt)
    g = grad(m, inputs=wrt, output=loss_name(case))
    if kind == "grad":
        return g
    if kind == "vmap_grad":
        return vmap(g, in_axes=axes)
    if kind == "jvp_grad":
        return jvp(g, inputs=wrt)
    raise ValueError(kind)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Every output of ``model`` in ONNX Runtime (one thread), fed the graph inputs it has."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    return list(session.run(None, {k: v for k, v in feeds.items() if k in wanted}))


def new_inputs(source: onnx.ModelProto, generated: onnx.ModelProto) -> list[str]:
    """The runtime inputs a transform appended (tangents, cotangents), in order."""
    old = {i.name for i in source.graph.input}
    inits = {t.name for t in generated.graph.initializer}
    return [i.name for i in generated.graph.input if i.name not in old and i.name not in inits]


def magnitude(arrays: Any) -> float:
    """The largest |value| among ``arrays``."""
    return max((float(np.max(np.abs(np.asarray(a, np.float64)), initial=0.0)) for a in arrays), default=0.0)


def error(actual: Any, expected: Any, scale: float | None = None) -> float:
    """max |actual - expected| / scale, the scale by default max |expected| (at least 1e-6).
    Derivatives are measured against the largest of their kind (every parameter's gradient):
    a block whose exact derivative is 0 (an attention key's bias) is then held to the same
    absolute error as the rest instead of a relative error on rounding noise."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if a.shape != e.shape:
        raise AssertionError(f"shape {a.shape}, expected {e.shape}")
    s = magnitude([e]) if scale is None else scale
    return float(np.max(np.abs(a - e), initial=0.0) / max(s, 1e-6))


def check(case: Case, kind: str, model: onnx.ModelProto) -> float:
    """Runs the transformed ``model`` and compares it with the references; returns the worst
    normalized error, raises AssertionError naming the quantity that is off."""
    ref, n = case.ref, len(case.wrt)
    worst = 0.0

    scale = {k: magnitude(ref[k]) for k in ("grad", "hvp", "vmap_grad")}

    def expect(what: str, actual: Any, expected: Any, tol: float, kind_scale: float | None = None) -> None:
        nonlocal worst
        err = error(actual, expected, kind_scale)
        worst = max(worst, err)
        if not err <= tol:  # (NaN fails too)
            raise AssertionError(f"{case.name} {kind}: {what} off by {err:.2e} (normalized; tol {tol:g})")

    if kind in ("vmap", "vmap_grad"):
        out = run(model, {**case.feeds, **case.vmap_feeds})
        expect("per-example loss", out[0], ref["vmap_loss"], TOL_LOSS)
        if kind == "vmap_grad":
            for j in range(n):
                expect(
                    f"per-example d loss / d {case.wrt[j]}",
                    out[1 + j],
                    ref["vmap_grad"][j],
                    TOL_FIRST,
                    scale["vmap_grad"],
                )
        return worst
    extra = new_inputs(case.model, model)
    if kind == "grad":
        out = run(model, case.feeds)
        expect("loss", out[0], ref["loss"], TOL_LOSS)
        for j in range(n):
            expect(f"d loss / d {case.wrt[j]}", out[1 + j], ref["grad"][j], TOL_FIRST, scale["grad"])
    elif kind in ("jvp", "jvp_grad"):
        assert len(extra) == n, f"{case.name} {kind}: tangent inputs {extra}, expected {n}"
        out = run(model, {**case.feeds, **dict(zip(extra, ref["tangent"], strict=True))})
        expect("loss", out[0], ref["loss"], TOL_LOSS)
        if kind == "jvp":
            expect("loss tangent", out[-1], ref["jvp_loss"], TOL_FIRST)
        else:
            for j in range(n):
                expect(f"d loss / d {case.wrt[j]}", out[1 + j], ref["grad"][j], TOL_FIRST, scale["grad"])
                expect(f"HVP, {case.wrt[j]} block", out[1 + n + j], ref["hvp"][j], TOL_SECOND, scale["hvp"])
    elif kind == "vjp":
        assert len(extra) == 1, f"{case.name} vjp: cotangent inputs {extra}, expected 1"
        out = run(model, {**case.feeds, extra[0]: np.asarray(COTANGENT, np.float32)})
        expect("loss", out[0], ref["loss"], TOL_LOSS)
        cts = [np.asarray(c, np.float64) for c in out[1:]]
        ts = [np.asarray(t, np.float64) for t in ref["tangent"]]
        lhs = sum(float(np.vdot(c, t)) for c, t in zip(cts, ts, strict=True))
        dot_scale = sum(float(np.vdot(np.abs(c), np.abs(t))) for c, t in zip(cts, ts, strict=True))
        rhs = COTANGENT * float(ref["jvp_loss"])
        err = abs(lhs - rhs) / max(dot_scale, 1e-12)  # relative to sum |ct| |t|, the sum's own scale
        worst = max(worst, err)
        if not err <= TOL_FIRST:
            raise AssertionError(
                f"{case.name} vjp: <vjp(c), t> = {lhs:.6g} but c * reference jvp = {rhs:.6g} ({err:.2e})"
            )
        for j in range(n):
            expect(
                f"cotangent of {case.wrt[j]}",
                cts[j],
                COTANGENT * ref["grad"][j],
                TOL_FIRST,
                COTANGENT * scale["grad"],
            )
    else:
        raise ValueError(kind)
    return worst


# Where onnax refuses a transform today: (model, transform) -> (op, the reason in its message).
# The test asserts the refusal is an onnax.OnnaxError naming both; a case that starts to work
# fails the test until it is removed from here (and is then checked numerically).
REFUSED: dict[tuple[str, str], tuple[str, str]] = {}


@dataclass
class Result:
    status: str  # passed / refused / failed
    detail: str = ""  # the refusal's message, or what failed
    error: float = float("nan")
    seconds: float = 0.0


def evaluate(case: Case, kind: str) -> Result:
    """One cell of the table: refused (onnax.OnnaxError at transform time), failed (anything
    else: another exception, a result ONNX Runtime rejects, a wrong number) or passed."""
    from onnax import OnnaxError

    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = transform(case, kind)
    except OnnaxError as err:
        return Result("refused", str(err), seconds=time.perf_counter() - start)
    except Exception as err:
        return Result("failed", f"transform raised {type(err).__name__}: {err}")
    try:
        worst = check(case, kind, model)
    except Exception as err:
        return Result("failed", f"{type(err).__name__}: {err}")
    return Result("passed", error=worst, seconds=time.perf_counter() - start)


def short(message: str) -> str:
    """A refusal's first sentence (its op and reason), without the suggested fix."""
    first = message.strip().splitlines()[0]
    return first.split(". Fix:")[0]


def table(names: tuple[str, ...] = NAMES, progress: Callable[[str], None] | None = None) -> str:
    """Markdown: the counts per source, then model x transform -> result."""
    results: dict[tuple[str, str], Result] = {}
    for name in names:
        case = load(name)
        for kind in TRANSFORMS:
            results[name, kind] = evaluate(case, kind)
            if progress:
                progress(f"{name} {kind}: {results[name, kind].status}")
    lines = [
        "| source | models | passed | refused (diagnostic) | failed |",
        "|---|---:|---:|---:|---:|",
    ]
    for source in dict.fromkeys(SOURCES[n] for n in names):
        models = [n for n in names if SOURCES[n] == source]
        cells = [results[n, k] for n in models for k in TRANSFORMS]
        count = {s: sum(c.status == s for c in cells) for s in ("passed", "refused", "failed")}
        lines.append(
            f"| {source} | {len(models)} | {count['passed']} | {count['refused']} | {count['failed']} |"
        )
    lines += ["", "| model | " + " | ".join(TRANSFORMS) + " |", "|---|" + "---|" * len(TRANSFORMS)]
    notes = []
    for name in names:
        row = []
        for kind in TRANSFORMS:
            r = results[name, kind]
            if r.status == "passed":
                row.append(f"passed ({r.error:.0e})")
            else:
                notes.append(f"- {name} {kind}: {r.status}: {short(r.detail)}")
                row.append(f"{r.status} [{len(notes)}]")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    if notes:
        lines += ["", *[f"{k + 1}. {n[2:]}" for k, n in enumerate(notes)]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    names = tuple(a for a in argv if not a.startswith("-")) or NAMES
    text = table(names, progress=lambda s: print(s, file=sys.stderr))
    if "--counts" in argv:
        text = text.split("\n\n")[0]
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
