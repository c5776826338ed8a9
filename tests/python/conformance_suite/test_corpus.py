"""The real-model corpus (``conformance/corpus``) against its framework references.

By default the entries marked ``quick`` run from the committed artifacts (ONNX files and
reference ``.npz``; no JAX or PyTorch needed): every transform must match JAX / torch.func
(or the float64 finite-difference / loop oracle for the built graph network) within the
entry's tolerance, pass ``onnx.checker`` and strict shape inference, and run in ONNX Runtime.
When jax2onnx is installed (requirements.txt), one model is re-exported and its JAX
references recomputed to check the committed files are what the generator produces.
``ONNAX_CORPUS_FULL=1`` also runs entries not marked ``quick`` and the onnx package's light
architectures (generated on the fly).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from conformance.corpus import artifacts, runner  # noqa: E402

FULL = os.environ.get("ONNAX_CORPUS_FULL", "") not in ("", "0")

# Cases onnx refuses with a diagnostic, with the words the diagnostic must contain. A case
# that starts passing fails here so this list (and the README) gets updated.
EXPECTED_UNSUPPORTED: dict[tuple[str, str], str] = {}


def _entries() -> list[str]:
    names = artifacts.list_entries()
    if FULL:
        return names
    return [n for n in names if artifacts.read_manifest(artifacts.paths(n)[1]).quick]


def test_corpus_has_the_required_models() -> None:
    names = set(artifacts.list_entries())
    required = {
        "jax_mlp",
        "jax_cnn_gap",
        "jax_transformer",
        "jax_embed_xent",
        "jax_gru",
        "gnn_message_passing",
    }
    assert required <= names, sorted(required - names)
    quick = set(_entries())
    assert required <= quick or FULL


@pytest.mark.parametrize("name", _entries())
def test_corpus_entry(onnax, name: str) -> None:
    rows = runner.run_corpus([name])
    assert [r.transform for r in rows] == list(artifacts.TRANSFORMS)
    problems = []
    for r in rows:
        expected = EXPECTED_UNSUPPORTED.get((r.model, r.transform))
        if expected is not None:
            if r.status != "unsupported" or expected not in r.message:
                problems.append(
                    f"{r.transform}: expected unsupported ({expected}), got {r.status}: {r.message}"
                )
            continue
        if r.status != "passed":
            problems.append(f"{r.transform}: {r.status}: {r.message}")
            continue
        assert r.max_error is not None and r.tolerance is not None
        assert r.max_error <= r.tolerance, (r.transform, r.max_error, r.tolerance)
        assert r.transform_s is not None and r.runtime_ratio is not None
    assert not problems, f"{name}:\n" + "\n".join(problems)


def test_reference_layout_is_complete() -> None:
    """Every transform of every entry has stored inputs and at least one reference output."""
    for name in artifacts.list_entries():
        _, js, npz = artifacts.paths(name)
        m = artifacts.read_manifest(js)
        arrays = artifacts.read_arrays(npz)
        model = onnx.load(artifacts.paths(name)[0])
        for t in artifacts.TRANSFORMS:
            assert any(k.startswith(f"{t}/out/") for k in arrays), (name, t)
            for vi in runner.runtime_inputs(model):
                assert f"{t}/feed/{vi.name}" in arrays, (name, t, vi.name)
        assert set(m.params) <= {i.name for i in model.graph.initializer}, name


@pytest.mark.skipif(importlib.util.find_spec("jax2onnx") is None, reason="jax2onnx not installed")
def test_jax_export_reproduces_committed_artifacts(tmp_path: Path) -> None:
    """Re-exporting one model with jax2onnx and recomputing its JAX references gives the
    committed ONNX graph and references (about 30 s: JAX import, export, references)."""
    code = (
        "from pathlib import Path; from conformance.corpus import jax_export;"
        f"jax_export.generate(['jax_mlp'], root=Path({str(tmp_path)!r}))"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=900)
    fresh = onnx.load(tmp_path / "jax_mlp.onnx")
    committed = onnx.load(artifacts.paths("jax_mlp")[0])
    assert fresh.graph == committed.graph
    new = artifacts.read_arrays(tmp_path / "jax_mlp.npz")
    old = artifacts.read_arrays(artifacts.paths("jax_mlp")[2])
    assert new.keys() == old.keys()
    for k in old:
        np.testing.assert_allclose(new[k], old[k], rtol=1e-12, atol=1e-12, err_msg=k)


@pytest.mark.skipif(not FULL, reason="set ONNAX_CORPUS_FULL=1 (generates ~800 MB, a few minutes)")
def test_onnx_light_architectures(onnax) -> None:
    """The onnx package's light architectures: vmap matches per-example loops; the other
    transforms either build, check and run, or stop at onnax's diagnostic."""
    from conformance.corpus import onnx_light

    names = onnx_light.generate()
    rows = runner.run_corpus(names, root=onnx_light.CACHE_DIR)
    failed = [f"{r.model}/{r.transform}: {r.message}" for r in rows if r.status == "failed"]
    assert not failed, "\n".join(failed)
    assert all(r.status == "passed" for r in rows if r.transform == "vmap")
