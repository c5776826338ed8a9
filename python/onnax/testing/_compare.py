"""Comparison of a generated model's outputs with the reference, with dtype-aware tolerances."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# (rtol, atol) by output dtype. "exact" outputs are the reference computed directly (primal
# outputs, per-example loops); "fd" outputs come from float64 central differences, whose own
# error (~1e-8 relative for one level, ~1e-6 nested) sets the float64 floor.
EXACT_TOL = {"float64": (1e-7, 1e-7), "float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2)}
FD_TOL = {"float64": (1e-5, 1e-6), "float32": (2e-3, 5e-4), "float16": (5e-2, 5e-2)}
OTHER_FLOAT_TOL = (5e-2, 5e-2)  # bfloat16 and narrower


def default_tolerance(dtype: np.dtype, fd: bool) -> tuple[float, float]:
    table = FD_TOL if fd else EXACT_TOL
    return table.get(np.dtype(dtype).name, OTHER_FLOAT_TOL)


@dataclass
class OutputComparison:
    """How one output compares; ``index`` is where the error relative to the tolerance peaks."""

    name: str
    dtype: str
    shape: list[int]
    method: str  # "exact" or "finite differences"
    rtol: float
    atol: float
    checked: int
    total: int
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    index: list[int] | None = None
    problem: str = ""  # set when the output fails
    skipped_rough: int = 0  # coordinates left out because the source is not smooth there

    @property
    def ok(self) -> bool:
        return not self.problem

    def line(self) -> str:
        where = f" at index {tuple(self.index)}" if self.index is not None else ""
        sample = ""
        if self.skipped_rough:
            sample = f", {self.skipped_rough} non-smooth coordinates skipped"
        if self.checked + self.skipped_rough != self.total:
            sample += f", {self.checked} of {self.total} coordinates checked"
        status = "ok" if self.ok else "FAIL"
        return (
            f"{self.name}: {self.dtype}{self.shape} vs {self.method}: max abs error {self.max_abs_error:.3g}"
            f"{where}, max rel error {self.max_rel_error:.3g} (rtol {self.rtol:g}, atol {self.atol:g}"
            f"{sample}) {status}"
        )


def compare(
    name: str,
    actual: np.ndarray,
    expected: np.ndarray,
    checked: np.ndarray | None,
    *,
    fd: bool,
    rtol: float | None,
    atol: float | None,
    method: str | None = None,
    defaults: tuple[float, float] | None = None,
    rough: np.ndarray | None = None,
) -> OutputComparison:
    """Compares in float64. ``atol`` is scaled by the output's largest reference magnitude when
    that exceeds 1, so large gradients are held to a relative standard. ``defaults`` replaces
    the dtype's default tolerances (a float32-only reference); ``rough`` marks coordinates
    skipped as non-smooth (already left out of ``checked``)."""
    d_rtol, d_atol = default_tolerance(actual.dtype, fd) if _floating(actual) else (0.0, 0.0)
    if defaults is not None and _floating(actual):
        d_rtol, d_atol = max(d_rtol, defaults[0]), max(d_atol, defaults[1])
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    res = OutputComparison(
        name,
        actual.dtype.name,
        list(actual.shape),
        method or ("finite differences" if fd else "exact"),
        rtol,
        atol,
        int(actual.size if checked is None else np.count_nonzero(checked)),
        int(actual.size),
    )
    if rough is not None and rough.shape == actual.shape:
        res.skipped_rough = int(np.count_nonzero(rough))
    if actual.shape != expected.shape:
        res.problem = (
            f"output '{name}' has shape {list(actual.shape)}, the reference {list(expected.shape)}; "
            "the generated model computes something else than the recorded transform"
        )
        return res
    if not _floating(actual) or not _floating(expected):
        wrong = np.asarray(actual != expected)
        if checked is not None:
            wrong &= checked
        if wrong.any():
            idx = np.unravel_index(int(np.argmax(wrong)), wrong.shape)
            res.index = [int(i) for i in idx]
            res.max_abs_error = float("inf")
            res.problem = f"output '{name}' differs from the reference at {int(wrong.sum())} positions"
        return res
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    mask = np.ones(a.shape, bool) if checked is None else checked.astype(bool)
    finite_e = np.isfinite(e) & mask
    scale = max(1.0, float(np.max(np.abs(e[finite_e])))) if finite_e.any() else 1.0
    allowed = atol * scale + rtol * np.abs(e)
    with np.errstate(invalid="ignore"):
        err = np.abs(a - e)
        same_nonfinite = (~np.isfinite(a)) & (~np.isfinite(e)) & ((a == e) | (np.isnan(a) & np.isnan(e)))
        err = np.where(same_nonfinite, 0.0, err)
        err = np.where(np.isnan(err), np.inf, err)
        ratio = np.where(mask, err / np.maximum(allowed, 1e-300), 0.0)
        rel = np.where(mask, err / np.maximum(np.abs(e), 1e-300), 0.0)
    if a.size:
        worst = int(np.argmax(ratio))
        res.index = [int(i) for i in np.unravel_index(worst, a.shape)]
        res.max_abs_error = float(np.max(np.where(mask, err, 0.0)))
        res.max_rel_error = float(np.max(rel))
        if ratio.flat[worst] > 1.0:
            bad = int(np.count_nonzero(ratio > 1.0))
            res.problem = (
                f"output '{name}' differs from the reference ({res.method}) at {bad} of {res.checked} "
                f"checked positions; worst at index {tuple(res.index)}: "
                f"|actual - expected| = {err.flat[worst]:.3g}, "
                f"allowed {allowed.flat[worst]:.3g} (rtol {rtol:g}, atol {atol:g}"
                f"{f' x {scale:.3g}' if scale > 1 else ''})"
            )
    return res


def _floating(a: np.ndarray) -> bool:
    return bool(np.issubdtype(a.dtype, np.floating))
