"""Trace replay: the hit-rate targets on the conversation trace, model-versus-cluster agreement,
and the command's JSON and PNG."""

import json
import os
import pathlib
import subprocess
import sys
from dataclasses import replace

import pytest

from gcache.cli.replay import replay_cluster
from gcache.kv import ModelLayout
from gcache.kv.replay import format_table, prepare, replay_model
from gcache.kv.trace import BLOCK_SIZE, read_trace, request_tokens

TRACE = str(pathlib.Path(__file__).resolve().parents[2] / "data/traces/conversation_trace.jsonl")
TARGET_BUDGETS = (0.02, 0.1, 1.0)


@pytest.fixture(scope="module")
def mimo_pro():
    return ModelLayout.from_config("mimo-v2.5-pro", page_size=BLOCK_SIZE)


def test_trace_tokens_are_deterministic_per_block():
    first, second = read_trace(TRACE, limit=2)
    a, b = request_tokens(first), request_tokens(second)
    assert len(a) == first.input_length and first.hash_ids[0] == second.hash_ids[0] == 0
    assert (a[:BLOCK_SIZE] == b[:BLOCK_SIZE]).all() and (a[BLOCK_SIZE:2 * BLOCK_SIZE] !=
                                                        b[BLOCK_SIZE:2 * BLOCK_SIZE]).any()


# About 100 s alone on the 2-core machine (30 replays of the whole trace, each asking the
# eviction rule at every step): the suite's 120 s default would fail it beside a busy core.
@pytest.mark.timeout(300)
def test_default_policy_meets_the_targets_on_the_conversation_trace(mimo_pro):
    # three budgets of the six make replay prints (each replay of the whole trace costs about
    # 15 s of make test): the smallest, one in the middle and the whole working set
    rows = replay_model(prepare(read_trace(TRACE), mimo_pro), budgets=TARGET_BUDGETS)
    hit = {(r.policy, r.budget_fraction): r.hit_rate for r in rows}
    default = next(r.policy for r in rows if r.is_default)
    assert hit[(default, 0.02)] >= 4 * hit[("full-layer", 0.02)]
    for budget in TARGET_BUDGETS:
        best = max(v for (p, b), v in hit.items() if b == budget and p != "full-layer")
        assert hit[(default, budget)] >= hit[("full-layer", budget)], budget
        assert hit[(default, budget)] >= 0.97 * best, budget
    # Full-layer storage at the whole working set is the ceiling: every shared page hits.
    assert hit[("full-layer", 1.0)] == max(hit.values())


# About 75 s alone on the 2-core machine (replays of the trace's first 100 requests against real
# servers; 200 took 125 s of make test's budget): the suite's 120 s default would fail it
# whenever the other core is busy.
@pytest.mark.timeout(400)
def test_model_and_real_cluster_agree_within_two_points(mimo_pro):
    subset = prepare(read_trace(TRACE, limit=100), mimo_pro)
    policies, budgets = ["tail", "adaptive", "full-layer"], [0.05]
    model = replay_model(subset, policies, budgets)
    cluster = replay_cluster(subset, 512, policies, budgets, servers=2, log=lambda *_: None)
    assert [r.policy for r in model] == [r.policy for r in cluster]
    for m, c in zip(model, cluster):
        assert abs(m.hit_rate - c.hit_rate) <= 0.02, (m, c)
        assert c.unreachable_share is not None and 0 <= c.unreachable_share < 1, c
        if c.is_default:             # the bound for the default policy
            assert c.unreachable_share <= 0.05 and m.unreachable_share <= 0.05, (m, c)
    assert max(r.hit_rate for r in cluster) > 0.01        # the comparison is not 0 against 0
    table = format_table([replace(r, source="model-subset") for r in model] + cluster)
    assert "(over all lookups)" in table and "what the servers' sweeps found" in table


def test_replay_command_writes_rows_and_a_png(tmp_path):
    out, png = tmp_path / "rows.json", tmp_path / "curves.png"
    proc = subprocess.run([sys.executable, "-m", "gcache.cli", "replay", "--trace", TRACE,
                           "--limit", "150", "--budgets", "0.05,1", "--out", str(out),
                           "--plot", str(png)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "adaptive *" in proc.stdout and "model optimal" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {tuple(sorted(r)) for r in rows} == {tuple(sorted(
        ["policy", "budget_fraction", "hit_rate", "stored_bytes", "storage_ratio", "is_default",
         "source", "requests", "of_optimal", "unreachable_share"]))}
    assert {r["policy"] for r in rows} == {"full-layer", "tail", "checkpoint-4",
                                          "checkpoint-16", "adaptive", "optimal"}
    assert len(rows) == 12 and sum(r["is_default"] for r in rows) == 2
    optimal = {r["budget_fraction"]: r["hit_rate"] for r in rows if r["policy"] == "optimal"}
    assert all(r["hit_rate"] <= optimal[r["budget_fraction"]] for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--budgets", "0,1"], "fractions in (0, 1]"),
    (["--trace", "/nonexistent.jsonl"], "cannot be opened"),
    (["--model", "nope"], "shipped configs"),
    (["--policies", "lru"], "must be tail"),
])
def test_replay_command_rejects_bad_arguments(args, message):
    proc = subprocess.run([sys.executable, "-m", "gcache.cli", "replay", "--trace", TRACE,
                           "--limit", "5", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_the_models_figures_do_not_depend_on_the_processes_hash_seed():
    """``gcache demo`` compares its own model run with this process's: the model's rows must
    come out the same in any process (no iteration over a set of bytes decides a victim)."""
    script = ("import json,sys; from gcache.kv import ModelLayout; "
              "from gcache.kv.replay import prepare, replay_model; "
              "from gcache.kv.trace import BLOCK_SIZE, conversations, read_trace; "
              "layout = ModelLayout.from_config('mimo-v2.5-pro', page_size=BLOCK_SIZE); "
              "trace = prepare(conversations(read_trace(sys.argv[1]), limit=6), layout); "
              "print(json.dumps([(r.policy, r.budget_fraction, r.hit_rate) for r in "
              "replay_model(trace, ['adaptive', 'full-layer'], [0.1, 0.5])]))")
    runs = [subprocess.run([sys.executable, "-c", script, TRACE], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PYTHONHASHSEED": seed})
            for seed in ("0", "1", "2")]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout and runs[0].stdout.strip()
