"""``onnax check`` / ``onnax validate`` / ``onnax bench`` as subprocesses: ``.venv/bin/onnax``
(the Python command, this worktree's package via PYTHONPATH) and ``build/onnax`` (the C++
binary: ``check`` itself, ``validate``/``bench`` answered with a pointer to the Python
command). Exit codes: 0 pass, 1 failed check or unusable file, 2 usage."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from oracles.validate_models import (
    README_TRANSFORMS,
    dangling_input,
    embedded_loss,
    embedded_transform,
    flip_sign,
    linear_loss,
    readme_transforms,
    save,
    with_custom_op,
    wrong_declared_shape,
)

pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[3]
PY_CLI = ROOT / ".venv" / "bin" / "onnax"
CPP_CLI = ROOT / "build" / "onnax"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "python")}


def run(cmd: Path, *args: object) -> subprocess.CompletedProcess[str]:
    if not cmd.exists():
        pytest.skip(f"{cmd} is missing (run ./setup.sh)")
    return subprocess.run(
        [str(cmd), *map(str, args)], capture_output=True, text=True, timeout=120, check=False, env=ENV
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("validate_cli")
    source = linear_loss()
    gen = readme_transforms(source)
    out = {"source": save(source, d / "linear_loss.onnx")}
    out.update({k: save(m, d / f"{k}.onnx") for k, m in gen.items()})
    out["flipped"] = save(flip_sign(gen["grad"], "weight_grad"), d / "flipped.onnx")
    out["dangling"] = save(dangling_input(gen["grad"]), d / "dangling.onnx")
    out["bad_shape"] = save(wrong_declared_shape(gen["grad"], "weight_grad"), d / "bad_shape.onnx")
    out["custom"] = save(with_custom_op(gen["grad"], "weight_grad"), d / "custom.onnx")
    good = out["grad"].read_bytes()
    (d / "truncated.onnx").write_bytes(good[: len(good) // 2])
    out["truncated"] = d / "truncated.onnx"
    emb = embedded_loss()
    out["embedded"] = save(emb, d / "embedded.onnx")
    out["embedded_grad"] = save(embedded_transform(emb, "grad"), d / "embedded_grad.onnx")
    return out


@pytest.mark.parametrize("name", README_TRANSFORMS)
def test_validate_readme_transforms(files, name: str) -> None:
    r = run(PY_CLI, "validate", files["source"], files[name])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("onnax validate: PASSED")
    assert r.stdout.count("[pass]") == 4


def test_validate_wrong_numbers(files, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    r = run(PY_CLI, "validate", files["source"], files["flipped"], "--json", report)
    assert r.returncode == 1
    assert "FAILED at step 'numerical parity'" in r.stdout
    assert "output 'weight_grad' differs from the reference (exact (JAX float64))" in r.stdout
    assert "finite differences confirm the mismatch of ['weight_grad']" in r.stdout
    data = json.loads(report.read_text())
    assert data["ok"] is False and data["failed_step"] == "numerical parity"
    worst = next(o for o in data["outputs"] if o["name"] == "weight_grad")
    # The seeded inputs (seed 0) give gradient 2 x^2 w; the flipped graph is off by twice it.
    import onnx
    from onnax.testing._inputs import make_feeds

    feeds = make_feeds(onnx.load(files["flipped"]), {}, seed=0)
    g = 2 * feeds["x"].astype(float) ** 2 * feeds["weight"].astype(float)
    assert worst["max_abs_error"] == pytest.approx(2 * abs(g).max(), rel=1e-5)
    assert worst["index"] == [int(abs(g).argmax())]
    assert data["versions"]["onnxruntime"] == "1.31.1" and data["versions"]["onnx"] == "1.23.2"
    assert data["opsets"]["generated"] == {"ai.onnx": 18}
    assert data["op_counts"]["source"] == {"Mul": 2, "ReduceSum": 1}


@pytest.mark.parametrize(
    ("name", "step", "needle"),
    [
        ("dangling", "checker", "undefined_value"),
        ("bad_shape", "strict shape inference", "(2) vs (3)"),
        ("custom", "runtime", "com.example:Foo"),
    ],
)
def test_validate_broken_models(files, name: str, step: str, needle: str) -> None:
    r = run(PY_CLI, "validate", files["source"], files[name])
    assert r.returncode == 1
    assert f"FAILED at step {step!r}" in r.stdout
    assert needle in r.stdout and "Fix:" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_validate_bad_files_and_usage(files, tmp_path: Path) -> None:
    r = run(PY_CLI, "validate", tmp_path / "missing.onnx", files["grad"])
    assert r.returncode == 1 and "does not exist. Fix: check the path" in r.stderr
    r = run(PY_CLI, "validate", files["source"], files["truncated"])
    assert r.returncode == 1 and "truncated, corrupt or not an ONNX model" in r.stderr
    r = run(PY_CLI, "validate", files["source"], files["grad"], "--inputs", tmp_path / "none.npz")
    assert r.returncode == 1 and "inputs file" in r.stderr and "does not exist" in r.stderr
    r = run(PY_CLI, "validate", files["source"])
    assert r.returncode == 2 and "usage" in r.stderr
    r = run(PY_CLI, "validate", files["source"], files["grad"], "--dim", "batch")
    assert r.returncode == 2 and "--dim needs NAME=N" in r.stderr
    for stream in (r.stdout, r.stderr):
        assert "Traceback" not in stream
    r = run(PY_CLI, "validate", "--help")
    assert r.returncode == 0 and "numerical parity" in r.stdout


def test_validate_progress_quiet_reference_and_help(files) -> None:
    """Progress lines on stderr (one clean line each), none with --quiet; --reference fd forces
    finite differences; per-command help; --max-seconds must be positive."""
    r = run(PY_CLI, "validate", files["source"], files["hvp"])
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert any("running the source model on the chosen inputs" in line for line in lines), r.stderr
    assert any("exact reference" in line for line in lines), r.stderr
    assert all(line.startswith("onnax validate: [") for line in lines), r.stderr
    assert "reference  exact" in r.stdout
    r = run(PY_CLI, "validate", files["source"], files["hvp"], "--quiet", "--reference", "fd")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "reference  finite differences" in r.stdout and "eps 0.001" in r.stdout
    r = run(PY_CLI, "validate", files["source"], files["grad"], "--max-seconds", "0")
    assert r.returncode == 2 and "--max-seconds must be > 0, got 0" in r.stderr
    v = run(PY_CLI, "validate", "--help").stdout
    b = run(PY_CLI, "bench", "--help").stdout
    assert v.startswith("usage: onnax validate") and "--max-seconds" in v and "--no-reference" not in v
    assert b.startswith("usage: onnax bench") and "--no-reference" in b and "--reference auto|fd" not in b


def test_bench_without_reference_and_notices(tmp_path: Path) -> None:
    """bench --no-reference measures without a reference; onnax's notice (an opset upgrade)
    is one clean line, not a Python warning with its source line; --quiet silences it."""
    model = ROOT / "tests" / "python" / "models" / "exporters" / "tf_mlp.onnx"
    args = ("bench", model, "--transforms", "grad", "--warmup", "0", "--iterations", "2", "--repeats", "1")
    r = run(PY_CLI, *args, "--no-reference", "--output", tmp_path / "b.json")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["settings"]["reference"] is False
    assert "errors" not in data["models"]["grad"] and "not compared" in r.stdout
    notices = [line for line in r.stderr.splitlines() if "notice" in line]
    assert notices and notices[0].startswith("onnax bench: notice: grad: upgraded the model"), r.stderr
    assert "UserWarning" not in r.stderr and "warnings.warn" not in r.stderr
    r = run(PY_CLI, *args, "--no-reference", "--quiet", "--output", tmp_path / "c.json")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_cpp_binary_points_at_python_command(files) -> None:
    for cmd in ("validate", "bench"):
        r = run(CPP_CLI, cmd, files["source"], files["grad"])
        assert r.returncode == 2
        assert ".venv/bin/onnax" in r.stderr and "Fix:" in r.stderr


@pytest.mark.parametrize("cli", [PY_CLI, CPP_CLI], ids=["python", "cpp"])
def test_check(files, cli: Path) -> None:
    r = run(cli, "check", files["vmap_grad"], "--symbolic", "x:0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[pass] checker" in r.stdout and "[pass] strict shape inference" in r.stdout
    assert "[pass] symbolic lengths" in r.stdout and "onnax.transforms" in r.stdout
    r = run(cli, "check", files["dangling"])
    assert r.returncode == 1
    assert (
        "[FAIL] checker" in r.stdout and "undefined_value" in r.stdout and "[skip] strict shape" in r.stdout
    )
    r = run(cli, "check", files["bad_shape"])
    assert r.returncode == 1 and "[FAIL] strict shape inference" in r.stdout
    r = run(cli, "check", files["vmap_grad"], "--symbolic", "x:0,1", "--embedded", "weight")
    assert r.returncode == 1
    assert "axis 1 of 'x' is baked to 2" in r.stdout
    assert "'weight' is a runtime graph input, expected an initializer" in r.stdout
    r = run(cli, "check", files["embedded_grad"], "--symbolic", "x:0", "--embedded", "weight")
    assert r.returncode == 0, r.stdout
    r = run(cli, "check", files["truncated"])
    assert r.returncode == 1 and "truncated" in r.stderr.lower()
    r = run(cli, "check", files["source"].parent / "missing.onnx")
    assert r.returncode == 1 and "does not exist" in r.stderr
    r = run(cli, "check", files["source"], "--symbolic", "x")
    assert r.returncode == 2 and "INPUT:AXIS" in r.stderr
    r = run(cli, "--help")
    assert "check MODEL.onnx" in r.stdout and "validate SOURCE.onnx GENERATED.onnx" in r.stdout


def test_bench_cli(files, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = run(
        PY_CLI,
        "bench",
        files["source"],
        "--transforms",
        "grad,vmap",
        "--in-axes",
        "0,none",
        "--warmup",
        "1",
        "--iterations",
        "3",
        "--repeats",
        "2",
        "--output",
        out,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert set(data["models"]) == {"forward", "grad", "vmap"}
    assert "grad/forward" in data["ratios"] and "vmap per example/forward" in data["ratios"]
    assert "grad/forward" in r.stdout
    r = run(PY_CLI, "bench", files["source"], "--transforms", "nope")
    assert r.returncode == 1 and "unknown transforms ['nope']" in r.stderr
    r = run(PY_CLI, "bench", files["source"], "--repeats", "0")
    assert r.returncode == 2
