"""``onnax validate`` and ``onnax bench``: the Python half of the command line (they need
NumPy and ONNX Runtime); every other command runs in the C++ core."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from onnax.testing._models import ValidationInputError

VALIDATE_HELP = """usage: onnax validate SOURCE.onnx GENERATED.onnx [options]

Validates a model onnax generated from SOURCE in four steps and prints a report for a bug
report (versions, opsets, the transform call, op counts, worst error and where):
  1. ONNX checker   2. strict shape inference   3. ONNX Runtime load + run (the ONNX
  reference evaluator above opset 26)   4. numerical parity with the transform chain the
  generated model records, computed from SOURCE without onnax: exact when JAX is installed
  (the source interpreted op by op in JAX float64, then jax.vmap/jvp/vjp/grad of it, its
  forward pass checked against ONNX Runtime), else float64 central finite differences (also
  when the interpreter lacks an op; the report names it). Non-smooth coordinates (ReLU at 0,
  max-pool ties) are skipped and counted. A mismatch is called an onnax bug only when a
  second reference (finite differences) confirms it. The source runs first: if it does not
  run on the inputs, the report blames the source or the inputs, not onnax.
Exit 0 when all pass, 1 naming the failed step (or INCOMPLETE: --max-seconds), 2 for usage errors.

options:
  --inputs FILE.npz   values by generated-model input name (others: seeded random)
  --seed N            seed of the random inputs (default 0)
  --dim NAME=N        length of symbolic dimension NAME (default 3; repeatable)
  --rtol R, --atol A  tolerances (default: by dtype, looser for finite differences)
  --backend ort|ref   force ONNX Runtime or the ONNX reference evaluator
  --max-coords N      finite differences, reverse mode: coordinates per input (default 64; 0 = all)
  --max-seconds S     bound the reference: finite differences check what they computed by
                      then; the exact reference is awaited until then, else only the
                      primal outputs are compared and the report is INCOMPLETE (exit 1)
  --reference auto|fd auto: exact (JAX) when available; fd: finite differences only
  --json PATH         also write the report as JSON
  --web               also run the generated model on onnxruntime-web (WASM, Node.js)
  --quiet             no progress lines or notices on stderr (the report is still printed)
"""

BENCH_HELP = """usage: onnax bench MODEL.onnx [--transforms vmap,grad,...] [options]

ONNX Runtime latency of MODEL (forward) and of its transforms, in one report: session
initialization and first run (single samples), warmed latency (median of per-repeat means),
op counts before/after ORT optimization, errors against the float64 reference, and ratios
(grad/forward, vmap per example/forward, ...).

