"""Models crafted to crash, hang or exhaust a tool (from a fuzzing probe of onnax): each gets a
clear diagnostic and exit code 1 from the command line (an OnnaxError in Python), never a
segfault, an "internal error", a hang or a silently accepted invalid node. Valid neighbours of
the same ops still transform, and their results run in ONNX Runtime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

onnax = pytest.importorskip("onnax")

F = TensorProto.FLOAT
OPSET = helper.make_opsetid("", 18)
BOMB_DOMAIN = helper.make_opsetid("bomb", 1)


def model(
    nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
) -> onnx.ModelProto:
    return helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=10,
    )


def body_with_unnamed_output() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Identity", ["c"], ["co"]), helper.make_node("Identity", ["s"], ["so"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s", F, [2]),
        ],
        [
            helper.make_tensor_value_info("co", TensorProto.BOOL, []),
            helper.make_tensor_value_info("", F, [2]),
        ],
    )


def branch_with_unnamed_output() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Identity", ["x"], ["z"])],
        "branch",
        [],
        [helper.make_tensor_value_info("", F, [2])],
    )


x2 = helper.make_tensor_value_info("x", F, [2, 2])
CASES = {
    # (model, transform, words the diagnostic must contain)
    "einsum_without_equation": (
        model(
            [helper.make_node("Einsum", ["x"], ["y"])], [x2], [helper.make_tensor_value_info("y", F, None)]
        ),
        "vmap",
        ["Einsum", "required attribute 'equation'"],
    ),
    "einsum_arrow_without_dash": (
        model(
            [helper.make_node("Einsum", ["x"], ["y"], equation="ij>ji")],
            [x2],
            [helper.make_tensor_value_info("y", F, None)],
        ),
        "jvp",
        ["Einsum", "ij>ji", "character '>'"],
    ),
    "loop_body_output_unnamed": (
        model(
            [
                helper.make_node("Constant", [], ["n"], value=numpy_helper.from_array(np.array(2, np.int64))),
                helper.make_node("Loop", ["n", "", "x"], ["y"], body=body_with_unnamed_output()),
            ],
            [helper.make_tensor_value_info("x", F, [2])],
            [helper.make_tensor_value_info("y", F, [2])],
        ),
        "vjp",
        ["Loop", "unnamed output"],
    ),
    "if_branch_output_unnamed": (
        model(
            [
                helper.make_node(
                    "If",
                    ["c"],
                    ["y"],
                    then_branch=branch_with_unnamed_output(),
                    else_branch=branch_with_unnamed_output(),
                )
            ],
            [
                helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                helper.make_tensor_value_info("x", F, [2]),
            ],
            [helper.make_tensor_value_info("y", F, [2])],
        ),
        "jvp",
        ["If", "unnamed output"],
    ),
    "lrn_on_rank_1": (
        model(
            [helper.make_node("LRN", ["x"], ["y"], size=3)],
            [helper.make_tensor_value_info("x", F, [5])],
            [helper.make_tensor_value_info("y", F, [5])],
        ),
        "vjp",
        ["LRN", "rank 1"],
    ),
    "conv_on_rank_1": (
        model(
            [helper.make_node("Conv", ["x", "w"], ["y"])],
            [helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("w", F, [3])],
            [helper.make_tensor_value_info("y", F, None)],
        ),
        "vjp",
        ["Conv", "rank 1"],
    ),
    "average_pool_strides_shorter_than_kernel": (
        model(
            [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[1])],
            [helper.make_tensor_value_info("x", F, [1, 1, 4, 4])],
            [helper.make_tensor_value_info("y", F, None)],
        ),
        "vjp",
        ["AveragePool", "strides of 1 entries; expected 2"],
    ),
    "max_pool_pads_not_two_per_axis": (
        model(
            [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1])],
            [helper.make_tensor_value_info("x", F, [1, 1, 4, 4])],
            [helper.make_tensor_value_info("y", F, None)],
        ),
        "grad",
        ["MaxPool", "pads of 2 entries; expected 4"],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_crafted_model_gets_a_diagnostic_and_exit_code_1(name: str, tmp_path: Path) -> None:
    m, transform, words = CASES[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, path)
    args = [transform, str(path), "-o", str(tmp_path / "out.onnx")]
    if transform == "grad":
        args = ["vjp", str(path), "-o", str(tmp_path / "out.onnx")]
    proc = subprocess.run(
        [sys.executable, "-m", "onnax", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 1, proc.stderr
    assert "invalid model" in proc.stderr and "Fix:" in proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
    assert not (tmp_path / "out.onnx").exists()
    with pytest.raises(onnax.OnnaxError, match="invalid model"):
        {"vmap": onnax.vmap, "jvp": onnax.jvp, "vjp": onnax.vjp, "grad": onnax.vjp}[transform](m)


def test_a_dimension_of_2_to_the_40_is_not_materialized(tmp_path: Path) -> None:
    """An int64 input declared [2^40] feeding Cast made ONNX's data propagation allocate one dim
    per element. The transform now finishes (in a subprocess with a timeout, so a regression
    fails instead of hanging the suite) and declares the batched shape."""
    m = model(
        [helper.make_node("Cast", ["x"], ["y"], to=F)],
        [helper.make_tensor_value_info("x", TensorProto.INT64, [2**40])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    path = tmp_path / "bomb.onnx"
    onnx.save(m, path)
    out = tmp_path / "out.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "onnax", "vmap", str(path), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = onnx.load(out)
    onnx.checker.check_model(result)
    dims = [
        d.dim_value if d.HasField("dim_value") else d.dim_param
        for d in result.graph.input[0].type.tensor_type.shape.dim
    ]
    assert dims[1:] == [2**40]


def test_valid_pools_with_full_attribute_lists_still_transform_exactly() -> None:
    m = model(
        [
            helper.make_node(
                "AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[1, 2], pads=[0, 1, 1, 0]
            )
        ],
        [helper.make_tensor_value_info("x", F, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    xs = np.random.default_rng(0).standard_normal((3, 1, 1, 4, 4)).astype(np.float32)
    batched = ort.InferenceSession(onnax.vmap(m).SerializeToString(), providers=["CPUExecutionProvider"])
    single = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = batched.run(None, {"x": xs})[0]
    for b in range(3):
        np.testing.assert_allclose(got[b], single.run(None, {"x": xs[b]})[0], rtol=1e-6)


def _nested_functions(depth: int, recursive: bool = False) -> onnx.ModelProto:
    """f0(x) = Relu(x); f_k(x) = f_{k-1}(f_{k-1}(x)): 2^depth Relus once inlined (a few KB)."""
    functions = [
        helper.make_function("bomb", "f0", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])], [OPSET])
    ]
    for k in range(1, depth + 1):
        inner = f"f{k - 1}" if not (recursive and k == depth) else f"f{k}"
        nodes = [
            helper.make_node(inner, ["x"], ["h"], domain="bomb"),
            helper.make_node(inner, ["h"], ["y"], domain="bomb"),
        ]
        functions.append(
            helper.make_function(
                "bomb", f"f{k}", ["x"], ["y"], nodes, [OPSET, helper.make_opsetid("bomb", 1)]
            )
        )
    graph = helper.make_graph(
        [helper.make_node(f"f{depth}", ["x"], ["y"], domain="bomb")],
        "g",
        [helper.make_tensor_value_info("x", F, [3])],
        [helper.make_tensor_value_info("y", F, [3])],
    )
    model = helper.make_model(graph, opset_imports=[OPSET, BOMB_DOMAIN], functions=functions, ir_version=10)
    return model


BOMBS = [(30, False, "more than 16777216 nodes"), (3, True, "calls itself")]


@pytest.mark.parametrize(("depth", "recursive", "words"), BOMBS)
def test_function_bombs_are_measured_before_inlining(
    depth: int, recursive: bool, words: str, tmp_path: Path
) -> None:
    m = _nested_functions(depth, recursive)
    assert m.ByteSize() < 4000
    path = tmp_path / "bomb.onnx"
    onnx.save(m, path)
    proc = subprocess.run(
        [sys.executable, "-m", "onnax", "vmap", str(path), "-o", str(tmp_path / "out.onnx")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and words in proc.stderr and "Fix:" in proc.stderr, proc.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_nested_functions_below_the_limit_are_inlined_and_exact() -> None:
    m = _nested_functions(6)  # 64 Relus
    out = onnax.vmap(m)
    assert sum(n.op_type == "Relu" for n in out.graph.node) == 64
    x = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.0]], np.float32)
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x, 0))


def test_control_characters_in_model_names_are_escaped_in_messages() -> None:
    # A NUL would cut the message short; a terminal escape would act on the user's terminal.
    name = "x\x1b[2J\x00hidden"
    m = model(
        [helper.make_node("Relu", [name], ["y"])],
        [helper.make_tensor_value_info(name, F, [3])],
        [helper.make_tensor_value_info("y", F, [3])],
    )
    with pytest.raises(onnax.OnnaxError) as info:
        onnax.vmap(m, in_axes=5)
    message = str(info.value)
    assert "x\\x1b[2J\\x00hidden" in message, message
    assert "\x00" not in message and "\x1b" not in message
    assert "Fix:" in message


def _nested_ifs(levels: int) -> onnx.ModelProto:
    """If inside If, `levels` deep (one branch nests, the other is a leaf)."""
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y0"])],
        "b0",
        [],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2])],
    )
    for i in range(1, levels + 1):
        leaf = helper.make_graph(
            [helper.make_node("Identity", ["x"], [f"e{i}"])],
            f"e{i}",
            [],
            [helper.make_tensor_value_info(f"e{i}", TensorProto.FLOAT, [2])],
        )
        node = helper.make_node("If", ["c"], [f"y{i}"], then_branch=g, else_branch=leaf)
        g = helper.make_graph(
            [node], f"b{i}", [], [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2])]
        )
    main = helper.make_graph(
        list(g.node),
        "main",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info(f"y{levels}", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(main, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_a_result_nested_past_protobufs_limit_is_refused(tmp_path: Path) -> None:
    """31 nested Ifs parse; vmapped with a batched condition each example runs in a loop of its
    own, one level more: past the 100 messages protobuf readers accept. Refused (exit 1, no file)
    instead of written unreadable; 30 levels work and load."""
    import onnax

    deep = _nested_ifs(31)
    onnx.save(deep, tmp_path / "deep.onnx")
    cmd = [
        sys.executable,
        "-m",
        "onnax",
        "vmap",
        str(tmp_path / "deep.onnx"),
        "-o",
        str(tmp_path / "out.onnx"),
    ]
    r = subprocess.run([*cmd, "--in-axes", "0,0"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1 and "protobuf readers accept" in r.stderr and "Fix:" in r.stderr, r.stderr
    assert not (tmp_path / "out.onnx").exists()
    with pytest.raises(onnax.OnnaxError, match=r"nest past the 100 messages"):
        onnax.vmap(deep, in_axes=0)
    ok = onnax.vmap(_nested_ifs(30), in_axes=0)
    onnx.checker.check_model(onnx.load_from_string(ok.SerializeToString()))
    # Every branch returns x: each example gets its own x back, whatever its condition.
    xs = np.arange(6, dtype=np.float32).reshape(3, 2)
    session = ort.InferenceSession(ok.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"c": np.array([True, False, True]), "x": xs})[0]
    np.testing.assert_array_equal(got, xs)
