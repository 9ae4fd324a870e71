"""The suite's trace generators (``gcache.kv.workloads``) and the suite table (``gcache.kv.suite``):
seeded and deterministic, each of the shape it claims, and the table's verdicts."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from gcache.errors import ConfigError
from gcache.kv.optimal import residencies
from gcache.kv.replay import OPTIMAL, ReplayRow
from gcache.kv.suite import NAMES, format_suite, suite_cells, trace_requests
from gcache.kv.trace import BLOCK_SIZE
from gcache.kv.workloads import GENERATORS, MODEL_ID_STRIDE, agentic, multitenant, toolcalls

SMALL = 600


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_a_seed_gives_the_same_requests_and_another_seed_others(name):
    make = GENERATORS[name]
    first, again, other = make(SMALL, seed=11), make(SMALL, seed=11), make(SMALL, seed=12)
    assert first == again
    assert [r.hash_ids for r in first] != [r.hash_ids for r in other]


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_requests_are_well_formed_mooncake_requests(name):
    requests = GENERATORS[name](SMALL, seed=5)
    assert len(requests) == SMALL
    assert [r.index for r in requests] == list(range(SMALL))
    assert all(a.timestamp_ms <= b.timestamp_ms for a, b in itertools.pairwise(requests))
    for r in requests:
        assert len(r.hash_ids) == -(-r.input_length // BLOCK_SIZE) and r.output_length >= 1
    # Equal ids name equal prefixes: the optimum's residencies accept them as paths.
    residencies([r.hash_ids for r in requests])


def _shared_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_agentic_sessions_come_back_to_their_whole_prefix_and_branch():
    requests = agentic(SMALL, seed=1)
    full = {r.hash_ids[:r.input_length // BLOCK_SIZE]: r for r in requests}
    resumed = [r for r in requests
               if any(r.hash_ids[:k] in full and full[r.hash_ids[:k]] is not r and k > 8
                      for k in range(len(r.hash_ids), 0, -1))]
    assert len(resumed) > SMALL // 2            # tool loops resend what they sent before
    # retries and sub-agents: two requests share a long prefix, then differ
    branches = sum(1 for a, b in itertools.pairwise(requests)
                   if 8 < _shared_blocks(a.hash_ids, b.hash_ids) < min(len(a.hash_ids),
                                                                      len(b.hash_ids)) - 1)
    assert branches > 0
    heads = {r.hash_ids[:6] for r in requests}
    assert 1 < len(heads) <= 6                  # a few kinds of agent, each its system prompt


def test_multitenant_models_share_no_page_and_prompt_families_are_reused():
    requests = multitenant(SMALL * 2, seed=2, models=3)
    models = {r.hash_ids[0] // MODEL_ID_STRIDE for r in requests}
    assert models == {0, 1, 2}
    for r in requests:                          # every block of a request in one model's range
        assert len({h // MODEL_ID_STRIDE for h in r.hash_ids}) == 1
    heads = [r.hash_ids[:3] for r in requests if len(r.hash_ids) >= 3]
    assert len(set(heads)) < len(heads) // 2    # families: many requests per shared head
    with pytest.raises(ConfigError, match="models"):
        multitenant(10, models=0)


def test_toolcalls_are_one_shot_suffixes_on_shared_system_prompts():
    requests = toolcalls(SMALL, seed=3)
    calls = [r for r in requests if r.output_length < 60 and len(r.hash_ids) >= 6]
    prompts = {r.hash_ids[:5] for r in calls}
    assert len(prompts) < len(calls) // 2
    lasts = [r.hash_ids[-1] for r in requests]
    assert len(set(lasts)) == len(lasts)        # every request ends in a block of its own


@pytest.mark.parametrize("bad", [0, -3])
def test_a_generator_refuses_no_requests(bad):
    with pytest.raises(ConfigError, match="requests"):
        agentic(bad)


def test_suite_traces_by_name_and_a_clear_error_for_neither_name_nor_file():
    assert len(trace_requests("conversation", limit=5)) == 5
    assert trace_requests("toolcalls", limit=7) == toolcalls()[:7]
    with pytest.raises(ConfigError, match="suite's traces"):
        trace_requests("no-such-trace")


def _row(policy: str, budget: float, hit: float) -> ReplayRow:
    return ReplayRow(policy, budget, hit, 0, 0.0, policy == "adaptive", "model", 10)


def test_the_suite_table_marks_each_cell_that_misses_a_target():
    rows = {"t": [_row("adaptive", 0.02, 0.45), _row("tail", 0.02, 0.40),
                  _row(OPTIMAL, 0.02, 0.50), _row("adaptive", 0.1, 0.49),
                  _row("tail", 0.1, 0.505), _row(OPTIMAL, 0.1, 0.51)]}
    cells = suite_cells(rows)
    assert [(c.budget_fraction, c.best_fixed_policy, c.holds) for c in cells] == [
        (0.02, "tail", True), (0.1, "tail", False)]      # 0.49 < 0.98 × 0.505
    table = format_suite(cells)
    assert "| t | default (adaptive) | 0.450 | 0.490 |" in table
    assert "**0.970**" in table and "missed at t 10%" in table


def test_replay_suite_command_prints_every_trace(tmp_path):
    out = tmp_path / "suite.json"
    proc = subprocess.run([sys.executable, "-m", "gcache.cli", "replay", "--suite",
                           "--limit", "150", "--budgets", "0.05,1.0",
                           "--policies", "adaptive,tail", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    for name in NAMES:
        assert f"| {name} | default (adaptive) |" in proc.stdout
    assert out.exists() and "of_best_fixed" in out.read_text()
