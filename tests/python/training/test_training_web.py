"""Training in the browser runtime: a training step onnax writes, looped 100 times by
onnxruntime-web (WASM, Node.js) the way a web page would loop it (web/train_loop.mjs), against
plain SGD on the same MLP in JAX float64."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import numpy as np
import onnx
import pytest
from oracles.training_oracle import as64, jax_loss, mlp_jax, mlp_model, mlp_values

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

onnax = pytest.importorskip("onnax")
from onnax.testing._web import _decode, _encode, unavailable, web_dir  # noqa: E402

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "web runtime available")


def test_sgd_in_onnxruntime_web_follows_jax(tmp_path: Any) -> None:
    rng = np.random.default_rng(11)
    values = mlp_values(rng)
    loss_model = onnax.add_loss(mlp_model(values), "softmax_cross_entropy")
    lr = 0.5
    step = onnax.train_step(loss_model, optimizer="sgd", learning_rate=lr)
    init = onnx.load_from_string(_initial_state_model(loss_model, step))
    onnx.save(step, tmp_path / "step.onnx")
    onnx.save(init, tmp_path / "init.onnx")

    # Two fixed batches of a separable 3-class problem.
    centers = rng.standard_normal((3, 4)) * 2
    batches: list[dict[str, np.ndarray]] = []
    for _ in range(2):
        t = rng.integers(0, 3, size=16)
        x = (centers[t] + rng.standard_normal((16, 4)) * 0.5).astype(np.float32)
        batches.append({"x": x, "label": t.astype(np.int64)})
    request = {
        "step": str(tmp_path / "step.onnx"),
        "init": str(tmp_path / "init.onnx"),
        "feedback": onnax.feedback(step),
        "batches": [{k: _encode(v) for k, v in b.items()} for b in batches],
        "steps": 100,
        "loss": "loss",
    }
    proc = subprocess.run(
        ["node", str(web_dir() / "train_loop.mjs")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=web_dir(),
    )
    reply = json.loads(proc.stdout)
    assert "error" not in reply, reply.get("error")
    web_losses = reply["losses"]

    element = jax_loss("softmax_cross_entropy")

    def loss(params: dict[str, Any], x: Any, t: Any) -> Any:
        return jnp.mean(element(mlp_jax(params, x), t))

    params = as64(values)
    jax_losses = []
    grad = jax.jit(jax.value_and_grad(loss))
    for i in range(100):
        b = batches[i % 2]
        value, g = grad(params, b["x"].astype(np.float64), b["label"])
        jax_losses.append(float(value))
        params = {k: params[k] - lr * g[k] for k in params}
    np.testing.assert_allclose(web_losses, jax_losses, rtol=2e-3, atol=1e-4)
    assert web_losses[-1] < 0.2 * web_losses[0]
    final = {k: _decode(v) for k, v in reply["state"].items()}
    assert int(final["step"]) == 100
    for k in params:
        np.testing.assert_allclose(final[k], params[k], rtol=2e-3, atol=2e-3, err_msg=k)


def _initial_state_model(loss_model: onnx.ModelProto, step: onnx.ModelProto) -> bytes:
    """The command line's --init model (onnax train-step --init), written through the CLI."""
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        onnx.save(loss_model, Path(d) / "loss.onnx")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "onnax",
                "train-step",
                str(Path(d) / "loss.onnx"),
                "-o",
                str(Path(d) / "step.onnx"),
                "--optimizer",
                "sgd",
                "--lr",
                "0.5",
                "--init",
                str(Path(d) / "init.onnx"),
            ],
            check=True,
            capture_output=True,
        )
        assert onnx.load(Path(d) / "step.onnx").SerializeToString() == step.SerializeToString()
        return (Path(d) / "init.onnx").read_bytes()
