"""``onnax validate --web`` / ``allclose_web``: the README's graphs run on onnxruntime-web's
WASM backend in Node.js and match the float64 reference. Skips (with the reason) when Node.js
or the npm install from ./setup.sh is absent."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from oracles.validate_models import flip_sign, linear_loss, readme_transforms, save

testing = pytest.importorskip("onnax.testing")
pytest.importorskip("onnxruntime")
from onnax.testing._web import unavailable  # noqa: E402

REASON = unavailable()
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "available")

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "python")}


@pytest.fixture(scope="module")
def models():
    source = linear_loss()
    return source, readme_transforms(source)


@pytest.mark.parametrize("name", ["grad", "vmap_grad", "hvp", "vjp"])
def test_readme_transforms_on_wasm(models, name: str) -> None:
    source, gen = models
    report = testing.validate(source, gen[name], web=True)
    assert report.ok, report.format()
    assert [s.name for s in report.steps][-1] == "onnxruntime-web (wasm)"
    assert {c.name for c in report.web_outputs} == {o.name for o in gen[name].graph.output}
    assert report.versions["onnxruntime-web"] == "1.30.0"


def test_allclose_web(models) -> None:
    source, gen = models
    x, w = np.array([1.0, 2.0], np.float32), np.array([3.0, -1.0], np.float32)
    ok, msg = testing.allclose_web(source, gen["grad"], {"x": x, "weight": w})
    assert ok, msg
    ok, msg = testing.allclose_web(source, flip_sign(gen["grad"], "weight_grad"), {"x": x, "weight": w})
    assert not ok and "'weight_grad'" in msg


def test_cli_web(models, tmp_path: Path) -> None:
    source, gen = models
    cli = ROOT / ".venv" / "bin" / "onnax"
    if not cli.exists():
        pytest.skip(f"{cli} is missing (run ./setup.sh)")
    src = save(source, tmp_path / "src.onnx")
    hvp = save(gen["hvp"], tmp_path / "hvp.onnx")
    r = subprocess.run(
        [str(cli), "validate", str(src), str(hvp), "--web"],
        capture_output=True, text=True, timeout=120, check=False, env=ENV,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[pass] 5. onnxruntime-web (wasm)" in r.stdout
    assert "outputs on onnxruntime-web (wasm)" in r.stdout
