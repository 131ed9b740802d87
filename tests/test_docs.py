"""The API reference (docs/api.md) is generated from the docstrings and kept up to date; the code a new user
copies from the README and the `model.fit` guide runs as written."""

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import keras
from helpers import classification_data

import kfit

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
                "kfit/interval.py", "kfit/_checks.py", "kfit/_files.py", "kfit/_backend.py"]
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


def python_block(doc: str, heading: str) -> str:
    """The first ```python block of ``doc`` after the line ``heading``, as a user copies it."""
    text = (ROOT / doc).read_text()
    block = re.search(r"^```python\n(.*?)^```", text[text.index(f"\n{heading}\n"):], re.M | re.S)
    assert block, f"no python block after {heading!r} in {doc}"
    return block.group(1)


def classifier() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3, activation="softmax")])


def test_the_readmes_few_lines_run_as_written(tmp_path, monkeypatch):
    """README's "In a few lines", verbatim, given the tiny model and data it leaves to the user."""
    monkeypatch.chdir(tmp_path)
    x, y = classification_data(256, features=4, classes=3)  # one minibatch shape: compiled once
    x_val, y_val = classification_data(64, features=4, classes=3, seed=1)
    code = python_block("README.md", "## In a few lines")
    namespace = {"model": classifier(), "x": x, "y": y, "x_val": x_val, "y_val": y_val}
    exec(compile(code, "README.md", "exec"), namespace)
    history, model = namespace["history"], namespace["model"]
    summary = history.epoch_summaries[-1]
    # the fields its last line names, and what it says of them
    shown = re.search(r"# (EpochSummary\(.*\))", code).group(1)
    assert [f.name for f in dataclasses.fields(summary)] == re.findall(r"(\w+)=", shown)
    assert summary.samples == len(x) and "val_average_error" in summary.metrics
    assert len(history.epoch_summaries) == len(history.epoch)
    # "every 100k samples; resumes": the run's final state is on disk
    info = kfit.checkpoint.read_checkpoint_info(tmp_path / "run" / "model.h5")
    assert info.samples == kfit.get_clock(model).samples == len(x) * len(history.epoch)


def test_the_model_fit_guides_code_runs_as_written(tmp_path, monkeypatch):
    """docs/migrating-from-keras.md: step 1 (``callbacks=[...]`` left empty; 3 epochs of its 30, for CI's time) and
    kfit's callbacks in model.fit."""
    monkeypatch.chdir(tmp_path)
    x, y = classification_data(64, features=4, classes=3)
    x_val, y_val = classification_data(32, features=4, classes=3, seed=1)
    for heading, check in (("## Step 1: `model.fit(` becomes `kfit.fit(model, `", "history"),
                           ("## What needs `kfit.fit`, and what works in plain `model.fit`", "model")):
        code = python_block("docs/migrating-from-keras.md", heading).replace("callbacks=[...]", "callbacks=[]")
        code = code.replace("epochs=30,", "epochs=3,")
        model = classifier()
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        namespace = {"kfit": kfit, "model": model, "x": x, "y": y, "x_val": x_val, "y_val": y_val}
        exec(compile(code, "docs/migrating-from-keras.md", "exec"), namespace)
        clock = kfit.get_clock(model)
        assert clock.samples == len(x) * len(model.history.epoch) > 0
        if check == "history":
            assert len(namespace["history"].epoch_summaries) == 3
        else:  # the cross-validation every 1000 samples reached EarlyStopping's logs
            assert "val_average_error" in model.history.history
