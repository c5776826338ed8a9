"""Benchmarks of ``onnax.train_step``: training-step time against the forward pass, DP-SGD
against the non-private step, and against ONNX Runtime training's ``generate_artifacts``.

Benchmarks, not tests. Three measurements, side by side in one run, on the models of
``bench/grad_bench.py`` (a 4-layer MLP, MatMul + Add + Relu, and a pre-LN transformer block),
stripped of grad_bench's loss and given one by ``onnax.add_loss(model, "mse")`` with a
symbolic batch dim (DP-SGD needs one; Reshape targets copy the batch dim with 0):

(1) **forward vs training step.** The loss model's forward pass against
    ``onnax.train_step(loss_model, optimizer="adamw", ...)`` (every float initializer a
    parameter), run as a training loop does it: every fed-back output (parameters, moments,
    step) goes back into the next run.
(2) **DP-SGD vs non-private step** at the same batch: ``dp_clip_norm=1``,
    ``noise_multiplier=1``, the same optimizer, the ``<p>_noise`` inputs fed (drawn once before
    timing; the NumPy draw per step is reported apart).
(3) **ONNX Runtime training 1.19.2**: ``onnxruntime.training.artifacts.generate_artifacts``
    on the same loss model (``loss=None``: the model's output is the loss;
    ``requires_grad`` = the same parameters) with an AdamW optimizer block of the same
    hyperparameters, and its training session (``Module`` + ``Optimizer``): one step is
    ``module(x, label)`` (train_step) + ``optimizer.step()`` + ``module.lazy_reset_grad()``.
    It runs in a separate virtual environment that this script creates on demand
    (``--ort-training-venv``, default ``~/.cache/onnax-bench/ort-training``; the package is
    never a project dependency), in a subprocess, on the same inputs. Before timing, one step
    from the same parameters on both sides: the updated parameters are compared.
    ORT's AdamW kernel runs in Hugging Face mode (``adam_mode=1``: epsilon added to
    sqrt(v) before bias correction, weight decay applied after the Adam update), onnax's as
    optax/PyTorch do it: the two differ by O(lr * epsilon) and O(lr^2 * weight_decay).
    ``onnxruntime.training`` imports ``torch`` through its ``optim`` subpackage (microsoft/
    onnxruntime#22070, open) though on-device training does not use it: the worker registers
    an empty ``onnxruntime.training.optim`` module before the import instead of installing
    PyTorch.

ORT methodology (as ``grad_bench.time_ort``, so the figures compare with bench/RESULTS.md):
``intra_op_num_threads=1``, ``inter_op_num_threads=1``, sequential execution, default graph
optimizations; session creation and the first run are single samples, then ``--warmup`` runs,
then ``--repeats`` repeats of ``--runs`` runs each; the latency is the median of the
per-repeat means. The repeats of all variants of a model (forward, step, DP step, ORT
training's step) run in turn, so a load that drifts on the shared machine hits them alike.
onnax's graphs run in the project's ONNX Runtime (requirements.txt), ORT training's in its
own 1.19.2 build.

    python bench/train_step.py                        # full run (~3 min on 2 cores)
    python bench/train_step.py --quick                # small models, few repeats
    python bench/train_step.py --no-ort-training --output train_step.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = Path.home() / ".cache" / "onnax-bench" / "ort-training"
# The CPU build of onnxruntime-training 1.19.2 (the last release); the CUDA build
# ("onnxruntime-training", 300 MB) runs the same CPU kernels. onnx 1.16 is the release
# ORT 1.19 was built and tested with; NumPy 1.x as its wheels were built against.
DEFAULT_PACKAGES = ("onnxruntime-training-cpu==1.19.2", "onnx==1.16.2", "numpy<2")

LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
BETAS = (0.9, 0.999)
EPSILON = 1e-8


# --------------------------------------------------------------------------------------------
# Timing (shared by both sides: the worker runs without onnax or grad_bench)


def _error(stage: str, exc: BaseException) -> dict[str, str]:
    return {
        "stage": stage,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(limit=6),
    }


# --------------------------------------------------------------------------------------------
# ONNX Runtime training worker (runs in the separate venv)


def ort_training_worker(job: Path) -> int:
    """Reads job/config.json, job/loss_model.onnx, job/data.npz; writes job/result.json and
    job/params_after.npz (the parameters after one step from the stored ones)."""
    import types

    cfg = json.loads((job / "config.json").read_text())
    result: dict[str, Any] = {}
    try:
        # onnxruntime.training imports torch through .optim (microsoft/onnxruntime#22070);
        # on-device training (artifacts, api) does not use it.
        sys.modules.setdefault("onnxruntime.training.optim", types.ModuleType("onnxruntime.training.optim"))
        import onnx
        import onnxruntime as ort
        from onnxruntime.training import artifacts, onnxblock
        from onnxruntime.training.api import CheckpointState, Module, Optimizer

        result["versions"] = {
            "onnxruntime-training": ort.__version__,
            "onnx": onnx.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
        }
        model = onnx.load(str(job / cfg.get("model", "loss_model.onnx")))
        art = job / "artifacts"
        art.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        artifacts.generate_artifacts(
            model,
            requires_grad=list(cfg["params"]),
            frozen_params=[],
            loss=None,
            optimizer=onnxblock.optim.AdamW(
                betas=tuple(cfg["betas"]), eps=cfg["epsilon"], weight_decay=cfg["weight_decay"]
            ),
            artifact_directory=str(art),
        )
        result["generate_artifacts_s"] = time.perf_counter() - t0
        if cfg.get("probe_only"):
            (job / "result.json").write_text(json.dumps(result, indent=1) + "\n")
            return 0
        result["training_model_nodes"] = len(onnx.load(str(art / "training_model.onnx")).graph.node)
        result["optimizer_model_nodes"] = len(onnx.load(str(art / "optimizer_model.onnx")).graph.node)
        data = dict(np.load(job / "data.npz"))

        def session() -> tuple[Any, Any, Any, list[np.ndarray], float]:
            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            so.log_severity_level = 3
            t0 = time.perf_counter()
            state = CheckpointState.load_checkpoint(str(art / "checkpoint"))
            module = Module(str(art / "training_model.onnx"), state, session_options=so)
            opt = Optimizer(str(art / "optimizer_model.onnx"), module)
            opt.set_learning_rate(cfg["learning_rate"])
            init_s = time.perf_counter() - t0
            module.train()
            feeds = [data[name] for name in module.input_names()]
            return state, module, opt, feeds, init_s

        # One step from the stored parameters: the update, for the comparison with onnax.
        state, module, opt, feeds, _ = session()
        loss = module(*feeds)
        opt.step()
        module.lazy_reset_grad()
        result["check_loss"] = float(np.asarray(loss[0] if isinstance(loss, (list, tuple)) else loss))
        after = {p: np.array(state.parameters[p].data) for p in cfg["params"]}
        np.savez(job / "params_after.npz", **after)  # type: ignore[arg-type]
        del state, module, opt

        _state, module, opt, feeds, init_s = session()
        result["input_names"] = list(module.input_names())

        def step() -> None:
            module(*feeds)
            opt.step()
            module.lazy_reset_grad()

        def train_only() -> None:
            module(*feeds)
            module.lazy_reset_grad()

        t0 = time.perf_counter()
        step()
        first_s = time.perf_counter() - t0
        for _ in range(cfg["timing"]["warmup"]):
            step()
        result["step_info"] = {"session_init_s": init_s, "first_run_s": first_s}
    except Exception as exc:
        result["error"] = _error("onnxruntime-training", exc)
    (job / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    if "error" in result or cfg.get("probe_only"):
        return 0
    # Serve timed repeats on request ("step" / "train" / "quit"), interleaved with onnax's.
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd not in ("step", "train"):
            break
        fn = step if cmd == "step" else train_only
        t0 = time.perf_counter()
        for _ in range(cfg["timing"]["runs"]):
            fn()
        print(json.dumps((time.perf_counter() - t0) / cfg["timing"]["runs"]), flush=True)
    return 0


def ensure_ort_training_venv(venv: Path, packages: Sequence[str], python: str) -> dict[str, Any]:
    """Creates ``venv`` with ``packages`` unless it imports them already; says why not."""
    py = venv / "bin" / "python"
    probe = (
        "import sys, types; sys.modules['onnxruntime.training.optim'] = types.ModuleType('x'); "
        "import onnxruntime; from onnxruntime.training import artifacts; from onnxruntime.training.api "
        "import Module; print(onnxruntime.__version__)"
    )
    env = _clean_env()
    if py.exists():
        r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, env=env)
        if r.returncode == 0:
            return {"ok": True, "venv": str(venv), "created": False, "version": r.stdout.strip()}
        shutil.rmtree(venv)
    print(f"  creating {venv} with {' '.join(packages)} (once)", flush=True)
    t0 = time.perf_counter()
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [python, "-m", "venv", str(venv)],
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *packages],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            return {
                "ok": False,
                "venv": str(venv),
                "error": f"{' '.join(cmd)} failed: {r.stderr.strip()[-2000:]}",
            }
    r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"ok": False, "venv": str(venv), "error": f"import failed: {r.stderr.strip()[-2000:]}"}
    return {
        "ok": True,
        "venv": str(venv),
        "created": True,
        "install_s": time.perf_counter() - t0,
        "version": r.stdout.strip(),
    }


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_NO_INPUT"] = "1"
    return env


# --------------------------------------------------------------------------------------------
# Models


def loss_model_of(model: Any, batch: int, ln_stats: bool = True) -> Any:
    """grad_bench's model with its MSE loss replaced by ``onnax.add_loss(..., "mse")`` over a
    symbolic batch dim ``N``; only the loss is output. With ``ln_stats`` every
    LayerNormalization also names its Mean and InvStdDev outputs (unused): ONNX Runtime
    training 1.19.2's LayerNormalization gradient reads them and fails on a one-output node."""
    import onnax
    import onnx
    from onnx import numpy_helper

    g = model.graph
    diff = next(n for n in g.node if n.output[0] == "diff")
    prediction = diff.input[0]
    drop = {"diff", "sq", "loss"}
    kept = [n for n in g.node if n.output[0] not in drop]
    del g.node[:]
    g.node.extend(kept)
    x = next(i for i in g.input if i.name == "x")
    out_vi = onnx.ValueInfoProto()
    out_vi.CopyFrom(x)
    out_vi.name = prediction
    del g.output[:]
    g.output.append(out_vi)
    inputs = [i for i in g.input if i.name != "target"]
    del g.input[:]
    g.input.extend(inputs)
    for vi in (g.input[0], g.output[0]):
        vi.type.tensor_type.shape.dim[0].ClearField("dim_value")
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    for n in g.node:
        if ln_stats and n.op_type == "LayerNormalization" and len(n.output) == 1:
            n.output.extend([f"{n.output[0]}_mean", f"{n.output[0]}_inv_std"])
    # Reshape targets that spell the batch size copy it instead (0), so one example runs too.
    shape_inputs = {n.input[1] for n in g.node if n.op_type == "Reshape"}
    for i, t in enumerate(g.initializer):
        if t.name in shape_inputs:
            v = numpy_helper.to_array(t).copy()
            if v.ndim == 1 and v.size and v[0] == batch:
                v[0] = 0
                g.initializer[i].CopyFrom(numpy_helper.from_array(v, t.name))
    lm = onnax.add_loss(model, "mse")
    outputs = [o for o in lm.graph.output if o.name == "loss"]
    del lm.graph.output[:]
    lm.graph.output.extend(outputs)
    return lm


