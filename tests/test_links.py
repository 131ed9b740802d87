"""Every relative link and file reference in the README, the docs, the benchmark log and the examples points to a file that exists.

Markdown links and images (``[text](docs/x.md)``, ``![curves](docs/demo-curves.png)``) are resolved against
the file that holds them; file names in prose and code (``docs/migrating-from-keras.md``,
``examples/cntk_advanced_mnist.py``, ``scripts/demo.sh``) against the repository's root. Web addresses are
not fetched (the tests run offline).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FILE_REFERENCE = re.compile(
    r"(?<![\w./-])((?:\.\./)?(?:docs|examples|scripts|benchmarks|tests|kfit|\.ci)/[\w./-]*\.(?:md|py|sh|png|svg|txt|toml|json|csv))\b"
)


def documents() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md")), *sorted((ROOT / "benchmarks").glob("*.md")),
             *sorted((ROOT / "examples").glob("**/*.py"))]
    return [f for f in files if f.is_file()]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The links and file references of ``path`` that do not resolve, as ``"FILE:LINE: TARGET"``."""
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for target in MARKDOWN_LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):  # http:, mailto:, an anchor
                continue
            file = target.split("#", 1)[0]
            if not (path.parent / file).resolve().exists():
                problems.append(f"{path.relative_to(root)}:{number}: {target}")
        for reference in FILE_REFERENCE.findall(line):
            if "://" in line and f"/{reference}" in line.split("://", 1)[1]:
                continue  # part of a web address
            base = path.parent if reference.startswith("../") else root
            if not (base / reference).resolve().exists():
                problems.append(f"{path.relative_to(root)}:{number}: {reference}")
    return list(dict.fromkeys(problems))  # a link is also a file reference: report it once


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_file_references_resolve(path):
    assert broken_links(path) == []


def test_the_checker_finds_a_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("x")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/there.md) [ok too](docs/there.md#a-heading) [web](https://example.com/docs/x.md)\n"
        "[gone](docs/migrating.md) ![picture](docs/missing.png)\n"
        "see docs/there.md and docs/nowhere.md\n"
    )
    assert broken_links(page, root=tmp_path) == [
        "README.md:2: docs/migrating.md", "README.md:2: docs/missing.png", "README.md:3: docs/nowhere.md",
    ]
