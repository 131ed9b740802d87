"""The API reference (docs/api.md) is generated from the docstrings and kept up to date."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_api_reference_is_up_to_date():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_api_docs.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_readme_quick_start_commands_exist():
    readme = (ROOT / "README.md").read_text()
    for command in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert command in readme
        assert (ROOT / command.split()[1]).exists()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