def build_models(args: argparse.Namespace) -> list[dict[str, Any]]:
    sys.path.insert(0, str(HERE))
    from grad_bench import mlp_model, mlp_weights, transformer_model, transformer_weights

    models = []
    if "mlp" in args.models:
        w, b, n = args.mlp_width, args.batch, args.mlp_layers
        models.append(
            {
                "key": "mlp",
                "label": f"{n}-layer MLP (MatMul+Add+Relu), width {w}, batch {b}",
                "config": {"width": w, "layers": n, "batch": b},
                "loss_model": loss_model_of(mlp_model(w, b, layers=n), b),
                "params": list(mlp_weights(w, n, 0)),
                "shape": (b, w),
            }
        )
    if "transformer" in args.models:
        cfg = {"batch": args.tf_batch, "seq": args.tf_seq, "width": args.tf_width, "heads": args.tf_heads}
        models.append(
            {
                "key": "transformer",
                "label": (
                    f"pre-LN transformer block, batch {cfg['batch']}, seq {cfg['seq']}, width "
                    f"{cfg['width']}, {cfg['heads']} heads, GELU MLP x4"
                ),
                "config": cfg,
                "loss_model": loss_model_of(transformer_model(**cfg), cfg["batch"]),
                "plain_loss_model": loss_model_of(transformer_model(**cfg), cfg["batch"], ln_stats=False),
                "params": list(transformer_weights(cfg["width"], 4 * cfg["width"], 0)),
                "shape": (cfg["batch"], cfg["seq"], cfg["width"]),
            }
        )
    return models


