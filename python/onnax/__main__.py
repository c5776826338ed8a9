"""The ``onnax`` command (shares its implementation with the standalone C++ binary)."""

from __future__ import annotations

import sys

from onnax import _core


def main() -> int:
    return int(_core.cli_main(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
