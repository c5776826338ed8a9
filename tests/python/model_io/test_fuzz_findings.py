"""Models from the findings of the coverage-guided fuzzer (fuzz/onnax_fuzz.cc; each finding's
input is replayed from fuzz/regressions/ by scripts/fuzz.sh --replay). Here each pattern is
built from scratch and must get the contract's diagnostic: exit code 1 with a message and a
fix from the command line, an OnnaxError in Python; valid neighbours still transform."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

onnax = pytest.importorskip("onnax")

F = TensorProto.FLOAT


def lp_pool_model(opsets: list[tuple[str, int]]) -> onnx.ModelProto:
    """LpPool with an empty kernel_shape over an input of unknown rank (so no node check can
    compare the two), importing the given (domain, version) pairs."""
    node = helper.make_node("LpPool", ["x"], ["y"])
    node.attribute.append(helper.make_attribute("kernel_shape", [], attr_type=onnx.AttributeProto.INTS))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", F, None)],
        [helper.make_tensor_value_info("y", F, None)],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=10
    )


def run_cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onnax", *args], capture_output=True, text=True, timeout=120, check=False
    )


def assert_invalid_model(
    m: onnx.ModelProto, command: list[str], words: str, transforms: list[Any], tmp_path: Path
) -> None:
    """`onnax COMMAND model -o out` exits 1 with an invalid-model diagnostic containing `words`
    and a fix, writing nothing; each Python transform raises OnnaxError with `words`."""
    path, out = tmp_path / "model.onnx", tmp_path / "out.onnx"
    onnx.save(m, path)
    proc = run_cli([command[0], str(path), "-o", str(out), *command[1:]])
    assert proc.returncode == 1, proc.stderr
    assert "invalid model" in proc.stderr and words in proc.stderr and "Fix:" in proc.stderr, proc.stderr
    assert not out.exists()
    for transform in transforms:
        with pytest.raises(onnax.OnnaxError, match=re.escape(words)):
            transform(m)


@pytest.mark.parametrize(
    ("opsets", "words"),
    [
        # The fuzzer's input: onnax read opset 22, then returned the result from opset 2^31 to 22
        # one opset at a time (a hang).
        ([("", 22), ("", 2**31)], "imports domain 'ai.onnx' twice, at opsets 22 and 2147483648"),
        ([("", 18), ("ai.onnx", 21)], "imports domain 'ai.onnx' twice, at opsets 18 and 21"),
    ],
)
def test_a_domain_imported_at_two_opsets_is_refused(
    opsets: list[tuple[str, int]], words: str, tmp_path: Path
) -> None:
    assert_invalid_model(lp_pool_model(opsets), ["jvp"], words, [onnax.jvp, onnax.vjp, onnax.vmap], tmp_path)


def test_a_domain_imported_twice_at_one_opset_still_transforms() -> None:
    x = helper.make_tensor_value_info("x", F, [2])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [x], [helper.make_tensor_value_info("y", F, [2])]
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)] * 2, ir_version=10)
    result = onnax.jvp(m)
    assert [o.name for o in result.graph.output] == ["y", "y_tangent"]


def einsum_model(equation: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["x"], ["y"], equation=equation)],
        "g",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [3, 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_onnax_check_reports_an_einsum_equation_that_hangs_onnx_inference(tmp_path: Path) -> None:
    # The ONNX checker passes "ij-" (an arrow cut short); ONNX's Einsum inference then loops
    # forever, so `onnax check` hung in its strict shape inference step.
    path = tmp_path / "einsum.onnx"
    onnx.save(einsum_model("ij-"), path)
    proc = run_cli(["check", str(path)])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[pass] checker" in proc.stdout, proc.stdout
    assert "[FAIL] strict shape inference" in proc.stdout, proc.stdout
    for words in ("was not run", "Einsum", "equation 'ij-'", "character '-'", "Fix:"):
        assert words in proc.stdout, proc.stdout
    # The valid equation passes both steps.
    onnx.save(einsum_model("ij->ji"), path)
    proc = run_cli(["check", str(path)])
    assert proc.returncode == 0 and "all 2 checks passed" in proc.stdout, proc.stdout + proc.stderr


def scan_model(num_scan_inputs: int) -> onnx.ModelProto:
    """A sequence model as `onnax step` reads it: one Scan carrying s over the rows of x."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
            helper.make_node("Identity", ["s_out"], ["y_t"]),
        ],
        "body",
        [helper.make_tensor_value_info("s_in", F, [2]), helper.make_tensor_value_info("x_t", F, [2])],
        [helper.make_tensor_value_info("s_out", F, [2]), helper.make_tensor_value_info("y_t", F, [2])],
    )
    node = helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=num_scan_inputs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("s0", F, [2]), helper.make_tensor_value_info("x", F, [3, 2])],
        [helper.make_tensor_value_info("s", F, [2]), helper.make_tensor_value_info("y", F, [3, 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("count", [-1, -3, 5, 2**31])
def test_a_scan_with_num_scan_inputs_out_of_range_is_refused_by_step_and_signature(
    count: int, tmp_path: Path
) -> None:
    # The fuzzer's input had 2^31 (an int overflow, then a refusal by luck); -1 read past the
    # body's inputs: a segfault of `onnax step` and `onnax signature`.
    m = scan_model(count)
    path, out = tmp_path / "scan.onnx", tmp_path / "step.onnx"
    onnx.save(m, path)
    words = f"its Scan has num_scan_inputs {count} for 2 inputs"
    for args in (["step", str(path), "-o", str(out)], ["signature", str(path)]):
        proc = run_cli(args)
        assert proc.returncode == 1, proc.stderr
        assert words in proc.stderr and "Fix:" in proc.stderr, proc.stderr
    assert not out.exists()
    with pytest.raises(onnax.OnnaxError, match=re.escape(words)):
        onnax.step(m)
    with pytest.raises(onnax.OnnaxError, match=re.escape(words)):
        onnax.signature(m)


def test_a_scan_with_its_one_sequence_still_steps() -> None:
    stepped = onnax.step(scan_model(1))
    assert [i.name for i in stepped.graph.input] == ["s0", "x"]


def expand_without_outputs(opsets: list[int]) -> onnx.ModelProto:
    """An Expand with no outputs (its schema needs one), after a Relu, at the given opsets."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Expand", ["y", "shape"], [])],
        "g",
        [
            helper.make_tensor_value_info("x", F, [2]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", F, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", v) for v in opsets], ir_version=10)


def test_jacobians_and_convert_opset_refuse_a_domain_imported_at_two_opsets() -> None:
    # The fuzzer's input imported [13, 13, 19]: jacrev read 13 and upgraded the model, and the
    # upgrade read 19 and lowered it instead, over nodes nothing had checked; its message read
    # the first output of an Expand that has none (out of bounds).
    m = expand_without_outputs([13, 13, 19])
    words = "imports domain 'ai.onnx' twice, at opsets 13 and 19"
    for transform in (onnax.jacrev, onnax.jacfwd, onnax.hessian):
        with pytest.raises(onnax.OnnaxError, match=re.escape(words)):
            transform(m)
    with pytest.raises(onnax.OnnaxError, match=re.escape(words)):
        onnax.convert_opset(m, 18)


def test_convert_opset_lowering_a_node_without_outputs_is_refused() -> None:
    # The lowering's message named the node by its first output, which this one lacks.
    with pytest.raises(
        onnax.OnnaxError, match=r"convert_opset: cannot write the model at ai.onnx opset 18.*Expand"
    ):
        onnax.convert_opset(expand_without_outputs([19]), 18)


def attention_model(q_shape: list[int], reshape_q: bool = False) -> onnx.ModelProto:
    """Attention(Q, K, V) at opset 23 with 4-D K and V; Q declared with `q_shape`, or (reshape_q)
    computed by a Reshape to that shape from a 4-D input, so only inference knows its rank."""
    kv = [2, 3, 4, 8]
    nodes = [helper.make_node("Attention", ["Q", "K", "V"], ["Y"])]
    inputs = [helper.make_tensor_value_info(n, F, kv) for n in ("K", "V")]
    initializers = []
    if reshape_q:
        nodes.insert(0, helper.make_node("Reshape", ["q4", "q_shape"], ["Q"]))
        inputs.insert(0, helper.make_tensor_value_info("q4", F, [2, 3, 4, 8]))
        initializers.append(helper.make_tensor("q_shape", TensorProto.INT64, [len(q_shape)], q_shape))
    else:
        inputs.insert(0, helper.make_tensor_value_info("Q", F, q_shape))
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("Y", F, None)], initializer=initializers
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def test_vmap_of_attention_with_a_query_of_rank_0_is_an_invalid_model(tmp_path: Path) -> None:
    # The fuzzer's input declared Q with shape []: vmap's Attention rule sized a vector by
    # rank - 1 = -1, an "internal error" (std::length_error) from the command line.
    words = "reads a query (input 0) of rank 0; Attention needs rank 3 or 4"
    assert_invalid_model(attention_model([]), ["vmap"], words, [onnax.vmap, onnax.jvp], tmp_path)


def test_vmap_of_attention_with_a_query_inference_finds_of_rank_2_is_an_invalid_model() -> None:
    with pytest.raises(
        onnax.OnnaxError, match=re.escape("reads a query (input 0) of rank 2; Attention needs")
    ):
        onnax.vmap(attention_model([6, 32], reshape_q=True))


def test_vmap_of_attention_with_a_4d_query_still_batches() -> None:
    result = onnax.vmap(attention_model([2, 3, 4, 8]))
    assert [o.name for o in result.graph.output] == ["Y"]


def conv_model(weight_shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        "g",
        [
            helper.make_tensor_value_info("x", F, [1, 1, 5, 5]),
            helper.make_tensor_value_info("W", F, weight_shape),
        ],
        [helper.make_tensor_value_info("y", F, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)


def test_a_conv_weight_of_another_rank_than_its_input_is_an_invalid_model(tmp_path: Path) -> None:
    # The fuzzer's input: a rank-7 weight for a rank-4 input. vjp's Conv transpose counted 5
    # spatial axes from the weight and read 5 begin pads from a list of 4 (a heap over-read
    # under ASan; "internal error" or heap bytes in the result without it).
    words = "has a weight (input 1) of rank 7 for an input of rank 4"
    m = conv_model([3, 5, 6, 6, 5, 3, 4])
    assert_invalid_model(m, ["vjp", "--inputs", "W"], words, [onnax.vjp, onnax.vmap], tmp_path)


def test_a_conv_weight_of_its_inputs_rank_still_differentiates() -> None:
    result = onnax.vjp(conv_model([2, 1, 3, 3]), inputs=["W"])
    assert [o.name for o in result.graph.output] == ["y", "W_cotangent"]


def roi_align_loss(output_height: int, dtype: int = F, opset: int = 22) -> onnx.ModelProto:
    """The fuzzer's model: RoiAlign with a huge output_height, reduced to a scalar loss."""
    nodes = [
        helper.make_node(
            "RoiAlign",
            ["X", "rois", "idx"],
            ["Y"],
            output_height=output_height,
            output_width=5,
            sampling_ratio=2,
        ),
        helper.make_node("ReduceSum", ["Y"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("X", dtype, ["n", 1, 10, 10]),
            helper.make_tensor_value_info("rois", dtype, [3, 4]),
            helper.make_tensor_value_info("idx", TensorProto.INT64, [3]),
        ],
        [helper.make_tensor_value_info("loss", dtype, [])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_roi_align_with_an_output_height_of_2_to_the_40_is_refused_without_allocating(tmp_path: Path) -> None:
    # Before: the derivative's sample table held output_height x sampling_ratio positions, so
    # grad of this 300-byte model allocated until memory ran out. Under a 2 GB address-space
    # limit the command must answer with the diagnostic, not run out of memory.
    path, out = tmp_path / "model.onnx", tmp_path / "grad.onnx"
    onnx.save(roi_align_loss(2**40), path)
    proc = subprocess.run(
        ["bash", "-c", f'ulimit -v 2000000; exec "{sys.executable}" -m onnax grad "{path}" -o "{out}"'],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "output_height 1099511627776 with sampling_ratio 2" in proc.stderr and "Fix:" in proc.stderr
    assert not out.exists()
    with pytest.raises(onnax.OnnaxError, match="output_height 1099511627776"):
        onnax.grad(roi_align_loss(2**40))


def test_roi_align_with_a_large_output_height_still_differentiates() -> None:
    # 5000 bins x 2 samples: the positions come from a Range. The loss is linear in X, so a
    # float64 central difference along a random direction is exact up to rounding.
    np = pytest.importorskip("numpy")
    ort = pytest.importorskip("onnxruntime")
    model = roi_align_loss(5000, TensorProto.DOUBLE, opset=18)  # (ONNX Runtime: double up to 18)
    g = onnax.grad(model, inputs=["X"])
    assert "Range" in {n.op_type for n in g.graph.node}
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 1, 10, 10))
    feeds = {
        "rois": np.array([[1.0, 1.5, 6.0, 7.5], [0.5, 2.0, 8.0, 4.0], [2.0, 0.0, 5.0, 9.0]]),
        "idx": np.array([0, 1, 1]),
    }
    # One thread: ONNX Runtime 1.31.1's ScatterND with reduction="add" (this gradient's
    # transpose of GatherND) loses updates to a race on several threads at this size.
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    loss, x_grad = ort.InferenceSession(g.SerializeToString(), options).run(None, {"X": x, **feeds})
    forward = ort.InferenceSession(model.SerializeToString())
    v, eps = rng.standard_normal(x.shape), 1e-3
    up, down = (forward.run(None, {"X": x + s * eps * v, **feeds})[0] for s in (1, -1))
    assert abs(float(loss) - float(forward.run(None, {"X": x, **feeds})[0])) < 1e-9
    np.testing.assert_allclose(float(np.sum(x_grad * v)), float((up - down) / (2 * eps)), rtol=1e-8)
