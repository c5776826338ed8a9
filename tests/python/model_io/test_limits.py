"""Bounds for services (onnax.limits, --max-seconds, --max-output-mb) and Ctrl-C: a transform
stops with a diagnostic and writes nothing, other Python threads run while it works, and after
the bound the same thread transforms as before (checked in ONNX Runtime against NumPy)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

onnax = pytest.importorskip("onnax")

F = TensorProto.FLOAT


def branch(level: int, depth: int, then: bool) -> onnx.GraphProto:
    out = f"o{level}_{int(then)}"
    if level == depth:
        nodes = [
            helper.make_node("Mul", ["x", "w"], [f"m{level}_{int(then)}"]),
            helper.make_node("Tanh", [f"m{level}_{int(then)}"], [out]),
        ]
    else:
        nodes = [
            helper.make_node(
                "If",
                ["c"],
                [f"i{level}_{int(then)}"],
                then_branch=branch(level + 1, depth, True),
                else_branch=branch(level + 1, depth, False),
            ),
            helper.make_node("Sin", [f"i{level}_{int(then)}"], [out]),
        ]
    return helper.make_graph(nodes, f"b{level}_{int(then)}", [], [helper.make_tensor_value_info(out, F, [3])])


def if_tree(depth: int) -> onnx.ModelProto:
    """Ifs nested `depth` deep in both branches (2^depth leaves): a transform that takes a few
    seconds at depth 8 or more, and milliseconds at depth 2."""
    graph = helper.make_graph(
        [
            helper.make_node(
                "If", ["c"], ["y"], then_branch=branch(1, depth, True), else_branch=branch(1, depth, False)
            ),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        "if_tree",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", F, [3]),
            helper.make_tensor_value_info("w", F, [3]),
        ],
        [helper.make_tensor_value_info("loss", F, [])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def check_small_gradient() -> None:
    """grad of the depth-2 tree is exact (d/dw sum sin(tanh(x w)) = cos(t) (1 - t^2) x)."""
    result = onnax.grad(if_tree(2), inputs=["w"])
    x, w = np.array([0.3, -1.2, 0.8], np.float32), np.array([0.5, 0.7, -0.4], np.float32)
    session = ort.InferenceSession(result.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = session.run(None, {"c": np.array(True), "x": x, "w": w})
    got = dict(zip([o.name for o in session.get_outputs()], outputs, strict=True))
    t = np.tanh(x.astype(np.float64) * w)
    np.testing.assert_allclose(got["w_grad"], np.cos(t) * (1 - t * t) * x, rtol=1e-5)


def test_a_transform_past_its_time_limit_stops_and_the_thread_transforms_again_after() -> None:
    with onnax.limits(max_seconds=0.05), pytest.raises(onnax.LimitError, match=r"time limit of 0\.05 s") as e:
        onnax.grad(if_tree(9), inputs=["w"])
    assert isinstance(e.value, onnax.OnnaxError)
    assert "nothing was written" in str(e.value) and "Fix:" in str(e.value)
    check_small_gradient()


def test_nested_limits_tighten_and_numpy_numbers_are_taken() -> None:
    # (The outer 0.05 s holds inside the looser inner block.)
    with (
        onnax.limits(max_seconds=np.float64(0.05)),
        onnax.limits(max_seconds=np.int64(600)),
        pytest.raises(onnax.LimitError, match=r"time limit of 0\.05 s"),
    ):
        onnax.grad(if_tree(9), inputs=["w"])
    check_small_gradient()


def test_the_size_limit_counts_the_weights_the_core_does_not_see() -> None:
    """Large float weights reach the core as data-less stand-ins; the bound still counts them."""
    model = if_tree(2)
    big = helper.make_tensor("big", F, [300, 1000], np.zeros(300_000, np.float32))
    model.graph.initializer.append(big)  # (1.2 MB, held back from the core)
    model.graph.node.append(helper.make_node("ReduceSum", ["big"], ["big_sum"], keepdims=0))
    model.graph.output.append(helper.make_tensor_value_info("big_sum", F, []))
    with onnax.limits(max_output_mb=1), pytest.raises(onnax.LimitError, match="over the limit of 1 MB"):
        onnax.grad(model, inputs=["w"], output="loss")
    assert onnax.grad(model, inputs=["w"], output="loss").ByteSize() > 2**20


def test_a_result_over_the_size_limit_is_refused() -> None:
    with onnax.limits(max_output_mb=0.001), pytest.raises(onnax.OnnaxError, match="over the limit of") as e:
        onnax.grad(if_tree(4), inputs=["w"])
    assert "MB" in str(e.value) and "Fix:" in str(e.value)
    with onnax.limits(max_output_mb=10):
        check_small_gradient()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", True, 1e400])
def test_limits_must_be_positive_numbers(bad: object) -> None:
    with pytest.raises(ValueError, match="positive finite number"), onnax.limits(max_seconds=bad):  # type: ignore[arg-type]
        pass


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [("--max-seconds", "0.05", "time limit of 0.05 s"), ("--max-output-mb", "0.001", "over the limit of")],
)
def test_command_line_bounds_exit_1_and_write_nothing(
    option: str, value: str, words: str, tmp_path: Path
) -> None:
    source, out = tmp_path / "tree.onnx", tmp_path / "grad.onnx"
    onnx.save(if_tree(9 if option == "--max-seconds" else 4), source)
    args = ["grad", str(source), "-o", str(out), "--inputs", "w", option, value]
    proc = subprocess.run([sys.executable, "-m", "onnax", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stderr  # (4: a bound, not a bad model)
    assert words in proc.stderr and "Fix:" in proc.stderr
    assert not out.exists()


CTRL_C = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, {tests!r})
    import onnax
    from test_limits import if_tree
    model = if_tree(10)
    ticks = []
    def tick():
        while True:
            ticks.append(time.perf_counter())
            time.sleep(0.01)
    threading.Thread(target=tick, daemon=True).start()
    print("started", flush=True)
    start = time.perf_counter()
    try:
        onnax.grad(model, inputs=["w"])
        print("finished")
    except KeyboardInterrupt:
        during = [t for t in ticks if t > start]
        print(f"interrupted {{time.perf_counter() - start:.2f}} ticks {{len(during)}}")
    """
)


def test_ctrl_c_stops_a_running_transform_while_other_threads_run(tmp_path: Path) -> None:
    """The transform runs with the GIL released on a worker thread: another Python thread keeps
    ticking, and SIGINT raises KeyboardInterrupt in the caller within moments (the transform
    alone takes tens of seconds)."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C.format(tests=str(Path(__file__).parent)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    words = out.split()
    assert words[0] == "interrupted", out
    assert int(words[3]) > 10, out  # (the other thread ran while the transform did)


def test_ctrl_c_in_the_command_exits_130_and_writes_nothing(tmp_path: Path) -> None:
    source, out = tmp_path / "tree.onnx", tmp_path / "grad.onnx"
    onnx.save(if_tree(10), source)
    proc = subprocess.Popen(
        [sys.executable, "-m", "onnax", "grad", str(source), "-o", str(out), "--inputs", "w"],
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3.0)  # (imports, then into the transform)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().endswith("onnax: interrupted") and "error:" not in err and "Traceback" not in err
    assert not out.exists()  # (the transform alone takes over a minute)
