import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "poplar")


@pytest.fixture
def run_example():
    """Run an example script as the tutorials' tests do: merged stdout+stderr, exit code checked."""
    def run(name, *args, env=None, expect_code=0):
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=e, cwd=ROOT)
        assert p.returncode == expect_code, p.stdout
        return p.stdout
    return run
