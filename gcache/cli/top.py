"""``gcache top``: per-server rates from two STAT polls, live or once; and the STAT reading that
``gcache status`` and ``gcache explain`` share.

What STAT carries (``gcache.server``): each tier's gauges (``used_bytes``, ``capacity_bytes``,
``bytes``, ``objects``) and counters since the server started (``hits``, ``misses``, ``puts``,
``deletes``, ``evicted_objects``, ``checksum_failures``; with a cold tier, ``tiers.cold`` has
its own ``hits`` and ``misses``). Rates are counter deltas over the server's own uptime
between two polls, so a slow poll does not bend them, and a server that restarted in between
(uptime went back) shows no rates rather than negative ones. STAT has no byte counters and no
latencies: the GB/s columns are estimates (keys per second times the mean stored value), and
p99 is "-" (op latencies are in the servers' Prometheus metrics). Below the servers, one row
per tenant (``top_tenants``) once any tenant shows.

Invariants: the poller is a TCP ``Client`` over exactly the servers shown, with ``suspect_s``
0, so a server that stops answering shows "down" at once and one that returns shows "up" at
the next poll; a poll never raises for a server, only for bad arguments or unreachable masters.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gcache.cli.top_tenants import tenant_lines
from gcache.config import ClientConfig
from gcache.config_loader import load_config
from gcache.errors import InvalidRequest, MasterError
from gcache.master_client import STATE_NAMES, MasterClient
from gcache.placement import PlacedMap, Placement
from gcache.proto import master_pb2 as pb
from gcache.sdk import Client

log = logging.getLogger(__name__)
Stat = dict[str, Any]
CLEAR = "\x1b[H\x1b[2J"           # cursor home, clear screen


@dataclass(frozen=True, slots=True)
class Targets:
    """The servers a command looks at, and where keys go among them."""

    config: ClientConfig                 # --servers or --master, token, timeout (and env)
    addresses: tuple[str, ...]           # data-plane HOST:PORT, sorted
    names: dict[str, str]                # address -> server id (the address without masters)
    states: dict[str, str]               # address -> the map's state ("static" without one)
    placed: PlacedMap                    # key -> owner, as the SDK places it


def add_target_flags(cmd: argparse.ArgumentParser) -> None:
    """``--servers`` / ``--master``, ``--token``, ``--timeout`` and ``--config``."""
    where = cmd.add_mutually_exclusive_group()
    where.add_argument("--servers", help="HOST:PORT[,HOST:PORT...] (or GCACHE_CLIENT_SERVERS)")
    where.add_argument("--master", help="masters' HOST:PORT[,...]: the servers of their map")
    cmd.add_argument("--token", help="cluster token (prefer GCACHE_TOKEN: flags show in ps)")
    cmd.add_argument("--timeout", type=float, default=2.0, help="IO timeout in seconds")
    cmd.add_argument("--config", help="TOML file with a [client] section")


def targets_of(args: argparse.Namespace) -> Targets:
    """The servers named by ``--servers``, or by the masters' map (every server in it but those
    that left). Raises ``ConfigError`` / ``InvalidRequest`` for bad flags and ``MasterError``
    when no master answers."""
    flags = {"servers": args.servers, "master": args.master, "token": args.token,
             "timeout_s": args.timeout}
    cfg = load_config(ClientConfig, "client", path=args.config, flags=flags)
    if args.master:            # a flag wins over the other kind given in the environment
        cfg = dataclasses.replace(cfg, servers=())
    elif args.servers:
        cfg = dataclasses.replace(cfg, master=())
    own = Placement(vnodes=cfg.vnodes, group_width=cfg.group_width)
    if not cfg.master:
        if not cfg.servers:
            raise InvalidRequest("give --servers HOST:PORT[,...] or --master HOST:PORT[,...]")
        return Targets(cfg, tuple(sorted(cfg.servers)), {a: a for a in cfg.servers},
                       dict.fromkeys(cfg.servers, "static"),
                       PlacedMap({a: (a, 1.0) for a in cfg.servers}, None, own))
    with MasterClient(list(cfg.master), token=cfg.token, timeout_s=cfg.timeout_s) as link:
        cluster_map = link.cluster_map()
    shown = [s for s in cluster_map.servers if s.state != pb.LEFT]
    return Targets(cfg, tuple(sorted(s.address for s in shown)),
                   {s.address: s.id for s in shown},
                   {s.address: STATE_NAMES.get(s.state, "?") for s in shown},
                   PlacedMap.of_map(cluster_map, own))


def stat_client(config: ClientConfig, addresses: tuple[str, ...]) -> Client:
    """A TCP client of exactly ``addresses`` that retries a failed server at every call."""
    return Client(config=dataclasses.replace(config, servers=addresses, master=(),
                                             suspect_s=0.0, transport="tcp"))


def poll(client: Client, addresses: tuple[str, ...]) -> dict[str, Stat | None]:
    """Every server's STAT (None: it did not answer), keyed by address."""
    answered = client.server_stats() if addresses else {}
    return {a: answered.get(a) for a in addresses}


