"""Backpropagation through time of spyx's spiking networks: ONNX Runtime running onnax's
``grad(scan(step))`` against ``jax.jit(jax.grad(loss))`` of the same spyx network, one thread.

Benchmark, not a test. For each network (``lif``, ``alif``, ``rlif``: ``spyx.nn.Sequential(
nnx.Linear(8, H), NEURON((H,)), nnx.Linear(H, 4), spyx.nn.LI((4,)))`` built as
``tests/python/models/spyx/generate_spyx.py`` builds them, with the same seeds and the same
perturbation of the biases and of LI's beta, but batch B and hidden width H), input a binary
spike train (T, B, 8) with p = 0.4, zero initial state, float32:

* **JAX** (spyx 1.0.0, in a separate venv, in a subprocess):
  ``jax.jit(jax.grad(loss))`` w.r.t. every parameter, ``loss(p, x, *state) = 0.5 *
  sum(spyx.nn.run(nnx.merge(graphdef, p), x, state)[0] ** 2)``, the hidden neuron with spyx's
  default surrogate ``superspike(k=25)``. One call is ``fn(params, x, *state0)`` then
  ``jax.block_until_ready``; x and the state are arguments, not closure constants.
* **onnax**: spyx's own step export of the same model (``spyx.experimental.onnx.to_onnx(model,
  (8,), batch=B)``, written by the worker), ``onnax.scan(step)`` (one Loop, symbolic time),
  loss ``0.5 * sum(out_seq ** 2)`` appended (Mul, ReduceSum, Mul), then
  ``onnax.grad(loss_model, inputs=<the parameters' initializers>, output="loss",
  surrogate="superspike:k=25")``; the parameters' initializers are found by exact value, as
  generate_spyx.py's ``param_map`` does. Run in the project's ONNX Runtime,
  ``intra_op_num_threads=1``, ``inter_op_num_threads=1``, sequential execution, default graph
  optimizations (``bench/grad_bench.py``'s ``ort_session``); one call fetches the gradient
  outputs only.

The forward pass (the loss alone: ``jax.jit(loss)`` / the scanned loss model) is timed too, for
the gradient-over-forward ratios. Before timing, both sides' gradients (and losses) are
compared: ``max over parameters of max|onnax - jax| / max|jax|`` (float32 on both sides; a
spike decision whose margin is near float32 rounding could flip and break the agreement, so the
smallest |pre-activation| along the run is reported too).

One thread: the JAX worker runs with ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` and, like
``taskset -c CPU``, its CPU affinity is set to one CPU (``--cpu``, default 0) before JAX is
imported (XLA:CPU sizes its intra-op pool from the affinity mask); the driver, which runs ONNX
Runtime, pins itself to the same CPU. The two never run at the same time: the worker serves
timed repeats on request. Timing: compile / session creation and the first run are single
samples; after ``--warmup`` runs, each variant's run count per repeat is set so that a repeat
lasts about ``--repeat-seconds``; then ``--repeats`` rounds, each timing every variant of every
configuration once (JAX grad, onnax grad, JAX forward, onnax forward; the order of the two sides
alternates from round to round), so a load that drifts on the shared machine hits both alike.
Reported: the median (and best) of the per-repeat means, and the ratio onnax / JAX as the
median of the per-round ratios (each round's two means are taken seconds apart, so the ratio
is steadier than either time when the machine's speed drifts; the ratio of the medians is in
the JSON too). ``--profile`` adds ONNX Runtime's profile of both onnax models: kernel calls per
time step inside the Loop bodies, the unprofiled time per kernel call, and the op types' shares
of the profiled kernel time (the profiler itself roughly doubles the run time).

The spyx venv (``spyx==1.0.0 jax2onnx onnx onnxruntime``; never a project dependency) is
created on demand under ``--spyx-venv`` (default ``~/.cache/onnax-bench/spyx``), or given by
``--spyx-python``.

    python bench/spyx_bptt.py --quick                        # lif, alif; B=32, H=16; ~1-2 min
    python bench/spyx_bptt.py --nets lif,alif,rlif --batch 32,128 --hidden 16,128
    python bench/spyx_bptt.py --spyx-python /tmp/spyx-venv/bin/python --profile --output r.json
"""

from __future__ import annotations

