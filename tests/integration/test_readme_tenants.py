"""The two-tenant set-up of docs/operations/tenants.md, run as printed: a master and a server with
the administrator's token, then the ``gcache tenant`` block (two tenants, their tokens, each one's
own ``"k"``, quotas changed, a revocation and a removal)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations" / "tenants.md"
sys.path.insert(0, str(ROOT / "connectors"))
from engine_testing.readme import (  # noqa: E402
    Shell,
    activated,
    readme_block,
    remove_server_files,
)

pytestmark = pytest.mark.timeout(300)
DATA_DIR, PORT = pathlib.Path("/tmp/gcache-tenants"), 7740


def remove_files() -> None:
    """The master's data and what the server leaves by design (a server with masters also
    keeps its mutable keys beside its arena)."""
    shutil.rmtree(DATA_DIR, ignore_errors=True)
    remove_server_files(PORT)
    for suffix in (".mutable", ".mutable.epoch"):
        pathlib.Path(f"/dev/shm/gcache-{PORT}{suffix}").unlink(missing_ok=True)


def test_the_two_tenant_set_up_runs_as_printed(tmp_path):
    remove_files()
    daemons = Shell(readme_block(PAGE, "tenants-daemons"),
                    tmp_path / "daemons.log", env=activated())
    try:
        daemons.wait_for("gcache-server ready", 60)
        daemons.wait_for("membership.registered", 30)
        done = subprocess.run(["bash", "-c", readme_block(PAGE, "tenants")],
                              env=dict(os.environ, **activated()), capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr + daemons.log()
        lines = done.stdout.splitlines()
        assert any(line.split()[:3] == ["alice", "1", "active"] for line in lines), lines
        assert any(line.split()[:3] == ["bob", "2", "active"] for line in lines), lines
        assert "b\"alice's value\" b\"bob's value\"" in done.stdout, done.stdout
        assert "bob removed" in done.stderr
    finally:
        daemons.stop()
        remove_files()
