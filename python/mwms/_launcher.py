"""The ``mwmsrun`` console script: runs the launcher binary shipped in the package (mwms/bin).

``mwmsrun -np 2 python train.py`` starts 2 processes of ``python train.py`` on this machine, each
with its own TF_CONFIG on free loopback ports (README, "Launching locally").
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def launcher_path() -> str:
    """Path of the ``mwmsrun`` binary inside the installed package."""
    return str(Path(__file__).resolve().parent / "bin" / "mwmsrun")


def main() -> None:
    """Replaces this process with ``mwmsrun`` and the command line's arguments."""
    path = launcher_path()
    os.execv(path, [path, *sys.argv[1:]])


if __name__ == "__main__":
    main()
