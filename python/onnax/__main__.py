"""The ``onnax`` command. ``validate`` and ``bench`` run models (NumPy, ONNX Runtime) and
``init-state`` / ``apply-params`` read and write NumPy files, so they are implemented in
Python; every other command is the C++ core's, shared with the standalone binary."""

from __future__ import annotations

import sys
import warnings

from onnax import _core

PYTHON_COMMANDS = """
commands implemented in Python (this command only, not the standalone C++ binary):
  validate SOURCE.onnx GENERATED.onnx [--inputs FILE.npz] [--rtol R] [--atol A] [--web] ...
      checker, strict shape inference, ONNX Runtime execution and numerical parity with the
      recorded transform chain (onnax validate --help)
  bench MODEL.onnx [--transforms vmap,grad,...] [--intra-op-threads N] [--output R.json] ...
      ONNX Runtime latency of a model and its transforms (onnax bench --help)
  init-state LOSS.onnx STEP.onnx -o STATE.npz
      a training step's first fed-back inputs (stored parameters, zero state) as arrays
  apply-params MODEL.onnx PARAMS.npz -o TRAINED.onnx [--ignore-unknown]
      trained parameters written back into the model's initializers (or Constant nodes)
  signature MODEL.onnx ... --zeros STATE0.npz [--dim batch=2]
      the signature (as the core's command prints it) and zero initial states as arrays
"""


def _one_line(message: Warning | str, *_: object, **__: object) -> str:
    return f"{message}\n"


def main() -> int:
    # Notices print as the standalone binary prints them: one line, no Python source location.
    warnings.formatwarning = _one_line  # type: ignore[assignment]
    args = sys.argv[1:]
    if args and args[0] in ("validate", "bench"):
        from onnax.testing._cli import main as python_main

        return python_main(args[0], args[1:])
    if args and args[0] == "signature" and any(a == "--zeros" for a in args):
        from onnax._sequence_cli import main as sequence_main

        return sequence_main(args[1:])
    if args and args[0] in ("init-state", "apply-params"):
        from onnax._training_cli import main as training_main

        return training_main(args[0], args[1:])
    try:
        code = int(_core.cli_main(args))
    except KeyboardInterrupt:
        # (The transform stopped at its next check, before writing; a result written just before
        # the signal is complete: writes are atomic.)
        print("onnax: interrupted", file=sys.stderr)
        return 130
    if not args or args[0] in ("-h", "--help", "help"):
        print(PYTHON_COMMANDS, end="")
    return code


if __name__ == "__main__":
    sys.exit(main())
