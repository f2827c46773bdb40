"""The README as a user guide: every python quick start in it runs as written, and every link in
the README and docs/ points at a file of the repository (no ``../shared``)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

README = os.path.join(ROOT, "README.md")
#: Quick starts light enough for the default run (a few seconds each); the rest are slow.
LIGHT = ("popart.Builder()", "poplar.IPUModel(")


def python_blocks(path: str = README) -> list[str]:
    """The ```python blocks of a Markdown file, dedented (a block inside a list item is indented)."""
    import textwrap
    text = open(path, encoding="utf-8").read()
    return [textwrap.dedent(m.group(2)) for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.M | re.S)]


def _params():
    out = []
    for i, code in enumerate(python_blocks()):
        marks = [] if any(k in code for k in LIGHT) else [pytest.mark.slow]
        first = next(line for line in code.splitlines() if line.strip() and not line.startswith("import"))
        out.append(pytest.param(code, id=f"{i}-{re.sub(r'[^A-Za-z0-9]+', '_', first)[:30]}", marks=marks))
    return out


def test_the_readme_has_quick_starts():
    blocks = python_blocks()
    assert len(blocks) >= 6
    for api in ("popart.", "poptorch.", "poprt", "poplar.", "pva.", "torch.onnx.export"):
        assert any(api in b for b in blocks), api


@pytest.mark.parametrize("code", _params())
def test_readme_python_runs(code, tmp_path):
    """Run one block as a user would paste it: a fresh interpreter in an empty directory."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert p.returncode == 0, f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"


def _markdown_files():
    files = [README]
    for d, _, names in os.walk(os.path.join(ROOT, "docs")):
        files += [os.path.join(d, n) for n in names if n.endswith(".md")]
    return files


def test_links_point_into_the_repository():
    bad = []
    for f in _markdown_files():
        text = open(f, encoding="utf-8").read()
        if "../shared" in text:
            bad.append(f"{f}: ../shared")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(f), target.split("#")[0]))
            if not path.startswith(ROOT) or not os.path.exists(path):
                bad.append(f"{os.path.relpath(f, ROOT)}: {target}")
    assert not bad, bad
