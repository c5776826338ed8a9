"""`import onnax` and the `onnax` command load neither onnx nor NumPy until a transform needs
them (they take about a second to import; `onnax version` takes well under that), and the lazy
names are exactly the public ones."""

from __future__ import annotations

import subprocess
import sys

import onnax


def test_import_loads_no_onnx_or_numpy() -> None:
    code = "import sys, onnax; print(sorted(m for m in ('onnx', 'numpy', 'onnx_ir') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_command_version_loads_neither() -> None:
    code = (
        "import sys; from onnax.__main__ import main; sys.argv = ['onnax', 'version']; main(); "
        "print(sorted(m for m in ('onnx', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines() == [f"onnax {onnax.__version__}", "[]"]


def test_public_names_resolve() -> None:
    lazy = set(onnax._LAZY)
    # (onnax.limits needs neither onnx nor NumPy: it is imported with the package.)
    assert set(onnax.__all__) == lazy | {"LimitError", "OnnaxError", "__version__", "limits"}
    assert callable(onnax.limits)
    for name in sorted(lazy):
        assert callable(getattr(onnax, name)), name
    assert onnax.training.add_loss is onnax.add_loss
