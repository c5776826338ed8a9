"""One-way layers in the C++ core: a file includes headers of its own layer or lower ones.

Bottom to top: diagnostics and the graph-edit basics (ir), model files (io), node validation
(check), facts (what is known of each value), emission (emit), the op table's rules (rules), the
transforms (transforms, which implement the public API <onnax/onnax.h>), training steps
(training), the command line (cli). A rule that needs a body transformed should get a callback
from the transform rather than include it.

KNOWN_UPWARD lists the upward includes that exist today and are to be removed; the test fails
on any other upward include, and on a listed one that no longer exists (so the list only
shrinks).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LAYERS = ["diagnostics", "ir", "io", "check", "facts", "emit", "rules", "transforms", "training", "cli"]
PUBLIC = {
    "onnax/diagnostics.h": "diagnostics",
    "onnax/options.h": "diagnostics",
    "onnax/rules.h": "rules",
    "onnax/onnax.h": "transforms",
    "onnax/training.h": "training",
}
# The top-level files of src/ (notices) sit with diagnostics.
TOP_LEVEL = "diagnostics"

KNOWN_UPWARD = {
    # io defines the public API's load_model/parse_model/save_model.
    ("io/model_io.cc", "onnax/onnax.h"),
    # Control-flow rules build bodies as standalone models (subgraph.h) and read their facts
    # through prepare; both belong below the rules.
    ("rules/control_flow.cc", "transforms/subgraph.h"),
    ("rules/control_flow_batching.cc", "transforms/subgraph.h"),
    ("rules/loop_products.cc", "transforms/subgraph.h"),
    ("rules/loop_products.h", "transforms/prepare.h"),
    ("rules/loop_residuals.cc", "transforms/prepare.h"),
    ("rules/loop_residuals.cc", "transforms/subgraph.h"),
    ("rules/loop_residuals.h", "transforms/prepare.h"),
    ("rules/loop_transpose.cc", "transforms/prepare.h"),
    ("rules/loop_transpose.cc", "transforms/subgraph.h"),
}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def _layer_of_header(header: str) -> str | None:
    if header in PUBLIC:
        return PUBLIC[header]
    folder = header.split("/", 1)[0] if "/" in header else None
    if folder in LAYERS:
        return folder
    if folder is None and (ROOT / "src" / header).exists():
        return TOP_LEVEL
    return None  # a system or third-party header


def _upward_includes() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "src").rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        rel = path.relative_to(ROOT / "src").as_posix()
        own = rel.split("/", 1)[0] if "/" in rel else TOP_LEVEL
        assert own in LAYERS, f"src/{rel}: folder '{own}' has no place in LAYERS; add it where it belongs"
        for header in INCLUDE.findall(path.read_text()):
            layer = _layer_of_header(header)
            if layer is not None and LAYERS.index(layer) > LAYERS.index(own):
                found.add((rel, header))
    return found


def test_no_new_upward_include() -> None:
    new = sorted(_upward_includes() - KNOWN_UPWARD)
    assert not new, "lower layer includes a higher one:\n" + "\n".join(
        f"  src/{f} includes {h}" for f, h in new
    )


def test_known_upward_includes_still_exist() -> None:
    gone = sorted(KNOWN_UPWARD - _upward_includes())
    assert not gone, "removed upward includes still listed in KNOWN_UPWARD:\n" + "\n".join(
        f"  src/{f} includes {h}" for f, h in gone
    )


def test_the_check_sees_an_upward_include(tmp_path: Path) -> None:
    # The pattern and the layer order catch a real upward include (facts including a rule).
    text = '#include <vector>\n#include "rules/batching.h"\n#include "facts/facts.h"\n'
    headers = INCLUDE.findall(text)
    assert headers == ["vector", "rules/batching.h", "facts/facts.h"]
    upward = [
        h for h in headers if (layer := _layer_of_header(h)) and LAYERS.index(layer) > LAYERS.index("facts")
    ]
    assert upward == ["rules/batching.h"]
