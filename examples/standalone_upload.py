"""Upload a local directory (a checkpoint, a dataset) to any pyarrow filesystem, with retries.

    python examples/standalone_upload.py ./checkpoint s3://bucket/ckpt --max-attempts 8

Any URI pyarrow understands works (s3://, gs://, abfs://, file://, local paths). A commit that
finally fails raises instead of being ignored by ``pyarrow.fs.copy_files``.
"""

from __future__ import annotations

import argparse
import logging

import pyarrow.fs as pafs

import retryfs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a local directory or file")
    parser.add_argument("destination", help="a URI or path pyarrow understands")
    parser.add_argument("--max-attempts", type=int, default=8)
    parser.add_argument("--max-delay", type=float, default=30.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    inner, path = pafs.FileSystem.from_uri(args.destination)
    fs = retryfs.RetryingFileSystem(
        inner, retryfs.RetryPolicy(max_attempts=args.max_attempts, max_delay=args.max_delay))
    fs.create_dir(path)
    pafs.copy_files(args.source, path, destination_filesystem=fs)
    snap = fs.stats.snapshot()
    print(f"uploaded {args.source} -> {args.destination}: {snap['calls']} calls, "
          f"{snap['retries']} retries, {snap['giveups']} give-ups")


if __name__ == "__main__":
    main()