# --------------------------------------------------------------------------------------------
# onnax side


def adamw_first_step(p: np.ndarray, g: np.ndarray, hugging_face: bool) -> np.ndarray:
    """One AdamW step from zero moments in float64: optax's / PyTorch's form, or Hugging
    Face's (ORT training's ``adam_mode=1``: epsilon added to sqrt(v) before the bias
    correction, which goes into the step size; decay applied to the updated parameter)."""
    b1, b2 = BETAS
    p, g = p.astype(np.float64), g.astype(np.float64)
    m, v = (1 - b1) * g, (1 - b2) * g * g
    if hugging_face:
        q = p - LEARNING_RATE * np.sqrt(1 - b2) / (1 - b1) * m / (np.sqrt(v) + EPSILON)
        return q - LEARNING_RATE * WEIGHT_DECAY * q
    m_hat, v_hat = m / (1 - b1), v / (1 - b2)
    return p - LEARNING_RATE * (m_hat / (np.sqrt(v_hat) + EPSILON) + WEIGHT_DECAY * p)


def _step_runner(
    step_model: Any, state: dict[str, np.ndarray], data: dict[str, np.ndarray]
) -> Callable[[Any], object]:
    """A training loop's run: every fed-back output goes into the next run."""
    import onnax

    pairs = [(i, o) for i, o in onnax.feedback(step_model) if o is not None]
    names = [o.name for o in step_model.graph.output]
    st = dict(state)

    def run(sess: Any) -> object:
        out = dict(zip(names, sess.run(None, {**st, **data}), strict=True))
        for i, o in pairs:
            st[i] = out[o]
        return out

    return run


