"""A two-layer message-passing graph network with symbolic node and edge counts.

Built with ``onnx.helper`` the way graph-network exporters emit it (seed 002): the node count
``num_nodes`` and edge count ``num_edges`` are ``dim_param`` s, the aggregation buffer's size
comes from ``Shape(nodes)`` (never a baked integer), learned weights are initializers.

    m1 = Relu(Gather(h0, senders) @ W1 + b1)          messages on edges
    a1 = ScatterND(zeros[N, 8], receivers, m1, add)   sum per receiving node
    h1 = Relu(Concat(h0, a1) @ U1 + c1)
    m2 = Tanh(Gather(h1, senders) @ W2)
    a2 = ScatterElements(zeros[N, 8], receivers, m2, axis 0, add)
    h2 = h1 + a2 @ U2
    pred = h2 @ w_out;  loss = mean(pred^2)

References: float64 finite differences and per-example loops (:mod:`fd_refs`); run
``python -m conformance.corpus.gnn``.
"""

from __future__ import annotations

from importlib import metadata

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conformance.corpus import artifacts, fd_refs

NAME = "gnn_message_passing"
F = TensorProto.FLOAT
NUM_NODES, NUM_EDGES = 5, 9  # concrete sizes of the reference inputs
PARAM_SHAPES = {
    "W1": (4, 8),
    "b1": (8,),
    "U1": (12, 8),
    "c1": (8,),
    "W2": (8, 8),
    "U2": (8, 8),
    "w_out": (8, 1),
}


def build(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    params = {n: (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s in PARAM_SHAPES.items()}
    consts = {
        "axis0": np.asarray([0], np.int64),
        "axis1": np.asarray([1], np.int64),
        "width": np.asarray([8], np.int64),
        "zero": np.asarray([0], np.int64),
        "one": np.asarray([1], np.int64),
    }
    n = helper.make_node
    nodes = [
        # zeros[N, 8] sized from the node tensor, so N stays symbolic
        n("Shape", ["nodes"], ["nodes_shape"]),
        n("Slice", ["nodes_shape", "zero", "one"], ["num_nodes"]),
        n("Concat", ["num_nodes", "width"], ["agg_shape"], axis=0),
        n("ConstantOfShape", ["agg_shape"], ["agg_zeros"], value=helper.make_tensor("z", F, [1], [0.0])),
        # layer 1: ScatterND with reduction add
        n("Gather", ["nodes", "senders"], ["h0_src"], axis=0),
        n("MatMul", ["h0_src", "W1"], ["m1_lin"]),
        n("Add", ["m1_lin", "b1"], ["m1_pre"]),
        n("Relu", ["m1_pre"], ["m1"]),
        n("Unsqueeze", ["receivers", "axis1"], ["recv_col"]),
        n("ScatterND", ["agg_zeros", "recv_col", "m1"], ["a1"], reduction="add"),
        n("Concat", ["nodes", "a1"], ["h0_a1"], axis=1),
        n("MatMul", ["h0_a1", "U1"], ["h1_lin"]),
        n("Add", ["h1_lin", "c1"], ["h1_pre"]),
        n("Relu", ["h1_pre"], ["h1"]),
        # layer 2: ScatterElements with reduction add
        n("Gather", ["h1", "senders"], ["h1_src"], axis=0),
        n("MatMul", ["h1_src", "W2"], ["m2_lin"]),
        n("Tanh", ["m2_lin"], ["m2"]),
        n("Shape", ["m2"], ["m2_shape"]),
        n("Expand", ["recv_col", "m2_shape"], ["recv_full"]),
        n("ScatterElements", ["agg_zeros", "recv_full", "m2"], ["a2"], axis=0, reduction="add"),
        n("MatMul", ["a2", "U2"], ["a2_lin"]),
        n("Add", ["h1", "a2_lin"], ["h2"]),
        n("MatMul", ["h2", "w_out"], ["pred"]),
        n("Mul", ["pred", "pred"], ["pred_sq"]),
        n("ReduceMean", ["pred_sq"], ["loss"], keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.asarray(v), name=k) for k, v in {**params, **consts}.items()]
    graph = helper.make_graph(
        nodes,
        NAME,
        [
            helper.make_tensor_value_info("nodes", F, ["num_nodes", 4]),
            helper.make_tensor_value_info("senders", TensorProto.INT64, ["num_edges"]),
            helper.make_tensor_value_info("receivers", TensorProto.INT64, ["num_edges"]),
        ],
        [
            helper.make_tensor_value_info("loss", F, []),
            helper.make_tensor_value_info("pred", F, ["num_nodes", 1]),
        ],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="onnax-corpus"
    )
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def example(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "nodes": rng.standard_normal((NUM_NODES, 4)).astype(np.float32),
        "senders": rng.integers(0, NUM_NODES, size=NUM_EDGES).astype(np.int64),
        "receivers": rng.integers(0, NUM_NODES, size=NUM_EDGES).astype(np.int64),
    }


def generate(seed: int = 0) -> str:
    model = build(seed)
    rng = np.random.default_rng(seed + 1)
    base = example(rng)
    batch = [example(rng) for _ in range(3)]
    params = list(PARAM_SHAPES)
    arrays = fd_refs.write_references(
        model, "loss", params, ["nodes", *params], ["nodes", *params], base, batch, seed
    )
    manifest = artifacts.Manifest(
        name=NAME,
        description="2-layer message-passing GNN (Gather, ScatterND / ScatterElements add, MatMul, "
        "Relu, Tanh), symbolic num_nodes / num_edges",
        origin=f"built with onnx.helper (onnx {metadata.version('onnx')}), float32, opset 18",
        reference="float64 central differences and per-example loops (tests/python oracles)",
        loss="loss",
        params=params,
        jvp_inputs=["nodes", *params],
        vjp_inputs=["nodes", *params],
        outputs=["loss", "pred"],
        batch=len(batch),
        quick=True,
        notes=[
            "vmap batches whole graphs of equal size: nodes [batch, num_nodes, 4], edges [batch, num_edges]"
        ],
        reference_by_transform={t: "fd" for t in ("grad", "jvp", "vjp", "vmap_grad", "jvp_grad")}
        | {"vmap": "loop"},
        # Against finite differences (truncation ~1e-9, rounding ~1e-10 relative; HVP by a
        # difference of differences, ~1e-7) the float32 model's own rounding dominates.
        tolerances={
            "vmap": 1e-5,
            "grad": 1e-4,
            "jvp": 1e-4,
            "vjp": 1e-4,
            "vmap_grad": 1e-4,
            "jvp_grad": 1e-3,
        },
    )
    artifacts.MODELS_DIR.mkdir(exist_ok=True)
    onnx_path, _, _ = artifacts.paths(NAME)
    onnx.save(model, onnx_path)
    artifacts.write_manifest(manifest)
    artifacts.write_arrays(NAME, arrays)
    return NAME


if __name__ == "__main__":
    print(f"wrote {generate()}")
