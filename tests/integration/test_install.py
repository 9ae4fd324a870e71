"""The distribution name: the install commands of the engine pages (docs/engines), run as printed
in a fresh virtual environment, install GCache (``gcache-kv``) with the connector, never the
package index's unrelated ``gcache``."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "connectors"))
from engine_testing.readme import readme_block  # noqa: E402

pytestmark = pytest.mark.timeout(600)


def test_the_readme_install_commands_work_in_a_fresh_environment(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
               VIRTUAL_ENV=str(venv), PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    for readme in ("docs/engines/sglang-hicache.md", "docs/engines/vllm.md"):
        block = readme_block(ROOT / readme, "install")
        result = subprocess.run(["bash", "-c", block], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=500)
        assert result.returncode == 0, f"{readme}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    probe = ("import importlib.metadata as m, gcache; "
             "names = {d.metadata['Name'].lower() for d in m.distributions()}; "
             "print(sorted(n for n in names if 'gcache' in n)); "
             "print(gcache.__file__)")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "['gcache-kv', 'gcache-sglang', 'gcache-vllm']", out
    assert out[1].startswith(str(venv)), out      # an installed copy, not the checkout
