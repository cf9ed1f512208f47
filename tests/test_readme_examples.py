"""The README's Python examples (```pycon blocks of its "After training" section) run as doctests, in a process
of their own: `rapid.train(in_process=True)` sends that process's logging to the run's log file.

About 8 s on 2 cores, most of it the tiny training run."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers import ROOT

RUNNER = """
import doctest, sys
text = open(sys.argv[1]).read()
test = doctest.DocTestParser().get_doctest(text, {}, "README.md: After training", "README.md", 0)
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
runner.run(test)
print(f"{runner.tries} examples, {runner.failures} failed")
sys.exit(1 if runner.failures or not runner.tries else 0)
"""


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_after_training_examples_run(tmp_path):
    text = section((ROOT / "README.md").read_text(), "After training")
    blocks = re.findall(r"```pycon\n(.*?)```", text, re.S)
    assert len(blocks) >= 2, "the section's Python examples"
    examples = tmp_path / "examples.txt"
    examples.write_text("\n".join(blocks))
    out = subprocess.run([sys.executable, "-c", RUNNER, str(examples)], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " 0 failed" in out.stdout