import argparse
import json
import math
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
DEFAULT_VENV = Path.home() / ".cache" / "onnax-bench" / "spyx"
DEFAULT_PACKAGES = ("spyx==1.0.0", "jax2onnx", "onnx", "onnxruntime")
XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false"
SEEDS = {"lif": 0, "alif": 1, "rlif": 4}
IN = 8
OUT = 4
SPIKE_PROB = 0.4
SURROGATE = "superspike:k=25"


def _error(stage: str, exc: BaseException) -> dict[str, str]:
    return {
        "stage": stage,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(limit=6),
    }


def case_key(net: str, batch: int, hidden: int) -> str:
    return f"{net}_b{batch}_h{hidden}"


def pin(cpu: int | None) -> list[int]:
    """Restricts this process to one CPU (as ``taskset -c``); returns the affinity mask."""
    if cpu is not None and cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


# --------------------------------------------------------------------------------------------
# JAX worker (runs in the spyx venv: no onnax, no project imports)


def jax_worker(job: Path) -> int:
    """Reads job/config.json; for every case writes job/KEY/step.onnx, data.npz (x_seq, the
    zero states, param/<key>) and grads.npz (jax's float32 gradients and loss), then
    job/result.json; then serves timed repeats: ``grad KEY RUNS`` / ``fwd KEY RUNS`` on stdin
    -> seconds per run on stdout; ``quit`` ends."""
    cfg = json.loads((job / "config.json").read_text())
    result: dict[str, Any] = {"affinity": pin(cfg.get("cpu")), "cases": {}}
    fns: dict[str, dict[str, Any]] = {}
    try:
        from importlib.metadata import version

        import jax
        import jax.numpy as jnp
        import onnx
        from flax import nnx
        from spyx import nn as snn
        from spyx.experimental import onnx as sonnx

        result["versions"] = {
            k: version(k) for k in ("spyx", "jax", "jaxlib", "flax", "jax2onnx", "onnx", "numpy")
        }
        result["versions"]["python"] = sys.version.split()[0]
        result["xla_flags"] = os.environ.get("XLA_FLAGS", "")
        result["devices"] = [str(d) for d in jax.devices()]
        neurons = {"lif": snn.LIF, "alif": snn.ALIF, "rlif": snn.RLIF}

        def key_of(path: tuple[Any, ...]) -> str:
            parts = []
            for p in path:
                if isinstance(p, jax.tree_util.DictKey):
                    parts.append(str(p.key))
                elif isinstance(p, jax.tree_util.SequenceKey):
                    parts.append(str(p.idx))
                elif isinstance(p, jax.tree_util.GetAttrKey):
                    if p.name != "value":
                        parts.append(p.name)
                else:
                    parts.append(str(p))
            return ".".join(parts)

        for case in cfg["cases"]:
            net, batch, hidden, steps = case["net"], case["batch"], case["hidden"], case["steps"]
            key = case_key(net, batch, hidden)
            d = job / key
            d.mkdir(exist_ok=True)
            seed = SEEDS[net]
            # generate_spyx.py's build(), with the hidden width H
            rngs = nnx.Rngs(seed)
            model = snn.Sequential(
                nnx.Linear(IN, hidden, rngs=rngs),
                neurons[net]((hidden,), rngs=rngs),
                nnx.Linear(hidden, OUT, rngs=rngs),
                snn.LI((OUT,), rngs=rngs),
            )
            rs = np.random.RandomState(100 + seed)
            layers = model.layers
            layers[0].bias.value = jnp.asarray(rs.normal(0.0, 0.2, hidden).astype(np.float32))
            layers[2].bias.value = jnp.asarray(rs.normal(0.0, 0.2, OUT).astype(np.float32))
            layers[3].beta.value = jnp.asarray((0.8 + rs.uniform(-0.1, 0.1, OUT)).astype(np.float32))

            t0 = time.perf_counter()
            step = onnx.load_from_string(sonnx.to_onnx(model, (IN,), batch=batch))
            export_s = time.perf_counter() - t0
            onnx.save(step, str(d / "step.onnx"))

            graphdef, pstate = nnx.split(model)
            leaves, _ = jax.tree_util.tree_flatten_with_path(pstate)
            params = {key_of(p): np.asarray(v, dtype=np.float32) for p, v in leaves}
            state0 = model.initial_state(batch)
            flat0, treedef = jax.tree_util.tree_flatten(state0)
            rng = np.random.default_rng(1000 + seed)
            x_seq = (rng.random((steps, batch, IN)) < SPIKE_PROB).astype(np.float32)
            data = {"x_seq": x_seq}
            data |= {f"state_{i}": np.asarray(s, dtype=np.float32) for i, s in enumerate(flat0)}
            data |= {f"param/{k}": v for k, v in params.items()}
            np.savez(d / "data.npz", **data)  # type: ignore[arg-type]

            def loss_fn(p: Any, x: Any, *flat: Any, graphdef: Any = graphdef, treedef: Any = treedef) -> Any:
                m = nnx.merge(graphdef, p)
                out, _ = snn.run(m, x, jax.tree_util.tree_unflatten(treedef, list(flat)))
                return 0.5 * jnp.sum(out**2)

            def hidden_in(
                p: Any, x: Any, *flat: Any, graphdef: Any = graphdef, treedef: Any = treedef
            ) -> Any:
                """The hidden neuron's incoming state at every step (what its spike sees)."""
                m = nnx.merge(graphdef, p)

                def body(state: Any, x_t: Any) -> tuple[Any, Any]:
                    _, new = m(x_t, state)
                    return new, state[1]

                return jax.lax.scan(body, jax.tree_util.tree_unflatten(treedef, list(flat)), x)[1]

            args = (pstate, jnp.asarray(x_seq), *[jnp.asarray(s) for s in flat0])
            grad_fn = jax.jit(jax.grad(loss_fn))
            fwd_fn = jax.jit(loss_fn)
            t0 = time.perf_counter()
            g = jax.block_until_ready(grad_fn(*args))
            grad_first_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            loss = jax.block_until_ready(fwd_fn(*args))
            fwd_first_s = time.perf_counter() - t0
            grads = {
                f"grad/{key_of(p)}": np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(g)[0]
            }
            grads["loss"] = np.asarray(loss)
            np.savez(d / "grads.npz", **grads)  # type: ignore[arg-type]

            v_in = np.asarray(jax.jit(hidden_in)(*args))
            thr = float(model.layers[1].threshold)
            if net == "alif":
                v, adapt = np.split(v_in, 2, axis=-1)
                margin = v - (thr + adapt)
            else:
                margin = v_in - thr
            fns[key] = {"grad": (grad_fn, args), "fwd": (fwd_fn, args)}
            result["cases"][key] = {
                "export_s": export_s,
                "jax_grad_compile_and_first_run_s": grad_first_s,
                "jax_fwd_compile_and_first_run_s": fwd_first_s,
                "loss": float(loss),
                "params": {k: list(v.shape) for k, v in params.items()},
                "param_count": int(sum(v.size for v in params.values())),
                "hidden_spike_rate": float(np.mean(margin > 0)),
                "min_margin": float(np.min(np.abs(margin))),
            }
            for _ in range(cfg["warmup"]):
                for fn, a in fns[key].values():
                    jax.block_until_ready(fn(*a))
    except Exception as exc:
        result["error"] = _error("jax worker", exc)
    (job / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    if "error" in result:
        return 0
    print("ready", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 3 or parts[0] not in ("grad", "fwd"):
            break
        fn, a = fns[parts[1]][parts[0]]
        runs = int(parts[2])
        t0 = time.perf_counter()
        for _ in range(runs):
            jax.block_until_ready(fn(*a))
        print(json.dumps((time.perf_counter() - t0) / runs), flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# The spyx venv


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_NO_INPUT"] = "1"
    return env


PROBE = (
    "import spyx, jax, flax, jax2onnx, onnx; from spyx.experimental import onnx as o; print(jax.__version__)"
)


def ensure_spyx_venv(venv: Path, packages: Sequence[str], python: str) -> dict[str, Any]:
    """Creates ``venv`` with ``packages`` unless it imports them already; says why not."""
    py = venv / "bin" / "python"
    env = _clean_env()
    if py.exists():
        r = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, env=env)
        if r.returncode == 0:
            return {"ok": True, "python": str(py), "created": False}
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
            return {"ok": False, "python": str(py), "error": f"{' '.join(cmd)} failed: {r.stderr[-2000:]}"}
    r = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"ok": False, "python": str(py), "error": f"import failed: {r.stderr[-2000:]}"}
    return {"ok": True, "python": str(py), "created": True, "install_s": time.perf_counter() - t0}


class Worker:
    """The JAX worker process: prepares every case, then times repeats on request."""

    def __init__(self, python: str, job: Path, cfg: dict[str, Any]) -> None:
        (job / "config.json").write_text(json.dumps(cfg))
        env = _clean_env()
        env["XLA_FLAGS"] = XLA_FLAGS
        self.stderr = (job / "worker.stderr").open("w")
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--jax-worker", str(job)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        t0 = time.perf_counter()
        line = self.proc.stdout.readline()
        self.ready = line.strip() == "ready"
        self.prepare_s = time.perf_counter() - t0
        res = job / "result.json"
        self.result: dict[str, Any] = json.loads(res.read_text()) if res.exists() else {}
        if not self.ready and "error" not in self.result:
            self.stderr.flush()
            tail = (job / "worker.stderr").read_text()[-2000:]
            self.result["error"] = {"stage": "worker", "message": f"exited without a result: {tail}"}

    def time(self, what: str, key: str, runs: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{what} {key} {runs}\n")
        self.proc.stdin.flush()
        return float(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.stderr.close()


# --------------------------------------------------------------------------------------------
# onnax side


def append_half_sum_of_squares(model: Any, output: str) -> Any:
    """loss = 0.5 * sum(output ** 2) as the model's only output
    (tests/python/control_flow/test_sequences.py)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    g.node.extend(
        [
            helper.make_node("Mul", [output, output], ["sq"]),
            helper.make_node("ReduceSum", ["sq"], ["sq_sum"], keepdims=0),
            helper.make_node("Mul", ["sq_sum", "half"], ["loss"]),
        ]
    )
    g.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    return m


def param_initializers(step: Any, params: dict[str, np.ndarray]) -> dict[str, str]:
    """parameter key -> the step graph's initializer holding exactly that value."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in step.graph.initializer}
    out = {}
    for k, v in params.items():
        hits = [
            n for n, a in values.items() if a.shape == v.shape and a.dtype == v.dtype and np.array_equal(a, v)
        ]
        if len(hits) != 1:
            raise ValueError(f"parameter {k}: {len(hits)} initializers hold its value ({hits})")
        out[k] = hits[0]
    return out


def count_nodes(graph: Any) -> int:
    n = 0
    for node in graph.node:
        n += 1
        for a in node.attribute:
            if a.g is not None and a.type == a.GRAPH:
                n += count_nodes(a.g)
            for sub in a.graphs:
                n += count_nodes(sub)
    return n


def scan_step(step: Any, d: Path) -> tuple[Any, float, str]:
    """``onnax.scan(step)`` and its time."""
    import onnax

    t0 = time.perf_counter()
    return onnax.scan(step), time.perf_counter() - t0, "python"


def prepare_onnax(key: str, job: Path) -> dict[str, Any]:
    """scan + loss + grad of the worker's step export; the check against jax's gradients; ORT
    sessions. Returns the record and, under "_run", the grad / fwd run functions."""
    import onnax
    import onnx

    sys.path.insert(0, str(HERE))
    from grad_bench import ort_session

    d = job / key
    step = onnx.load(str(d / "step.onnx"))
    data = dict(np.load(d / "data.npz"))
    want = dict(np.load(d / "grads.npz"))
    params = {k.removeprefix("param/"): v for k, v in data.items() if k.startswith("param/")}
    inits = param_initializers(step, params)
    seq, scan_s, scan_via = scan_step(step, d)
    loss_model = append_half_sum_of_squares(seq, seq.graph.output[0].name)
    t0 = time.perf_counter()
    gm = onnax.grad(loss_model, inputs=list(inits.values()), output="loss", surrogate=SURROGATE)
    grad_s = time.perf_counter() - t0
    rec: dict[str, Any] = {
        "transform_s": {"scan": scan_s, "grad": grad_s, "total": scan_s + grad_s},
        "scan_via": scan_via,
        "initializers": inits,
        "nodes": {
            "step": count_nodes(step.graph),
            "loss_model": count_nodes(loss_model.graph),
            "grad_model": count_nodes(gm.graph),
        },
    }
    feeds = {i.name: data["x_seq"] if i.name == "x" else data[i.name] for i in gm.graph.input}
    g_names = [f"{inits[k]}_grad" for k in params]
    t0 = time.perf_counter()
    gsess = ort_session(gm)
    fsess = ort_session(loss_model)
    rec["session_init_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = dict(zip(g_names, gsess.run(g_names, feeds), strict=True))
    rec["grad_first_run_s"] = time.perf_counter() - t0
    (loss,) = fsess.run(["loss"], feeds)
    # agreement: per parameter max|ours - jax| / max|jax|
    rel = {}
    for k in params:
        a, b = got[f"{inits[k]}_grad"].astype(np.float64), want[f"grad/{k}"].astype(np.float64)
        rel[k] = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))
    rec["grad_rel_diff"] = rel
    rec["grad_max_rel_diff"] = max(rel.values())
    rec["loss_rel_diff"] = float(abs(float(loss) - float(want["loss"])) / abs(float(want["loss"])))
    rec["_run"] = {
        "grad": lambda: gsess.run(g_names, feeds),
        "fwd": lambda: fsess.run(["loss"], feeds),
        "grad_model": gm,
        "loss_model": loss_model,
        "feeds": feeds,
        "g_names": g_names,
    }
    return rec


def profile_ort(model: Any, outputs: list[str], feeds: dict[str, np.ndarray], runs: int) -> dict[str, Any]:
    """ONNX Runtime's profiler over ``runs`` runs: time per run by op type (top-level nodes
    and, separately, the nodes run inside Loop bodies) and the share of the wall time."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="onnax-spyx-prof-") as tmp:
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "p")
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for _ in range(3):
            sess.run(outputs, feeds)
        t0 = time.perf_counter()
        for _ in range(runs):
            sess.run(outputs, feeds)
        wall = (time.perf_counter() - t0) / runs
        events = json.loads(Path(sess.end_profiling()).read_text())
    top = {n.name for n in model.graph.node}
    model_runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    # only the timed runs: the last `runs` model_run events and the node events inside them
    model_runs = sorted(model_runs, key=lambda e: e["ts"])[-runs:]
    t_from = model_runs[0]["ts"] if model_runs else 0
    by_op: dict[str, float] = {}
    inner: dict[str, float] = {}
    inner_count = 0
    for e in events:
        if e.get("cat") != "Node" or e["ts"] < t_from or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"].removesuffix("_kernel_time")
        op = e.get("args", {}).get("op_name", "?")
        if name in top:
            by_op[op] = by_op.get(op, 0.0) + e["dur"] * 1e-6 / runs
        else:
            inner[op] = inner.get(op, 0.0) + e["dur"] * 1e-6 / runs
            inner_count += 1
    run_s = statistics.median([e["dur"] * 1e-6 for e in model_runs]) if model_runs else float("nan")
    return {
        "wall_s_per_run": wall,
        "model_run_s": run_s,
        "top_level_s": dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
        "loop_body_s": dict(sorted(inner.items(), key=lambda kv: -kv[1])),
        "loop_body_kernels_per_run": inner_count / runs,
    }


# --------------------------------------------------------------------------------------------
# Timing


def calibrate(fn: Callable[[int], float], target_s: float) -> int:
    """Runs per repeat so that a repeat lasts about target_s."""
    t = fn(1)
    return max(1, min(2000, math.ceil(target_s / max(t, 1e-6))))


def time_cases(
    keys: list[str], onnax_runs: dict[str, dict[str, Any]], worker: Worker, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    variants: list[tuple[str, str, str, Callable[[int], float]]] = []  # (key, what, side, fn(runs))
    for key in keys:
        for what in ("grad", "fwd"):
            run = onnax_runs[key][what]

            def ours(runs: int, run: Callable[[], object] = run) -> float:
                t0 = time.perf_counter()
                for _ in range(runs):
                    run()
                return (time.perf_counter() - t0) / runs

            def theirs(runs: int, key: str = key, what: str = what) -> float:
                return worker.time(what, key, runs)

            for _ in range(args.warmup):
                ours(1)
            variants.append((key, what, "jax", theirs))
            variants.append((key, what, "onnax", ours))
    counts = {(k, w, s): calibrate(fn, args.repeat_seconds) for k, w, s, fn in variants}
    samples: dict[tuple[str, str, str], list[float]] = {v: [] for v in counts}
    for r in range(args.repeats):
        order = (
            variants
            if r % 2 == 0
            else [v for pair in zip(variants[1::2], variants[::2], strict=True) for v in pair]
        )
        for k, w, s, fn in order:
            samples[(k, w, s)].append(fn(counts[(k, w, s)]))
        print(f"  round {r + 1}/{args.repeats} done (load {os.getloadavg()[0]:.2f})", flush=True)
    out: dict[str, dict[str, Any]] = {k: {} for k in keys}
    for (k, w, s), xs in samples.items():
        out[k][f"{s}_{w}"] = {
            "median_s": statistics.median(xs),
            "best_s": min(xs),
            "runs_per_repeat": counts[(k, w, s)],
            "repeat_means_s": xs,
        }
    return out


# --------------------------------------------------------------------------------------------
# Main


def report(result: dict[str, Any]) -> list[str]:
    problems = []
    print(
        f"\nBPTT over T = {result['steps']}, loss 0.5*sum(out_seq^2), float32, one thread "
        "(ms per call: median of per-repeat means, best in parentheses; onnax/JAX: median of the "
        "per-round ratios, their range in parentheses)"
    )
    head = (
        "| net | B | H | params | JAX grad ms | onnax grad ms | onnax/JAX grad | JAX fwd ms "
        "| onnax fwd ms | onnax/JAX fwd | grad/fwd JAX | grad/fwd onnax | grad rel. diff |"
    )
    print(head)
    print("|" + "---|" * 3 + "---:|" * 10)
    for c in result["cases"]:
        if "error" in c:
            print(f"| {c['net']} | {c['batch']} | {c['hidden']} | FAILED: {c['error']['message'][:200]} |")
            problems.append(f"{c['key']}: {c['error']['message'][:200]}")
            continue
        t = c["timing"]

        def ms(v: dict[str, Any]) -> str:
            return f"{v['median_s'] * 1e3:.3f} ({v['best_s'] * 1e3:.3f})"

        def ratio(c: dict[str, Any], what: str) -> str:
            xs = c[f"ratio_{what}_per_round"]
            return f"{c[f'ratio_{what}']:.2f}x ({min(xs):.2f}-{max(xs):.2f})"

        print(
            f"| {c['net']} | {c['batch']} | {c['hidden']} | {c['param_count']} | {ms(t['jax_grad'])} | "
            f"{ms(t['onnax_grad'])} | {ratio(c, 'grad')} | {ms(t['jax_fwd'])} | {ms(t['onnax_fwd'])} | "
            f"{ratio(c, 'fwd')} | {c['jax_grad_over_fwd']:.2f}x | {c['onnax_grad_over_fwd']:.2f}x | "
            f"{c['grad_max_rel_diff']:.1e} |"
        )
        if c["grad_max_rel_diff"] > 1e-4:
            problems.append(f"{c['key']}: gradients differ by {c['grad_max_rel_diff']:.2e} (relative)")
    print("\nper configuration:")
    for c in result["cases"]:
        if "error" in c:
            continue
        tr = c["onnax"]["transform_s"]
        via = " (the CLI's)" if c["onnax"]["scan_via"] == "cli" else ""
        print(
            f"  {c['key']}: onnax transform {tr['total']:.3f} s (scan{via} {tr['scan']:.3f} s, grad "
            f"{tr['grad']:.3f} s), nodes step/loss/grad (incl. Loop bodies) "
            f"{c['onnax']['nodes']['step']}/{c['onnax']['nodes']['loss_model']}/"
            f"{c['onnax']['nodes']['grad_model']}, ORT sessions {c['onnax']['session_init_s']:.2f} s; "
            f"JAX jit+first grad {c['jax']['jax_grad_compile_and_first_run_s']:.2f} s; hidden spike rate "
            f"{c['jax']['hidden_spike_rate']:.3f}, min |margin| {c['jax']['min_margin']:.1e}; loss rel. diff "
            f"{c['onnax']['loss_rel_diff']:.1e}"
        )
        for what, prof in c.get("profile", {}).items():
            calls = prof["loop_body_kernels_per_run"]
            per_call = c["timing"][f"onnax_{what}"]["median_s"] / max(calls, 1)
            kernel_s = (
                sum(prof["loop_body_s"].values())
                + sum(prof["top_level_s"].values())
                - prof["top_level_s"].get("Loop", 0.0)
            )
            total = max(sum(prof["loop_body_s"].values()), 1e-12)
            body = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in list(prof["loop_body_s"].items())[:8])
            c.setdefault("profile_summary", {})[what] = {
                "loop_body_kernel_calls_per_step": calls / c["steps"],
                "unprofiled_s_per_kernel_call": per_call,
                "profiled_kernel_share_of_run": kernel_s / prof["model_run_s"],
            }
            print(
                f"    ORT {what}: {calls / c['steps']:.0f} kernel calls per time step in Loop bodies, "
                f"{per_call * 1e6:.2f} us per call unprofiled; profiled: kernels "
                f"{100 * kernel_s / prof['model_run_s']:.0f}% of model_run; Loop-body kernel time: {body}"
            )
    return problems


def git_head() -> str:
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jax-worker", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="fewer and shorter repeats")
    p.add_argument("--nets", default="lif,alif", help="comma-separated subset of lif, alif, rlif")
    p.add_argument("--batch", default="32", help="batch size(s), comma-separated (default 32)")
    p.add_argument("--hidden", default="16", help="hidden width(s), comma-separated (default 16)")
    p.add_argument("--steps", type=int, default=100, help="T (default 100)")
    p.add_argument("--cpu", type=int, default=0, help="CPU both sides are pinned to (-1: no pinning)")
    p.add_argument("--spyx-venv", type=Path, default=DEFAULT_VENV, help=f"default {DEFAULT_VENV}")
    p.add_argument("--spyx-python", default=None, help="a Python with spyx 1.0.0 (skips the venv)")
    p.add_argument(
        "--spyx-package",
        action="append",
        default=None,
        help=f"pip requirement(s) for the venv (repeatable; default {' '.join(DEFAULT_PACKAGES)})",
    )
    p.add_argument("--venv-python", default=sys.executable, help="Python that creates the venv")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 11; quick 5)")
    p.add_argument("--repeat-seconds", type=float, default=None, help="per repeat (default 0.4; quick 0.2)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up runs (default 5; quick 2)")
    p.add_argument("--profile", action="store_true", help="ONNX Runtime profile of both onnax models")
    p.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.jax_worker is not None:
        return jax_worker(args.jax_worker)

    q = args.quick
    args.repeats = args.repeats or (5 if q else 11)
    args.repeat_seconds = args.repeat_seconds or (0.2 if q else 0.4)
    args.warmup = args.warmup if args.warmup is not None else (2 if q else 5)
    nets = [s.strip() for s in args.nets.split(",") if s.strip()]
    unknown = [n for n in nets if n not in SEEDS]
    if unknown:
        p.error(f"unknown nets {unknown} (choose from {', '.join(SEEDS)})")
    cases = [
        {"net": n, "batch": int(b), "hidden": int(h), "steps": args.steps}
        for n in nets
        for b in args.batch.split(",")
        for h in args.hidden.split(",")
    ]

    sys.path.insert(0, str(HERE))
    from grad_bench import machine_info, versions

    cpu = args.cpu if args.cpu >= 0 else None
    machine = machine_info()
    affinity = pin(cpu)
    result: dict[str, Any] = {
        "quick": q,
        "steps": args.steps,
        "machine": machine,
        "loadavg_start": list(os.getloadavg()),
        "versions": versions(),
        "onnax_commit": git_head(),
        "affinity": affinity,
        "xla_flags": XLA_FLAGS,
        "surrogate": SURROGATE,
        "timing": {"repeats": args.repeats, "repeat_seconds": args.repeat_seconds, "warmup": args.warmup},
        "cases": [],
    }
    print(f"machine: {result['machine']['cpu']}, nproc {result['machine']['nproc']}, pinned to {affinity}")
    print(
        "versions: "
        + ", ".join(f"{k} {v}" for k, v in result["versions"].items())
        + f" ({result['onnax_commit'][:7]})"
    )
    t_start = time.perf_counter()

    if args.spyx_python:
        python = args.spyx_python
        result["spyx_env"] = {"ok": True, "python": python, "given": True}
    else:
        print(f"spyx venv: {args.spyx_venv}", flush=True)
        info = ensure_spyx_venv(args.spyx_venv, args.spyx_package or list(DEFAULT_PACKAGES), args.venv_python)
        result["spyx_env"] = info
        if not info["ok"]:
            print(f"  UNAVAILABLE: {info['error'][:1000]}")
            return 1
        python = info["python"]

    with tempfile.TemporaryDirectory(prefix="onnax-spyx-bptt-") as tmp:
        job = Path(tmp)
        print(f"JAX worker: export, jit, reference gradients of {len(cases)} configuration(s)", flush=True)
        cfg = {"cases": cases, "cpu": cpu, "warmup": args.warmup}
        worker = Worker(python, job, cfg)
        try:
            wres = worker.result
            if "error" in wres:
                print(f"  JAX worker FAILED: {wres['error']['message'][:2000]}")
                print(wres["error"].get("traceback", ""))
                return 1
            result["jax_versions"] = wres["versions"]
            result["jax_worker"] = {
                "affinity": wres["affinity"],
                "xla_flags": wres["xla_flags"],
                "devices": wres["devices"],
                "prepare_s": worker.prepare_s,
            }
            print("spyx side: " + ", ".join(f"{k} {v}" for k, v in wres["versions"].items()))
            print(f"  worker pinned to {wres['affinity']}, XLA_FLAGS={wres['xla_flags']!r}", flush=True)
            runs: dict[str, dict[str, Any]] = {}
            for c in cases:
                key = case_key(c["net"], c["batch"], c["hidden"])
                rec: dict[str, Any] = {"key": key, **c, "jax": wres["cases"][key]}
                rec["param_count"] = rec["jax"]["param_count"]
                try:
                    o = prepare_onnax(key, job)
                    runs[key] = o.pop("_run")
                    rec["onnax"] = o
                    rec["grad_max_rel_diff"] = o["grad_max_rel_diff"]
                    worst = max(o["grad_rel_diff"].items(), key=lambda kv: kv[1])
                    print(
                        f"  {key}: gradients agree to {o['grad_max_rel_diff']:.1e} (max over parameters of "
                        f"max|onnax - jax| / max|jax|; worst {worst[0]}), loss to {o['loss_rel_diff']:.1e}; "
                        f"onnax scan+grad {o['transform_s']['total']:.3f} s",
                        flush=True,
                    )
                    if args.profile:
                        r = runs[key]
                        rec["profile"] = {
                            "grad": profile_ort(r["grad_model"], r["g_names"], r["feeds"], runs=10),
                            "fwd": profile_ort(r["loss_model"], ["loss"], r["feeds"], runs=10),
                        }
                except Exception as exc:
                    rec["error"] = _error("onnax", exc)
                    print(f"  {key}: onnax FAILED: {type(exc).__name__}: {exc}", flush=True)
                result["cases"].append(rec)
            keys = [c["key"] for c in result["cases"] if "error" not in c]
            print(f"timing {len(keys)} configuration(s) x 4 variants, {args.repeats} rounds", flush=True)
            timing = time_cases(keys, runs, worker, args)
        finally:
            worker.close()
    for c in result["cases"]:
        if c["key"] not in timing:
            continue
        t = c["timing"] = timing[c["key"]]
        for what in ("grad", "fwd"):
            c[f"ratio_{what}_of_medians"] = t[f"onnax_{what}"]["median_s"] / t[f"jax_{what}"]["median_s"]
            # paired: the two sides' means of the same round (the machine's speed drifts between rounds)
            per_round = [
                o / j
                for o, j in zip(
                    t[f"onnax_{what}"]["repeat_means_s"], t[f"jax_{what}"]["repeat_means_s"], strict=True
                )
            ]
            c[f"ratio_{what}_per_round"] = per_round
            c[f"ratio_{what}"] = statistics.median(per_round)
        c["jax_grad_over_fwd"] = t["jax_grad"]["median_s"] / t["jax_fwd"]["median_s"]
        c["onnax_grad_over_fwd"] = t["onnax_grad"]["median_s"] / t["onnax_fwd"]["median_s"]
    result["loadavg_end"] = list(os.getloadavg())
    problems = report(result)
    result["total_s"] = time.perf_counter() - t_start
    result["problems"] = problems
    print(
        f"\nload average {result['loadavg_start'][0]:.2f} at start, {result['loadavg_end'][0]:.2f} at end; "
        f"total {result['total_s']:.0f} s"
    )
    for s in problems:
        print(f"  PROBLEM: {s}")
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.output}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
