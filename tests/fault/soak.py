"""``make soak``: the fault scenarios of ``tests/fault`` for as long as one likes.

    python -m tests.fault.soak --seconds 600 [--scenarios crash,cold,leader,corruption,exhaustion]
                               [--json bench/results/soak-latest.json]

Rounds of the chosen scenarios run in turn, each on a fresh cluster in a temporary directory,
until the time is up (a round that started finishes). The summary table sums them; the run
fails (exit 1) on any wrong value, and on any lost acknowledged value in a round that evicted
nothing (a corruption round may lose at most one value per flip). Everything runs on 127.0.0.1
and every process it starts is ended by the round that started it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
import time

from tests.fault.scenarios import Tally, corruption, crash_under_load, exhaustion, leader_failover

TOKEN = "soak-run-cluster-token-0123456789"
SCENARIOS = {
    "crash": lambda s, d, seed: crash_under_load(s, cold=False, log_dir=d, seed=seed),
    "cold": lambda s, d, seed: crash_under_load(s, cold=True, log_dir=d, seed=seed),
    "leader": lambda s, d, seed: leader_failover(s, log_dir=d, seed=seed, token=TOKEN),
    "corruption": lambda s, d, seed: corruption(14, log_dir=d, seed=seed),
    "exhaustion": lambda s, d, seed: exhaustion(s, log_dir=d, seed=seed),
}


def verdict(name: str, tally: Tally) -> list[str]:
    """What is wrong with a scenario's sum, in words; empty when it held."""
    problems = []
    if tally.wrong_values:
        problems.append(f"{tally.wrong_values} wrong values")
    allowed = tally.faults if name == "corruption" else 0
    if tally.lost_acked > allowed and not tally.evicted:
        problems.append(f"{tally.lost_acked} acknowledged values lost")
    if name == "leader" and tally.puts_failed:
        problems.append(f"{tally.puts_failed} puts failed during leader failover")
    return problems


def table(results: dict[str, Tally], seconds: float) -> str:
    head = ("scenario", "rounds", "ops", "puts ok", "reads", "hits", "faults", "wrong",
            "lost ack", "evicted", "misses by reason")
    rows = [head]
    for name, t in results.items():
        misses = ", ".join(f"{k}={v}" for k, v in sorted(t.misses.items())) or "-"
        rows.append((name, t.rounds, t.ops, t.puts_acked, t.reads, t.hits, t.faults,
                     t.wrong_values, t.lost_acked, t.evicted, misses))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head) - 1)]
    lines = [f"gcache soak: {seconds:.0f} s"]
    for row in rows:
        lines.append("  ".join(str(c).rjust(w) for c, w in zip(row, widths)) + "  " +
                     str(row[-1]))
    for name, t in results.items():
        lines.extend(f"  {name}: {note}" for note in t.notes[:5])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="total run time")
    parser.add_argument("--round-seconds", type=float, default=30.0,
                        help="length of one load round")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--json", default="", help="also write the summary here")
    args = parser.parse_args(argv)
    # Misses during faults are expected and logged by the SDK at WARNING; the table counts them.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s %(message)s")
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        parser.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    results = {name: Tally() for name in names}
    started = time.monotonic()
    seed = 0
    while time.monotonic() - started < args.seconds:
        name = names[seed % len(names)]
        left = args.seconds - (time.monotonic() - started)
        with tempfile.TemporaryDirectory(prefix=f"gcache-soak-{name}-") as folder:
            tally = SCENARIOS[name](max(5.0, min(args.round_seconds, left)), folder, seed)
        results[name].add(tally)
        print(f"round {seed} {name}: ops={tally.ops} faults={tally.faults} "
              f"wrong={tally.wrong_values} lost={tally.lost_acked}", flush=True)
        seed += 1
    elapsed = time.monotonic() - started
    print(table(results, elapsed))
    problems = {name: verdict(name, t) for name, t in results.items()}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"date": time.strftime("%Y-%m-%d"), "seconds": round(elapsed, 1),
                       "scenarios": {n: {**dataclasses.asdict(t), "misses": dict(t.misses),
                                         "notes": t.notes[:20], "problems": problems[n]}
                                     for n, t in results.items()}}, fh, indent=2)
    failed = {n: p for n, p in problems.items() if p}
    for name, found in failed.items():
        print(f"FAILED {name}: {'; '.join(found)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
