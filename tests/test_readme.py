"""The README's first screen: its first example runs as shown, its contents list covers every
section, and it tells one install story."""

import re
import subprocess
import sys
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_first_example_runs_and_shows_a_retried_fault():
    first = README.index("```python\n", README.index("## First look"))
    code = README[first + len("```python\n"):README.index("```", first + 10)]
    assert len(code.strip().splitlines()) <= 12
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "'retries': 2" in done.stdout and "'throttled': 2" in done.stdout
    output = README.index("```\n", README.index("```", first + 10) + 3) + 4  # the block below
    shown = README[output:README.index("```", output)].strip().splitlines()[-1]
    assert done.stdout.strip() == shown  # the stats line the README shows
    assert done.stderr.count("SLOW_DOWN during UploadPart") == 2  # the log line per retry


def test_the_contents_list_covers_every_section():
    headings = [line[3:] for line in README.splitlines() if line.startswith("## ")]
    contents = README[README.index("Contents:"):README.index("\n\n", README.index("Contents:"))]
    linked = re.findall(r"\]\(#([^)]+)\)", contents)
    assert linked == [anchor(h) for h in headings]
    assert README.index("Contents:") < README.index("## ")  # on the first screen


def test_one_install_story():
    assert not re.search(r"pip install ['\"]?retryfs", README)
    assert "pip install ." in README and "pip install '.[demo]'" in README
