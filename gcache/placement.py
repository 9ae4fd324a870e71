"""Where keys live (ARCHITECTURE §3): the consistent-hash ring, a group's slot owners, and the
parameters that clients and servers must agree on, which the masters carry in the cluster map.

Each server gets virtual nodes in proportion to its capacity, at points ``xxh3_64(address#i)``.
The ring holds every *known* server, live or not; ``live`` says which may own keys. A key is
owned by the first live server clockwise of ``xxh3_64(key)``. With a ``group`` the placement key
is the group: its ``group_width`` slots are each anchored on the ring (slot j at
``xxh3_64(group_hash ‖ j)``) and assigned distinct servers in slot order, over all known servers;
a slot whose server is not live falls through to the next live server clockwise of its anchor. A
key goes to slot ``xxh3_64(key) % width``. So one prefix tree lives on ``width`` servers, one host
failure touches only the groups it holds, and, because the assignment is computed over servers
that stay known when they die or drain, a server leaving moves only the keys it held: a drain
hands over exactly those. (Computing the distinct assignment over live servers only would make a
departure shift other slots too.)

A client and a draining server must place a key identically, so ``vnodes`` and ``group_width``
are the masters' (``gcache-master --vnodes --group-width``), sent in every cluster map; a client
without masters (``servers=[...]``) uses its own ``ClientConfig``.

The ring is immutable; membership changes build a new one (rings are small: servers × vnodes).
"""


from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gcache.errors import ConfigError
from gcache.keys import key_hash
from gcache.proto import master_pb2 as pb

_SLOT = struct.Struct("<QH")     # a group's placement hash and a slot number

# Points per server (of weight 1): 64 left the busiest of 8 servers 1.49x the mean of
# ungrouped keys on the conversation trace, 256 leaves 1.12x (bench/placement.py --vnodes).
DEFAULT_VNODES = 256
DEFAULT_GROUP_WIDTH = 2
IN_MAP = (pb.ALIVE, pb.SUSPECT)     # states whose servers own keys (suspect keeps its keys)


class Ring:
    """Immutable ring over ``weights`` (address -> capacity weight, any positive unit)."""

    __slots__ = ("_live", "_live_owners", "_owners", "_points", "_servers")

    def __init__(self, weights: Mapping[str, float], *, vnodes: int = DEFAULT_VNODES,
                 live: Sequence[str] | None = None) -> None:
        if any(w <= 0 for w in weights.values()):
            raise ConfigError("weights", dict(weights), "server weights must be positive")
        self._servers = tuple(sorted(weights))
        self._live = frozenset(self._servers if live is None else live) & set(self._servers)
        mean = sum(weights.values()) / len(weights) if weights else 1.0
        points: list[tuple[int, str]] = []
        for address in self._servers:
            count = max(1, round(vnodes * weights[address] / mean))
            points.extend((key_hash(f"{address}#{i}".encode()), address) for i in range(count))
        points.sort()
        self._points = [p for p, _ in points]
        self._owners = [a for _, a in points]
        # the first live server at or clockwise of each point: a key's owner is one bisect away
        # (walking the ring per key cost most of a batch's placement)
        self._live_owners = self._first_live_at_each_point()

    @classmethod
    def uniform(cls, servers: Sequence[str], *, vnodes: int = DEFAULT_VNODES) -> Ring:
        return cls(dict.fromkeys(servers, 1.0), vnodes=vnodes)

    @property
    def servers(self) -> tuple[str, ...]:
        return self._servers

    @property
    def live(self) -> frozenset[str]:
        return self._live

    def successors(self, point: int, count: int) -> list[str]:
        """Up to ``count`` distinct servers (live or not) clockwise from ``point``."""
        return list(itertools.islice(self._clockwise(point), count))

    def owner(self, key: bytes, *, group: bytes | None = None, group_width: int = 2) -> str | None:
        """The server that holds ``key`` (None on an empty ring)."""
        return self.owner_by_hash(key, 0 if group is None else key_hash(group),
                                  group_width=group_width)

    def owner_by_hash(self, key: bytes, group_hash: int, *, group_width: int = 2) -> str | None:
        """``owner`` from the group's placement hash (0: no group), as servers store it."""
        if group_hash == 0:
            return self._first_live(key_hash(key))
        return self.slot_owners(group_hash, group_width)[key_hash(key) % group_width]

    def slot_owners(self, group_hash: int, group_width: int) -> list[str | None]:
        """The live owner of each of a group's slots (compute once, place many keys)."""
        taken: set[str] = set()
        owners: list[str | None] = []
        for j in range(group_width):
            anchor = key_hash(_SLOT.pack(group_hash, j))
            server = next((s for s in self._clockwise(anchor) if s not in taken), None)
            if server is None:                   # fewer known servers than slots
                server = next(self._clockwise(anchor), None)
            if server is not None:
                taken.add(server)
            owners.append(server if server in self._live else self._first_live(anchor))
        return owners

    def _first_live(self, point: int) -> str | None:
        if not self._points:
            return None
        return self._live_owners[bisect.bisect_left(self._points, point) % len(self._points)]

    def _first_live_at_each_point(self) -> list[str | None]:
        owners: list[str | None] = [None] * len(self._owners)
        # past the last point the ring wraps round to its start
        after = next((owner for owner in self._owners if owner in self._live), None)
        for i in range(len(self._owners) - 1, -1, -1):
            if self._owners[i] in self._live:
                after = self._owners[i]
            owners[i] = after
        return owners

    def _clockwise(self, point: int) -> Iterator[str]:
        """Distinct servers in ring order from ``point``."""
        if not self._points:
            return
        start, seen = bisect.bisect_left(self._points, point), set()
        for step in range(len(self._points)):
            owner = self._owners[(start + step) % len(self._points)]
            if owner not in seen:
                seen.add(owner)
                yield owner


