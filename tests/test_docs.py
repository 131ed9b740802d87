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


LOWER_LAYERS = ["kfit/checkpoint", "kfit/data", "kfit/schedules", "kfit/optimizers", "kfit/_run.py", "kfit/clock.py",
                "kfit/interval.py", "kfit/_checks.py", "kfit/_backend.py"]
UPPER_LAYERS = ("kfit.callbacks", "kfit.training")


def test_no_upward_imports():
    """The layers of docs/architecture.md: the lower ones never import kfit.callbacks or kfit.training."""
    import ast

    root = ROOT
    files = [p for layer in LOWER_LAYERS for p in sorted((root / layer).rglob("*.py") if (root / layer).is_dir()
                                                          else [root / layer])]
    assert len(files) > 15
    upward = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            upward += [f"{path.relative_to(root)}:{node.lineno} imports {n}" for n in names
                       if n.startswith(UPPER_LAYERS)]
    assert upward == []
