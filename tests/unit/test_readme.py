"""README.md is a short window onto the documentation site: each of its code blocks is a copy
of a block on a page of docs/ (where the blocks a reader runs are tested as printed), so the two
cannot drift; each of its links reaches a file, and a heading there when it names one; and the
benchmark renderer finds a place for every table it renders (``bench/update_readme.py
--check``), one file per table."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from markdown.extensions.toc import slugify

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```[a-z]*\n.*?^```$", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> dict[pathlib.Path, str]:
    return {path: path.read_text() for path in sorted((ROOT / "docs").rglob("*.md"))}


def anchors(text: str) -> set[str]:
    """The heading ids MkDocs gives a page (Python-Markdown's toc slugify)."""
    headings = re.findall(r"^#+ (.*)$", FENCE.sub("", text), re.M)
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in headings}


def test_every_readme_code_block_is_a_block_of_a_docs_page():
    docs = "\n".join(pages().values())
    blocks = FENCE.findall(README.read_text())
    assert len(blocks) >= 6, blocks
    for block in blocks:
        assert block in docs, f"README block not on any docs page:\n{block}"


def test_every_readme_link_reaches_a_file_and_its_heading():
    text = README.read_text()
    for target in LINK.findall(text):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        file = README if not path else (ROOT / path)
        assert file.exists(), f"README links to {target}: no such file"
        if anchor:
            assert anchor in anchors(file.read_text()), f"README links to {target}: no heading"


def test_the_benchmark_renderer_finds_one_file_for_every_table():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "update_readme.py"), "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "README.md: headline figures" in done.stdout
