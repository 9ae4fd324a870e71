"""The ring clients place keys on, as a server rebuilds it from the masters' map: for a drain
(the map without itself) and for the mutable keys it no longer owns after a map change."""

from __future__ import annotations

from gcache.config import ServerConfig
from gcache.proto import master_pb2 as pb
from gcache.ring import Ring
from gcache.transport.master_rpc import IN_MAP, MasterLink


def fetch_map(config: ServerConfig) -> pb.ClusterMap:
    """The current map from any master. Raises MasterError / Unavailable."""
    link = MasterLink(config.master, token=config.token)
    try:
        return link.call("GetClusterMap", pb.GetClusterMapRequest())
    finally:
        link.close()


def ring_of(cluster_map: pb.ClusterMap, *, vnodes: int,
            without: str | None = None) -> tuple[Ring, dict[str, str]]:
    """The ring over the map's servers that own keys (alive or suspect), less ``without``,
    weighted by capacity and with ``vnodes`` points per server as clients build it; and each
    server's address by id."""
    live = [s.id for s in cluster_map.servers if s.state in IN_MAP and s.id != without]
    ring = Ring({s.id: float(s.capacity_bytes) for s in cluster_map.servers}, vnodes=vnodes,
                live=live)
    return ring, {s.id: s.address for s in cluster_map.servers}
