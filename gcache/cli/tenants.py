"""``gcache tenant``: the masters' tenant table, with the administrator's (cluster) token.

``add`` prints the new tenant's token alone on one line of stdout (everything else goes to
stderr), so ``TOKEN=$(gcache tenant add NAME ...)`` captures it: the masters keep only its hash,
so it is shown this once (``set NAME --new-token`` makes another). ``rm`` also frees the
tenant's values: every server deletes them as it learns the table. Quotas are per data server
(``docs/operations.md``: what they guarantee under pressure).
"""

from __future__ import annotations

import argparse
import os
import sys

from gcache.config import format_size, parse_size
from gcache.master_client import MasterClient, parse_masters
from gcache.proto import master_pb2 as pb

STATE_NAMES = {pb.ACTIVE: "active", pb.REVOKED: "revoked"}


def _link(args: argparse.Namespace) -> MasterClient:
    return MasterClient(parse_masters(args.master),
                        token=args.token or os.environ.get("GCACHE_TOKEN"),
                        timeout_s=args.timeout)


def _size(text: str | None, flag: str) -> int | None:
    return None if text is None else parse_size(text, key=flag)


def _quota(n_bytes: int) -> str:
    return format_size(n_bytes) if n_bytes else "-"


def _line(tenant: pb.Tenant) -> str:
    return (f"{tenant.name:<24} {tenant.id:>4} {STATE_NAMES.get(tenant.state, '?'):<8} "
            f"{_quota(tenant.memory_quota_bytes):>10} {_quota(tenant.disk_quota_bytes):>10}")


def _add(args: argparse.Namespace) -> int:
    with _link(args) as link:
        reply = link.add_tenant(args.name,
                                memory_quota_bytes=_size(args.memory_quota, "--memory-quota") or 0,
                                disk_quota_bytes=_size(args.disk_quota, "--disk-quota") or 0)
    print(f"gcache tenant: added {_line(reply.tenant).rstrip()}; its token follows, shown "
          "this once", file=sys.stderr)
    print(reply.token)
    return 0


def _set(args: argparse.Namespace) -> int:
    with _link(args) as link:
        reply = link.set_tenant(args.name,
                                memory_quota_bytes=_size(args.memory_quota, "--memory-quota"),
                                disk_quota_bytes=_size(args.disk_quota, "--disk-quota"),
                                new_token=args.new_token)
    print(f"gcache tenant: {_line(reply.tenant).rstrip()}", file=sys.stderr)
    if reply.token:
        print(reply.token)
    return 0


def _ls(args: argparse.Namespace) -> int:
    with _link(args) as link:
        table = link.tenants()
    print(f"{'NAME':<24} {'ID':>4} {'STATE':<8} {'MEMORY':>10} {'DISK':>10}")
    for tenant in sorted(table.tenants, key=lambda t: t.name):
        print(_line(tenant))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    with _link(args) as link:
        tenant = link.revoke_tenant(args.name)
    print(f"gcache tenant: {tenant.name} revoked: its token opens nothing from the servers' "
          "next heartbeat on", file=sys.stderr)
    return 0


def _rm(args: argparse.Namespace) -> int:
    with _link(args) as link:
        tenant = link.remove_tenant(args.name)
    print(f"gcache tenant: {tenant.name} removed; every server deletes its values",
          file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tenant = sub.add_parser("tenant", help="tenants: scoped tokens and quotas (the masters' "
                            "table, with the cluster token)")
    verbs = tenant.add_subparsers(dest="verb", required=True)
    for verb, run, helptext in (
            ("add", _add, "add a tenant; prints its token alone on stdout"),
            ("set", _set, "change a tenant's quotas, or give it a new token"),
            ("ls", _ls, "list the tenants"),
            ("revoke", _revoke, "refuse a tenant's token from the next heartbeat on"),
            ("rm", _rm, "remove a tenant and free its values")):
        cmd = verbs.add_parser(verb, help=helptext)
        if verb != "ls":
            cmd.add_argument("name")
        if verb in ("add", "set"):
            cmd.add_argument("--memory-quota", help="bytes per server (e.g. 8GiB); 0: none")
            cmd.add_argument("--disk-quota", help="bytes per server's disk (e.g. 100GiB)")
        if verb == "set":
            cmd.add_argument("--new-token", action="store_true",
                             help="make a new token (printed on stdout); active again")
        cmd.add_argument("--master", required=True, help="HOST:PORT[,HOST:PORT...]")
        cmd.add_argument("--token", help="the cluster token (prefer GCACHE_TOKEN)")
        cmd.add_argument("--timeout", type=float, default=5.0)
        cmd.set_defaults(run=run)