def stats_of(addresses: list[str], *, token: str | None,
             timeout_s: float) -> dict[str, Stat | None]:
    """One STAT of each of ``addresses`` (None: no answer); {} for none."""
    if not addresses:
        return {}
    unique = tuple(sorted(set(addresses)))
    with stat_client(ClientConfig(token=token, timeout_s=timeout_s), unique) as client:
        return poll(client, unique)


# ---- reading one STAT ---------------------------------------------------------------------------

def reads(stat: Stat) -> tuple[int, int]:
    """(hits, misses) of reads since the server started. With a cold tier a memory miss that
    the disk served is a hit, so the misses are the cold tier's."""
    cold = (stat.get("tiers") or {}).get("cold")
    tier = stat["tier"]
    return int(tier["hits"]), int(cold["misses"] if cold else tier["misses"])


def fills(stat: Stat) -> dict[str, tuple[int, int, int]]:
    """Per tier: (used bytes, capacity bytes, objects)."""
    tier = stat["tier"]
    out = {"hot": (int(tier["used_bytes"]), int(tier["capacity_bytes"]), int(tier["objects"]))}
    cold = (stat.get("tiers") or {}).get("cold")
    if cold:
        out["cold"] = (int(cold["bytes"]), int(cold["capacity_bytes"]), int(cold["objects"]))
    return out


def size(n_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n_bytes) < 1024 or unit == "TiB":
            return f"{n_bytes:.0f}{unit}" if unit == "B" else f"{n_bytes:.1f}{unit}"
        n_bytes /= 1024
    raise AssertionError("unreachable")


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def tier_lines(stat: Stat | None) -> list[str]:
    """What ``gcache status`` adds under each server: tier usage and reads since it started."""
    if stat is None:
        return ["  stat: no answer (down)"]
    lines = [f"  tier {name}: {size(used)} of {size(cap)} used ({percent(used, cap)}), "
             f"{objects} objects" for name, (used, cap, objects) in fills(stat).items()]
    hits, misses = reads(stat)
    lines.append(f"  reads: hits={hits} misses={misses} hit rate {percent(hits, hits + misses)}"
                 f" (since the server started {stat.get('server', {}).get('uptime_s', '?')}s"
                 " ago)")
    return lines


# ---- two polls into rates -----------------------------------------------------------------------

HOT_COUNTERS = ("hits", "misses", "puts", "deletes", "evicted_objects", "checksum_failures")
COUNTERS = (*HOT_COUNTERS, "cold_hits", "cold_misses")


def counters(stat: Stat) -> dict[str, int]:
    """The counters rates are made of: the hot tier's, and the cold tier's as ``cold_*``."""
    tier = stat["tier"]
    cold = (stat.get("tiers") or {}).get("cold") or {}
    out = {name: int(tier.get(name, 0)) for name in HOT_COUNTERS}
    out["cold_hits"], out["cold_misses"] = int(cold.get("hits", 0)), int(cold.get("misses", 0))
    return out


def uptime_s(stat: Stat) -> float | None:
    value = stat.get("server", {}).get("uptime_s")
    return float(value) if value is not None else None


def row(targets: Targets, address: str, before: Stat | None, after: Stat | None,
        wall_s: float) -> list[str]:
    """One table row: the rates between two STATs of one server. Its state is whether it
    answered, and the map's state where that is not plain alive (suspect, draining, dead)."""
    name, in_map = targets.names[address], targets.states[address]
    label = name if name == address else f"{name} {address}"
    noted = "" if in_map in ("alive", "static") else f" ({in_map})"
    if after is None:
        return [label, "down" + noted] + ["-"] * 10
    used, cap, _ = fills(after)["hot"]
    cold = fills(after).get("cold")
    fill = [f"{percent(used, cap)} of {size(cap)}",
            f"{percent(cold[0], cold[1])} of {size(cold[1])}" if cold else "-"]
    up0, up1 = (uptime_s(before) if before else None), uptime_s(after)
    if before is None or (up0 is not None and up1 is not None and up1 < up0):
        return [label, "up (new)" + noted] + ["-"] * 6 + fill + ["-", "-"]
    dt = up1 - up0 if up0 is not None and up1 is not None and up1 > up0 else wall_s
    c0, c1 = counters(before), counters(after)
    rate = {k: max(0, c1[k] - c0[k]) / dt for k in COUNTERS}
    hits, misses = reads(after)[0] - reads(before)[0], reads(after)[1] - reads(before)[1]
    read_s = (hits + misses) / dt
    tier = after["tier"]
    mean = tier["bytes"] / tier["objects"] if tier["objects"] else 0.0
    return [label, "up" + noted, f"{read_s + rate['puts'] + rate['deletes']:.0f}", f"{read_s:.0f}",
            f"{rate['puts']:.0f}", percent(hits, hits + misses),
            f"{rate['puts'] * mean / 1e9:.3f}", f"{rate['hits'] * mean / 1e9:.3f}",
            *fill, f"{rate['evicted_objects']:.0f}", "-"]


