"""MkDocs hook: links from a page to files of the repository outside ``docs/``.

The pages are read in two places: as files of the checkout (a code host or an editor, where
``[deploy/systemd](../deploy/systemd)`` opens the folder) and as the built site, which holds
only ``docs/``. MkDocs reports every link that leaves ``docs/`` as not found, and ``--strict``
makes that an error. This hook keeps such a link checked rather than ignored: a target that
exists in the repository becomes its path in code (``deploy/systemd``) on the site, since the
site has no copy of it to link to; a target that does not exist is a warning, so ``mkdocs build
--strict`` (``make lint``) fails on it as it does on a broken link between pages. Links inside
fenced code blocks are not links and are left alone.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from typing import Any

log = logging.getLogger("mkdocs.hooks.repo_links")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[([^\]\n]*)\]\(([^)\s]+)\)")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """The page's Markdown with links that leave ``docs/`` rewritten as described above."""
    here = posixpath.dirname(page.file.src_uri)
    out, start = [], 0
    for fence in FENCE.finditer(markdown):
        out.append(_rewrite(markdown[start:fence.start()], here, page.file.src_uri))
        out.append(fence.group(0))
        start = fence.end()
    out.append(_rewrite(markdown[start:], here, page.file.src_uri))
    return "".join(out)


def _rewrite(text: str, here: str, src_uri: str) -> str:
    def replace(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if "://" in target or target.startswith(("#", "mailto:", "/")):
            return match.group(0)
        path = target.split("#", 1)[0]
        inside = posixpath.normpath(posixpath.join(here, path))
        if not inside.startswith("../"):
            return match.group(0)             # a page or asset of the site: MkDocs checks it
        repo_path = posixpath.normpath(posixpath.join("docs", inside))
        if repo_path.startswith("../") or not os.path.exists(os.path.join(ROOT, repo_path)):
            log.warning("Doc file '%s' links to '%s', which is not a file of the repository",
                        src_uri, target)
            return match.group(0)
        return label if "`" in label else f"{label} (`{repo_path}`)"

    return LINK.sub(replace, text)
