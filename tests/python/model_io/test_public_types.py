"""The public API's types, as a type checker sees them: every transform gives back the kind of
model it was given (an ``onnx.ModelProto`` for a ModelProto, an ``onnx_ir.Model`` for an onnx_ir
Model), functions that read a model take either kind, and anything else (a path, bytes) is a
type error. Checked by running mypy over a snippet of calls with ``typing.assert_type``. (Without
protobuf's type stubs every protobuf message is compatible with every other for mypy, so a
GraphProto passed for a ModelProto is not caught; a str or bytes is.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SNIPPET = """\
from typing import assert_type

import numpy as np
import onnax
import onnx
import onnx_ir as ir

proto = onnx.ModelProto()
model = ir.Model(ir.Graph([], [], nodes=[]), ir_version=10)
rule = onnx.FunctionProto()

assert_type(onnax.vmap(proto, in_axes=0), onnx.ModelProto)
assert_type(onnax.vmap(model, in_axes=0), ir.Model)
assert_type(onnax.jvp(proto), onnx.ModelProto)
assert_type(onnax.vjp(model), ir.Model)
assert_type(onnax.grad(model), ir.Model)
assert_type(onnax.jacfwd(proto), onnx.ModelProto)
assert_type(onnax.jacrev(model), ir.Model)
assert_type(onnax.hessian(model), ir.Model)
assert_type(onnax.linearize(proto), tuple[onnx.ModelProto, onnx.ModelProto])
assert_type(onnax.linearize(model), tuple[ir.Model, ir.Model])
assert_type(onnax.stop_gradient(model, ["h"]), ir.Model)
assert_type(onnax.convert_opset(proto, 18), onnx.ModelProto)
assert_type(onnax.add_loss(model, "mse"), ir.Model)
assert_type(onnax.train_step(proto), onnx.ModelProto)
assert_type(onnax.apply_params(model, {"w": np.zeros(2)}), ir.Model)
assert_type(onnax.scan(proto), onnx.ModelProto)
assert_type(onnax.step(model), ir.Model)
assert_type(onnax.parameters(model), list[str])
assert_type(onnax.select_params(proto), list[str])
assert_type(onnax.initial_state(model, proto), dict[str, np.ndarray])
onnax.register_rule("Cube", "my.ops", jvp=rule)

onnax.vmap("model.onnx")  # error 1: a path
onnax.grad(b"bytes")  # error 2: serialized bytes
onnax.train_step("loss.onnx")  # error 3
onnax.parameters("step.onnx")  # error 4
onnax.add_loss(model, "hinge")  # error 5: not a loss kind
"""


def test_transforms_give_back_the_kind_of_model_they_are_given(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
            "--hide-error-context",
            str(snippet),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
        env={"MYPYPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin"},
    )
    lines = SNIPPET.splitlines()
    expected = {i + 1 for i, line in enumerate(lines) if "# error" in line}
    errors: dict[int, str] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r".*snippet\.py:(\d+): error: (.*)", line)
        if m:
            errors[int(m.group(1))] = m.group(2)
    # Every assert_type holds (no error on those lines) and each wrong call is an error.
    assert set(errors) == expected, proc.stdout + proc.stderr
    assert 'Value of type variable "ModelT" of "vmap" cannot be "str"' in errors[min(expected)]
