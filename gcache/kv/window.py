"""The window-safe rule: which prefix lengths may be reported as a hit.

A boundary b (in pages) is safe when every paged layer holds pages 0..b-1 and every SWA layer
holds the window tail before b: the last ``W`` tokens (or the whole prefix, if shorter). Reporting
any other boundary is a pseudo-hit: the engine would attend over stale or missing window KV and
its output would degrade silently. This is SGLang's rule (last W tokens); it implies vLLM's (the
last ceil((W-1)/B) blocks). The rule is pure so the store, the replay model and the connectors
share one definition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gcache.errors import InvalidRequest


def leading(present: Sequence[bool]) -> int:
    """How many entries at the start are all true."""
    for i, ok in enumerate(present):
        if not ok:
            return i
    return len(present)


def safe_boundary(n_pages: int, pages_present: Sequence[bool] | None,
                  tail_present: Callable[[int], bool] | None) -> int:
    """The largest safe boundary in ``0..n_pages``.

    ``pages_present[i]``: page i of every paged layer exists (``None`` when the model has no
    paged layers). ``tail_present(b)``: the window tail before boundary b exists for every SWA
    layer (``None`` when the model has no SWA layers).
    """
    limit = n_pages if pages_present is None else leading(pages_present[:n_pages])
    if tail_present is None:
        return limit
    for b in range(limit, 0, -1):
        if tail_present(b):
            return b
    return 0


def restorable_prefixes(n_pages: int, tail_present: Sequence[bool],
                        tail_pages: int) -> list[int]:
    """Prefix lengths ``1..n_pages`` (pages) whose last ``tail_pages`` pages all have their
    window data (``tail_present[i]`` for page i), or all pages when the prefix is shorter.

    This is the rule for engines that keep window KV per page under the page's own key
    (SGLang's SWA pool, ``TRAILING_PAGES``): a tail can be present at 5 pages and missing at 4,
    so the answer is a set, not a length.
    """
    if tail_pages < 1:
        raise InvalidRequest(f"tail_pages must be at least 1; got {tail_pages}")
    out = []
    run = 0                              # present pages ending at the current prefix
    for p in range(1, n_pages + 1):
        run = run + 1 if tail_present[p - 1] else 0
        if run >= min(p, tail_pages):
            out.append(p)
    return out


def tail_span(boundary_pages: int, page_size: int, window: int) -> tuple[int, int]:
    """Token range ``[start, stop)`` of the window tail before ``boundary_pages`` pages."""
    stop = boundary_pages * page_size
    return max(0, stop - window), stop
