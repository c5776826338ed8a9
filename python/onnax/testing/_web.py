"""Running a model on onnxruntime-web's WASM backend in Node.js (``onnax validate --web``).

``./setup.sh`` installs the pinned ``onnxruntime-web`` into ``web/node_modules`` (npm ci);
``web/run_model.mjs`` runs one model and returns its outputs. Arrays cross as base64 bytes.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from onnax.testing._models import ValidationInputError


def web_dir() -> Path:
    """``$ONNAX_WEB_DIR``, else the repository's ``web/`` next to ``python/``."""
    env = os.environ.get("ONNAX_WEB_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "web"


def unavailable() -> str:
    """Why the WASM backend cannot run here ("" when it can)."""
    if shutil.which("node") is None:
        return "Node.js ('node') is not on PATH. Fix: install Node.js 18 or newer, then run ./setup.sh"
    d = web_dir()
    if not (d / "run_model.mjs").exists():
        return (
            f"{d / 'run_model.mjs'} is missing. Fix: set ONNAX_WEB_DIR to the onnax repository's web/ "
            "directory"
        )
    if not (d / "node_modules" / "onnxruntime-web").exists():
        return f"onnxruntime-web is not installed in {d}. Fix: run ./setup.sh (or `npm ci` in {d})"
    return ""


def _encode(a: np.ndarray) -> dict[str, object]:
    a = np.array(a, order="C")  # (not ascontiguousarray: it turns a scalar into shape [1])
    dtype = "bool" if a.dtype == np.bool_ else a.dtype.name
    data = a.astype(np.uint8) if a.dtype == np.bool_ else a
    return {
        "dtype": dtype,
        "shape": list(a.shape),
        "data": base64.b64encode(data.astype(data.dtype.newbyteorder("<")).tobytes()).decode(),
    }


def _decode(spec: Mapping[str, object]) -> np.ndarray:
    dtype = str(spec["dtype"])
    raw = base64.b64decode(str(spec["data"]))
    shape = [int(d) for d in spec["shape"]]  # type: ignore[attr-defined]
    arr = np.frombuffer(
        raw, dtype=np.dtype(np.uint8 if dtype == "bool" else dtype).newbyteorder("<")
    ).reshape(shape)
    return arr.astype(np.bool_) if dtype == "bool" else arr.astype(arr.dtype.newbyteorder("="))


def run_web(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], timeout: float = 300
) -> dict[str, np.ndarray]:
    """Outputs of ``model`` on onnxruntime-web (WASM, one thread); raises RuntimeError with
    onnxruntime-web's message when it cannot load or run the model."""
    reason = unavailable()
    if reason:
        raise ValidationInputError(f"--web: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save_model(model, path)
        request = {"model": path, "inputs": {k: _encode(np.asarray(v)) for k, v in feeds.items()}}
        proc = subprocess.run(
            ["node", str(web_dir() / "run_model.mjs")],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=web_dir(),
        )
    try:
        reply = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(
            f"node exited with {proc.returncode}: {' '.join(proc.stderr.split())[:400]}"
        ) from None
    if "error" in reply:
        raise RuntimeError(" ".join(str(reply["error"]).split())[:400])
    return {k: _decode(v) for k, v in reply["outputs"].items()}


def web_version() -> str:
    try:
        with open(web_dir() / "node_modules" / "onnxruntime-web" / "package.json") as f:
            return str(json.load(f)["version"])
    except (OSError, KeyError, ValueError):
        return "not installed"
