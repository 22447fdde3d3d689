"""The README's usage snippet runs as written, in a clean working directory it leaves empty."""
import pathlib
import re
import sys

import _procs

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_usage_snippet_runs(tmp_path):
    blocks = python_blocks()
    assert blocks, "README has no python example"
    for code in blocks:
        proc = _procs.run([sys.executable, "-c", code], 300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []


def test_readme_commands_match_ci():
    """CI runs the README's test command verbatim."""
    readme = README.read_text(encoding="utf-8")
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    test_cmd = re.search(r"# 2\. set up \+ run the tests\n(.+)\n", readme).group(1).strip()
    assert test_cmd in ci


def test_readme_stays_a_ten_minute_read():
    """The README is what a newcomer reads first: at most 300 lines; design, tables and detail live in docs/."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/ (e.g. docs/distillation.md)"
