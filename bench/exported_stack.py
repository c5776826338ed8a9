"""A deep transformer as exporters write it, for the grad-transform scaling benchmark.

``vmap_scaling.chain_model`` is the cheapest graph there is to parse: one input and one output
per node, names of three to six characters and no attributes. Models exported from PyTorch
(``torch.onnx``'s TorchScript path, Hugging Face ``optimum``) look different: node names such as
``/layers.17/attn/q_proj/MatMul``, values named ``<node>_output_0``, attributes (perm, axis),
LayerNormalization, Softmax, Reshape/Transpose around the attention heads, and rules that emit
several nodes per source node. This module builds such a model: ``blocks`` pre-LN transformer
blocks of 29 nodes each over an input x[batch, seq, width], followed by a mean-square loss. The
blocks share their weights (one set of initializers), so the file is a graph, not a weight dump,
and parse+serialize measures the graph too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NODES_PER_BLOCK = 29
OPSET = 20


def weights(width: int) -> dict[str, np.ndarray]:
    """The blocks' shared weights (float32), by initializer name."""
    rng = np.random.default_rng(0)
    ff = 4 * width
    out: dict[str, np.ndarray] = {}
    for name, rows, cols in (
        ("Wq", width, width),
        ("Wk", width, width),
        ("Wv", width, width),
        ("Wo", width, width),
    ):
        out[name] = rng.standard_normal((rows, cols)) / math.sqrt(rows)
    out["W1"] = rng.standard_normal((width, ff)) / math.sqrt(width)
    out["W2"] = rng.standard_normal((ff, width)) / math.sqrt(ff)
    for name, n in (("bq", width), ("bk", width), ("bv", width), ("bo", width), ("c1", ff), ("c2", width)):
        out[name] = rng.standard_normal(n) * 0.1
    for name in ("ln1", "ln2"):
        out[f"{name}_g"] = 1.0 + rng.standard_normal(width) * 0.1
        out[f"{name}_b"] = rng.standard_normal(width) * 0.1
    return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}


def stack_loss_model(
    blocks: int, width: int = 16, heads: int = 2, seq: int = 4, batch: int = 2
) -> onnx.ModelProto:
    """``blocks`` pre-LN transformer blocks (x + Attn(LN1(x)), then + MLP(LN2(.))) and
    ``loss = mean(y * y)`` in float32; 29 nodes per block plus 2."""
    dh = width // heads
    inits = [numpy_helper.from_array(v, k) for k, v in weights(width).items()]
    inits += [
        numpy_helper.from_array(np.array([batch, seq, heads, dh], np.int64), "heads_shape"),
        numpy_helper.from_array(np.array([batch, seq, width], np.int64), "flat_shape"),
        numpy_helper.from_array(np.array(1.0 / math.sqrt(dh), np.float32), "scale"),
    ]
    nodes: list[onnx.NodeProto] = []
    used: dict[str, int] = {}

    def op(scope: str, op_type: str, inputs: list[str], **attrs: Any) -> str:
        # TorchScript-export naming: "<scope>/<Op>", "<scope>/<Op>_<k>" for the k-th repeat.
        key = f"{scope}/{op_type}"
        k = used.get(key, 0)
        used[key] = k + 1
        name = key if k == 0 else f"{key}_{k}"
        nodes.append(helper.make_node(op_type, inputs, [f"{name}_output_0"], name=name, **attrs))
        return f"{name}_output_0"

    x = "x"
    for layer in range(blocks):
        p = f"/layers.{layer}"
        ln1 = op(f"{p}/ln1", "LayerNormalization", [x, "ln1_g", "ln1_b"], axis=-1)
        proj = {}
        for w, b in (("q", "bq"), ("k", "bk"), ("v", "bv")):
            scope = f"{p}/attn/{w}_proj"
            proj[w] = op(scope, "Add", [op(scope, "MatMul", [ln1, f"W{w}"]), b])
        a = f"{p}/attn"
        qh = op(a, "Transpose", [op(a, "Reshape", [proj["q"], "heads_shape"])], perm=[0, 2, 1, 3])
        kt = op(a, "Transpose", [op(a, "Reshape", [proj["k"], "heads_shape"])], perm=[0, 2, 3, 1])
        vh = op(a, "Transpose", [op(a, "Reshape", [proj["v"], "heads_shape"])], perm=[0, 2, 1, 3])
        probs = op(a, "Softmax", [op(a, "Mul", [op(a, "MatMul", [qh, kt]), "scale"])], axis=-1)
        heads_out = op(a, "MatMul", [probs, vh])
        merged = op(a, "Reshape", [op(a, "Transpose", [heads_out], perm=[0, 2, 1, 3]), "flat_shape"])
        attn = op(f"{a}/out_proj", "Add", [op(f"{a}/out_proj", "MatMul", [merged, "Wo"]), "bo"])
        r1 = op(p, "Add", [x, attn])
        ln2 = op(f"{p}/ln2", "LayerNormalization", [r1, "ln2_g", "ln2_b"], axis=-1)
        f1 = op(f"{p}/mlp/fc1", "Add", [op(f"{p}/mlp/fc1", "MatMul", [ln2, "W1"]), "c1"])
        act = op(f"{p}/mlp/act", "Gelu", [f1])
        f2 = op(f"{p}/mlp/fc2", "Add", [op(f"{p}/mlp/fc2", "MatMul", [act, "W2"]), "c2"])
        x = op(p, "Add", [r1, f2])
    op("/loss", "ReduceMean", [op("/loss", "Mul", [x, x])], keepdims=0)
    nodes[-1].output[0] = "loss"
    graph = helper.make_graph(
        nodes,
        f"transformer_stack{blocks}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, width])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return model


def blocks_for(n_nodes: int) -> int:
    """The number of blocks whose model has about ``n_nodes`` nodes."""
    return max(1, round((n_nodes - 2) / NODES_PER_BLOCK))


_erf = np.vectorize(math.erf)


def numpy_loss(x: np.ndarray, w: dict[str, np.ndarray], blocks: int, heads: int = 2) -> float:
    """The model's loss in float64 NumPy: an oracle independent of ONNX (the ONNX reference
    evaluator computes Erf, hence Gelu, to float32 precision only)."""
    w = {k: np.asarray(v, dtype=np.float64) for k, v in w.items()}
    batch, seq, width = x.shape
    dh = width // heads

    def layer_norm(v: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        centred = v - v.mean(axis=-1, keepdims=True)
        return centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5) * g + b

    def split(v: np.ndarray) -> np.ndarray:  # [batch, seq, width] -> [batch, heads, seq, dh]
        return v.reshape(batch, seq, heads, dh).transpose(0, 2, 1, 3)

    h = np.asarray(x, dtype=np.float64)
    for _ in range(blocks):
        a = layer_norm(h, w["ln1_g"], w["ln1_b"])
        q, k, v = (split(a @ w[f"W{n}"] + w[f"b{n}"]) for n in "qkv")
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        h = h + (p @ v).transpose(0, 2, 1, 3).reshape(batch, seq, width) @ w["Wo"] + w["bo"]
        f = layer_norm(h, w["ln2_g"], w["ln2_b"]) @ w["W1"] + w["c1"]
        h = h + (0.5 * f * (1.0 + _erf(f / math.sqrt(2.0)))) @ w["W2"] + w["c2"]
    return float(np.mean(h * h))
