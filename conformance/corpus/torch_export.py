"""Exports small PyTorch models with ``torch.onnx.export(..., dynamo=True)`` and computes their
references with ``torch.func`` (vmap, grad, jvp, vjp) in float64.

PyTorch is not in requirements.txt: PyPI's Linux wheel pulls about 5 GB of CUDA libraries
(the CPU-only index is not reachable from CI), which does not fit the CI budget. The exported
models and references are committed; to regenerate them, use a separate environment::

    python3 -m venv /work/venv-torch
    /work/venv-torch/bin/pip install torch==2.15.0 onnxscript==0.7.2 onnx==1.23.2 onnx-ir==1.1.0 numpy
    /work/venv-torch/bin/python -m conformance.corpus.torch_export

Parameters become initializers named by their module path; they are located by value like the
JAX ones (:mod:`conformance.corpus.params`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from conformance.corpus import artifacts, framework_refs
from conformance.corpus.params import locate_params

BATCH_IN_MODEL = 4
VMAP_BATCH = 3
Arrays = list[Any]


@dataclass(frozen=True)
class TorchModel:
    name: str
    description: str
    build: Callable[[], Any]  # -> torch.nn.Module (eval mode)
    loss: Callable[..., Any]  # loss(module_outputs..., *inputs) -> (loss, *outputs)
    inputs: Sequence[tuple[str, tuple[int, ...]]]  # shapes with the batch first
    outputs: Sequence[str]


def _models() -> list[TorchModel]:
    import torch
    from torch import nn
    from torch.nn import functional as F

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = nn.Linear(8, 16)
            self.out = nn.Linear(16, 4)

        def forward(self, x: Any, y: Any) -> tuple[Any, Any]:
            pred = self.out(F.gelu(self.hidden(x)))
            return F.mse_loss(pred, y), pred

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
            self.head = nn.Linear(8, 3)

        def forward(self, x: Any, target: Any) -> tuple[Any, Any]:
            h = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
            h = F.relu(self.conv2(h))
            logits = self.head(torch.cat([h.mean((2, 3)), h.amax((2, 3))], 1))
            # Written out: F.cross_entropy with probability targets exports as
            # SoftmaxCrossEntropyLoss with float labels, which ONNX does not allow.
            return -(target * F.log_softmax(logits, -1)).sum(-1).mean(), logits

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(6, 5)

        def forward(self, x: Any, labels: Any) -> tuple[Any, Any]:
            logits = self.proj(torch.tanh(x))
            return F.cross_entropy(logits, labels), logits

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)

        def forward(self, x: Any) -> tuple[Any, Any]:
            out = self.layer(x)
            return (out**2).mean(), out

    def cnn() -> Any:
        m = CNN()
        with torch.no_grad():
            m.bn.running_mean.copy_(torch.tensor([0.1, -0.2, 0.05, 0.3]))
            m.bn.running_var.copy_(torch.tensor([0.5, 1.5, 0.8, 1.2]))
            m.bn.weight.copy_(torch.tensor([0.9, 1.1, 1.3, 0.7]))
            m.bn.bias.copy_(torch.tensor([0.1, -0.1, 0.2, 0.0]))
        return m

    return [
        TorchModel(
            "torch_mlp",
            "PyTorch MLP 8-16-4 (Linear, erf-GELU), F.mse_loss",
            MLP,
            lambda m, x, y: m(x, y),
            [("x", (8,)), ("y", (4,))],
            ["loss", "pred"],
        ),
        TorchModel(
            "torch_cnn",
            "PyTorch CNN: Conv2d-BatchNorm2d(eval)-ReLU-max_pool2d-Conv2d-ReLU-mean/amax-Linear, "
            "cross-entropy with soft targets",
            cnn,
            lambda m, x, t: m(x, t),
            [("x", (1, 8, 8)), ("target", (3,))],
            ["loss", "logits"],
        ),
        TorchModel(
            "torch_cross_entropy",
            "PyTorch Linear-tanh classifier with F.cross_entropy on integer labels",
            Classifier,
            lambda m, x, t: m(x, t),
            [("x", (6,)), ("labels", ())],
            ["loss", "logits"],
        ),
        TorchModel(
            "torch_transformer",
            "PyTorch nn.TransformerEncoderLayer(8, 2 heads, 16, norm_first, eval), mean-square loss",
            Encoder,
            lambda m, x: m(x),
            [("x", (5, 8))],
            ["loss", "out"],
        ),
    ]


def _example(spec: TorchModel, rng: np.random.Generator) -> list[np.ndarray]:
    xs = []
    for name, shape in spec.inputs:
        if name == "labels":  # class indices
            xs.append(rng.integers(0, 5, size=(BATCH_IN_MODEL, *shape)).astype(np.int64))
            continue
        v = rng.standard_normal((BATCH_IN_MODEL, *shape))
        if name == "target":  # class probabilities
            v = np.exp(v) / np.exp(v).sum(-1, keepdims=True)
        xs.append(v.astype(np.float32))
    return xs


def _offset_params(module: Any, seed: int) -> Any:
    """Adds N(0, 0.1) noise to every parameter: LayerNorm's ones and zeros would otherwise be
    indistinguishable when parameters are located by value."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return module


