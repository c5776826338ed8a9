"""The JAX / Flax NNX models of the corpus.

Each model is a Flax NNX module plus an ``apply(module, *inputs)`` that returns the scalar loss
first and then the model's other outputs, so one export serves every transform: ``grad`` and
the HVP differentiate the loss, ``jvp`` / ``vjp`` / ``vmap`` use all outputs. Input shapes use
the symbolic batch ``B`` (jax2onnx keeps it a ``dim_param``); ``example`` draws concrete inputs.
Parameters get a random offset after initialization so no two parameters are equal (biases
start at zero), which lets the exporter find each parameter's initializer by its value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

Shape = tuple[int | str, ...]


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: Shape  # "B" is the symbolic batch
    dtype: str  # numpy dtype name
    vocab: int = 0  # integer inputs are drawn from [0, vocab)


@dataclass(frozen=True)
class JaxModel:
    name: str
    description: str
    build: Callable[[], nnx.Module]
    apply: Callable[..., tuple[Any, ...]]  # apply(module, *inputs) -> (loss, *outputs)
    inputs: Sequence[InputSpec]
    outputs: Sequence[str]  # the first is the scalar loss


def example(spec: Sequence[InputSpec], batch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Concrete inputs with the symbolic batch set to ``batch``."""
    values = []
    for s in spec:
        shape = tuple(batch if d == "B" else int(d) for d in s.shape)
        if s.vocab:
            values.append(rng.integers(0, s.vocab, size=shape).astype(s.dtype))
        else:
            values.append(rng.standard_normal(shape).astype(s.dtype))
    return values


def _offset_params(module: nnx.Module, seed: int) -> nnx.Module:
    """Adds N(0, 0.1) noise to every parameter so that none is all zeros or a repeated value."""
    graphdef, state = nnx.split(module)
    leaves, treedef = jax.tree.flatten(state)
    rng = np.random.default_rng(seed)
    noisy = [
        leaf + rng.normal(0.0, 0.1, size=leaf.shape).astype(leaf.dtype)
        if jnp.issubdtype(leaf.dtype, jnp.floating)
        else leaf
        for leaf in leaves
    ]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, noisy))


# --------------------------------------------------------------------------------------------
# MLP with a mean-squared-error loss


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(8, 16, rngs=rngs)
        self.out = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(jax.nn.gelu(self.hidden(x)))


def _mlp_apply(m: MLP, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    pred = m(x)
    return jnp.mean((pred - y) ** 2), pred


# --------------------------------------------------------------------------------------------
# CNN: Conv, BatchNorm (inference statistics), max and average pooling, softmax cross-entropy


class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(1, 4, (3, 3), padding="SAME", rngs=rngs)
        self.bn = nnx.BatchNorm(4, use_running_average=True, rngs=rngs)
        self.conv2 = nnx.Conv(4, 4, (3, 3), padding="SAME", rngs=rngs)
        self.head = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = nnx.relu(self.bn(self.conv1(x)))
        h = nnx.max_pool(h, window_shape=(2, 2), strides=(2, 2))
        h = nnx.relu(self.conv2(h))
        h = nnx.avg_pool(h, window_shape=(2, 2), strides=(2, 2))
        return self.head(h.reshape(h.shape[0], -1))


class CNNGlobalPool(CNN):
    """The same CNN with global average pooling (a mean over H and W) instead of AvgPool."""

    def __call__(self, x: jax.Array) -> jax.Array:
        h = nnx.relu(self.bn(self.conv1(x)))
        h = nnx.max_pool(h, window_shape=(2, 2), strides=(2, 2))
        h = nnx.relu(self.conv2(h))
        return self.head(
            jnp.concatenate([jnp.mean(h, axis=(1, 2)), jnp.max(h, axis=(1, 2)), h[:, 0, 0], h[:, -1, -1]], -1)
        )


def _cnn_build(cls: type[CNN] = CNN) -> nnx.Module:
    m = cls(nnx.Rngs(1))
    # Non-trivial running statistics (the defaults are mean 0, variance 1).
    m.bn.mean[...] = jnp.asarray([0.1, -0.2, 0.05, 0.3], jnp.float32)
    m.bn.var[...] = jnp.asarray([0.5, 1.5, 0.8, 1.2], jnp.float32)
    return _offset_params(m, 1)


def _cnn_apply(m: CNN, x: jax.Array, onehot: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits = m(x)
    loss = -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))
    return loss, logits


# --------------------------------------------------------------------------------------------
# Pre-LN transformer block: LayerNorm, multi-head attention (softmax), GELU MLP, residuals


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.ln1 = nnx.LayerNorm(8, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(2, 8, decode=False, rngs=rngs)
        self.ln2 = nnx.LayerNorm(8, rngs=rngs)
        self.up = nnx.Linear(8, 16, rngs=rngs)
        self.down = nnx.Linear(16, 8, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x))
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x)), approximate=False))


