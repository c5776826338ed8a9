"""Checks every transformed model must pass before its numbers are compared.

The runner applies :data:`DEFAULT_CHECKS` in order, then any extra checks it is given (each a
callable ``(source, generated, feeds) -> None`` that raises on a problem; ``feeds`` are the
inputs the runner will run ``generated`` on). :func:`onnax_validate`
is such an extra: ``onnax.testing.validate``'s own independent parity check
(``python -m conformance.corpus --validate``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx

Feeds = Mapping[str, np.ndarray]
Check = Callable[[onnx.ModelProto, onnx.ModelProto, Feeds], None]


def checker(source: onnx.ModelProto, model: onnx.ModelProto, feeds: Feeds) -> None:
    """``onnx.checker`` with full_check (includes ONNX shape inference in strict mode)."""
    onnx.checker.check_model(model, full_check=True)


def strict_shape_inference(source: onnx.ModelProto, model: onnx.ModelProto, feeds: Feeds) -> None:
    """Shape inference with data propagation must accept every node of the generated graph."""
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)


def onnax_validate(source: onnx.ModelProto, model: onnx.ModelProto, feeds: Feeds) -> None:
    """``onnax.testing.validate``: checker, strict inference, runtime and numerical parity
    with the recorded transform chain (exact JAX float64 reference when its interpreter covers
    the model, else kink-aware float64 finite differences)."""
    from onnax.testing import validate

    report = validate(source, model, inputs=feeds, max_coords=16)
    if report.failed_step is not None:
        detail = " ".join(report.format().split())
        raise AssertionError(f"onnax.testing.validate failed: {detail}")


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of `graph` (or of its subgraphs) reads, and the graphs' outputs."""
    from onnax.testing._models import graphs

    acc: set[str] = set()
    for g in graphs(graph):
        acc.update(i for n in g.node for i in n.input)
        acc.update(o.name for o in g.output)
    return acc


def _dead_nodes(source: onnx.ModelProto, model: onnx.ModelProto, only: str | None = None) -> list[str]:
    """The result's nodes (of type `only`, when given) that nothing reads, other than the
    source's own dead ones."""
    read = _read_names(model.graph)
    source_read = _read_names(source.graph)
    source_dead = {
        o for n in source.graph.node for o in n.output if not any(x in source_read for x in n.output if x)
    }
    return [
        f"{n.op_type} -> {list(n.output)}"
        for n in model.graph.node
        if (only is None or n.op_type == only)
        and not any(o in read for o in n.output if o)
        and not set(n.output) & source_dead
    ]


def no_dead_nodes(source: onnx.ModelProto, model: onnx.ModelProto, feeds: Feeds) -> None:
    """Derivative graphs compute nothing in vain: every node outside the source's own dead
    ones has an output that a node, a subgraph or a graph output reads."""
    dead = _dead_nodes(source, model)
    if dead:
        raise AssertionError(f"{len(dead)} dead node(s) in the result, e.g. {dead[:3]}")


def no_dead_constants(source: onnx.ModelProto, model: onnx.ModelProto, feeds: Feeds) -> None:
    """No Constant the transform left unread (ONNX Runtime warns about each one)."""
    dead = _dead_nodes(source, model, only="Constant")
    if dead:
        raise AssertionError(f"{len(dead)} dead Constant node(s) in the result, e.g. {dead[:3]}")


DEFAULT_CHECKS: list[Check] = [checker, strict_shape_inference, no_dead_constants]
# Reverse and forward mode drop everything they compute in vain (vmap may leave a dead
# non-constant node, e.g. the reshape of a MaxPool output only its indices are read of).
AUTODIFF_CHECKS: list[Check] = [no_dead_nodes]
