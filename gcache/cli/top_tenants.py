"""``gcache top``'s tenant table: per tenant, over every server shown, what its values hold in
memory and on disk against its quotas, and its reads, puts, evictions and refusals in the
interval (from STAT's ``tenants``, ``gcache.server.tenant_stats``; the administrator's keys as
``_admin``). Quotas are per server, so the quota column is per server too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Stat = dict[str, Any]
HEADER = ["TENANT", "MEMORY", "QUOTA/SRV", "DISK", "DISK QUOTA/SRV", "HIT%", "PUT/S", "EVICT/S",
          "REFUSED/S"]
_COUNTERS = ("hits", "misses", "puts", "evicted_objects", "refusals")


def _sums(stats: Mapping[str, Stat | None]) -> dict[str, dict[str, int]]:
    """Each tenant's figures summed over the servers that answered (quotas: the largest)."""
    out: dict[str, dict[str, int]] = {}
    for stat in stats.values():
        for name, row in ((stat or {}).get("tenants") or {}).items():
            into = out.setdefault(name, {})
            for key, value in row.items():
                if key.endswith("_quota_bytes"):
                    into[key] = max(into.get(key, 0), int(value))
                else:
                    into[key] = into.get(key, 0) + int(value)
    return out


def _size(n_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n_bytes) < 1024 or unit == "TiB":
            return f"{n_bytes:.0f}{unit}" if unit == "B" else f"{n_bytes:.1f}{unit}"
        n_bytes /= 1024
    raise AssertionError("unreachable")


def tenant_lines(before: Mapping[str, Stat | None], after: Mapping[str, Stat | None],
                 wall_s: float) -> list[str]:
    """The table, or nothing when no tenant but the administrator's keys shows."""
    now, then = _sums(after), _sums(before)
    if not set(now) - {"_admin"}:
        return []
    rows = []
    for name in sorted(now):
        row, old = now[name], then.get(name, {})
        delta = {k: max(0, row.get(k, 0) - old.get(k, 0)) for k in _COUNTERS}
        reads = delta["hits"] + delta["misses"]
        rows.append([name, _size(row.get("memory_bytes", 0)),
                     _size(row["memory_quota_bytes"]) if row.get("memory_quota_bytes") else "-",
                     _size(row.get("disk_bytes", 0)),
                     _size(row["disk_quota_bytes"]) if row.get("disk_quota_bytes") else "-",
                     f"{100 * delta['hits'] / reads:.1f}%" if reads else "-",
                     f"{delta['puts'] / wall_s:.0f}", f"{delta['evicted_objects'] / wall_s:.0f}",
                     f"{delta['refusals'] / wall_s:.0f}"])
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    return ["tenants (memory and disk summed over the servers shown):",
            *("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
              for r in [HEADER, *rows])]
