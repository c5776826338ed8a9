"""jvp / vjp conformance over the ONNX backend node tests.

For every applicable node-test model (at least one FLOAT/DOUBLE runtime input and at least one
FLOAT/DOUBLE output; see ``backend_vmap`` for the data, the runtimes and the skipped models) this
runs

* ``jvp`` -- ``onnax.jvp(model, inputs=<float inputs>, outputs=<float outputs>)`` and checks the
  tangents against central finite differences of the *original* model at ``test_data_set_0``;
* ``vjp`` -- ``onnax.vjp(model, inputs=<float inputs>, outputs=<float outputs>)`` and checks the
  cotangents with the dot-product test ``<u, J v> == <J^T u, v>``.

The oracle, per float input ``x_i`` (the other inputs held fixed):

* a random direction ``v_i = n * max(1, |x_i|)`` (``n`` standard normal, so the step is relative
  to the data), a step ``eps`` (1e-3 for FLOAT inputs, 1e-6 for DOUBLE);
* central differences at ``eps`` and ``eps/2`` and one-sided differences at ``eps`` (along
  ``v`` and along a second random direction, so kinks of several coordinates cannot cancel
  out).  An output
  element whose four estimates disagree by more than the tolerance (a kink or a jump of the
  function at the test data: Relu at 0, Floor at an integer, a tie in Max, ...) or that is not
  finite is *masked*; if every element is masked the input is "FD unstable".  An input whose
  perturbation changes the output shapes or makes the model fail (a Resize ``scales``, a Range
  limit) is "not perturbable";
* ``jvp``: one run per input with ``v_i`` as its tangent (zeros elsewhere): the tangent must match
  the central difference on the unmasked elements, ``|jvp - fd| <= tol * S + noise`` with ``S``
  the largest stable ``|fd|`` of that output, ``tol`` 2e-2 for FLOAT outputs, 1e-5 for DOUBLE, and
  ``noise`` the FD rounding level (20 ulps of max ``|y|`` / eps, plus the rounding of the perturbed
  input); one more run with all tangents at once must equal the sum (linearity, tight); the
  primal outputs must equal the original model's outputs;
* ``vjp``: per input, a cotangent ``u`` (standard normal on every float output) and the check
  ``|<u, J v_i> - <ct_i, v_i>| <= tol * (sum |u * J v_i| + sum |ct_i * v_i|)``, with ``J v_i`` from
  the jvp model when that ran and was not contradicted by FD (tight: ``tol`` 1e-4 for FLOAT,
  1e-9 for DOUBLE), else from FD (with ``u`` zero on the masked elements, FD tolerance).  Where
  ``J v`` is not finite (a singular point such as Acosh at 1) ``u`` is zero and non-finite
  cotangent elements are left out (0 * inf is NaN in reverse mode, as in JAX); a non-finite
  cotangent is also not counted when the forward pass itself computes NaN somewhere (e.g. a
  softmax over a fully masked row that a later Where discards), which reverse mode propagates.

Each (model, transform) is classified as

* ``passed``      -- every checkable input matches,
* ``failed``      -- wrong numbers, the generated model fails ``onnx.checker`` or does not load
  or run, different primal outputs, a crash or hang, an exception other than ``OnnaxError``,
* ``unsupported`` -- the transform raised ``onnax.OnnaxError`` (first line recorded),
* ``skipped``     -- the transform worked and its model ran, but no input could be checked (FD
  unstable / not perturbable); the reason is recorded.

Models that cannot be used at all (``backend_vmap``'s static reasons, no float input or output, a
source model the runtimes cannot run or that is non-deterministic) are recorded once as
``skipped`` with transform ``-``.

Usage::

    python -m conformance.backend_ad                 # full run, writes the reports
    python -m conformance.backend_ad -k 'gemm|conv'  # only matching test names
    python -m conformance.backend_ad --help
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import os
import re
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from conformance import backend_vmap as bv

HERE = Path(__file__).resolve().parent
DEFAULT_MD = HERE / "ad_backend_results.md"
DEFAULT_JSON = HERE / "ad_backend_results.json"

SEED = 0
DEFAULT_TIMEOUT = 60.0
TRANSFORMS = ("jvp", "vjp")
STATUSES = bv.STATUSES  # passed, failed, unsupported, skipped

FLOAT_ELEM_TYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64}

# Relative FD step per input dtype; FD tolerance and dot-product tolerance per output dtype.
FD_EPS = {"float32": 1e-3, "float64": 1e-6}
FD_TOL = {"float32": 2e-2, "float64": 1e-5}
DOT_TOL = {"float32": 1e-4, "float64": 1e-9}
# Smallest derivative scale (absolute) and the FD noise floor factor (times machine epsilon
# times max |y| / eps): derivatives below it are indistinguishable from rounding noise.
ABS_FLOOR = {"float32": 1e-6, "float64": 1e-12}
NOISE_FACTOR = 20.0


# --------------------------------------------------------------------------------------------
# Planning (parent process)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ADModelInfo:
    name: str
    path: str
    op: str
    opset: int | None
    float_inputs: list[str]
    float_outputs: list[str]
    skip_reason: str | None = None


def _float_names(values, exclude: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    out = []
    for vi in values:
        if vi.name in exclude or vi.type.WhichOneof("value") != "tensor_type":
            continue
        if vi.type.tensor_type.elem_type in FLOAT_ELEM_TYPES:
            out.append(vi.name)
    return out


def discover_models(data_dir: Path, pattern: str | None = None) -> list[ADModelInfo]:
    infos = []
    for vinfo in bv.discover_models(data_dir, pattern):
        model = onnx.load(str(Path(vinfo.path) / "model.onnx"), load_external_data=False)
        inits = {t.name for t in model.graph.initializer}
        f_in = _float_names(model.graph.input, inits)
        f_out = _float_names(model.graph.output)
        reason = vinfo.skip_reason
        if reason is None and not f_in:
            reason = "no FLOAT/DOUBLE runtime input"
        if reason is None and not f_out:
            reason = "no FLOAT/DOUBLE output"
        infos.append(ADModelInfo(vinfo.name, vinfo.path, vinfo.op, vinfo.opset, f_in, f_out, reason))
    return infos


def select_subset(infos: list[ADModelInfo], keep_every: int, always_ops: set[str]) -> list[ADModelInfo]:
    """Every model of ``always_ops`` (and their expanded forms) plus every ``keep_every``-th other."""
    return bv.select_subset(infos, keep_every, always_ops)  # type: ignore[arg-type, return-value]


# --------------------------------------------------------------------------------------------
# Finite differences (worker process)
# --------------------------------------------------------------------------------------------


class _NotPerturbable(Exception):
    pass


@dataclasses.dataclass
class _FD:
    """Finite-difference directional derivative of every float output along one input."""

    status: str  # "ok", "unstable", "not perturbable", "empty"
    why: str = ""
    fd: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)  # output index -> J v
    mask: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)  # stable elements
    scale: dict[int, float] = dataclasses.field(default_factory=dict)
    noise: dict[int, float] = dataclasses.field(default_factory=dict)  # absolute FD noise level
    masked: int = 0
    total: int = 0


def _fd_noise(y: np.ndarray, eps: float) -> float:
    """Rounding noise of a central difference of ``y`` (absolute): a few ulps of max |y| / eps."""
    finite = np.isfinite(y)
    ymax = float(np.abs(y[finite]).max()) if finite.any() else 0.0
    eps_mach = float(np.finfo(y.dtype).eps)
    return NOISE_FACTOR * eps_mach * ymax / eps


def finite_differences(
    run, feeds: dict[str, np.ndarray], name: str, v: np.ndarray, y0: list[np.ndarray], f_out: list[int]
) -> _FD:
    """Directional derivative of outputs ``f_out`` along ``v`` at input ``name`` (see module doc)."""
    x = feeds[name]
    if x.size == 0:
        return _FD("empty", "empty input")
    # The step suits the least precise of the input and the outputs (FLOAT -> DOUBLE casts).
    eps = max([FD_EPS[x.dtype.name]] + [FD_EPS[y0[k].dtype.name] for k in f_out])

    def f(h: float, direction: np.ndarray = v) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            xp = np.asarray(x.astype(np.float64) + h * direction.astype(np.float64), dtype=x.dtype)
        try:
            outs = run({**feeds, name: xp})
        except Exception as exc:
            raise _NotPerturbable(f"perturbed run fails: {bv._first_line(exc)[:160]}") from None
        for k, (a, b) in enumerate(zip(outs, y0, strict=True)):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise _NotPerturbable(f"output {k} changes shape/dtype {b.shape} -> {a.shape}")
        return outs

    # Kinks of several coordinates can cancel in the one-sided differences along v (e.g. two
    # grid coordinates of GridSample on pixel boundaries): one-sided differences along a second,
    # independent direction (of v's kind) expose them.
    other = np.random.default_rng(17).standard_normal(v.shape) * np.maximum(1.0, np.abs(x.astype(np.float64)))
    try:
        yp, ym, yp2, ym2 = f(eps), f(-eps), f(eps / 2), f(-eps / 2)
        ypf, ymf = f(eps, other), f(-eps, other)
    except _NotPerturbable as exc:
        return _FD("not perturbable", str(exc))
    res = _FD("ok")
    for k in f_out:
        y = y0[k].astype(np.float64)
        tol = FD_TOL[y0[k].dtype.name]
        with np.errstate(all="ignore"):
            c1 = (yp[k].astype(np.float64) - ym[k]) / (2 * eps)
            c2 = (yp2[k].astype(np.float64) - ym2[k]) / eps
            fwd = (yp[k].astype(np.float64) - y) / eps
            bwd = (y - ym[k].astype(np.float64)) / eps
            fwd_f = (ypf[k].astype(np.float64) - y) / eps
            bwd_f = (y - ymf[k].astype(np.float64)) / eps
            finite = np.isfinite(y) & np.isfinite(c1) & np.isfinite(c2) & np.isfinite(fwd) & np.isfinite(bwd)
            finite &= np.isfinite(fwd_f) & np.isfinite(bwd_f)
            # Robust scale: at a jump one of the estimates stays small while others blow up.
            robust = np.minimum(np.minimum(np.abs(c1), np.abs(c2)), np.minimum(np.abs(fwd), np.abs(bwd)))
        floor = ABS_FLOOR[y0[k].dtype.name]
        s0 = max(float(robust[finite].max()) if finite.any() else 0.0, floor)
        # Rounding of the outputs, plus rounding of the perturbed inputs themselves (x + h v is
        # rounded to the input dtype: relative error eps_in / h of the step, visible when a
        # FLOAT input feeds a DOUBLE output).
        noise = _fd_noise(y0[k], eps) + NOISE_FACTOR * float(np.finfo(x.dtype).eps) * s0 / eps
        with np.errstate(all="ignore"):
            stable = (
                finite
                & (np.abs(c1 - c2) <= tol * s0 + 3 * noise)
                & (np.abs(fwd - bwd) <= tol * s0 + 2 * noise)
                & (np.abs(fwd_f - bwd_f) <= tol * s0 + 2 * noise)
            )
        scale = max(float(np.abs(c1[stable]).max()) if stable.any() else 0.0, floor)
        res.noise[k] = noise
        res.fd[k] = c1
        res.mask[k] = stable
        res.scale[k] = scale
        res.masked += int(y.size - stable.sum())
        res.total += int(y.size)
    if res.total == 0:
        return _FD("empty", "empty outputs")
    if res.masked == res.total:
        return _FD("unstable", f"FD unstable at every output element ({res.total})")
    return res


def _mismatch(
    got: np.ndarray, want: np.ndarray, mask: np.ndarray, tol: float, scale: float, noise: float = 0.0
) -> str | None:
    """None if ``|got - want| <= tol * scale + noise`` on ``mask``, else a description."""
    with np.errstate(all="ignore"):
        err = np.abs(got.astype(np.float64) - want)
        bad = mask & ~(err <= tol * scale + noise)  # NaN errors count as bad
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    max_err = float(np.nanmax(np.where(mask, err, 0.0))) if np.isfinite(err[mask]).any() else float("nan")
    return (
        f"{int(bad.sum())}/{int(mask.sum())} checked elements differ (max abs err {max_err:.3g} > "
        f"tol {tol:g} * scale {scale:.3g} + noise {noise:.3g}); first at {idx}: "
        f"expected {want[idx]:.6g}, got {got[idx]:.6g}"
    )


# --------------------------------------------------------------------------------------------
# Worker process
# --------------------------------------------------------------------------------------------


def _source_runner(model: onnx.ModelProto, feeds: dict[str, np.ndarray], opset: int | None):
    errors = []
    kinds = ["ort", "ref"] if (opset is None or opset <= bv.ORT_MAX_OPSET) else ["ref"]
    for kind in kinds:
        try:
            runner = bv._Runner(model, kind)
            outs = runner.run(feeds)
            return runner, outs
        except Exception as exc:
            errors.append(f"{kind}: {bv._first_line(exc)}")
    raise bv._SourceError("runtime cannot run source: " + " | ".join(errors))


@dataclasses.dataclass
class _Ctx:
    """Everything about one model that both transforms need."""

    info: dict
    model: onnx.ModelProto
    runner: Any
    names: list[str]
    out_names: list[str]
    feeds: dict[str, np.ndarray]
    y0: list[np.ndarray]
    f_in: list[str]
    f_out: list[int]  # indices into out_names
    v: dict[str, np.ndarray]
    u: dict[int, np.ndarray]
    source_checks: bool
    fd: dict[str, _FD] = dataclasses.field(default_factory=dict)
    # jvp results per input (J v_i per float output index) and whether FD contradicted them
    jv: dict[str, dict[int, np.ndarray]] | None = None
    jv_bad: set[str] = dataclasses.field(default_factory=set)

    _nan_intermediates: bool | None = None

    def nan_intermediates(self) -> bool:
        """Whether the forward pass computes NaN anywhere (e.g. a softmax over a fully masked
        row that a later Where discards); checked on the reference evaluator."""
        if self._nan_intermediates is None:
            found = False
            try:
                from onnx.reference import ReferenceEvaluator

                ref = ReferenceEvaluator(self.model, new_ops=[bv._spec_loop()])
                values = ref.run(None, self.feeds, intermediate=True)
                assert isinstance(values, dict)  # (intermediate results come by name)
                found = any(
                    isinstance(a, np.ndarray) and a.dtype.kind == "f" and bool(np.isnan(a).any())
                    for a in values.values()
                )
            except Exception:
                found = False
            self._nan_intermediates = found
        return self._nan_intermediates

    def get_fd(self, name: str) -> _FD:
        if name not in self.fd:
            self.fd[name] = finite_differences(
                self.runner.run, self.feeds, name, self.v[name], self.y0, self.f_out
            )
        return self.fd[name]


class _Worker:
    def __init__(self, conn, seed: int, check_model: bool):
        self.conn = conn
        self.seed = seed
        self.check_model = check_model
        import onnax

        self.onnax = onnax

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def stage(self, transform: str, stage: str) -> None:
        self.send("stage", transform, stage)

    def record(
        self, info: dict, transform: str, status: str, message: str = "", note: str = "", **extra
    ) -> None:
        rec = {
            "model": info["name"],
            "op": info["op"],
            "variant": transform,
            "status": status,
            "message": message,
            "note": note,
            **extra,
        }
        self.send("case", rec)

    def process(self, task: dict) -> None:
        try:
            ctx = self._prepare(task)
        except bv._SourceError as exc:
            self.record(task, "-", "skipped", bv._first_line(exc))
            return
        for transform, _ in task["variants"]:
            self.stage(transform, "transform")
            getattr(self, f"_{transform}")(ctx)

    # -- source model --------------------------------------------------------------------

    def _prepare(self, info: dict) -> _Ctx:
        self.stage(info["variants"][0][0], "source")
        case_dir = Path(info["path"])
        model = onnx.load(str(case_dir / "model.onnx"))
        inits = {t.name for t in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in inits]
        out_names = [o.name for o in model.graph.output]
        ds = case_dir / "test_data_set_0"
        all_names = [i.name for i in model.graph.input]
        data = {n: bv._load_tensor(ds / f"input_{j}.pb") for j, n in enumerate(all_names)}
        feeds = {n: data[n] for n in names}
        runner, y0 = _source_runner(model, feeds, info["opset"])
        again = runner.run(feeds)
        if not all(bv._arrays_equal_exact(a, b) for a, b in zip(y0, again, strict=True)):
            raise bv._SourceError("non-deterministic outputs (two runs of the source model differ)")
        f_in = list(info["float_inputs"])
        f_out = [out_names.index(n) for n in info["float_outputs"]]
        for n in f_in:
            if feeds[n].dtype not in (np.float32, np.float64):
                raise bv._SourceError(f"input '{n}' data is {feeds[n].dtype}, declared float")
        for k in f_out:
            if y0[k].dtype not in (np.float32, np.float64):
                raise bv._SourceError(f"output '{out_names[k]}' is {y0[k].dtype}, declared float")
        rng = np.random.default_rng([self.seed, zlib.crc32(info["name"].encode())])
        v = {}
        for n in f_in:
            x = feeds[n]
            with np.errstate(all="ignore"):
                scale = np.maximum(1.0, np.abs(np.nan_to_num(x.astype(np.float64), posinf=1.0, neginf=1.0)))
            v[n] = np.asarray(rng.standard_normal(x.shape) * scale, dtype=x.dtype)
        u = {k: np.asarray(rng.standard_normal(y0[k].shape), dtype=y0[k].dtype) for k in f_out}
        source_checks = True
        if self.check_model:
            try:
                onnx.checker.check_model(model)
            except Exception:
                source_checks = False
        return _Ctx(info, model, runner, names, out_names, feeds, y0, f_in, f_out, v, u, source_checks)

    # -- shared steps --------------------------------------------------------------------

    def _transform(self, ctx: _Ctx, transform: str):
        """(derived model, None) or (None, recorded)."""
        src = onnx.ModelProto()
        src.CopyFrom(ctx.model)
        fn = getattr(self.onnax, transform)
        out_sel = [ctx.out_names[k] for k in ctx.f_out]
        try:
            return fn(src, inputs=list(ctx.f_in), outputs=out_sel)
        except self.onnax.OnnaxError as exc:
            self.record(ctx.info, transform, "unsupported", bv._first_line(exc))
        except Exception as exc:
            self.record(
                ctx.info,
                transform,
                "failed",
                f"crash in {transform}: {type(exc).__name__}: {bv._first_line(exc)}",
            )
        return None

    def _structure(self, ctx: _Ctx, transform: str, dm: Any, n_new_in: int, n_new_out: int):
        """(extra input names, extra output names) or a problem string."""
        if not isinstance(dm, onnx.ModelProto):
            return f"{transform} returned {type(dm).__name__}, expected onnx.ModelProto"
        inits = {t.name for t in dm.graph.initializer}
        got_in = [i.name for i in dm.graph.input if i.name not in inits]
        if got_in[: len(ctx.names)] != ctx.names or len(got_in) != len(ctx.names) + n_new_in:
            return f"graph inputs: expected {ctx.names} + {n_new_in} new, got {got_in}"
        got_out = [o.name for o in dm.graph.output]
        if got_out[: len(ctx.out_names)] != ctx.out_names or len(got_out) != len(ctx.out_names) + n_new_out:
            return f"graph outputs: expected {ctx.out_names} + {n_new_out} new, got {got_out}"
        if self.check_model and ctx.source_checks:
            try:
                onnx.checker.check_model(dm)
            except Exception as exc:
                return f"{transform} model fails onnx.checker: {bv._first_line(exc)}"
        return got_in[len(ctx.names) :], got_out[len(ctx.out_names) :]

    def _load(self, ctx: _Ctx, transform: str, dm: onnx.ModelProto):
        try:
            return bv._Runner(dm, ctx.runner.kind), None
        except Exception as exc:
            return None, f"{transform} model fails to load ({ctx.runner.kind}): {bv._first_line(exc)}"

    def _run(self, ctx: _Ctx, transform: str, runner, extra: dict[str, np.ndarray]):
        try:
            outs = runner.run({**ctx.feeds, **extra})
        except Exception as exc:
            return None, f"{transform} model fails to run ({ctx.runner.kind}): {bv._first_line(exc)}"
        for k, name in enumerate(ctx.out_names):
            problem = bv._compare(ctx.y0[k], outs[k], name)
            if problem is not None:
                return None, f"primal output differs: {problem}"
        return outs, None

    def _prologue(self, ctx: _Ctx, transform: str, n_new_in: int, n_new_out: int):
        """Transform, check and load: (runner, new inputs, new outputs) or None (recorded)."""
        t0 = time.perf_counter()
        dm = self._transform(ctx, transform)
        if dm is None:
            return None
        ctx.info["_seconds"] = round(time.perf_counter() - t0, 3)
        self.stage(transform, "check")
        st = self._structure(ctx, transform, dm, n_new_in, n_new_out)
        if isinstance(st, str):
            self.record(ctx.info, transform, "failed", st)
            return None
        self.stage(transform, "load")
        runner, problem = self._load(ctx, transform, dm)
        if runner is None:
            self.record(ctx.info, transform, "failed", problem)
            return None
        return runner, st[0], st[1]

    # -- jvp ----------------------------------------------------------------------------

    def _jvp(self, ctx: _Ctx) -> None:
        pro = self._prologue(ctx, "jvp", len(ctx.f_in), len(ctx.f_out))
        if pro is None:
            return
        runner, t_names, _ = pro
        tangent_of = dict(zip(ctx.f_in, t_names, strict=True))
        zeros = {tangent_of[n]: np.zeros_like(ctx.v[n]) for n in ctx.f_in}
        n_out = len(ctx.out_names)

        self.stage("jvp", "run")
        # All tangents at once: checks load/run/primal outputs, and linearity below.
        outs, problem = self._run(ctx, "jvp", runner, {tangent_of[n]: ctx.v[n] for n in ctx.f_in})
        if outs is None:
            self.record(ctx.info, "jvp", "failed", problem)
            return
        combined = {k: outs[n_out + j] for j, k in enumerate(ctx.f_out)}
        for k in ctx.f_out:
            if combined[k].shape != ctx.y0[k].shape or combined[k].dtype != ctx.y0[k].dtype:
                self.record(
                    ctx.info,
                    "jvp",
                    "failed",
                    f"tangent of '{ctx.out_names[k]}': {combined[k].dtype}{list(combined[k].shape)}, "
                    f"primal is {ctx.y0[k].dtype}{list(ctx.y0[k].shape)}",
                )
                return
        ctx.jv = {}
        for n in ctx.f_in:
            outs, problem = self._run(ctx, "jvp", runner, {**zeros, tangent_of[n]: ctx.v[n]})
            if outs is None:
                self.record(ctx.info, "jvp", "failed", problem)
                ctx.jv = None
                return
            ctx.jv[n] = {k: outs[n_out + j] for j, k in enumerate(ctx.f_out)}

        # Linearity: the all-at-once tangent is the sum of the per-input ones.
        for k in ctx.f_out:
            total = np.asarray(sum(ctx.jv[n][k].astype(np.float64) for n in ctx.f_in), dtype=np.float64)
            ok = np.isfinite(total)
            if not ok.any():
                continue
            scale = max(float(np.abs(total[ok]).max()), ABS_FLOOR[ctx.y0[k].dtype.name])
            problem = _mismatch(combined[k], total, ok, DOT_TOL[ctx.y0[k].dtype.name] * len(ctx.f_in), scale)
            if problem is not None:
                self.record(
                    ctx.info,
                    "jvp",
                    "failed",
                    f"not linear: tangent of '{ctx.out_names[k]}' with all tangents != sum of "
                    f"per-input tangents: {problem}",
                )
                ctx.jv_bad.update(ctx.f_in)
                return

        self.stage("jvp", "fd")
        checked, notes, failures = [], [], []
        for n in ctx.f_in:
            fd = ctx.get_fd(n)
            if fd.status != "ok":
                notes.append(f"{n}: {fd.status} ({fd.why})")
                continue
            for k in ctx.f_out:
                tol = FD_TOL[ctx.y0[k].dtype.name]
                problem = _mismatch(ctx.jv[n][k], fd.fd[k], fd.mask[k], tol, fd.scale[k], fd.noise[k])
                if problem is not None:
                    failures.append(f"d {ctx.out_names[k]} / d {n}: {problem}")
                    ctx.jv_bad.add(n)
            checked.append(n)
            if fd.masked:
                notes.append(f"{n}: {fd.masked}/{fd.total} output elements FD-masked")
        note = "; ".join(notes)
        extra = {"checked_inputs": checked, "seconds": ctx.info.get("_seconds")}
        if failures:
            self.record(ctx.info, "jvp", "failed", "mismatch vs FD: " + " | ".join(failures), note, **extra)
        elif checked:
            self.record(ctx.info, "jvp", "passed", "", note, **extra)
        else:
            self.record(ctx.info, "jvp", "skipped", _skip_message(notes), note, **extra)

    # -- vjp ----------------------------------------------------------------------------

    def _vjp(self, ctx: _Ctx) -> None:
        pro = self._prologue(ctx, "vjp", len(ctx.f_out), len(ctx.f_in))
        if pro is None:
            return
        runner, c_names, _ = pro
        cot_of = dict(zip(ctx.f_out, c_names, strict=True))
        n_out = len(ctx.out_names)
        pos = {n: n_out + j for j, n in enumerate(ctx.f_in)}

        self.stage("vjp", "run")
        outs, problem = self._run(ctx, "vjp", runner, {cot_of[k]: ctx.u[k] for k in ctx.f_out})
        if outs is None:
            self.record(ctx.info, "vjp", "failed", problem)
            return
        for n in ctx.f_in:
            ct = outs[pos[n]]
            if ct.shape != ctx.feeds[n].shape or ct.dtype != ctx.feeds[n].dtype:
                self.record(
                    ctx.info,
                    "vjp",
                    "failed",
                    f"cotangent of '{n}': {ct.dtype}{list(ct.shape)}, input is "
                    f"{ctx.feeds[n].dtype}{list(ctx.feeds[n].shape)}",
                )
                return

        checked, notes, failures = [], [], []
        for n in ctx.f_in:
            # J v_i: from the jvp model unless FD contradicted it, else from FD.
            if ctx.jv is not None and n not in ctx.jv_bad:
                jv = {k: ctx.jv[n][k].astype(np.float64) for k in ctx.f_out}
                masks = {k: np.isfinite(jv[k]) & np.isfinite(ctx.y0[k]) for k in ctx.f_out}
                tols = {k: DOT_TOL[ctx.y0[k].dtype.name] for k in ctx.f_out}
                how = "jvp"
            else:
                self.stage("vjp", "fd")
                fd = ctx.get_fd(n)
                if fd.status != "ok":
                    notes.append(f"{n}: {fd.status} ({fd.why})")
                    continue
                jv = fd.fd
                masks = fd.mask
                tols = {k: FD_TOL[ctx.y0[k].dtype.name] for k in ctx.f_out}
                how = "FD"
            if not any(m.any() for m in masks.values()):
                notes.append(f"{n}: no finite J v element")
                continue
            self.stage("vjp", "run")
            u = {k: np.where(masks[k], ctx.u[k], 0).astype(ctx.u[k].dtype) for k in ctx.f_out}
            if all(bool(masks[k].all()) for k in ctx.f_out):
                outs_n = outs
            else:
                outs_n, problem = self._run(ctx, "vjp", runner, {cot_of[k]: u[k] for k in ctx.f_out})
                if outs_n is None:
                    self.record(ctx.info, "vjp", "failed", problem)
                    return
            ct = outs_n[pos[n]].astype(np.float64)
            vi = ctx.v[n].astype(np.float64)
            ct_ok = np.isfinite(ct)
            if not ct_ok.all() and not all(bool(m.all()) for m in masks.values()):
                # Singular points (J v not finite there, e.g. Acosh at 1): u is zero on the
                # affected outputs, but 0 * inf in the transposed graph is NaN, as in JAX.
                ct, vi = np.where(ct_ok, ct, 0.0), np.where(ct_ok, vi, 0.0)
                notes.append(
                    f"{n}: {int((~ct_ok).sum())} non-finite cotangent elements at singular points excluded"
                )
            with np.errstate(all="ignore"):
                lhs = sum(float(np.sum(np.where(masks[k], u[k] * jv[k], 0.0))) for k in ctx.f_out)
                lhs_abs = sum(float(np.sum(np.where(masks[k], np.abs(u[k] * jv[k]), 0.0))) for k in ctx.f_out)
                rhs = float(np.sum(ct * vi))
                rhs_abs = float(np.sum(np.abs(ct * vi)))
            tol = max(tols.values())
            bound = tol * (lhs_abs + rhs_abs) + ABS_FLOOR[ctx.feeds[n].dtype.name]
            if np.isfinite(lhs) and not np.isfinite(rhs) and ctx.nan_intermediates():
                notes.append(
                    f"{n}: non-finite cotangent; the forward pass has NaN intermediate values "
                    "(reverse mode propagates them, as in JAX)"
                )
                continue
            checked.append(n)
            if not (np.isfinite(rhs) and abs(lhs - rhs) <= bound):
                failures.append(
                    f"<u, J v> != <J^T u, v> for input '{n}' (J v from {how}): "
                    f"<u, Jv>={lhs:.7g}, <ct, v>={rhs:.7g}, |diff|={abs(lhs - rhs):.3g} > {bound:.3g}"
                )
            if how == "FD":
                notes.append(f"{n}: checked against FD")
        note = "; ".join(notes)
        extra = {"checked_inputs": checked, "seconds": ctx.info.get("_seconds")}
        if failures:
            self.record(ctx.info, "vjp", "failed", "dot-product test: " + " | ".join(failures), note, **extra)
        elif checked:
            self.record(ctx.info, "vjp", "passed", "", note, **extra)
        else:
            self.record(ctx.info, "vjp", "skipped", _skip_message(notes), note, **extra)


def _skip_message(notes: list[str]) -> str:
    kinds = sorted({re.sub(r" \(.*", "", n.split(": ", 1)[-1]) for n in notes})
    return "no checkable input: " + ", ".join(kinds) if kinds else "no checkable input"


def _worker_main(conn, batch: int, seed: int, check_model: bool, log_path: str | None) -> None:
    del batch  # (the pool's common signature; this worker takes one model at a time)
    bv.serve(conn, lambda: _Worker(conn, seed, check_model), log_path)


class _Pool(bv._Pool):
    """backend_vmap's pool (timeouts, crash recovery) running this module's worker."""

    worker_main = staticmethod(_worker_main)


# --------------------------------------------------------------------------------------------
# Running and reporting
# --------------------------------------------------------------------------------------------


def _normalize(rec: dict) -> dict:
    return {
        "model": rec["model"],
        "op": rec["op"],
        "transform": rec["variant"],
        "status": rec["status"],
        "message": rec["message"],
        "note": rec.get("note", ""),
        "checked_inputs": rec.get("checked_inputs", []),
        "seconds": rec.get("seconds"),
    }


def run_conformance(
    models: list[ADModelInfo] | None = None,
    *,
    data_dir: Path | None = None,
    pattern: str | None = None,
    jobs: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    seed: int = SEED,
    check_model: bool = True,
    quiet_workers: bool = True,
    progress: bool = True,
    transforms: tuple[str, ...] = TRANSFORMS,
) -> dict:
    """Run the conformance; returns ``{"meta": ..., "cases": [...]}`` (see ``summarize``)."""
    import onnax  # noqa: F401 - fail early, in the parent, if the package is missing

    t0 = time.monotonic()
    if models is None:
        models = discover_models(bv.ensure_node_data(data_dir, verbose=progress), pattern)
    cases: list[dict] = []
    tasks = []
    for info in models:
        if info.skip_reason is not None:
            cases.append(
                _normalize(
                    {
                        "model": info.name,
                        "op": info.op,
                        "variant": "-",
                        "status": "skipped",
                        "message": info.skip_reason,
                    }
                )
            )
            continue
        tasks.append(
            {
                "name": info.name,
                "path": info.path,
                "op": info.op,
                "opset": info.opset,
                "float_inputs": info.float_inputs,
                "float_outputs": info.float_outputs,
                "variants": [(t, None) for t in transforms],
            }
        )
    jobs = jobs or os.cpu_count() or 1
    done = [0]
    last_print = [0.0]

    def on_case(rec: dict) -> None:
        cases.append(_normalize(rec))

    def on_progress() -> None:
        done[0] += 1
        now = time.monotonic()
        if progress and (now - last_print[0] > 5 or done[0] == len(tasks)):
            last_print[0] = now
            counts = collections.Counter(c["status"] for c in cases)
            print(
                f"[ad-conformance] {done[0]}/{len(tasks)} models, "
                + ", ".join(f"{k}={counts.get(k, 0)}" for k in STATUSES),
                file=sys.stderr,
                flush=True,
            )

    log_dir = tempfile.mkdtemp(prefix="onnax-ad-conformance-logs-") if quiet_workers else None
    if tasks:
        pool = _Pool(jobs, timeout, 0, seed, check_model, log_dir)
        pool.run(tasks, on_case, on_progress)
    order = {t: i for i, t in enumerate(("-", *TRANSFORMS))}
    cases.sort(key=lambda c: (c["model"], order.get(c["transform"], 9)))
    return {
        "meta": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "onnx": onnx.__version__,
            "onnxruntime": bv._version("onnxruntime"),
            "onnax": bv._version("onnax"),
            "seed": seed,
            "jobs": jobs,
            "timeout_s": timeout,
            "models": len(models),
            "wall_s": round(time.monotonic() - t0, 1),
            "worker_logs": log_dir,
        },
        "cases": cases,
    }


def summarize(result: dict) -> dict:
    def empty() -> dict:
        return {t: dict.fromkeys(STATUSES, 0) for t in TRANSFORMS} | {"models_skipped": 0}

    per_op: dict[str, dict] = collections.defaultdict(empty)
    totals = empty()
    for c in result["cases"]:
        for bucket in (per_op[c["op"]], totals):
            if c["transform"] == "-":
                bucket["models_skipped"] += 1
            else:
                bucket[c["transform"]][c["status"]] += 1
    return {"totals": totals, "per_op": dict(sorted(per_op.items()))}


_COLS = ("passed", "failed", "unsupported", "skipped")


def _row(cnt: dict) -> list[str]:
    return [str(cnt[t][s]) for t in TRANSFORMS for s in _COLS] + [str(cnt["models_skipped"])]


def format_table(summary: dict) -> str:
    short = {"passed": "pass", "failed": "fail", "unsupported": "unsup", "skipped": "skip"}
    head = ["operator"] + [f"{t}:{short[s]}" for t in TRANSFORMS for s in _COLS] + ["models skipped"]
    rows = [head]
    for op, cnt in summary["per_op"].items():
        rows.append([op, *_row(cnt)])
    rows.append(["TOTAL", *_row(summary["totals"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _totals_line(t: dict) -> str:
    parts = []
    for tr in TRANSFORMS:
        parts.append(f"**{tr}:** " + ", ".join(f"{s} {t[tr][s]}" for s in _COLS))
    parts.append(f"**models skipped:** {t['models_skipped']}")
    return "; ".join(parts) + "."


def format_markdown(result: dict, summary: dict) -> str:
    meta = result["meta"]
    t = summary["totals"]
    esc = bv._md_escape
    out = [
        "# onnax.jvp / onnax.vjp conformance over the ONNX backend node tests",
        "",
        (
            "Generated by `python -m conformance.backend_ad` "
            f"({meta['date']}; onnx {meta['onnx']}, onnxruntime {meta['onnxruntime']}, "
            f"onnax {meta['onnax']}; seed {meta['seed']}, {meta['models']} models, "
            f"{meta['wall_s']} s on {meta['jobs']} workers)."
        ),
        "",
        (
            "One jvp and one vjp case per model with a FLOAT/DOUBLE input and output, all float "
            "inputs and outputs selected. jvp is checked against central finite differences of "
            "the original model at `test_data_set_0` (per input, relative step 1e-3 in float32; "
            "output elements at kinks/jumps are masked; tolerance 2e-2 of the largest |FD| plus "
            "the FD rounding noise), vjp "
            "with the dot-product test `<u, J v> == <J^T u, v>` against the jvp model (tolerance "
            "1e-4 in float32) or FD. `skipped` in a transform column: no input could be checked "
            "(FD unstable / not perturbable); `models skipped`: the model was not used at all."
        ),
        "",
        _totals_line(t),
        "",
        "| operator | jvp passed | jvp failed | jvp unsupported | jvp skipped "
        "| vjp passed | vjp failed | vjp unsupported | vjp skipped | models skipped |",
        "|---|" + "---:|" * 9,
    ]
    for op, cnt in summary["per_op"].items():
        out.append(f"| {esc(op)} | " + " | ".join(_row(cnt)) + " |")
    out.append("| **TOTAL** | " + " | ".join(f"**{x}**" for x in _row(t)) + " |")

    failed = [c for c in result["cases"] if c["status"] == "failed"]
    out += ["", f"## Failed cases ({len(failed)})", ""]
    if failed:
        out += ["| model | transform | message |", "|---|---|---|"]
        for c in failed:
            out.append(f"| {c['model']} | {c['transform']} | {esc(c['message'][:600])} |")
    else:
        out.append("None.")

    unsup = collections.Counter(
        (c["op"], c["transform"], bv._message_category(c["message"]))
        for c in result["cases"]
        if c["status"] == "unsupported"
    )
    out += [
        "",
        f"## Unsupported (OnnaxError) messages ({sum(unsup.values())} cases)",
        "",
        "Grouped by operator, transform and message with names elided (the JSON report has "
        "every message verbatim).",
        "",
    ]
    if unsup:
        out += ["| operator | transform | cases | message |", "|---|---|---:|---|"]
        for (op, tr, msg), n in sorted(unsup.items()):
            out.append(f"| {esc(op)} | {tr} | {n} | {esc(msg)} |")
    else:
        out.append("None.")

    tskip = collections.Counter(
        (c["transform"], c["message"])
        for c in result["cases"]
        if c["status"] == "skipped" and c["transform"] != "-"
    )
    out += [
        "",
        "## Skipped transform cases by reason",
        "",
        "| transform | reason | cases |",
        "|---|---|---:|",
    ]
    for (tr, reason), n in sorted(tskip.items(), key=lambda kv: (-kv[1], kv[0])):
        out.append(f"| {tr} | {esc(reason)} | {n} |")

    skipped = collections.Counter(
        bv._skip_category(c["message"]) for c in result["cases"] if c["transform"] == "-"
    )
    out += ["", "## Skipped models by reason", "", "| reason | models |", "|---|---:|"]
    for reason, n in skipped.most_common():
        out.append(f"| {esc(reason)} | {n} |")
    out.append("")
    return "\n".join(out)


def write_reports(
    result: dict, md_path: Path | None = DEFAULT_MD, json_path: Path | None = DEFAULT_JSON
) -> dict:
    return bv.write_reports(result, md_path, json_path, summarize=summarize, format_markdown=format_markdown)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m conformance.backend_ad",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data-dir", type=Path, default=None, help="node-test directory")
    p.add_argument("-k", "--filter", default=None, help="regex on test names")
    p.add_argument("-t", "--transform", choices=TRANSFORMS, action="append", help="only this transform")
    p.add_argument("-j", "--jobs", type=int, default=None, help="worker processes (default: cores)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per case")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--no-checker", action="store_true", help="do not run onnx.checker on derived models")
    p.add_argument("--show-worker-stderr", action="store_true", help="workers write to this stderr")
    p.add_argument("--md", type=Path, default=DEFAULT_MD, help="markdown report path")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="JSON report path")
    p.add_argument("--no-write", action="store_true", help="only print, write no reports")
    args = p.parse_args(argv)

    result = run_conformance(
        data_dir=args.data_dir,
        pattern=args.filter,
        jobs=args.jobs,
        timeout=args.timeout,
        seed=args.seed,
        check_model=not args.no_checker,
        quiet_workers=not args.show_worker_stderr,
        transforms=tuple(args.transform) if args.transform else TRANSFORMS,
    )
    summary = summarize(result) if args.no_write else write_reports(result, args.md, args.json)
    print(format_table(summary))
    failed = [c for c in result["cases"] if c["status"] == "failed"]
    if failed:
        print(f"\n{len(failed)} failed cases:")
        for c in failed:
            print(f"  {c['model']} [{c['transform']}]: {c['message'][:400]}")
    if not args.no_write:
        print(f"\nwrote {args.md} and {args.json}")
    print(f"wall time {result['meta']['wall_s']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
