"""The exporter corpus (``exporter_corpus.py``, models in ``models/exporters``): every model x
{vmap, grad, jvp, vjp, vmap(grad), jvp(grad)} with onnax's Python API, run in ONNX Runtime and
checked against the exporting framework's float64 references, or refused with an
onnax.OnnaxError that names the op and the reason (``exporter_corpus.REFUSED``; a refusal that
goes away fails here until its entry is removed, and the case is then checked numerically).

``python tests/python/oracles/exporter_corpus.py`` prints the same cases as a table.
"""

from __future__ import annotations

import functools

import pytest

onnax = pytest.importorskip("onnax")
pytest.importorskip("onnxruntime")

from oracles import exporter_corpus as ec  # noqa: E402

# (tf2onnx and skl2onnx exported opset 17; onnax upgrades it to 18 and says so)
pytestmark = pytest.mark.filterwarnings("ignore:onnax. .*upgraded the model:UserWarning")


@functools.cache
def _case(name: str) -> ec.Case:
    return ec.load(name)


@pytest.mark.parametrize("kind", ec.TRANSFORMS)
@pytest.mark.parametrize("name", ec.NAMES)
def test_transform_matches_the_framework_or_is_refused_with_a_diagnostic(name: str, kind: str) -> None:
    case = _case(name)
    if (name, kind) in ec.REFUSED:
        op, reason = ec.REFUSED[name, kind]
        try:
            ec.transform(case, kind)
        except onnax.OnnaxError as err:
            message = str(err)
            assert op in message, f"the refusal does not name {op}: {message}"
            assert reason in message, f"the refusal's reason changed: {message}"
            return
        pytest.fail(
            f"{name} {kind} is no longer refused: remove it from exporter_corpus.REFUSED "
            "(it is then checked against the references) and update the README's count"
        )
    ec.check(case, kind, ec.transform(case, kind))


def test_every_model_is_tested_and_differentiated() -> None:
    for name in ec.NAMES:
        case = _case(name)
        assert case.wrt and case.vmap_feeds, name
    # jax2onnx's GPT: its weights are Constant nodes inside @onnx_function bodies, all of which
    # become parameters and are matched to JAX's (2 layers x 16 + embeddings, final norm, head)
    assert len(_case("jax2onnx_gpt").wrt) == 37


def test_the_table_counts_what_the_test_asserts() -> None:
    text = ec.table(("script_loop", "jax2onnx_vit"))
    refused = sum(1 for key in ec.REFUSED if key[0] in ("script_loop", "jax2onnx_vit"))
    assert text.count("refused [") == refused, text
    assert "failed [" not in text, text


def test_a_wrong_gradient_is_caught() -> None:
    from oracles.validate_models import flip_sign

    case = _case("tf_mlp")
    g = flip_sign(ec.transform(case, "grad"), f"{case.wrt[0]}_grad")
    with pytest.raises(AssertionError, match="d loss / d"):
        ec.check(case, "grad", g)
