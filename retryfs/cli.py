"""The `retryfs` command."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retryfs",
                                     description="Storage I/O that survives transient failures.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="upload a checkpoint through injected faults, "
                                     "with and without retryfs")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from .demo import run

        return run()
    return 2


if __name__ == "__main__":
    sys.exit(main())
