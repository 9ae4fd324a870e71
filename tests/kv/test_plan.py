"""``gcache plan`` on the shipped trace: its answer, replayed, meets the target it was asked for,
and no cheaper budget any policy was measured at does."""

import json
import pathlib
import subprocess
import sys

import pytest

from gcache.errors import InvalidRequest
from gcache.kv import ModelLayout
from gcache.kv.plan import DISK_HEADROOM, plan
from gcache.kv.replay import prepare, replay_model
from gcache.kv.trace import BLOCK_SIZE, read_trace

TRACE = str(pathlib.Path(__file__).resolve().parents[2] / "data/traces/conversation_trace.jsonl")
REQUESTS = 1500          # the first requests only: the whole trace takes a minute per plan
GiB = 1 << 30


@pytest.fixture(scope="module")
def trace():
    layout = ModelLayout.from_config("mimo-v2.5-pro", page_size=BLOCK_SIZE)
    return prepare(read_trace(TRACE, limit=REQUESTS), layout)


@pytest.mark.parametrize("target", [0.1, 0.25])
def test_the_answer_replayed_meets_the_target_and_nothing_cheaper_was_seen_to(trace, target):
    found = plan(trace, target=target, hosts=4, host_memory_bytes=8 * GiB)
    replayed = replay_model(trace, [found.policy], [found.budget_fraction])[0]
    assert replayed.hit_rate >= target and replayed.hit_rate == found.hit_rate
    assert all(r.budget_fraction >= found.budget_fraction
               for r in found.probes if r.hit_rate >= target)
    assert found.capacity_bytes >= found.budget_fraction * trace.working_set_bytes
    per_host = -(-found.capacity_bytes // found.hosts)
    assert found.memory_per_host_bytes == min(per_host, 8 * GiB)
    assert found.disk_per_host_bytes >= (per_host - found.memory_per_host_bytes) * \
        (1 + DISK_HEADROOM)


def test_a_target_no_policy_reaches_is_a_clear_error(trace):
    with pytest.raises(InvalidRequest, match="no policy reaches a hit rate of 0.9"):
        plan(trace, target=0.9, hosts=2, host_memory_bytes=GiB)
    with pytest.raises(InvalidRequest, match="must be in"):
        plan(trace, target=1.5, hosts=2, host_memory_bytes=GiB)


def test_the_command_writes_the_plan_and_refuses_a_bad_target(tmp_path):
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "gcache.cli", "plan", "--trace", TRACE, "--limit", "600",
           "--hosts", "2", "--host-memory", "1GiB"]
    done = subprocess.run([*cmd, "--target", "0.15", "--json", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "reaches a token hit rate of" in done.stdout and "per host of 2" in done.stdout
    written = json.loads(out.read_text())
    assert written["hit_rate"] >= 0.15 and written["probes"]
    refused = subprocess.run([*cmd, "--target", "0.95"], capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode == 2 and "no policy reaches" in refused.stderr
