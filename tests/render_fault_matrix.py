"""Render the fault matrix's results into docs/testing.md, between its markers.

    .venv/bin/python -m tests.render_fault_matrix --run    # run the matrix, then render
    .venv/bin/python -m tests.render_fault_matrix          # render the last run's results
    .venv/bin/python -m tests.render_fault_matrix --check  # is the page's table current?

The results are what ``tests/arrow/test_s3_matrix.py`` recorded, cell by cell, in
``tests/.matrix-results.json`` (or ``$RETRYFS_FAULT_MATRIX_RESULTS``). Rendering refuses
results with a cell missing or failed: the page shows a complete, passing run or nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "docs" / "testing.md"  # the page that holds the table
RESULTS = Path(os.environ.get("RETRYFS_FAULT_MATRIX_RESULTS")
               or ROOT / "tests" / ".matrix-results.json")
START, END = "<!-- fault-matrix:start -->", "<!-- fault-matrix:end -->"
#: The GCS and Azure matrix (tests/arrow/test_cloud_matrix.py), rendered the same way.
CLOUD_RESULTS = Path(os.environ.get("RETRYFS_CLOUD_MATRIX_RESULTS")
                     or ROOT / "tests" / ".cloud-matrix-results.json")
CLOUD_START, CLOUD_END = "<!-- cloud-fault-matrix:start -->", "<!-- cloud-fault-matrix:end -->"

SYMBOL = {"survived": "✅", "failed_fast": "🛑", "not_found": "🛑", "n/a": "—", "lost": "❌"}
SHORT = {  # column headings
    "internal_error": "500 InternalError", "slow_down": "503 SlowDown",
    "service_unavailable": "503 ServiceUnavailable", "too_many_requests": "429",
    "reset": "reset", "truncate": "truncated body", "error_in_200":
    "200 + `<Error>`", "access_denied": "403 AccessDenied", "no_such_bucket":
    "404 NoSuchBucket",
}
SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def run_matrix(test: str = "tests/arrow/test_s3_matrix.py", results: Path = RESULTS,
               variable: str = "RETRYFS_FAULT_MATRIX_RESULTS") -> None:
    results.unlink(missing_ok=True)  # a full run: no cell of an earlier run survives
    env = {**os.environ, variable: str(results)}
    done = subprocess.run([sys.executable, "-m", "pytest", test, "-q",
                           "-p", "no:cacheprovider"], cwd=ROOT, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"the fault matrix failed (pytest exit {done.returncode}); page unchanged")


def _listed(results: dict[str, Any], matrix: str) -> list[dict[str, Any]]:
    """Every cell of the matrix (kind, group, client order); exits naming those missing or
    failed."""
    keys = [f"{client}|{group['name']}|{kind['name']}" for kind in results["kinds"]
            for group in results["groups"] for client in results["clients"]]
    cells: dict[str, dict[str, Any]] = results["cells"]
    problems = [f"{key}: {cells.get(key, {}).get('outcome') or 'not run'}" for key in keys
                if cells.get(key, {}).get("outcome") not in SYMBOL]
    if problems:
        sys.exit(f"incomplete or failing {matrix} results, run it first "
                 "(--run):\n  " + "\n  ".join(problems))
    return [cells[key] for key in keys]


def _grid(results: dict[str, Any], heading: str,
          column: Callable[[dict[str, Any]], str]) -> tuple[list[str], list[str]]:
    """The table (a row per operation group, a column per fault kind, each cell the clients'
    symbols in order) and its numbered notes."""
    clients, kinds, cells = results["clients"], results["kinds"], results["cells"]
    notes: list[str] = []

    def mark(cell: dict[str, Any]) -> str:
        note = cell.get("note")
        if not note:
            return SYMBOL[cell["outcome"]]
        if note not in notes:
            notes.append(note)
        return SYMBOL[cell["outcome"]] + str(notes.index(note) + 1).translate(SUPERSCRIPT)

    lines = [f"| {heading} | " + " | ".join(column(k) for k in kinds) + " |",
             "| --- |" + " :-: |" * len(kinds)]
    for group in results["groups"]:
        row = [" ".join(mark(cells[f"{client}|{group['name']}|{kind['name']}"])
                        for client in clients) for kind in kinds]
        lines.append(f"| {group['title']} | " + " | ".join(row) + " |")
    return lines, [f"{i}. {note}" for i, note in enumerate(notes, 1)]


def render(results: dict[str, Any]) -> str:
    clients, kinds, groups = results["clients"], results["kinds"], results["groups"]
    cells: dict[str, dict[str, Any]] = results["cells"]
    _listed(results, "fault matrix")
    lines, notes = _grid(results, "operation (faulted S3 request)",
                         lambda kind: SHORT.get(kind["name"], kind["title"]))
    counts = Counter(cell["outcome"] for cell in cells.values())
    faulted = sum(cell.get("faulted", 0) for cell in cells.values())
    requests = sum(len(cell.get("requests", ())) for cell in cells.values())
    total = len(clients) * len(kinds) * len(groups)
    versions = ", ".join(f"{name} {version}" for name, version in results["versions"].items())
    return "\n".join([
        START,
        "<!-- generated by `python -m tests.render_fault_matrix` from the results of "
        "tests/arrow/test_s3_matrix.py: do not edit by hand -->",
        "",
        f"Each cell: {' | '.join(f'**{c}**' for c in clients)}. ✅ survived: the operation "
        "succeeded after exactly one retry by the wrapper, the bytes stored or read are "
        "identical, and the endpoint's record shows the faulted request(s), then the good "
        "ones of one attempt. 🛑 failed fast: raised after one request of the faulted "
        "operation (no retry) with the client's own error type; a write committed nothing, "
        "a delete or move left its source intact. — does not apply.",
        "",
        *lines,
        "",
        *notes,
        "",
        f"{total} cells: {counts.get('survived', 0)} survived, "
        f"{counts.get('failed_fast', 0) + counts.get('not_found', 0)} failed fast, "
        f"{counts.get('n/a', 0)} do not apply; {faulted} faults injected, {requests} requests "
        f"of the faulted operations in all. Policy: {results['policy']['max_attempts']} "
        f"attempts, backoff ≤ {results['policy']['max_delay'] * 1000:g} ms. {versions}.",
        END,
    ])


def render_cloud(results: dict[str, Any]) -> str:
    """The GCS and Azure matrix: one row per operation group, one column per fault, each cell
    the four clients' outcomes in order."""
    clients = results["clients"]
    listed = _listed(results, "cloud fault matrix")
    lines, notes = _grid(results, "operation (faulted request)", lambda kind: kind["title"])
    counts = Counter(cell["outcome"] for cell in listed)
    titles = results.get("client_titles", {})
    versions = ", ".join(f"{name} {version}" for name, version in results["versions"].items())
    return "\n".join([
        CLOUD_START,
        "<!-- generated by `python -m tests.render_fault_matrix` from the results of "
        "tests/arrow/test_cloud_matrix.py: do not edit by hand -->",
        "",
        "Each cell: " + " | ".join(f"**{titles.get(c, c)}**" for c in clients) + ". ✅ "
        "survived (bytes identical, every planned fault fired, within the cell's time bound); "
        "🛑 failed fast (after exactly one request of the faulted operation, no retry), or "
        "answered as absent where the note says so; ❌ a wrong outcome the test pins down "
        "(see its note); — does not apply.",
        "",
        *lines,
        "",
        *notes,
        "",
        f"{len(listed)} cells: {counts.get('survived', 0)} survived, "
        f"{counts.get('failed_fast', 0) + counts.get('not_found', 0)} failed fast, "
        + (f"{counts['lost']} wrong outcome{'s' * (counts['lost'] > 1)}, "
           if counts.get("lost") else "") +
        f"{counts.get('n/a', 0)} do not apply. Policy: {results['policy']['max_attempts']} "
        f"attempts, backoff ≤ {results['policy']['max_delay'] * 1000:g} ms. {versions}.",
        CLOUD_END,
    ])


