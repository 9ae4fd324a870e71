"""``bench/routing.py`` on the long variant of every trace of the replay suite (issue 47).

For each trace (``gcache.kv.suite``: the conversation trace and the three generated shapes) it
runs every policy with and without buckets on the long variant and checks the three router
figures issue 47 asks of ``ours`` with buckets: max/mean load ≤ 1.2, short-bucket TTFT p99 ≤ 0.5×
the best policy without buckets, token hit rate ≥ 0.95× the best cache-aware baseline. The
figures are computed and printed, never asserted. ``--results`` writes
``bench/results/routing-suite-latest.json``, which ``bench/update_readme.py`` renders.

    .venv/bin/python bench/routing_suite.py --jobs 2 --results
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import routing
from results_file import write_results

from gcache.kv.suite import NAMES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", nargs="+", choices=NAMES, default=list(NAMES))
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--results", action="store_true",
                        help="also write bench/results/routing-suite-latest.json")
    args = parser.parse_args(argv)
    cfg = routing.SimConfig()
    started = time.perf_counter()
    report: dict[str, dict] = {}
    for trace in args.traces:
        run = argparse.Namespace(trace=trace, limit=None, variants=["long"],
                                 policies=list(routing.POLICIES), jobs=args.jobs)
        rows, meta = routing.run_all(run, cfg)
        checks = routing.targets(rows)
        report[trace] = {"meta": meta["long"], "rows": rows, "targets": checks}
        print(f"\n== {trace} (long): {meta['long']['requests']} requests, instances per bucket "
              f"{meta['long']['instances_per_bucket']}")
        print(routing.table(rows))
        for t in checks:
            print(f"- {'holds' if t['holds'] else 'MISSES'}: {t['target']}: {t['figures']}")
    wall_s = time.perf_counter() - started
    print(f"\n{len(args.traces)} traces in {wall_s:.0f} s")
    if args.results:
        write_results("routing-suite", {"date": dt.date.today().isoformat(),
                                        "command": "python bench/routing_suite.py "
                                                   + " ".join(argv or sys.argv[1:]),
                                        "ours": routing.ours_source(), "traces": report,
                                        "runtime_s": round(wall_s)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
