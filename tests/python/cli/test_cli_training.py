"""The training commands (``onnax loss``, ``onnax train-step``) and the parameter options of
``grad``: results checked numerically against the Python API's graphs in ONNX Runtime and
against JAX, and clear errors (exit 2 for usage, 1 for model/selection problems, a message
naming the problem, never a traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from oracles.training_oracle import PARAMS, as64, mlp_jax, mlp_model, mlp_values, run

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

onnax = pytest.importorskip("onnax")
ONNAX = [sys.executable, "-m", "onnax"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ONNAX, *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("cli_training")
    values = mlp_values(np.random.default_rng(20))
    onnx.save(mlp_model(values), d / "mlp.onnx")
    assert cli("loss", str(d / "mlp.onnx"), "-o", str(d / "loss.onnx"), "--kind", "mse").returncode == 0
    return {"dir": d, "values": values}


def test_grad_with_params_patterns_and_a_params_file(files: dict[str, Any]) -> None:
    d: Path = files["dir"]
    (d / "params.txt").write_text("# the weight matrices\nW1\n\n  W2  \n")
    for spec in ("W*", "@" + str(d / "params.txt"), "re:W[0-9]"):
        r = cli("grad", str(d / "loss.onnx"), "-o", str(d / "g.onnx"), "--params", spec)
        assert r.returncode == 0, r.stderr
        g = onnx.load(d / "g.onnx")
        assert [o.name for o in g.graph.output] == ["loss", "y", "W1_grad", "W2_grad"]
    rng = np.random.default_rng(21)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    t = rng.standard_normal((5, 3)).astype(np.float32)
    got = run(g, {"x": x, "label": t})
    want = jax.grad(lambda p: jnp.mean((mlp_jax(p, x.astype(np.float64)) - t) ** 2))(as64(files["values"]))
    for p in ("W1", "W2"):
        np.testing.assert_allclose(got[f"{p}_grad"], want[p], rtol=1e-5, atol=1e-7)


def test_stop_gradient_option(files: dict[str, Any]) -> None:
    d: Path = files["dir"]
    r = cli("grad", str(d / "loss.onnx"), "-o", str(d / "sg.onnx"), "--params", "all", "--stop-gradient", "h")
    assert r.returncode == 0, r.stderr
    rng = np.random.default_rng(22)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    t = rng.standard_normal((5, 3)).astype(np.float32)
    got = run(onnx.load(d / "sg.onnx"), {"x": x, "label": t})
    assert not np.any(got["W1_grad"]) and not np.any(got["b1_grad"])
    h = np.tanh(x.astype(np.float64) @ files["values"]["W1"] + files["values"]["b1"])
    residual = h @ files["values"]["W2"] + files["values"]["b2"] - t
    np.testing.assert_allclose(got["W2_grad"], 2 * h.T @ residual / residual.size, rtol=1e-5, atol=1e-7)


def test_train_step_command_runs_dp_sgd(files: dict[str, Any]) -> None:
    d: Path = files["dir"]
    r = cli(
        "train-step", str(d / "loss.onnx"), "-o", str(d / "dp.onnx"), "--optimizer", "sgd", "--lr", "0.1",
        "--dp-clip", "0.5", "--noise-multiplier", "0", "--init", str(d / "dp_init.onnx"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "trains 4 parameter(s): W1 b1 W2 b2" in r.stderr
    step = onnx.load(d / "dp.onnx")
    state = run(onnx.load(d / "dp_init.onnx"), {})
    rng = np.random.default_rng(23)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    t = rng.standard_normal((3, 3)).astype(np.float32)
    noise = {f"{p}_noise": np.zeros_like(files["values"][p]) for p in PARAMS}
    out = run(step, {**state, **noise, "x": x, "label": t})
    # Without noise: the mean of per-example gradients, each clipped to norm 0.5.
    params = as64(files["values"])
    per_example = [
        jax.grad(lambda p, i=i: jnp.mean((mlp_jax(p, x[i : i + 1].astype(np.float64)) - t[i : i + 1]) ** 2))(
            params
        )
        for i in range(3)
    ]
    for p in PARAMS:
        clipped = [
            g[p] * min(1.0, 0.5 / np.sqrt(sum(np.sum(np.asarray(g[q]) ** 2) for q in PARAMS)))
            for g in per_example
        ]
        np.testing.assert_allclose(
            out[f"{p}_new"], params[p] - 0.1 * np.mean(clipped, axis=0), rtol=1e-5, atol=1e-7
        )


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["loss", "{mlp}", "-o", "{out}"], 2, "loss needs --kind"),
        (["loss", "{mlp}", "-o", "{out}", "--kind", "hinge"], 2, "unknown loss 'hinge'; choose one of mse"),
        (
            ["loss", "{mlp}", "-o", "{out}", "--kind", "mse", "--output", "nope"],
            1,
            "'nope' is not a graph output",
        ),
        (["loss", "{mlp}", "-o", "{mlp}", "--kind", "mse"], 2, "never overwrites its input"),
        (["train-step", "{loss}", "-o", "{out}", "--optimizer", "rmsprop"], 2, "choose sgd, adam or adamw"),
        (
            ["train-step", "{loss}", "-o", "{out}", "--dp-clip", "1"],
            2,
            "needs both --dp-clip C and --noise-multiplier",
        ),
        (["train-step", "{loss}", "-o", "{out}", "--params", "conv*"], 1, "'conv*' matches none of"),
        (["train-step", "{loss}", "-o", "{out}", "--lr", "fast"], 2, "'fast' is not a number"),
        (
            ["train-step", "{loss}", "-o", "{out}", "--beta1", "1"],
            1,
            "beta1 is 1.000000; expected a value in [0, 1)",
        ),
        (["train-step", "{loss}", "-o", "{out}", "--nesterov"], 1, "Nesterov's variant needs momentum > 0"),
        (["grad", "{loss}", "-o", "{out}", "--params", "@/nonexistent"], 2, "cannot read the file"),
    ],
)
def test_training_command_errors(files: dict[str, Any], args: list[str], code: int, message: str) -> None:
    d: Path = files["dir"]
    subst = {"{mlp}": str(d / "mlp.onnx"), "{loss}": str(d / "loss.onnx"), "{out}": str(d / "out.onnx")}
    r = cli(*[subst.get(a, a) for a in args])
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_init_state_and_apply_params_commands(files: dict[str, Any]) -> None:
    d: Path = files["dir"]
    assert (
        cli("train-step", str(d / "loss.onnx"), "-o", str(d / "adam.onnx"), "--optimizer", "adam").returncode
        == 0
    )
    r = cli("init-state", str(d / "loss.onnx"), str(d / "adam.onnx"), "-o", str(d / "state.npz"))
    assert r.returncode == 0, r.stderr
    with np.load(d / "state.npz") as data:
        state = {k: data[k] for k in data.files}
    for p in PARAMS:
        np.testing.assert_array_equal(state[p], files["values"][p])
        np.testing.assert_array_equal(state[f"{p}_m"], 0)
    assert state["step"].dtype == np.int64 and state["step"].shape == ()
    trained = {k: v + 1 if k in PARAMS else v for k, v in state.items()}
    np.savez(d / "trained.npz", **trained)
    r = cli("apply-params", str(d / "mlp.onnx"), str(d / "trained.npz"), "-o", str(d / "trained.onnx"))
    assert r.returncode == 1 and "'W1_m'" in r.stderr and "Traceback" not in r.stderr
    r = cli(
        "apply-params",
        str(d / "mlp.onnx"),
        str(d / "trained.npz"),
        "-o",
        str(d / "trained.onnx"),
        "--ignore-unknown",
    )
    assert r.returncode == 0, r.stderr
    x = np.random.default_rng(24).standard_normal((2, 4)).astype(np.float32)
    moved = {p: files["values"][p] + 1 for p in PARAMS}
    np.testing.assert_allclose(
        run(onnx.load(d / "trained.onnx"), {"x": x})["y"],
        np.asarray(mlp_jax(as64(moved), x.astype(np.float64))),
        rtol=1e-5,
    )