def export(spec: TorchModel, module: Any) -> onnx.ModelProto:
    import torch

    batch = torch.export.Dim("B", min=2)
    args = tuple(torch.as_tensor(x) for x in _example(spec, np.random.default_rng(0)))
    dynamic = {n: {0: batch} for n, _ in spec.inputs}
    program = torch.onnx.export(
        module,
        args,
        dynamo=True,
        opset_version=18,
        input_names=[n for n, _ in spec.inputs],
        output_names=list(spec.outputs),
        dynamic_shapes=dynamic,
        verbose=False,
    )
    proto = program.model_proto
    proto.ir_version = min(proto.ir_version, 10)  # ONNX Runtime 1.31 rejects IR 14
    return proto


class TorchFramework:
    """:class:`framework_refs.Framework` by torch.func (functional_call on float64 copies)."""

    def __init__(self, module: Any, names: list[str], selected: list[str]) -> None:
        import torch

        self.torch = torch
        self.m = module.double()
        self.state = {k: v.detach().clone() for k, v in self.m.state_dict().items()}
        self.selected = selected

    def _t(self, a: Any) -> Any:
        return self.torch.as_tensor(np.asarray(a))

    def _f(self, ps: Sequence[Any], *xs: Any) -> tuple[Any, ...]:
        from torch.func import functional_call

        state = dict(self.state)
        state.update(zip(self.selected, ps, strict=True))
        return tuple(functional_call(self.m, state, tuple(xs)))

    def _np(self, ts: Sequence[Any]) -> list[np.ndarray]:
        return [t.detach().numpy() for t in ts]

    def _loss_grad(self, ps: Sequence[Any], *xs: Any) -> Any:
        from torch.func import grad

        return grad(lambda p, *a: self._f(p, *a)[0])(tuple(ps), *xs)

    def _of_selected(self, xs: Sequence[Any], float_idx: list[int]) -> Callable[..., Any]:
        def g(xf: Sequence[Any], ps: Sequence[Any]) -> tuple[Any, ...]:
            full = list(xs)
            for k, v in zip(float_idx, xf, strict=True):
                full[k] = v
            return self._f(ps, *full)

        return g

    def outputs(self, ps: Arrays, xs: Arrays) -> Arrays:
        return self._np(self._f([self._t(p) for p in ps], *map(self._t, xs)))

    def grad(self, ps: Arrays, xs: Arrays) -> Arrays:
        return self._np(self._loss_grad([self._t(p) for p in ps], *map(self._t, xs)))

    def jvp(self, ps: Arrays, xs: Arrays, float_idx: list[int], t_x: Arrays, t_p: Arrays) -> Arrays:
        from torch.func import jvp

        txs = [self._t(x) for x in xs]
        primals = (tuple(txs[k] for k in float_idx), tuple(self._t(p) for p in ps))
        tangents = (tuple(map(self._t, t_x)), tuple(map(self._t, t_p)))
        _, tan = jvp(self._of_selected(txs, float_idx), primals, tangents)
        return self._np(tan)

    def vjp(self, ps: Arrays, xs: Arrays, float_idx: list[int], cts: Arrays) -> tuple[Arrays, Arrays]:
        from torch.func import vjp

        txs = [self._t(x) for x in xs]
        fn = self._of_selected(txs, float_idx)
        _, pullback = vjp(fn, tuple(txs[k] for k in float_idx), tuple(self._t(p) for p in ps))
        ct_x, ct_p = pullback(tuple(map(self._t, cts)))
        return self._np(ct_x), self._np(ct_p)

    def hvp(self, ps: Arrays, xs: Arrays, v_p: Arrays) -> tuple[Arrays, Arrays]:
        # Reverse over reverse (H is symmetric, so the vjp of the gradient is H v): torch.func's
        # forward-over-reverse jvp(grad) raises "ZeroTensors are immutable" on these models.
        from torch.func import vjp

        txs = [self._t(x) for x in xs]
        g, pullback = vjp(lambda *p: self._loss_grad(p, *txs), *(self._t(p) for p in ps))
        h = pullback(tuple(map(self._t, v_p)))
        return self._np(g), self._np(h)

    def batched(self, ps: Arrays, batch: Arrays) -> tuple[Arrays, Arrays]:
        from torch.func import vmap

        tps = [self._t(p) for p in ps]
        outs, grads = vmap(lambda *a: (self._f(tps, *a), self._loss_grad(tps, *a)))(*map(self._t, batch))
        return self._np(outs), self._np(grads)


