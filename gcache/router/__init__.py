"""``gcache.router``: KV-cache-affinity routing of requests across engine instances (issue 20).

The policy (``route``, a pure function over per-instance snapshots), the length buckets whose
pools it routes within, and the per-instance prefix views that feed it. The HTTP proxy will
sit on top of these; ``bench/routing.py`` drives the same policy in virtual time.
"""

from gcache.router.buckets import Buckets
from gcache.router.policy import InstanceState, PolicyConfig, Route, route
from gcache.router.views import PrefixView

__all__ = ["Buckets", "InstanceState", "PolicyConfig", "PrefixView", "Route", "route"]
