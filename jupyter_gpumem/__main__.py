"""``python -m jupyter_gpumem``: the demo and tools for saved traces."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_gpumem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run a scripted workload on a simulated device, print a summary")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ._demo import main as demo

        demo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
