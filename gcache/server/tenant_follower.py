"""Following the masters' tenant table, and deleting what removed tenants left.

Each heartbeat answer carries the table's version (``HeartbeatReply.tenants_version``); when it
is not the version this server holds, the table is fetched (``GetTenants``) and swapped in
(``Tenants.update``). So a revoked tenant is refused within one heartbeat interval of the
revocation being applied (plus one fetch).

A removed tenant's values are deleted on a thread of its own, in both tiers: those of the ids
the new table dropped, and, on the first table after a start, those of every id the table does
not have (removed while this server was down; ids are never reused, so nothing of a live
tenant's can be mistaken for one). The administrator's keys (owner 0) are never touched.
"""

from __future__ import annotations

import logging
import threading

from gcache.errors import GCacheError
from gcache.master_client import MasterClient
from gcache.proto import master_pb2 as pb
from gcache.server.tenant_keys import ADMIN, owner_of
from gcache.server.tenant_table import Tenants
from gcache.server.tier_protocol import Listing, Tier

log = logging.getLogger(__name__)


class TenantFollower:
    def __init__(self, tenants: Tenants, tier: Tier, link: MasterClient) -> None:
        self.tenants, self.tier, self.link = tenants, tier, link
        self._fetching = threading.Lock()
        self._purging = threading.Lock()
        self.purged = 0                       # values of removed tenants deleted so far

    def seen(self, version: int) -> None:
        """A master answered with tenant table ``version``: fetch it unless it is ours.
        Version 0 is the empty table (every change moves it), taken without a call: masters
        of a release before tenants answer 0 and have no ``GetTenants``."""
        if self.tenants.known and version == self.tenants.version:
            return
        with self._fetching:
            if self.tenants.known and version == self.tenants.version:
                return
            try:
                table = (self.link.tenants(self.tenants.version if self.tenants.known else 0)
                         if version else pb.TenantTable(version=0, changed=True))
            except GCacheError as exc:
                log.warning("tenants.fetch_failed error=%s", exc)
                return
            if not table.changed and self.tenants.known:
                return
            first = not self.tenants.known
            gone = self.tenants.update(table)
            log.info("tenants.table version=%d tenants=%d removed=%d", table.version,
                     len(table.tenants), len(gone))
        if gone or first:
            threading.Thread(target=self.purge, name="gcache-tenant-purge",
                             daemon=True).start()

    def purge(self) -> int:
        """Delete every value whose owner is a tenant the table does not have; how many."""
        if not isinstance(self.tier, Listing):
            return 0
        with self._purging:
            live = self.tenants.ids() | {ADMIN}
            doomed = [k for k, _ in self.tier.keys_with_groups() if owner_of(k) not in live]
            for key in doomed:
                if owner_of(key) not in self.tenants.ids():     # not added back meanwhile
                    self.tier.delete(key)
            self.purged += len(doomed)
        if doomed:
            log.info("tenants.purged values=%d", len(doomed))
        return len(doomed)
