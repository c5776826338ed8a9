"""The seed README's complete example, executed unchanged, then its five graphs checked numerically.

The example builds ``loss = sum((x * w) ** 2)`` and derives ``gradient``, ``per_example``,
``pushforward``, ``pullback`` and ``hvp``. Closed forms (elementwise):

* ``dloss/dw = 2 x^2 w`` and ``dloss/dx = 2 w^2 x``;
* per-example gradients: ``2 x_i^2 w`` for each row ``x_i`` of a batch;
* pushforward along ``v`` (w.r.t. ``x``): ``sum(2 (x w) w v)``;
* pullback of ``u`` (w.r.t. ``weight``): ``u * 2 x^2 w``;
* HVP along ``v`` (w.r.t. ``weight``): ``2 x^2 v``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from oracles.vmap_oracle import run_model, to_proto

pytest.importorskip("onnax")

SEED = Path("/work/shared/seeds/000_ce74855b6f51f5fe.txt")
START = "import onnx_ir as ir"
END = 'ir.save(per_example, "per_example.onnx")'


def example_code() -> str:
    if not SEED.exists():
        pytest.skip(f"seed README not found at {SEED}")
    text = SEED.read_text()
    start = text.index(START)
    end = text.index(END, start) + len(END)
    return text[start:end] + "\n"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    code = example_code()
    workdir = tmp_path_factory.mktemp("seed_readme")
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        namespace: dict[str, Any] = {"__name__": "seed_readme_example"}
        exec(compile(code, "seed_readme_example", "exec"), namespace)
    finally:
        os.chdir(cwd)
    namespace["__workdir__"] = workdir
    return namespace


def _io(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    inits = {t.name for t in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in inits], [o.name for o in model.graph.output]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in model.graph.output]
    return dict(zip(names, run_model(model, feeds), strict=True))


RNG = np.random.default_rng(0)
X = RNG.standard_normal(2).astype(np.float32)
W = RNG.standard_normal(2).astype(np.float32)
RTOL = 1e-5
ATOL = 1e-6


def test_code_block_is_extracted_verbatim() -> None:
    code = example_code()
    assert code.startswith(START)
    assert code.rstrip().endswith(END)
    for name in ("gradient", "per_example", "pushforward", "pullback", "hvp"):
        assert re.search(rf"^{name} = ", code, re.MULTILINE), name


def test_example_runs_and_saves(example: dict[str, Any]) -> None:
    import onnx_ir as ir

    path = example["__workdir__"] / "per_example.onnx"
    assert path.exists()
    for name in ("model", "gradient", "per_example", "pushforward", "pullback", "hvp"):
        assert isinstance(example[name], ir.Model), f"{name} is {type(example[name]).__name__}"
    loaded = onnx.load(str(path))
    onnx.checker.check_model(loaded, full_check=True)
    assert _io(loaded) == _io(to_proto(example["per_example"]))


def test_source_model_is_unchanged(example: dict[str, Any]) -> None:
    model = to_proto(example["model"])
    assert _io(model) == (["x", "weight"], ["loss"])
    assert [n.op_type for n in model.graph.node] == ["Mul", "Mul", "ReduceSum"]


def test_all_generated_graphs_pass_full_check(example: dict[str, Any]) -> None:
    for name in ("gradient", "per_example", "pushforward", "pullback", "hvp"):
        onnx.checker.check_model(to_proto(example[name]), full_check=True)


def test_gradient(example: dict[str, Any]) -> None:
    g = to_proto(example["gradient"])
    ins, outs = _io(g)
    assert ins == ["x", "weight"]
    assert outs == ["loss", "weight_grad"]
    got = _run(g, {"x": X, "weight": W})
    np.testing.assert_allclose(got["loss"], np.sum((X * W) ** 2), rtol=RTOL, atol=ATOL)
    assert got["loss"].shape == ()
    np.testing.assert_allclose(got["weight_grad"], 2 * X**2 * W, rtol=RTOL, atol=ATOL)
    assert got["weight_grad"].dtype == np.float32


@pytest.mark.parametrize("batch", [1, 4])
def test_per_example(example: dict[str, Any], batch: int) -> None:
    pe = to_proto(example["per_example"])
    ins, outs = _io(pe)
    assert ins == ["x", "weight"]
    assert outs == ["loss", "weight_grad"]
    xs = np.random.default_rng(batch).standard_normal((batch, 2)).astype(np.float32)
    got = _run(pe, {"x": xs, "weight": W})
    np.testing.assert_allclose(got["loss"], np.sum((xs * W) ** 2, axis=1), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got["weight_grad"], 2 * xs**2 * W[None, :], rtol=RTOL, atol=ATOL)
    assert got["weight_grad"].shape == (batch, 2)


def test_pushforward(example: dict[str, Any]) -> None:
    pf = to_proto(example["pushforward"])
    ins, outs = _io(pf)
    assert ins == ["x", "weight", "x_tangent"]
    assert outs == ["loss", "loss_tangent"]
    v = np.asarray([0.3, -1.7], dtype=np.float32)
    got = _run(pf, {"x": X, "weight": W, "x_tangent": v})
    np.testing.assert_allclose(got["loss"], np.sum((X * W) ** 2), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got["loss_tangent"], np.sum(2 * (X * W) * W * v), rtol=RTOL, atol=ATOL)
    assert got["loss_tangent"].shape == ()


@pytest.mark.parametrize("u", [1.0, -2.5])
def test_pullback(example: dict[str, Any], u: float) -> None:
    pb = to_proto(example["pullback"])
    ins, outs = _io(pb)
    assert ins == ["x", "weight", "loss_cotangent"]
    assert outs == ["loss", "weight_cotangent"]
    got = _run(pb, {"x": X, "weight": W, "loss_cotangent": np.asarray(u, dtype=np.float32)})
    np.testing.assert_allclose(got["loss"], np.sum((X * W) ** 2), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got["weight_cotangent"], u * 2 * X**2 * W, rtol=RTOL, atol=ATOL)


def test_hvp(example: dict[str, Any]) -> None:
    h = to_proto(example["hvp"])
    ins, outs = _io(h)
    assert ins == ["x", "weight", "weight_tangent"]
    assert outs == ["loss", "weight_grad", "weight_grad_tangent"]
    v = np.asarray([0.7, -0.4], dtype=np.float32)
    got = _run(h, {"x": X, "weight": W, "weight_tangent": v})
    np.testing.assert_allclose(got["loss"], np.sum((X * W) ** 2), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got["weight_grad"], 2 * X**2 * W, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got[outs[2]], 2 * X**2 * v, rtol=RTOL, atol=ATOL)
    assert got[outs[2]].shape == (2,)


def test_hvp_is_nonzero_and_linear(example: dict[str, Any]) -> None:
    h = to_proto(example["hvp"])
    out = [o.name for o in h.graph.output][2]
    v1 = np.asarray([1.0, 0.0], dtype=np.float32)
    v2 = np.asarray([0.0, 1.0], dtype=np.float32)
    r1 = _run(h, {"x": X, "weight": W, "weight_tangent": v1})[out]
    r2 = _run(h, {"x": X, "weight": W, "weight_tangent": v2})[out]
    r12 = _run(h, {"x": X, "weight": W, "weight_tangent": 2 * v1 - 3 * v2})[out]
    assert np.any(r1 != 0)
    np.testing.assert_allclose(r12, 2 * r1 - 3 * r2, rtol=RTOL, atol=ATOL)
