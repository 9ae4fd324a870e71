"""A secured cluster with tenants, for the tenant tests: real masters and servers on loopback,
the cluster token the administrator's, tenants added through the masters' API."""

from __future__ import annotations

import json
import os
import pathlib
import struct

from gcache import Client
from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.frame import FLAG_TENANT, HEADER_SIZE, Header, Op, Status, auth_proof, unpack_header
from gcache.master_client import MasterClient
from gcache.tenant_token import tenant_of, tenant_proof, token_hash
from gcache.transport.stream import StreamConnection
from gcache.transport.tcp import connect
from tests.helpers import wait_until

CLUSTER_TOKEN = "the-administrators-cluster-token"
MASTER_ARGS = ("--dead-timeout", "2.0", "--heartbeat-interval", "0.5")
SERVER_ARGS = ("--segment-size", "1MiB", "--lease-ttl", "2.0", "--token", CLUSTER_TOKEN)


class TenantCluster:
    """``n_masters`` masters and ``n_servers`` servers sharing ``CLUSTER_TOKEN``."""

    def __init__(self, log_dir: pathlib.Path, *, n_masters: int = 1, n_servers: int = 1,
                 memory: str = "64MiB", server_args: tuple[str, ...] = ()) -> None:
        self.masters = LocalMasters(n_masters, args=MASTER_ARGS,
                                    env=dict(os.environ, GCACHE_TOKEN=CLUSTER_TOKEN),
                                    log_dir=str(log_dir / "masters"))
        self.cluster = LocalCluster(n_servers, memory=memory,
                                    server_args=(*SERVER_ARGS, *server_args),
                                    master=self.masters.spec, log_dir=str(log_dir / "servers"))
        self.link = MasterClient(self.masters.addresses, token=CLUSTER_TOKEN, timeout_s=5.0)

    def __enter__(self) -> TenantCluster:
        self.masters.__enter__()
        try:
            self.cluster.start()
        except BaseException:
            self.masters.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.link.close()
        self.cluster.stop()
        self.masters.__exit__(None, None, None)

    def add(self, name: str, **quotas: int) -> str:
        """A new tenant's token, once every server knows the tenant."""
        token = self.link.add_tenant(name, **quotas).token
        self.wait_known(name)
        return token

    def wait_known(self, name: str, *, present: bool = True, timeout_s: float = 15.0) -> None:
        """Until every server's table has (or, ``present=False``, lacks) ``name``."""
        def seen() -> bool:
            stats = self.admin_stats()
            return all((name in s.get("tenants", {})) == present for s in stats.values()) \
                and len(stats) == len(self.cluster.servers)
        wait_until(seen, timeout_s)

    def admin_stats(self) -> dict[str, dict]:
        with Client(self.cluster.addresses, token=CLUSTER_TOKEN, timeout_s=2.0) as admin:
            return {a: s for a, s in admin.server_stats().items() if s}

    def client(self, token: str, **kwargs: object) -> Client:
        return Client(master=self.masters.spec, token=token, timeout_s=2.0, **kwargs)

    @property
    def address(self) -> str:
        return self.cluster.addresses[0]


# ---- hand-made frames ---------------------------------------------------------------------------

def exchange(conn: StreamConnection, header: Header, *parts: bytes,
             max_payload: int = 1 << 24) -> tuple[Header, bytes]:
    conn.send((header.pack(), *parts), timeout_s=5)
    reply = unpack_header(conn.recv_exact(HEADER_SIZE, timeout_s=5), max_payload=max_payload)
    return reply, bytes(conn.recv_exact(reply.payload_len, timeout_s=5))


def raw_conn(address: str, token: str | None, *, as_tenant: str | None = None
             ) -> tuple[StreamConnection, Header, dict]:
    """A TCP connection past HELLO and AUTH made by hand: the AUTH reply and its facts."""
    conn = connect(address, timeout_s=5, io_size=1 << 20)
    reply, nonce = exchange(conn, Header(Op.HELLO, 1))
    assert reply.status == Status.AUTH_REQUIRED
    name = tenant_of(token) or as_tenant
    if token is None:
        body, flags = b"\0" * 32, 0
    elif name is None:
        body, flags = auth_proof(token, nonce), 0
    elif as_tenant is None:
        body, flags = tenant_proof(token_hash(token), nonce, name) + name.encode(), FLAG_TENANT
    else:
        from gcache.tenant_token import admin_as_tenant_proof
        body = admin_as_tenant_proof(token, nonce, name) + name.encode()
        flags = FLAG_TENANT
    reply, facts = exchange(conn, Header(Op.AUTH, 2, flags=flags, payload_len=len(body)), body)
    return conn, reply, json.loads(facts) if reply.status == Status.OK and facts else {}


def encode_keys(keys: list[bytes]) -> bytes:
    return b"".join(struct.pack("<H", len(k)) + k for k in keys)
