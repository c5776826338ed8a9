"""The ``onnax`` command line, run as a subprocess (both ``.venv/bin/onnax`` and
``python -m onnax``): vmap results checked against a per-example loop in ONNX Runtime, the
input file left untouched, deterministic output, and clear errors (non-zero exit, a message
that names the problem, "Fix:" for model/selection problems, never a traceback or an internal
error) for bad files, bad models and bad options."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ort = pytest.importorskip("onnxruntime")
if TYPE_CHECKING:  # for annotations: the module pytest imported above
    import onnxruntime

ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = ROOT / ".venv" / "bin"
F = TensorProto.FLOAT

COMMANDS = {
    "script": [str(VENV_BIN / "onnax")],
    "python-m": [str(VENV_BIN / "python"), "-m", "onnax"],
}


@pytest.fixture(params=sorted(COMMANDS), scope="module")
def cli(request: pytest.FixtureRequest) -> list[str]:
    command = COMMANDS[request.param]
    if not Path(command[0]).exists():
        pytest.skip(f"{command[0]} is missing (run ./setup.sh)")
    return command


def run(cli: list[str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    # timeout: a hang is a failure, not a stuck test run.
    return subprocess.run([*cli, *map(str, args)], capture_output=True, text=True, timeout=60, check=False)


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def make(nodes: list[onnx.NodeProto], inputs, outputs, opset: int = 18, extra_opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
    )
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def small_model() -> onnx.ModelProto:
    """y = tanh(x @ w) + x.sum(-1, keepdims)  with x: [3, 4], w: [4, 2]."""
    return make(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Tanh", ["h"], ["t"]),
            helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1),
            helper.make_node("Add", ["t", "s"], ["y"]),
        ],
        [("x", [3, 4]), ("w", [4, 2])],
        [("y", [3, 2])],
    )


def with_axes_initializer(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.initializer.append(helper.make_tensor("axes", TensorProto.INT64, [1], [-1]))
    return model


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return save(with_axes_initializer(small_model()), tmp_path / "small.onnx")


def session(path: Path) -> onnxruntime.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def per_example(source: Path, feeds: dict[str, np.ndarray], in_axes: dict[str, int | None], out_axis: int):
    """The reference: run the source model once per example and stack along out_axis."""
    sess = session(source)
    sizes = {feeds[n].shape[a] for n, a in in_axes.items() if a is not None}
    assert len(sizes) == 1
    results = []
    for b in range(sizes.pop()):
        one = {n: (v if in_axes[n] is None else np.take(v, b, axis=in_axes[n])) for n, v in feeds.items()}
        results.append(sess.run(["y"], one)[0])
    return np.stack(results, axis=out_axis)


RNG = np.random.default_rng(7)
X = RNG.standard_normal((5, 3, 4)).astype(np.float32)  # 5 examples at axis 0
W = RNG.standard_normal((4, 2)).astype(np.float32)


@pytest.mark.parametrize(
    ("options", "feeds", "in_axes", "out_axis"),
    [
        (["--in-axes", "0,none"], {"x": X, "w": W}, {"x": 0, "w": None}, 0),
        (["--in-axes", "x=0"], {"x": X, "w": W}, {"x": 0, "w": None}, 0),
        (["--in-axes", "x=0,w=none"], {"x": X, "w": W}, {"x": 0, "w": None}, 0),
        (["--in-axes", "0,none", "--out-axes", "1"], {"x": X, "w": W}, {"x": 0, "w": None}, 1),
        (["--in-axes", "0,none", "--out-axes", "-1"], {"x": X, "w": W}, {"x": 0, "w": None}, 2),
        (["--in-axes", "2,none"], {"x": X.transpose(1, 2, 0).copy(), "w": W}, {"x": 2, "w": None}, 0),
        (["--in-axes", "-1,none"], {"x": X.transpose(1, 2, 0).copy(), "w": W}, {"x": 2, "w": None}, 0),
        ([], {"x": X, "w": np.stack([W] * 5)}, {"x": 0, "w": 0}, 0),
        (["--in-axes", "0"], {"x": X, "w": np.stack([W] * 5) * 0.5}, {"x": 0, "w": 0}, 0),
        (["--in-axes", "0,none", "--axis-name", "examples"], {"x": X, "w": W}, {"x": 0, "w": None}, 0),
    ],
    ids=[
        "0,none",
        "by-name",
        "by-name-both",
        "out-axes-1",
        "out-axes-neg",
        "in-axis-2",
        "in-axis-neg",
        "default",
        "single-int",
        "axis-name",
    ],
)
def test_vmap_matches_per_example_loop(cli, small: Path, tmp_path: Path, options, feeds, in_axes, out_axis):
    before = small.read_bytes()
    out = tmp_path / "batched.onnx"
    result = run(cli, "vmap", small, "-o", out, *options)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert small.read_bytes() == before, "the input file was modified"
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)

    got = session(out).run(["y"], feeds)[0]
    want = per_example(small, feeds, in_axes, out_axis)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    batched = onnx.load(str(out))
    x_dims = [d.dim_param or d.dim_value for d in batched.graph.input[0].type.tensor_type.shape.dim]
    if "--axis-name" in options:
        assert "examples" in x_dims
    else:
        assert any(isinstance(d, str) and d.startswith("batch") for d in x_dims), x_dims


def test_two_runs_give_identical_bytes(cli, small: Path, tmp_path: Path):
    outs = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    for out in outs:
        result = run(cli, "vmap", small, "-o", out, "--in-axes", "0,none", "--out-axes", "1")
        assert result.returncode == 0, result.stderr
    assert outs[0].read_bytes() == outs[1].read_bytes()


def test_both_entry_points_write_the_same_bytes(small: Path, tmp_path: Path):
    outs = []
    for name, command in sorted(COMMANDS.items()):
        out = tmp_path / f"{name}.onnx"
        assert run(command, "vmap", small, "-o", out, "--in-axes", "x=0").returncode == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_external_data_option(cli, tmp_path: Path):
    model = make([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [3, 4])], [("y", [3, 512])])
    w = RNG.standard_normal((4, 512)).astype(np.float32)  # 8 KB: goes to the data file
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    src = save(model, tmp_path / "weights.onnx")
    out = tmp_path / "out" / "batched.onnx"
    result = run(cli, "vmap", src, "-o", out, "--external-data")
    assert result.returncode == 0, result.stderr
    data = tmp_path / "out" / "batched.onnx.data"
    assert data.stat().st_size >= w.nbytes
    assert out.stat().st_size < w.nbytes
    got = session(out).run(["y"], {"x": X})[0]
    np.testing.assert_allclose(got, per_example(src, {"x": X}, {"x": 0}, 0), rtol=1e-5, atol=1e-5)


# ---- help, version ---------------------------------------------------------------------------


def test_help_lists_vmap(cli):
    result = run(cli, "--help")
    assert result.returncode == 0
    assert "vmap" in result.stdout
    assert "--in-axes" in result.stdout
    assert run(cli, "vmap", "--help").returncode == 0


def test_version(cli):
    result = run(cli, "version")
    assert result.returncode == 0
    assert result.stdout.startswith("onnax ")


def test_no_arguments_prints_usage_and_fails(cli):
    result = run(cli)
    assert result.returncode == 2
    assert "usage" in result.stdout


# ---- errors ----------------------------------------------------------------------------------


def assert_clean_failure(
    result: subprocess.CompletedProcess[str], expected: Sequence[str], fix: bool
) -> None:
    output = result.stdout + result.stderr
    assert result.returncode in (1, 2), f"exit {result.returncode}: {output}"
    assert result.stderr.strip(), "no message on stderr"
    assert "Traceback" not in output
    assert "internal error" not in output
    for text in expected:
        assert text in result.stderr, f"{text!r} not in {result.stderr!r}"
    if fix:
        assert "Fix:" in result.stderr, result.stderr
    assert len(result.stderr) < 2000, "the message should not dump file or tensor contents"


def small_bytes() -> bytes:
    return with_axes_initializer(small_model()).SerializeToString()


def bad_model(kind: str) -> onnx.ModelProto:
    x, y = [("x", [3])], [("y", [3])]
    if kind == "cycle":
        return make(
            [
                helper.make_node("Add", ["x", "b"], ["a"]),
                helper.make_node("Relu", ["a"], ["b"]),
                helper.make_node("Identity", ["b"], ["y"]),
            ],
            x,
            y,
        )
    if kind == "dangling":
        return make([helper.make_node("Add", ["x", "ghost"], ["y"])], x, y)
    if kind == "opset6":
        return make([helper.make_node("Relu", ["x"], ["y"])], x, y, opset=6)
    if kind == "opset30":
        return make([helper.make_node("Relu", ["x"], ["y"])], x, y, opset=30)
    if kind == "unknown-op":
        return make(
            [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
            x,
            y,
            extra_opsets=[("com.example", 1)],
        )
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("cycle", ["cycle"]),
        ("dangling", ["'ghost'"]),
        ("opset6", ["opset is 6", "18-28", "7-17"]),
        ("opset30", ["opset is 30", "18-28"]),
        ("unknown-op", ["com.example::Frobnicate", "'x'"]),
    ],
)
def test_bad_models(cli, tmp_path: Path, kind: str, expected: list[str]):
    src = save(bad_model(kind), tmp_path / f"{kind}.onnx")
    before = src.read_bytes()
    out = tmp_path / "out.onnx"
    result = run(cli, "vmap", src, "-o", out)
    assert result.returncode == 1
    assert_clean_failure(result, expected, fix=True)
    assert not out.exists(), "a failed run must not write an output"
    assert src.read_bytes() == before


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("empty", b"", ["empty"]),
        ("random", np.random.default_rng(1).bytes(3000), ["not a valid ONNX model"]),
        ("text", b"this is not an onnx model\n" * 10, ["ONNX model"]),
        ("truncated-half", small_bytes()[: len(small_bytes()) // 2], ["not a valid ONNX model"]),
        ("truncated-1", small_bytes()[:-1], ["not a valid ONNX model"]),
        ("truncated-10", small_bytes()[:10], ["ONNX model"]),
    ],
)
def test_malformed_files(cli, tmp_path: Path, name: str, content: bytes, expected: list[str]):
    src = tmp_path / f"{name}.onnx"
    src.write_bytes(content)
    result = run(cli, "vmap", src, "-o", tmp_path / "out.onnx")
    assert result.returncode == 1
    assert_clean_failure(result, [f"{name}.onnx", *expected], fix=True)
    assert not (tmp_path / "out.onnx").exists()


def test_every_truncation_fails_cleanly(tmp_path: Path):
    # The standalone binary runs the same CLI code without Python start-up, so every cut is cheap.
    binary = ROOT / "build" / "onnax"
    command, step = ([str(binary)], 1) if binary.exists() else (COMMANDS["script"], 9)
    data = small_bytes()
    for cut in range(0, len(data), step):
        src = tmp_path / "cut.onnx"
        src.write_bytes(data[:cut])
        result = run(command, "vmap", src, "-o", tmp_path / "out.onnx")
        assert result.returncode == 1, f"cut at {cut}: {result.stderr}"
        assert_clean_failure(result, [], fix=True)
        assert not (tmp_path / "out.onnx").exists()


def test_missing_file(cli, tmp_path: Path):
    result = run(cli, "vmap", tmp_path / "nope.onnx", "-o", tmp_path / "out.onnx")
    assert result.returncode == 1
    assert_clean_failure(result, ["nope.onnx", "does not exist"], fix=True)


def test_directory_as_input(cli, tmp_path: Path):
    result = run(cli, "vmap", tmp_path, "-o", tmp_path / "out.onnx")
    assert result.returncode == 1
    assert_clean_failure(result, [str(tmp_path), "directory"], fix=True)


def test_missing_external_data_file(cli, tmp_path: Path):
    model = with_axes_initializer(small_model())
    tensor = model.graph.initializer[0]
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "axes.bin"
    src = save(model, tmp_path / "m.onnx")
    result = run(cli, "vmap", src, "-o", tmp_path / "out.onnx")
    assert result.returncode == 1
    assert_clean_failure(result, ["'axes'", "axes.bin", "does not exist"], fix=True)


def test_output_equal_to_input_is_refused(cli, small: Path):
    before = small.read_bytes()
    result = run(cli, "vmap", small, "-o", small)
    assert result.returncode == 2
    assert_clean_failure(result, ["input file"], fix=False)
    assert small.read_bytes() == before


def test_unwritable_output(cli, small: Path, tmp_path: Path):
    (tmp_path / "file").write_bytes(b"x")
    result = run(cli, "vmap", small, "-o", tmp_path / "file" / "out.onnx")
    assert result.returncode == 1
    assert_clean_failure(result, ["out.onnx"], fix=True)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--in-axes", "5,none"], ["axis 5", "'x'", "rank 2", "[-3, 2]"]),
        (["--in-axes", "-4,none"], ["axis -4", "'x'", "[-3, 2]"]),
        (["--in-axes", "0,none,0"], ["3 entries", "['x', 'w']"]),
        (["--in-axes", "0,0,0,0"], ["4 entries", "['x', 'w']"]),
        (["--in-axes", "q=0"], ["'q'", "['x', 'w']"]),
        (["--in-axes", "none"], ["batches no input"]),
        (["--in-axes", "0,none", "--out-axes", "3"], ["axis 3", "'y'"]),
        (["--in-axes", "0,none", "--out-axes", "0,0"], ["out_axes"]),
    ],
    ids=[
        "in-axis-too-big",
        "in-axis-too-small",
        "3-entries",
        "4-entries",
        "unknown-name",
        "all-none",
        "out-axis-too-big",
        "out-axes-count",
    ],
)
def test_selection_errors(cli, small: Path, tmp_path: Path, options: list[str], expected: list[str]):
    out = tmp_path / "out.onnx"
    result = run(cli, "vmap", small, "-o", out, *options)
    assert result.returncode == 1
    assert_clean_failure(result, expected, fix=True)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["vmap", "{small}", "-o", "{out}", "--in-axes", "abc"], ["'abc' is not an integer"]),
        (["vmap", "{small}", "-o", "{out}", "--in-axes", "1.5,none"], ["'1.5' is not an integer"]),
        (["vmap", "{small}", "-o", "{out}", "--in-axes", "99999999999999999999"], ["is not an integer"]),
        (["vmap", "{small}", "-o", "{out}", "--in-axes", "0,"], ["'' is not an integer"]),
        (["vmap", "{small}", "-o", "{out}", "--in-axes", ""], ["--in-axes needs a value"]),
        (["vmap", "{small}", "-o", "{out}", "--in-axes", "x=0,x=none"], ["'x' is named twice"]),
        (["vmap", "{small}", "-o", "{out}", "--in-axes", "x=0,1"], ["mix of positional"]),
        (["vmap", "{small}", "-o", "{out}", "--out-axes", "one"], ["'one' is not an integer"]),
        (["vmap", "{small}", "-o", "{out}", "--in-axes"], ["--in-axes needs a value"]),
        (["vmap", "{small}", "-o"], ["-o needs a value"]),
        (["vmap", "{small}"], ["needs -o"]),
        (["vmap", "-o", "{out}"], ["needs an input model"]),
        (["vmap", "{small}", "{small}", "-o", "{out}"], ["unexpected argument"]),
        (["vmap", "{small}", "-o", "{out}", "--bogus"], ["unknown option '--bogus'"]),
        (["frobnicate", "{small}"], ["unknown command 'frobnicate'"]),
    ],
    ids=[
        "bad-int",
        "float",
        "overflow",
        "trailing-comma",
        "empty",
        "name-twice",
        "mixed-forms",
        "bad-out-axes",
        "in-axes-no-value",
        "o-no-value",
        "missing-o",
        "missing-input",
        "extra-arg",
        "unknown-option",
        "unknown-command",
    ],
)
def test_usage_errors(cli, small: Path, tmp_path: Path, args: list[str], expected: list[str]):
    out = tmp_path / "out.onnx"
    result = run(cli, *(a.format(small=small, out=out) for a in args))
    assert result.returncode == 2
    assert_clean_failure(result, [*expected, "--help"], fix=False)
    assert not out.exists()


def test_repeated_in_axes_replaces_earlier(cli, small: Path, tmp_path: Path):
    out = tmp_path / "out.onnx"
    result = run(cli, "vmap", small, "-o", out, "--in-axes", "0", "--in-axes", "0,none")
    assert result.returncode == 0, result.stderr
    got = session(out).run(["y"], {"x": X, "w": W})[0]
    np.testing.assert_allclose(got, per_example(small, {"x": X, "w": W}, {"x": 0, "w": None}, 0), rtol=1e-5)