def bench_model(m: dict[str, Any], timing: dict[str, int], dp: bool) -> dict[str, Any]:
    import onnax
    from grad_bench import ort_session

    loss_model = m["loss_model"]
    rng = np.random.default_rng(3)
    data = {
        "x": rng.standard_normal(m["shape"]).astype(np.float32),
        "label": rng.standard_normal(m["shape"]).astype(np.float32),
    }
    out: dict[str, Any] = {"model": m["label"], "config": m["config"], "data": data}
    opts: dict[str, Any] = {
        "optimizer": "adamw",
        "learning_rate": LEARNING_RATE,
        "weight_decay": WEIGHT_DECAY,
        "beta1": BETAS[0],
        "beta2": BETAS[1],
        "epsilon": EPSILON,
    }
    out["params"] = onnax.select_params(loss_model)
    out["param_count"] = int(
        sum(np.prod(i.dims) for i in loss_model.graph.initializer if i.name in set(out["params"]))
    )
    variants: list[tuple[str, Any, Callable[[Any], object]]] = [
        ("forward", loss_model, lambda sess: sess.run(["loss"], data))
    ]
    try:
        t0 = time.perf_counter()
        step = onnax.train_step(loss_model, "all", **opts)
        out["step_transform_s"] = time.perf_counter() - t0
        state = onnax.initial_state(loss_model, step)
        out["state"] = state
        out["step_model"] = step
        first = dict(
            zip(
                [o.name for o in step.graph.output],
                ort_session(step).run(None, {**state, **data}),
                strict=True,
            )
        )
        out["check_params_after"] = {p: first[f"{p}_new"] for p in out["params"]}
        out["check_loss"] = float(first["loss"])
        gm = onnax.grad(loss_model, inputs=out["params"], output="loss")
        g_names = [f"{p}_grad" for p in out["params"]]
        out["check_grads"] = dict(zip(out["params"], ort_session(gm).run(g_names, data), strict=True))
        variants.append(("step", step, _step_runner(step, state, data)))
        # The gradient alone (parameters stored), to split the step into gradient and update.
        variants.append(("grad", gm, lambda sess: sess.run(g_names, data)))
    except Exception as exc:
        out["step_error"] = _error("onnax.train_step", exc)
        print(f"  onnax.train_step FAILED: {type(exc).__name__}: {exc}", flush=True)
    if dp:
        try:
            t0 = time.perf_counter()
            dp_step = onnax.train_step(loss_model, "all", dp_clip_norm=1.0, noise_multiplier=1.0, **opts)
            out["dp_step_transform_s"] = time.perf_counter() - t0
            dp_state = onnax.initial_state(loss_model, dp_step)
            shapes = {p: np.shape(dp_state[p]) for p in out["params"]}
            noise_rng = np.random.default_rng(11)

            def draw() -> dict[str, np.ndarray]:
                return {
                    f"{p}_noise": noise_rng.standard_normal(s, dtype=np.float32) for p, s in shapes.items()
                }

            noise = draw()
            t0 = time.perf_counter()
            for _ in range(5):
                draw()
            out["noise_draw_s"] = (time.perf_counter() - t0) / 5
            variants.append(("dp_step", dp_step, _step_runner(dp_step, dp_state, {**data, **noise})))
        except Exception as exc:
            out["dp_step_error"] = _error("onnax.train_step (DP-SGD)", exc)
            print(f"  DP-SGD train_step FAILED: {type(exc).__name__}: {exc}", flush=True)
    out["_variants"] = variants
    return out


