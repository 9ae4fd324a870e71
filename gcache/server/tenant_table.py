"""The tenants as this data server knows them: the masters' table, followed, and what each
tenant did here.

The table arrives from the masters (``GetTenants``) whenever a heartbeat answer shows a version
this server has not seen (``DataServer``), so a change reaches every server within one heartbeat
interval: a revoked tenant's next request is refused (``ConnectionHandler`` asks
``is_active`` before each one), and its new connections fail AUTH. The table is replaced whole,
never edited in place, so readers need no lock. Until a table arrived (no masters, or none
answered yet) there are no tenants: only the cluster token opens anything.

Also here, per tenant id: the counters only the request paths see (hits, misses, puts,
refusals), which STAT and /metrics report beside each tenant's bytes per tier
(``Owners.owner_stats``). A tenant's id is what its keys carry (``tenant_keys``).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from gcache.proto import master_pb2 as pb
from gcache.server.tenant_keys import ADMIN

ADMIN_LABEL = "_admin"     # the administrator's keys in per-tenant reports (no name can be it)
REQUEST_COUNTERS = ("hits", "misses", "puts", "refusals")


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    id: int
    token_sha256: bytes
    memory_quota_bytes: int
    disk_quota_bytes: int
    active: bool


class Tenants:
    """The tenant table (``update``), lookups by name and id, quotas for the tiers
    (``reclaim.Quotas``), and request counters per tenant."""

    def __init__(self) -> None:
        self._by_name: dict[str, Tenant] = {}
        self._by_id: dict[int, Tenant] = {}
        self.version = 0
        self.known = False            # a table arrived from the masters
        self._lock = threading.Lock()   # the counters
        self._counts: dict[int, collections.Counter[str]] = {}

    def update(self, table: pb.TenantTable) -> set[int]:
        """Take a table the masters sent (``changed``); returns the ids of tenants it no
        longer has (removed: their values go)."""
        tenants = [Tenant(t.name, t.id, bytes(t.token_sha256), t.memory_quota_bytes,
                          t.disk_quota_bytes, t.state == pb.ACTIVE) for t in table.tenants]
        gone = set(self._by_id) - {t.id for t in tenants}
        self._by_name = {t.name: t for t in tenants}
        self._by_id = {t.id: t for t in tenants}
        self.version, self.known = table.version, True
        return gone

    def by_name(self, name: str) -> Tenant | None:
        return self._by_name.get(name)

    def by_id(self, tenant_id: int) -> Tenant | None:
        return self._by_id.get(tenant_id)

    def ids(self) -> set[int]:
        return set(self._by_id)

    def is_active(self, tenant_id: int) -> bool:
        tenant = self._by_id.get(tenant_id)
        return tenant is not None and tenant.active

    def exists(self, tenant_id: int) -> bool:
        return tenant_id in self._by_id

    def label(self, tenant_id: int) -> str:
        """A tenant id's name for reports; ``ADMIN_LABEL`` for the administrator's keys."""
        if tenant_id == ADMIN:
            return ADMIN_LABEL
        tenant = self._by_id.get(tenant_id)
        return tenant.name if tenant is not None else f"#{tenant_id}"

    def memory_quota(self, owner: int) -> int:
        tenant = self._by_id.get(owner)
        return tenant.memory_quota_bytes if tenant is not None else 0

    def disk_quota(self, owner: int) -> int:
        tenant = self._by_id.get(owner)
        return tenant.disk_quota_bytes if tenant is not None else 0

    # ---- request counters ---------------------------------------------------------------------

    def count(self, tenant_id: int, **events: int) -> None:
        """Add ``events`` (names from ``REQUEST_COUNTERS``) to a tenant's counters."""
        with self._lock:
            counts = self._counts.get(tenant_id)
            if counts is None:
                counts = self._counts[tenant_id] = collections.Counter()
            counts.update(events)

    def counts(self) -> dict[int, dict[str, int]]:
        with self._lock:
            return {t: {k: c[k] for k in REQUEST_COUNTERS} for t, c in self._counts.items()}
