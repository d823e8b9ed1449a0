"""The root README's Python quick start runs as written (its heredoc script; the
``pip install`` line above it is what CI runs before these tests)."""

import os
import subprocess
import sys
import tempfile

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_readme_quick_start_runs():
    text = open(README).read()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    assert block.startswith("pip install ./python"), "the quick start installs the package first"
    script = block.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    # Out of the checkout: from python/, `-c` would import the source folder detcoll/ (no extension).
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