def _block_apply(m: Block, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    out = m(x)
    return jnp.mean(out**2), out


# --------------------------------------------------------------------------------------------
# Token embedding, projection to the vocabulary, softmax cross-entropy with integer labels


class EmbedClassifier(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(11, 6, rngs=rngs)
        self.proj = nnx.Linear(6, 11, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.proj(jnp.tanh(self.embed(tokens)))


def _embed_apply(m: EmbedClassifier, tokens: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits = m(tokens)
    logp = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(logp, labels[..., None], axis=-1)
    return -jnp.mean(picked), logits


# --------------------------------------------------------------------------------------------
# GRU cell unrolled over three steps in Python (no scan, so no ONNX Loop)


class GRU3(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.cell = nnx.GRUCell(4, 6, rngs=rngs)

    def __call__(self, xs: jax.Array, h: jax.Array) -> jax.Array:
        for t in range(xs.shape[1]):
            h, _ = self.cell(h, xs[:, t])
        return h


def _gru_apply(m: GRU3, xs: jax.Array, h0: jax.Array) -> tuple[jax.Array, jax.Array]:
    h = m(xs, h0)
    return jnp.mean(h**2), h


class GRUScan(GRU3):
    """The same cell over the whole sequence with ``jax.lax.scan`` (a full-sequence export:
    jax2onnx lowers the scan to an ONNX ``Loop``)."""

    def __call__(self, xs: jax.Array, h: jax.Array) -> jax.Array:
        h, _ = jax.lax.scan(lambda c, x: self.cell(c, x), h, jnp.swapaxes(xs, 0, 1))
        return h


def _f32(name: str, *shape: int | str) -> InputSpec:
    return InputSpec(name, tuple(shape), "float32")


MODELS: tuple[JaxModel, ...] = (
    JaxModel(
        "jax_mlp",
        "Flax NNX MLP 8-16-4 (Linear, tanh-GELU), mean-squared-error loss",
        lambda: _offset_params(MLP(nnx.Rngs(0)), 0),
        _mlp_apply,
        (_f32("x", "B", 8), _f32("y", "B", 4)),
        ("loss", "pred"),
    ),
    JaxModel(
        "jax_cnn",
        "Flax NNX CNN: Conv-BatchNorm-ReLU-MaxPool-Conv-ReLU-AvgPool-Linear, softmax cross-entropy",
        _cnn_build,
        _cnn_apply,
        (_f32("x", "B", 8, 8, 1), _f32("onehot", "B", 3)),
        ("loss", "logits"),
    ),
    JaxModel(
        "jax_cnn_gap",
        "Flax NNX CNN with global pooling: Conv-BatchNorm-ReLU-MaxPool-Conv-ReLU-mean/max over HxW-Linear",
        lambda: _cnn_build(CNNGlobalPool),
        _cnn_apply,
        (_f32("x", "B", 8, 8, 1), _f32("onehot", "B", 3)),
        ("loss", "logits"),
    ),
    JaxModel(
        "jax_transformer",
        "Flax NNX pre-LN transformer block: LayerNorm, 2-head attention, erf-GELU MLP, residuals",
        lambda: _offset_params(Block(nnx.Rngs(2)), 2),
        _block_apply,
        (_f32("x", "B", 5, 8),),
        ("loss", "out"),
    ),
    JaxModel(
        "jax_embed_xent",
        "Flax NNX Embed(11, 6)-tanh-Linear, softmax cross-entropy with integer labels",
        lambda: _offset_params(EmbedClassifier(nnx.Rngs(3)), 3),
        _embed_apply,
        (InputSpec("tokens", ("B", 5), "int32", 11), InputSpec("labels", ("B", 5), "int32", 11)),
        ("loss", "logits"),
    ),
    JaxModel(
        "jax_gru",
        "Flax NNX GRUCell(4, 6) unrolled over 3 steps (no scan), mean-square loss of the state",
        lambda: _offset_params(GRU3(nnx.Rngs(4)), 4),
        _gru_apply,
        (_f32("xs", "B", 3, 4), _f32("h0", "B", 6)),
        ("loss", "h"),
    ),
    JaxModel(
        "jax_gru_scan",
        "Flax NNX GRUCell(4, 6) over 3 steps with jax.lax.scan (exported as an ONNX Loop)",
        lambda: _offset_params(GRUScan(nnx.Rngs(4)), 4),
        _gru_apply,
        (_f32("xs", "B", 3, 4), _f32("h0", "B", 6)),
        ("loss", "h"),
    ),
)
