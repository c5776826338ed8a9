"""Exports the JAX-side models of the exporter corpus
(``tests/python/conformance_suite/test_exporter_corpus.py``) and computes their references with JAX
in float64.

Run with a Python that has Keras 3, JAX, Flax and jax2onnx (never the project's .venv, which has
no Keras; never requirements.txt):

    python3 -m venv /tmp/kerasjax-venv
    /tmp/kerasjax-venv/bin/pip install keras jax flax jax2onnx==0.17.1 onnx
    /tmp/kerasjax-venv/bin/python tests/python/models/exporters/generate_jax.py [NAME ...]

Writes, next to this file, ``NAME.onnx`` and ``NAME.npz`` for

* ``keras_jax_cnn``: Keras 3 on the JAX backend, Conv2D(relu) -> AveragePooling2D -> Flatten ->
  Dense(sigmoid) -> Dense, exported by ``model.export(format="onnx")`` (Keras hands it to jax2onnx);
  ``loss = sum(y^2)`` appended as ONNX nodes (Keras exports the forward pass only).
  (MaxPooling2D is left out: this Keras/jax2onnx pair writes a MaxPool that ONNX Runtime
  rejects, "Unsupported pooling size", an exporter problem; tanh too: Keras 3.15's JAX tanh
  computes a float64 input in float32, which would spoil the reference.)
* ``jax2onnx_gpt``: jax2onnx's shipped GPT example (``jax2onnx.plugins.examples.nnx.gpt.GPT``,
  ``@onnx_function`` modules, weights as Constant nodes inside the functions) at a small size,
  int32 tokens and the run-time ``deterministic`` flag of its test case; ``loss = sum(logits^2)``
  in the same export. Differentiated w.r.t. its weights.
* ``jax2onnx_vit``: jax2onnx's shipped ViT example (``...examples.nnx.vit.VisionTransformer``,
  conv embedding, its default dropout rates 0.1 with ``deterministic`` at run time) at a small
  size; ``loss = sum(log_probs^2)``. Differentiated w.r.t. the image.

Each ``.npz`` (the layout ``test_exporter_corpus.py`` reads):

* ``feed/<input>``: every runtime input (float32 / int32 / bool), ``vmap/<input>``: the inputs
  stacked on a new leading axis for vmap (inputs without a stack are shared);
* ``wrt``: the differentiated names, a runtime input's name or ``param:<k>`` for the weight
  stored as ``param/<k>`` (in the export's layout: the test finds it among the initializers
  that ``onnax.constants_to_initializers`` makes, by value);
* JAX float64 answers: ``loss``, ``grad/<j>``, ``tangent/<j>`` (a direction, float32),
  ``jvp_loss`` (jax.jvp of the loss along it), ``hvp/<j>`` (jax.jvp of jax.grad),
  ``vmap_loss`` and ``vmap_grad/<j>`` (per stacked example).

Every reference is checked to compute in float64 throughout (its jaxpr has no narrower float):
flax's attention calls ``jax.nn.dot_product_attention``, whose softmax runs in float32, so the
references use the same formula in float64 (``_attention64``).

The float32 weights are perturbed once after initialization so that no two are equal (LayerNorm
scales all start at one), which makes each one findable by value.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np
import onnx
from onnx import helper, numpy_helper

HERE = Path(__file__).resolve().parent
STACK = 3  # examples on the vmap axis


def _save(name: str, arrays: dict[str, Any]) -> None:
    np.savez(HERE / f"{name}.npz", **arrays)


def _references(
    loss64: Callable[..., Any],
    wrt: Sequence[Any],
    feeds: dict[str, np.ndarray],
    examples: list[tuple[list[np.ndarray], dict[str, np.ndarray]]],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """``loss64(wrt_values, feeds)`` in float64: the loss, its gradient, a JVP and an HVP along
    a random direction, and the loss and gradient of each ``(wrt_values, feeds)`` example."""
    import jax

    w64 = [np.asarray(w, np.float64) for w in wrt]
    jaxpr = str(jax.make_jaxpr(lambda ws: loss64(ws, feeds))(w64))
    if "f32[" in jaxpr or "f16[" in jaxpr:
        raise RuntimeError("the float64 reference computes in a narrower float type somewhere")
    tangents = [rng.standard_normal(w.shape).astype(np.float32) for w in w64]
    t64 = [t.astype(np.float64) for t in tangents]

    def value_and_grad(w: list[Any], f: dict[str, np.ndarray]) -> tuple[Any, Any]:
        return jax.value_and_grad(lambda ws: loss64(ws, f))(w)

    loss, g = value_and_grad(w64, feeds)
    _, jvp_loss = jax.jvp(lambda ws: loss64(ws, feeds), (w64,), (t64,))
    _, hvp = jax.jvp(lambda ws: jax.grad(lambda u: loss64(u, feeds))(ws), (w64,), (t64,))
    per = [value_and_grad([np.asarray(w, np.float64) for w in ws], f) for ws, f in examples]
    out: dict[str, np.ndarray] = {
        "loss": np.asarray(loss),
        "jvp_loss": np.asarray(jvp_loss),
        "vmap_loss": np.asarray([float(lo) for lo, _ in per]),
    }
    for j in range(len(w64)):
        out[f"grad/{j}"] = np.asarray(g[j])
        out[f"tangent/{j}"] = tangents[j]
        out[f"hvp/{j}"] = np.asarray(hvp[j])
        out[f"vmap_grad/{j}"] = np.stack([np.asarray(gr[j]) for _, gr in per])
    return out


# -- Keras 3, JAX backend ----------------------------------------------------------------------


def keras_jax_cnn() -> Callable[[], None]:
    """Exports now (JAX still in float32); returns the reference step (run after x64 is on)."""
    import keras

    layers = keras.layers

    def build(dtype: str) -> Any:
        return keras.Sequential(
            [
                keras.Input((6, 6, 2), dtype=dtype, name="x"),
                layers.Conv2D(4, 3, padding="same", activation="relu", dtype=dtype),
                layers.AveragePooling2D(2, dtype=dtype),
                layers.Flatten(dtype=dtype),
                layers.Dense(5, activation="sigmoid", dtype=dtype),
                layers.Dense(3, dtype=dtype),
            ]
        )

    keras.utils.set_random_seed(4)
    m32 = build("float32")
    m32(np.zeros((1, 6, 6, 2), np.float32))  # (Keras exports only a model that has been called)
    path = HERE / "keras_jax_cnn.onnx"
    m32.export(str(path), format="onnx", verbose=False)
    proto = onnx.load(path)
    (out,) = [o.name for o in proto.graph.output]
    proto.graph.node.extend(
        [
            helper.make_node("Mul", [out, out], ["loss_squares"]),
            helper.make_node("ReduceSum", ["loss_squares"], ["loss"], keepdims=0),
        ]
    )
    del proto.graph.output[:]
    proto.graph.output.append(helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, []))
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, path)
    (x_name,) = [i.name for i in proto.graph.input]
    weights = [w.copy() for w in m32.get_weights()]

    def refs() -> None:
        import jax.numpy as jnp

        m64 = build("float64")
        m64.set_weights([w.astype(np.float64) for w in weights])

        def loss64(ws: list[Any], _feeds: dict[str, np.ndarray]) -> Any:
            return jnp.sum(jnp.square(m64(ws[0], training=False)))

        rng = np.random.default_rng(4)
        x = rng.standard_normal((2, 6, 6, 2)).astype(np.float32)
        xs = rng.standard_normal((STACK, 2, 6, 6, 2)).astype(np.float32)
        arrays = _input_refs(loss64, x_name, {x_name: x}, {x_name: xs}, rng)
        _save("keras_jax_cnn", arrays)

    return refs


def _input_refs(
    loss64: Callable[..., Any],
    x_name: str,
    feeds: dict[str, np.ndarray],
    stacks: dict[str, np.ndarray],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """References w.r.t. the runtime input ``x_name``; the other feeds are passed through."""
    rest = {k: v for k, v in feeds.items() if k != x_name}

    def f(ws: list[Any], fd: dict[str, np.ndarray]) -> Any:
        return loss64(ws, {**rest, **fd})

    examples = [
        ([stacks[x_name][i]], {k: v[i] for k, v in stacks.items() if k != x_name}) for i in range(STACK)
    ]
    base = _references(f, [feeds[x_name]], rest, examples, rng)
    return {
        **{f"feed/{k}": v for k, v in feeds.items()},
        **{f"vmap/{k}": v for k, v in stacks.items()},
        "wrt": np.asarray([x_name]),
        **base,
    }


# -- jax2onnx examples -------------------------------------------------------------------------


def _perturbed(module: Any, seed: int) -> Any:
    """Every float parameter + 0.05 N(0, 1), so that no two are equal."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params, rest = nnx.split(module, nnx.Param, ...)  # type: ignore[misc]
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda p: (
            p + jnp.asarray(0.05 * rng.standard_normal(p.shape), p.dtype)
            if jnp.issubdtype(p.dtype, jnp.floating)
            else p
        ),
        params,
    )
    return nnx.merge(graphdef, params, rest)