def time_interleaved(
    variants: Sequence[tuple[str, Callable[[], tuple[dict[str, Any], Callable[[], float]]]]],
    repeats: int,
    out: dict[str, Any],
) -> None:
    """Prepares every variant (session init, first run, warm-up: single samples), then runs
    the timed repeats in turn, variant after variant, so a load that drifts on the shared
    machine hits them alike; ``out[key]`` gets the median of the per-repeat means."""
    ready: list[tuple[str, dict[str, Any], Callable[[], float]]] = []
    for key, prepare in variants:
        try:
            info, repeat = prepare()
            ready.append((key, info, repeat))
        except Exception as exc:
            out[f"{key}_error"] = _error(f"prepare {key}", exc)
            print(f"  {key}: FAILED {type(exc).__name__}: {exc}", flush=True)
    means: dict[str, list[float]] = {key: [] for key, _, _ in ready}
    failed: set[str] = set()
    for _ in range(repeats):
        for key, _, repeat in ready:
            if key in failed:
                continue
            try:
                means[key].append(repeat())
            except Exception as exc:
                out[f"{key}_error"] = _error(f"run {key}", exc)
                failed.add(key)
                print(f"  {key}: FAILED {type(exc).__name__}: {exc}", flush=True)
    for key, info, _ in ready:
        if key in failed or not means[key]:
            continue
        out[key] = {**info, "latency_s": statistics.median(means[key]), "repeat_means_s": means[key]}
        nodes = f", {info['nodes']} nodes" if "nodes" in info else ""
        print(
            f"  {key:<22} {out[key]['latency_s'] * 1e3:9.2f} ms/run (init {info['session_init_s']:.2f} s, "
            f"first run {info['first_run_s'] * 1e3:.1f} ms{nodes})",
            flush=True,
        )


def ort_variant(
    model: Any, run: Callable[[Any], object], warmup: int, runs: int
) -> Callable[[], tuple[dict[str, Any], Callable[[], float]]]:
    """A session of the project's ONNX Runtime, as grad_bench.time_ort prepares it."""
    from grad_bench import ort_session

    def prepare() -> tuple[dict[str, Any], Callable[[], float]]:
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

        def repeat() -> float:
            t0 = time.perf_counter()
            for _ in range(runs):
                run(sess)
            return (time.perf_counter() - t0) / runs

        return {"session_init_s": init_s, "first_run_s": first_s, "nodes": len(model.graph.node)}, repeat

    return prepare


# --------------------------------------------------------------------------------------------
# ORT training side (driver)


