"""Per-tenant figures, for STAT (``tenants``) and /metrics (a ``tenant`` label).

Bytes come from the tiers (``tier_protocol.Owners``: what each owner's spans hold in memory,
its values on disk, what it lost to claims), requests from the handlers' counters
(``Tenants.count``: hits, misses, puts, refusals), quotas from the table. Keyed by tenant name;
the administrator's keys (no tenant) under ``tenant_table.ADMIN_LABEL``. A tenant's own STAT
shows only its own entry: nothing a tenant asks tells it about another.
"""

from __future__ import annotations

from gcache.server.tenant_keys import ADMIN
from gcache.server.tenant_table import REQUEST_COUNTERS, Tenants
from gcache.server.tier_protocol import Owners, Tier

FIGURES = ("memory_bytes", "memory_quota_bytes", "disk_bytes", "disk_quota_bytes",
           "pinned_bytes", "evicted_objects", *REQUEST_COUNTERS)


def tenant_figures(tier: Tier, tenants: Tenants, *,
                   only: int | None = None) -> dict[str, dict[str, int]]:
    """Every owner's figures (``only``: that tenant's alone), by name."""
    owners = tier.owner_stats() if isinstance(tier, Owners) else {}
    counts = tenants.counts()
    ids = set(owners) | set(counts) | tenants.ids() | {ADMIN}
    if only is not None:
        ids = {only}
    out: dict[str, dict[str, int]] = {}
    for owner in sorted(ids):
        row = dict.fromkeys(FIGURES, 0)
        row.update(owners.get(owner, {}))
        row.update(counts.get(owner, {}))
        row["memory_quota_bytes"] = tenants.memory_quota(owner)
        row["disk_quota_bytes"] = tenants.disk_quota(owner)
        out[tenants.label(owner)] = row
    return out