def _float_constants(proto: onnx.ModelProto) -> list[np.ndarray]:
    """The float ``value`` tensors of Constant nodes in the graph and its local functions."""
    nodes = [*proto.graph.node, *(n for f in proto.functions for n in f.node)]
    found = []
    for n in nodes:
        if n.op_type != "Constant":
            continue
        for a in n.attribute:
            if a.name == "value" and a.t.data_type == onnx.TensorProto.FLOAT:
                found.append(numpy_helper.to_array(a.t))
    return found


def _locate(leaf: np.ndarray, constants: list[np.ndarray]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The permutation and shape with ``reshape(transpose(leaf, perm), shape)`` a Constant."""
    hits = []
    for c in constants:
        if c.size != leaf.size or c.ndim == 0:
            continue
        for perm in itertools.permutations(range(leaf.ndim)):
            if np.array_equal(np.transpose(leaf, perm).reshape(c.shape), c):
                hits.append((perm, tuple(c.shape)))
                break
    if len({(p, s) for p, s in hits}) != 1:
        raise RuntimeError(f"a weight of shape {leaf.shape} matches {len(hits)} Constant nodes")
    return hits[0]


def _jax2onnx_export(
    name: str, module: Any, inputs: list[Any], input_names: list[str]
) -> tuple[onnx.ModelProto, Callable[..., Any]]:
    import jax.numpy as jnp
    from jax2onnx import to_onnx

    def loss(x: Any, deterministic: bool = True) -> Any:
        return jnp.sum(jnp.square(module(x, deterministic=deterministic)))

    proto = to_onnx(
        loss,
        inputs,
        input_params={"deterministic": True},
        input_names=input_names,
        output_names=["loss"],
        model_name=name,
    )
    onnx.save(proto, HERE / f"{name}.onnx")
    return proto, loss


def _attention64(query: Any, key: Any, value: Any, bias: Any = None, mask: Any = None, **kw: Any) -> Any:
    """``jax.nn.dot_product_attention`` (which flax's ``nnx.dot_product_attention`` calls) in
    the inputs' precision: JAX's own casts the logits to float32 for the softmax."""
    import jax
    import jax.numpy as jnp

    if kw.get("is_causal") or kw.get("scale") is not None:
        raise NotImplementedError(kw)
    logits = jnp.einsum("...qhd,...khd->...hqk", query, key) / jnp.sqrt(query.shape[-1]).astype(query.dtype)
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jnp.einsum("...hqk,...khd->...qhd", jax.nn.softmax(logits, axis=-1), value)


def _pure64(module: Any) -> tuple[Callable[..., Any], list[np.ndarray]]:
    """``apply(param_leaves, x)`` on a float64 copy of ``module`` (deterministic), and the
    float32 leaves in order."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params, rest = nnx.split(module, nnx.Param, ...)  # type: ignore[misc]
    leaves, p_def = jax.tree.flatten(params)
    r_leaves, r_def = jax.tree.flatten(rest)
    r64 = [jnp.asarray(v, jnp.float64) if jnp.issubdtype(v.dtype, jnp.floating) else v for v in r_leaves]

    def apply(p_leaves: list[Any], x: Any) -> Any:
        full = [
            jnp.asarray(p, jnp.float64) if jnp.issubdtype(jnp.asarray(p).dtype, jnp.floating) else p
            for p in p_leaves
        ]
        m = nnx.merge(graphdef, jax.tree.unflatten(p_def, full), jax.tree.unflatten(r_def, r64))
        for _, sub in nnx.iter_graph(m):  # nnx.Embed fixes its dtype to its table's: float32
            if isinstance(sub, nnx.Module) and getattr(sub, "dtype", None) == jnp.float32:
                setattr(sub, "dtype", jnp.float64)  # noqa: B010
        with mock.patch("jax.nn.dot_product_attention", _attention64):
            return jnp.sum(jnp.square(m(x, deterministic=True)))

    return apply, [np.asarray(v) for v in leaves]


def jax2onnx_gpt() -> Callable[[], None]:
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax2onnx.plugins.examples.nnx.gpt import GPT

    module = GPT(vocab_size=20, n_layer=2, n_head=2, n_embd=8, block_size=4, dropout=0.0, rngs=nnx.Rngs(0))
    module = _perturbed(module, 5)
    proto, _ = _jax2onnx_export(
        "jax2onnx_gpt", module, [jax.ShapeDtypeStruct(("B", 4), jnp.int32)], ["tokens"]
    )

    def refs() -> None:
        apply, leaves = _pure64(module)
        constants = _float_constants(proto)
        floats = [i for i, v in enumerate(leaves) if np.issubdtype(v.dtype, np.floating)]
        sites = {i: _locate(leaves[i], constants) for i in floats}
        rng = np.random.default_rng(5)
        tokens = rng.integers(0, 20, (2, 4)).astype(np.int32)
        stack = rng.integers(0, 20, (STACK, 2, 4)).astype(np.int32)

        def loss64(ws: list[Any], feeds: dict[str, np.ndarray]) -> Any:
            full: list[Any] = list(leaves)
            for i, w in zip(floats, ws, strict=True):
                full[i] = w
            return apply(full, feeds["tokens"])

        def to_onnx_layout(i: int, v: Any) -> np.ndarray:
            perm, shape = sites[i]
            return np.transpose(np.asarray(v), perm).reshape(shape)

        wrt = [leaves[i] for i in floats]
        arrays = _references(loss64, wrt, {"tokens": tokens}, [(wrt, {"tokens": t}) for t in stack], rng)
        for j, i in enumerate(floats):
            for key in ("grad", "tangent", "hvp"):
                arrays[f"{key}/{j}"] = to_onnx_layout(i, arrays[f"{key}/{j}"])
            arrays[f"vmap_grad/{j}"] = np.stack([to_onnx_layout(i, g) for g in arrays[f"vmap_grad/{j}"]])
            arrays[f"param/{j}"] = to_onnx_layout(i, leaves[i])
        _save(
            "jax2onnx_gpt",
            {
                "feed/tokens": tokens,
                "feed/deterministic": np.asarray(True),
                "vmap/tokens": stack,
                "wrt": np.asarray([f"param:{j}" for j in range(len(floats))]),
                **arrays,
            },
        )

    return refs


def jax2onnx_vit() -> Callable[[], None]:
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax2onnx.plugins.examples.nnx.vit import VisionTransformer

    module = VisionTransformer(
        height=28,
        width=28,
        num_hiddens=16,
        num_layers=2,
        num_heads=2,
        mlp_dim=32,
        num_classes=10,
        embed_dims=(4, 8, 16),
        embedding_type="conv",
        rngs=nnx.Rngs(0),
    )
    module = _perturbed(module, 6)
    _jax2onnx_export("jax2onnx_vit", module, [jax.ShapeDtypeStruct(("B", 28, 28, 1), jnp.float32)], ["x"])

    def refs() -> None:
        apply, leaves = _pure64(module)

        def loss64(ws: list[Any], _feeds: dict[str, np.ndarray]) -> Any:
            return apply(leaves, ws[0])

        rng = np.random.default_rng(6)
        x = rng.standard_normal((2, 28, 28, 1)).astype(np.float32)
        xs = rng.standard_normal((STACK, 2, 28, 28, 1)).astype(np.float32)
        arrays = _input_refs(loss64, "x", {"x": x, "deterministic": np.asarray(True)}, {"x": xs}, rng)
        _save("jax2onnx_vit", arrays)

    return refs


MODELS = {"keras_jax_cnn": keras_jax_cnn, "jax2onnx_gpt": jax2onnx_gpt, "jax2onnx_vit": jax2onnx_vit}

if __name__ == "__main__":
    import sys

    import jax

    # Export everything in float32 first: the references switch JAX to float64.
    steps = [MODELS[n]() for n in (sys.argv[1:] or MODELS)]
    jax.config.update("jax_enable_x64", True)
    for step in steps:
        step()
    for p in sorted(HERE.glob("*.onnx")):
        print(p.name, p.stat().st_size, "bytes;", p.with_suffix(".npz").stat().st_size, "bytes of references")