def _run_worker(job: Path, cfg: dict[str, Any], venv_py: Path, timeout: float) -> dict[str, Any]:
    (job / "config.json").write_text(json.dumps(cfg))
    (job / "result.json").unlink(missing_ok=True)
    try:
        r = subprocess.run(
            [str(venv_py), str(Path(__file__).resolve()), "--ort-worker", str(job)],
            capture_output=True,
            text=True,
            env=_clean_env(),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": {"stage": "worker", "message": f"timed out after {timeout:.0f} s"}}
    if not (job / "result.json").exists():
        return {"error": {"stage": "worker", "message": f"exit {r.returncode}: {r.stderr.strip()[-2000:]}"}}
    result: dict[str, Any] = json.loads((job / "result.json").read_text())
    return result


def start_ort_training(
    rec: dict[str, Any], m: dict[str, Any], venv_py: Path, timing: dict[str, int], job: Path
) -> tuple[dict[str, Any], subprocess.Popen[str] | None]:
    """Generates the artifacts and takes the checked step in the venv's worker, which then
    waits for timed repeats. Returns what it reported and the waiting worker (or None)."""
    import onnx

    out: dict[str, Any] = {}
    onnx.save(m["loss_model"], str(job / "loss_model.onnx"))
    np.savez(job / "data.npz", **rec["data"])  # type: ignore[arg-type]
    cfg = {
        "params": rec["params"],
        "learning_rate": LEARNING_RATE,
        "weight_decay": WEIGHT_DECAY,
        "betas": list(BETAS),
        "epsilon": EPSILON,
        "timing": timing,
    }
    if "plain_loss_model" in m:
        # The same model with one-output LayerNormalization nodes, as grad_bench builds it.
        onnx.save(m["plain_loss_model"], str(job / "plain_model.onnx"))
        probe = _run_worker(job, {**cfg, "model": "plain_model.onnx", "probe_only": True}, venv_py, 900)
        shutil.rmtree(job / "artifacts", ignore_errors=True)
        out["plain_layernorm"] = {"ok": False, "error": probe["error"]} if "error" in probe else {"ok": True}
    (job / "config.json").write_text(json.dumps(cfg))
    (job / "result.json").unlink(missing_ok=True)
    stderr = (job / "stderr.txt").open("w")
    proc = subprocess.Popen(
        [str(venv_py), str(Path(__file__).resolve()), "--ort-worker", str(job)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=_clean_env(),
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline().strip() == "ready"
    if (job / "result.json").exists():
        out.update(json.loads((job / "result.json").read_text()))
    if not ready:
        proc.wait(timeout=60)
        if "error" not in out:
            message = (job / "stderr.txt").read_text().strip()[-2000:]
            out["error"] = {"stage": "worker", "message": f"exit {proc.returncode}: {message}"}
        return out, None
    return out, proc


def worker_variant(
    proc: subprocess.Popen[str], info: dict[str, Any], command: str
) -> Callable[[], tuple[dict[str, Any], Callable[[], float]]]:
    def prepare() -> tuple[dict[str, Any], Callable[[], float]]:
        def repeat() -> float:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the ONNX Runtime training worker exited ({proc.poll()})")
            return float(json.loads(line))

        return info, repeat

    return prepare


def check_against_ort_training(rec: dict[str, Any], out: dict[str, Any], job: Path) -> None:
    """The parameters after one step on both sides, and both against float64 formulas."""
    after = job / "params_after.npz"
    if "error" not in out and after.exists() and "check_params_after" in rec:
        theirs = dict(np.load(after))
        ours = rec["check_params_after"]
        before = rec["state"]
        grads = rec["check_grads"]
        diffs = {}

        def dmax(a: np.ndarray, b: np.ndarray) -> float:
            return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))

        for p in rec["params"]:
            optax_form = adamw_first_step(before[p], grads[p], hugging_face=False)
            hf_form = adamw_first_step(before[p], grads[p], hugging_face=True)
            diffs[p] = {
                "max_abs_diff": dmax(ours[p], theirs[p]),
                "max_abs_update": dmax(ours[p], before[p]),
                "onnax_vs_optax_formula": dmax(ours[p], optax_form),
                "ort_training_vs_hf_formula": dmax(theirs[p], hf_form),
                "ort_training_vs_optax_formula": dmax(theirs[p], optax_form),
                "optax_vs_hf_formula": dmax(optax_form, hf_form),
            }
        max_update = max(c["max_abs_update"] for c in diffs.values())
        out["update_check"] = {
            "max_abs_param_diff": max(c["max_abs_diff"] for c in diffs.values()),
            "max_abs_update": max_update,
            **{
                k: max(c[k] for c in diffs.values())
                for k in (
                    "onnax_vs_optax_formula",
                    "ort_training_vs_hf_formula",
                    "ort_training_vs_optax_formula",
                    "optax_vs_hf_formula",
                )
            },
            "loss_ours": rec["check_loss"],
            "loss_ort_training": out.get("check_loss"),
            "per_param": diffs,
        }


# --------------------------------------------------------------------------------------------
# Report


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = [tuple(header), *[tuple(r) for r in rows]]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for j, row in enumerate(table):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if j == 0:
            print("  ".join("-" * w for w in widths))


def _ms(rec: dict[str, Any], key: str) -> str:
    v = rec.get(key)
    return f"{v['latency_s'] * 1e3:.2f}" if isinstance(v, dict) and "latency_s" in v else "-"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def report(result: dict[str, Any]) -> list[str]:
    """Prints the table; returns the targets missed and the failures."""
    problems: list[str] = []
    rows = []
    for rec in result["models"]:
        ortt = rec.get("ort_training", {})
        rows.append(
            (
                rec["key"],
                _ms(rec, "forward"),
                _ms(rec, "step"),
                _x(rec.get("step_over_forward")),
                _ms(rec, "dp_step"),
                _x(rec.get("dp_over_step")),
                _ms(ortt, "step"),
                _x(rec.get("step_over_ort_training")),
                "-" if "update_check" not in ortt else f"{ortt['update_check']['max_abs_param_diff']:.1e}",
            )
        )
        for k in ("step_error", "dp_step_error", "forward_error", "step_error", "dp_step_error"):
            if k in rec:
                problems.append(f"{rec['key']}: {k}: {rec[k]['message'].splitlines()[0]}")
        if "error" in ortt:
            problems.append(f"{rec['key']}: ORT training: {ortt['error']['message'].splitlines()[0][:300]}")
        r = rec.get("step_over_ort_training")
        if r is not None and r > 1.0:
            problems.append(f"{rec['key']}: onnax step {r:.2f}x ORT training's (target <= 1.0x)")
        r = rec.get("dp_over_step")
        if rec["key"] == "mlp" and r is not None and r > 2.0:
            problems.append(f"mlp: DP-SGD step {r:.2f}x the non-private step (target <= 2x)")
    print("\nms/step, ORT 1 thread, median of per-repeat means; AdamW; ratios side by side in this run")
    _print_table(
        (
            "model",
            "forward",
            "onnax step",
            "step/fwd",
            "DP step",
            "DP/step",
            "ORT-training step",
            "onnax/ORT-tr",
            "max|dparam|",
        ),
        rows,
    )
    for rec in result["models"]:
        ortt = rec.get("ort_training", {})
        uc = ortt.get("update_check")
        if uc:
            print(
                f"  {rec['key']}: one step from the same parameters: max |onnax - ORT training| "
                f"{uc['max_abs_param_diff']:.2e} (largest update {uc['max_abs_update']:.2e}); loss "
                f"{uc['loss_ours']:.6g} vs {uc['loss_ort_training']:.6g}\n"
                f"    against float64 formulas from the same gradient: onnax vs optax/PyTorch AdamW "
                f"{uc['onnax_vs_optax_formula']:.1e}; ORT training vs Hugging Face AdamW "
                f"{uc['ort_training_vs_hf_formula']:.1e}, vs optax/PyTorch "
                f"{uc['ort_training_vs_optax_formula']:.1e}; the two formulas differ by "
                f"{uc['optax_vs_hf_formula']:.1e}"
            )
        plain = ortt.get("plain_layernorm")
        if plain and not plain["ok"]:
            print(
                f"  {rec['key']}: ORT training cannot differentiate the model with one-output "
                f"LayerNormalization nodes ({plain['error']['message'].strip()[:200]}); compared on the same "
                "model with their Mean/InvStdDev outputs named"
            )
        if "grad" in rec and "step" in rec:
            g_s, s_s = rec["grad"]["latency_s"], rec["step"]["latency_s"]
            print(
                f"  {rec['key']}: onnax: gradient {g_s * 1e3:.2f} ms + optimizer update and I/O "
                f"{(s_s - g_s) * 1e3:.2f} ms"
            )
        if "train_only" in ortt and "step" in ortt:
            both, train = ortt["step"]["latency_s"], ortt["train_only"]["latency_s"]
            print(
                f"  {rec['key']}: ORT training: train_step {train * 1e3:.2f} ms "
                f"+ optimizer_step {(both - train) * 1e3:.2f}"
                f" ms; training graph {ortt['training_model_nodes']} nodes + optimizer "
                f"{ortt['optimizer_model_nodes']}; onnax step {rec['step']['nodes']} nodes"
            )
        if "noise_draw_s" in rec:
            print(
                f"  {rec['key']}: drawing the DP noise in NumPy (not timed above): "
                f"{rec['noise_draw_s'] * 1e3:.2f} ms per step ({rec['param_count']} parameters)"
            )
    return problems


# --------------------------------------------------------------------------------------------
# Main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ort-worker", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="small models, few repeats")
    p.add_argument("--models", default="mlp,transformer", help="comma-separated subset of mlp, transformer")
    p.add_argument("--batch", type=int, default=None, help="MLP batch (default 64, also the DP-SGD batch)")
    p.add_argument("--mlp-width", type=int, default=None, help="MLP width (default 512; quick 128)")
    p.add_argument("--mlp-layers", type=int, default=4)
    p.add_argument("--tf-batch", type=int, default=None, help="transformer batch (default 8; quick 2)")
    p.add_argument("--tf-seq", type=int, default=None, help="transformer sequence (default 128; quick 32)")
    p.add_argument("--tf-width", type=int, default=None, help="transformer width (default 256; quick 64)")
    p.add_argument("--tf-heads", type=int, default=4)
    p.add_argument("--no-dp", action="store_true", help="skip the DP-SGD step")
    p.add_argument("--no-ort-training", action="store_true", help="skip the ONNX Runtime training comparison")
    p.add_argument("--ort-training-venv", type=Path, default=DEFAULT_VENV, help=f"default {DEFAULT_VENV}")
    p.add_argument(
        "--ort-training-package",
        action="append",
        default=None,
        help=f"pip requirement(s) for that venv (repeatable; default {' '.join(DEFAULT_PACKAGES)})",
    )
    p.add_argument("--venv-python", default=sys.executable, help="Python that creates the venv")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7; quick 3)")
    p.add_argument("--runs", type=int, default=None, help="runs per repeat (default 5; quick 2)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up runs (default 3; quick 1)")
    p.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.ort_worker is not None:
        return ort_training_worker(args.ort_worker)

    q = args.quick
    args.batch = args.batch or 64
    args.mlp_width = args.mlp_width or (128 if q else 512)
    args.tf_batch = args.tf_batch or (2 if q else 8)
    args.tf_seq = args.tf_seq or (32 if q else 128)
    args.tf_width = args.tf_width or (64 if q else 256)
    args.models = {s.strip() for s in args.models.split(",") if s.strip()}
    timing = {
        "warmup": args.warmup if args.warmup is not None else (1 if q else 3),
        "repeats": args.repeats or (3 if q else 7),
        "runs": args.runs or (2 if q else 5),
    }
    packages = args.ort_training_package or list(DEFAULT_PACKAGES)

    sys.path.insert(0, str(HERE))
    from grad_bench import machine_info, versions

    result: dict[str, Any] = {
        "quick": q,
        "machine": machine_info(),
        "versions": versions(),
        "ort_timing": timing,
        "optimizer": {
            "kind": "adamw",
            "learning_rate": LEARNING_RATE,
            "weight_decay": WEIGHT_DECAY,
            "betas": list(BETAS),
            "epsilon": EPSILON,
        },
        "dp_sgd": None if args.no_dp else {"clip_norm": 1.0, "noise_multiplier": 1.0},
        "models": [],
    }
    print(f"machine: {result['machine']['cpu']}, nproc {result['machine']['nproc']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()))
    t_start = time.perf_counter()

    venv_py: Path | None = None
    if not args.no_ort_training:
        print(f"\nONNX Runtime training venv: {args.ort_training_venv}", flush=True)
        info = ensure_ort_training_venv(args.ort_training_venv, packages, args.venv_python)
        info["packages"] = packages
        result["ort_training_env"] = info
        if info["ok"]:
            venv_py = args.ort_training_venv / "bin" / "python"
            print(f"  onnxruntime-training {info['version']}", flush=True)
        else:
            print(f"  UNAVAILABLE: {info['error'][:500]}", flush=True)

    for m in build_models(args):
        print(f"\n{m['label']}", flush=True)
        rec = bench_model(m, timing, dp=not args.no_dp)
        rec["key"] = m["key"]
        variants = [
            (key, ort_variant(model, run, timing["warmup"], timing["runs"]))
            for key, model, run in rec.pop("_variants")
        ]
        with tempfile.TemporaryDirectory(prefix="onnax-ort-training-") as tmp:
            job = Path(tmp)
            proc = None
            if venv_py is not None:
                print(
                    "  ONNX Runtime training: generate_artifacts, one checked step (subprocess)", flush=True
                )
                ortt, proc = start_ort_training(rec, m, venv_py, timing, job)
                rec["ort_training"] = ortt
                if proc is None:
                    print(f"  ORT training FAILED: {ortt['error']['message'][:500]}", flush=True)
                else:
                    variants.append(
                        ("ort_training_step", worker_variant(proc, ortt.pop("step_info"), "step"))
                    )
                    variants.append(
                        (
                            "ort_training_train_only",
                            worker_variant(proc, {"session_init_s": 0.0, "first_run_s": 0.0}, "train"),
                        )
                    )
            print(f"  timing {len(variants)} variants in turn, {timing['repeats']} repeats", flush=True)
            time_interleaved(variants, timing["repeats"], rec)
            if proc is not None:
                assert proc.stdin is not None
                proc.stdin.write("quit\n")
                proc.stdin.close()
                proc.wait(timeout=60)
                ortt = rec["ort_training"]
                for key in ("ort_training_step", "ort_training_train_only"):
                    if key in rec:
                        ortt[key.removeprefix("ort_training_")] = rec.pop(key)
                check_against_ort_training(rec, ortt, job)
        lat = {k: rec[k]["latency_s"] for k in ("forward", "step", "dp_step") if k in rec}
        if "forward" in lat and "step" in lat:
            rec["step_over_forward"] = lat["step"] / lat["forward"]
        if "step" in lat and "dp_step" in lat:
            rec["dp_over_step"] = lat["dp_step"] / lat["step"]
        ortt_step = rec.get("ort_training", {}).get("step")
        if "step" in lat and ortt_step:
            rec["step_over_ort_training"] = lat["step"] / ortt_step["latency_s"]
        for k in ("data", "state", "step_model", "check_params_after", "check_grads"):
            rec.pop(k, None)
        result["models"].append(rec)

    from grad_bench import finish

    finish(result, report(result), t_start, args.output, "all targets met")
    failed = any(k in rec for rec in result["models"] for k in ("step_error", "forward_error"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