options:
  --transforms LIST   of vmap, grad, jvp, vjp, vmap_grad, hvp (default: all)
  --in-axes AXES      vmap in_axes as for `onnax vmap` (default 0)
  --inputs NAMES      derivative selection, comma-separated (default: onnax's)
  --batch N           vmap batch size (default 8)
  --dim NAME=N        length of symbolic dimension NAME (default 3; repeatable)
  --warmup N          warm-up runs (default 10)
  --iterations N      runs per repeat (default 100)
  --repeats N         repeats (default 5)
  --intra-op-threads N  ONNX Runtime intra-op threads (default 1; 0 = ORT's default)
  --seed N            seed of the random inputs (default 0)
  --no-reference      skip the reference (no error column): latency only, fast
  --max-seconds S     bound on each model's reference (differences stop; the exact one is
                      awaited until then, else only primal errors, with a note saying so)
  --output PATH       write the JSON report there (default: print it after the table)
  --quiet             no progress lines or notices on stderr
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # exit 2 with our wording, not argparse's usage dump
        raise _Usage(message)


class _Usage(Exception):
    pass


def _dims(items: Sequence[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.lstrip("-").isdigit() or int(value) < 0:
            raise _Usage(f"--dim needs NAME=N with N >= 0, got '{item}'")
        out[name] = int(value)
    return out


def _in_axes(text: str) -> Any:
    def axis(s: str) -> int | None:
        if s.lower() in ("none", "null"):
            return None
        try:
            return int(s)
        except ValueError:
            raise _Usage(f"--in-axes: '{s}' is not an integer or 'none'") from None

    items = text.split(",")
    if any("=" in i for i in items):
        return {k: axis(v) for k, _, v in (i.partition("=") for i in items)}
    return axis(items[0]) if len(items) == 1 else [axis(i) for i in items]


def _progress(command: str, quiet: bool) -> Callable[[str], None]:
    """Progress lines on stderr (``onnax validate: [12.3 s] message``), none when quiet."""
    start = time.monotonic()

    def say(message: str) -> None:
        if not quiet:
            print(
                f"onnax {command}: [{time.monotonic() - start:5.1f} s] {message}", file=sys.stderr, flush=True
            )

    return say


@contextmanager
def _notices(command: str, quiet: bool) -> Iterator[None]:
    """Python warnings (onnax's notices, JAX's, NumPy's) as one clean line each on stderr,
    without source lines; none when quiet."""

    def show(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if not quiet:
            text = " ".join(str(message).split())
            print(f"onnax {command}: notice: {text.removeprefix('onnax: ')}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


def _positive_seconds(a: Any) -> float | None:
    if a.max_seconds is not None and a.max_seconds <= 0:
        raise _Usage(f"--max-seconds must be > 0, got {a.max_seconds:g}")
    return float(a.max_seconds) if a.max_seconds is not None else None


def validate_main(argv: Sequence[str]) -> int:
    from onnax.testing._validate import report_json, validate

    p = _Parser(add_help=False)
    p.add_argument("source")
    p.add_argument("generated")
    p.add_argument("--inputs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dim", action="append", default=[])
    p.add_argument("--rtol", type=float)
    p.add_argument("--atol", type=float)
    p.add_argument("--backend", choices=("ort", "ref"))
    p.add_argument("--max-coords", type=int, default=64)
    p.add_argument("--json")
    p.add_argument("--web", action="store_true")
    p.add_argument("--max-seconds", type=float)
    p.add_argument("--reference", choices=("auto", "fd"), default="auto")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    seconds = _positive_seconds(a)
    with _notices("validate", a.quiet):
        report = _validate_call(validate, a, seconds)
    print(report.format())
    if a.json:
        with open(a.json, "w") as f:
            f.write(report_json(report) + "\n")
    code = 0 if report.ok else 1
    _exit_now_if_computing(code)
    return code


def _exit_now_if_computing(code: int) -> None:
    """An exact reference left computing (the time limit, or a step failed before parity)
    would hold the process until its JAX compilation ends: exit at once instead."""
    from onnax.testing._evaluate import background_running

    if background_running():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _validate_call(validate: Any, a: Any, seconds: float | None) -> Any:
    return validate(
        a.source,
        a.generated,
        inputs=a.inputs,
        rtol=a.rtol,
        atol=a.atol,
        seed=a.seed,
        dims=_dims(a.dim),
        backend=a.backend,
        max_coords=a.max_coords or None,
        web=a.web,
        max_seconds=seconds,
        progress=_progress("validate", a.quiet),
        exact=a.reference == "auto",
    )


def bench_main(argv: Sequence[str]) -> int:
    from onnax.testing._bench import TRANSFORMS, bench, format_bench

    p = _Parser(add_help=False)
    p.add_argument("model")
    p.add_argument("--transforms", default=",".join(TRANSFORMS))
    p.add_argument("--in-axes", default="0")
    p.add_argument("--inputs")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dim", action="append", default=[])
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output")
    p.add_argument("--no-reference", action="store_true")
    p.add_argument("--max-seconds", type=float)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    seconds = _positive_seconds(a)
    for opt in ("batch", "iterations", "repeats"):
        if getattr(a, opt) < 1:
            raise _Usage(f"--{opt} must be at least 1, got {getattr(a, opt)}")
    if a.warmup < 0 or a.intra_op_threads < 0:
        raise _Usage("--warmup and --intra-op-threads must be >= 0")
    transforms = [t for t in a.transforms.split(",") if t] if a.transforms != "none" else []
    with _notices("bench", a.quiet):
        report = _bench_call(bench, a, transforms, seconds)
    print(format_bench(report))
    text = json.dumps(report, indent=2)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text + "\n")
        if not a.quiet:
            print(f"onnax: wrote {a.output}", file=sys.stderr)
    else:
        print(text)
    _exit_now_if_computing(0)
    return 0


def _bench_call(bench: Any, a: Any, transforms: list[str], seconds: float | None) -> Any:
    return bench(
        a.model,
        transforms,
        in_axes=_in_axes(a.in_axes),
        inputs=a.inputs.split(",") if a.inputs else None,
        batch=a.batch,
        dims=_dims(a.dim),
        warmup=a.warmup,
        iterations=a.iterations,
        repeats=a.repeats,
        threads=a.intra_op_threads,
        seed=a.seed,
        reference=not a.no_reference,
        max_seconds=seconds,
        progress=_progress("bench", a.quiet),
    )


def main(command: str, argv: Sequence[str]) -> int:
    helps = {"validate": VALIDATE_HELP, "bench": BENCH_HELP}
    if any(x in ("-h", "--help") for x in argv):
        print(helps[command], end="")
        return 0
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        # (The wheel does not depend on ONNX Runtime; validate and bench run models with it.)
        print(
            f"onnax {command}: error: onnxruntime is not installed in this environment, and {command} runs "
            "models with it. Fix: pip install onnxruntime",
            file=sys.stderr,
        )
        return 1
    try:
        return validate_main(argv) if command == "validate" else bench_main(argv)
    except _Usage as err:
        print(f"onnax {command}: {err}\n(run `onnax {command} --help` for usage)", file=sys.stderr)
        return 2
    except ValidationInputError as err:
        print(f"onnax {command}: error: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # OnnaxError from a transform (bench), bad values
        print(f"onnax {command}: error: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        print(
            f"onnax {command}: internal error: {type(err).__name__}: {err}\n"
            "Please report this with the models and the command line that caused it.",
            file=sys.stderr,
        )
        return 3