def _replaced(readme: str, start: str, end: str, table: str) -> str:
    if readme.count(start) != 1 or readme.count(end) != 1:
        sys.exit(f"docs/testing.md must hold exactly one {start} ... {end} block")
    head, rest = readme.split(start)
    _, tail = rest.split(end)
    return head + table + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="store_true", help="run the fault matrix first")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page's table differs from the results")
    args = parser.parse_args(argv)
    if args.run:
        run_matrix()
        run_matrix("tests/arrow/test_cloud_matrix.py", CLOUD_RESULTS, "RETRYFS_CLOUD_MATRIX_RESULTS")
    tables = []
    for path, start, end, fn in ((RESULTS, START, END, render),
                                 (CLOUD_RESULTS, CLOUD_START, CLOUD_END, render_cloud)):
        try:
            results = json.loads(path.read_text())
        except FileNotFoundError:
            sys.exit(f"{path} not found: run the matrix first (--run)")
        tables.append((start, end, fn(results)))
    readme = README.read_text()
    updated = readme
    for start, end, table in tables:
        updated = _replaced(updated, start, end, table)
    if args.check:
        if updated != readme:
            print("docs/testing.md: the fault matrix is not the rendering of the results", file=sys.stderr)
            return 1
        return 0
    if updated != readme:
        README.write_text(updated)
        print(f"docs/testing.md: fault matrix updated from {RESULTS}")
    else:
        print("docs/testing.md: fault matrix already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
