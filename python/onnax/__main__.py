"""The ``onnax`` command. ``validate`` and ``bench`` run models (NumPy, ONNX Runtime), so they
are implemented in Python; every other command is the C++ core's, shared with the standalone
binary."""

from __future__ import annotations

import sys

from onnax import _core

PYTHON_COMMANDS = """
commands implemented in Python (this command only, not the standalone C++ binary):
  validate SOURCE.onnx GENERATED.onnx [--inputs FILE.npz] [--rtol R] [--atol A] [--web] ...
      checker, strict shape inference, ONNX Runtime execution and numerical parity with the
      recorded transform chain (onnax validate --help)
  bench MODEL.onnx [--transforms vmap,grad,...] [--intra-op-threads N] [--output R.json] ...
      ONNX Runtime latency of a model and its transforms (onnax bench --help)
"""


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] in ("validate", "bench"):
        from onnax.testing._cli import main as python_main

        return python_main(args[0], args[1:])
    code = int(_core.cli_main(args))
    if not args or args[0] in ("-h", "--help", "help"):
        print(PYTHON_COMMANDS, end="")
    return code


if __name__ == "__main__":
    sys.exit(main())