HEADER = ["SERVER", "STATE", "OPS/S", "READ/S", "PUT/S", "HIT%", "~GB/S IN", "~GB/S OUT",
          "HOT FILL", "COLD FILL", "EVICT/S", "P99"]
NOTES = [
    "OPS/S: keys read, put and deleted per second by the server (a batch of 64 gets is 64; "
    "EXISTS and STAT are not counted).",
    "HIT%: hits / (hits + misses) of the reads in the interval (with a cold tier, a read the "
    "disk served is a hit).",
    "~GB/S: estimated as puts (in) and hits (out) per second times the mean stored value; "
    "STAT has no byte counters.",
    "P99: not in STAT; see each server's /metrics for op latencies.",
]


def misses_line(address: str, before: Stat | None, after: Stat | None) -> str | None:
    """The server-side misses of the interval by reason, or None without two answers."""
    if before is None or after is None:
        return None
    c0, c1 = counters(before), counters(after)
    d = {k: max(0, c1[k] - c0[k]) for k in COUNTERS}
    if "cold" not in fills(after):
        return f"  {address}: absent={d['misses']} checksum={d['checksum_failures']}"
    return (f"  {address}: absent={d['cold_misses']} checksum={d['checksum_failures']} "
            f"(memory misses {d['misses']}: {d['cold_hits']} served from disk)")


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
            for r in [HEADER, *rows]]


def render(targets: Targets, before: Mapping[str, Stat | None],
           after: Mapping[str, Stat | None], wall_s: float,
           poller_misses: Mapping[str, int]) -> list[str]:
    """The whole screen: the table, misses by reason, and what the columns mean."""
    where = ",".join(targets.config.master) if targets.config.master else "static servers"
    n = len(targets.addresses)
    lines = [f"gcache top: {n} server{'' if n == 1 else 's'} ({where}), interval "
             f"{wall_s:.1f}s, {time.strftime('%H:%M:%S')}"]
    lines += table([row(targets, a, before.get(a), after.get(a), wall_s)
                    for a in targets.addresses])
    missed = [m for a in targets.addresses
              if (m := misses_line(a, before.get(a), after.get(a))) is not None]
    if missed:
        lines += ["misses in the interval, server side, by reason:", *missed]
    lines += tenant_lines(before, after, wall_s)
    reasons = " ".join(f"{r}={n}" for r, n in sorted(poller_misses.items())) or "none"
    lines.append(f"this poller's failed STATs by reason (why a server shows down): {reasons}")
    return lines + NOTES


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise InvalidRequest(f"--interval {args.interval} must be positive seconds")
    targets = targets_of(args)
    client = stat_client(targets.config, targets.addresses)
    try:
        before, at = poll(client, targets.addresses), time.monotonic()
        while True:
            time.sleep(args.interval)
            if targets.config.master and not args.once:
                fresh = _refreshed(args, targets)
                if fresh.addresses != targets.addresses:
                    client.close()
                    client = stat_client(fresh.config, fresh.addresses)
                targets = fresh
            after, now = poll(client, targets.addresses), time.monotonic()
            screen = render(targets, before, after, now - at,
                            client.stats()["misses_by_reason"])
            if args.once:
                print("\n".join(screen))
                return 0
            sys.stdout.write(CLEAR + "\n".join(screen) + "\n")
            sys.stdout.flush()
            before, at = after, now
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()


def _refreshed(args: argparse.Namespace, targets: Targets) -> Targets:
    """The masters' current map, or the last one while none answers (the table goes on)."""
    try:
        return targets_of(args)
    except MasterError as exc:
        log.warning("top.map_unavailable error=%s: showing the servers of the last map", exc)
        return targets


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("top", help="per-server ops/s, hit rate, tier fill and evictions, "
                         "refreshing (--once: one table for scripts)")
    add_target_flags(cmd)
    cmd.add_argument("--interval", type=float, default=1.0,
                     help="seconds between the two STAT polls a table is computed from")
    cmd.add_argument("--once", action="store_true",
                     help="poll twice, print one table and exit (no screen clearing)")
    cmd.set_defaults(run=run)