def generate(names: Sequence[str] | None = None, seed: int = 0, root: Path | None = None) -> list[str]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(seed)
    # The fused inference path of nn.TransformerEncoderLayer has no forward-mode AD; the
    # composite path computes the same function.
    torch.backends.mha.set_fastpath_enabled(False)
    root = root or artifacts.MODELS_DIR
    root.mkdir(exist_ok=True)
    done = []
    for spec in _models():
        if names and spec.name not in names:
            continue
        module = _offset_params(spec.build(), seed).eval()
        proto = export(spec, module)
        params = dict(module.named_parameters())
        paths = list(params)
        leaves32 = [params[p].detach().numpy().copy() for p in paths]
        sites, missing = locate_params(paths, leaves32, proto)
        fw = TorchFramework(module, paths, [s.path for s in sites])
        rng = np.random.default_rng(seed)
        xs32 = _example(spec, rng)

        def draw_batch(spec: TorchModel = spec, rng: np.random.Generator = rng) -> list[np.ndarray]:
            examples = [_example(spec, rng) for _ in range(VMAP_BATCH)]
            return [np.stack(col) for col in zip(*examples, strict=True)]

        chosen = [leaves32[s.index].astype(np.float64) for s in sites]
        in_names = [n for n, _ in spec.inputs]
        # The fused CPU attention kernels have no forward-mode AD; the math kernel computes the
        # same attention from differentiable ops.
        with sdpa_kernel(SDPBackend.MATH):
            arrays = framework_refs.assemble(fw, sites, chosen, in_names, xs32, draw_batch, spec.outputs, rng)
        versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("torch", "onnxscript"))
        manifest = framework_refs.manifest_for(
            spec,
            sites,
            missing,
            in_names,
            xs32,
            origin=f"torch.onnx.export(dynamo=True) ({versions}), float32, opset 18",
            reference="torch.func in float64: vmap, grad, jvp, vjp, jvp(grad)",
            batch=VMAP_BATCH,
            quick=True,
        )
        onnx_path, _, _ = artifacts.paths(spec.name, root)
        onnx.save(proto, onnx_path)
        artifacts.write_manifest(manifest, root)
        artifacts.write_arrays(spec.name, arrays, root)
        done.append(spec.name)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("names", nargs="*", help="models to export (default: all)")
    args = parser.parse_args(argv)
    for name in generate(args.names):
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