@dataclass(frozen=True, slots=True)
class Placement:
    """The parameters every party must share to place a key the same way."""

    vnodes: int = DEFAULT_VNODES             # ring points per server of mean capacity
    group_width: int = DEFAULT_GROUP_WIDTH   # servers one placement group is striped over

    def to_pb(self) -> pb.Placement:
        return pb.Placement(vnodes=self.vnodes, group_width=self.group_width)

    @classmethod
    def of_map(cls, cluster_map: pb.ClusterMap, fallback: Placement) -> Placement:
        """The map's placement; ``fallback`` for a map from masters that send none."""
        sent = cluster_map.placement
        if sent.vnodes <= 0 or sent.group_width <= 0:
            return fallback
        return cls(vnodes=sent.vnodes, group_width=sent.group_width)


class PlacedMap:
    """One map's servers on a ring under one ``Placement``: key -> owner, by server id or by
    address. Immutable, so readers take a reference and need no lock."""

    __slots__ = ("address_of", "placement", "ring")

    def __init__(self, members: Mapping[str, tuple[str, float]], live: Sequence[str] | None,
                 placement: Placement) -> None:
        """``members``: server id -> (data-plane address, capacity weight), every server the
        map knows; only ``live`` ones (default: all) own keys. The ring is keyed by id, so a
        server that comes back at a new address keeps its keys."""
        self.ring = Ring({sid: weight for sid, (_, weight) in members.items()},
                         vnodes=placement.vnodes, live=live)
        self.address_of = {sid: address for sid, (address, _) in members.items()}
        self.placement = placement

    @classmethod
    def of_map(cls, cluster_map: pb.ClusterMap, fallback: Placement, *,
               without: str | None = None) -> PlacedMap:
        """The map's servers that own keys (alive or suspect), less ``without`` (a draining
        server places its keys on the map without itself), weighted by capacity."""
        members = {s.id: (s.address, float(s.capacity_bytes)) for s in cluster_map.servers}
        live = [s.id for s in cluster_map.servers if s.state in IN_MAP and s.id != without]
        return cls(members, live, Placement.of_map(cluster_map, fallback))

    def owner_id(self, key: bytes, group_hash: int) -> str | None:
        """The id of the server that holds ``key`` put with ``group_hash`` (0: no group)."""
        return self.ring.owner_by_hash(key, group_hash, group_width=self.placement.group_width)

    def owners(self, group_hash: int) -> Callable[[bytes], str | None]:
        """Key -> owner address for keys of one group (its slots are placed once)."""
        if group_hash == 0:
            return lambda key: self.address_of.get(self.ring.owner(key) or "")
        width = self.placement.group_width
        slots = [None if sid is None else self.address_of.get(sid)
                 for sid in self.ring.slot_owners(group_hash, width)]
        return lambda key: slots[key_hash(key) % width]
