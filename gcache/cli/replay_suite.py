"""``gcache replay --suite``: every trace of the suite through the model, one table.

Per trace it prints the usual per-policy table (``format_table``) and then the suite table
(``gcache.kv.suite.format_suite``): at each budget the default policy, the offline optimum, the
best fixed policy and the two ratios issue 47 sets targets on. ``--out`` writes every row with
the cells and the date as JSON (``bench/update_readme.py`` renders it into README.md).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

from gcache.kv import ModelLayout
from gcache.kv.replay import format_table
from gcache.kv.suite import SUITE, format_suite, suite_cells, suite_rows


def run_suite(args: argparse.Namespace, layout: ModelLayout, policies: list[str],
              budgets: list[float]) -> int:
    started = time.monotonic()
    names = [n for n in args.suite.split(",") if n]
    rows = suite_rows(layout, names=names, policies=policies, budgets=budgets,
                      limit=args.limit)
    for name, trace_rows in rows.items():
        print(f"\n== {name}")
        print(format_table(trace_rows))
    cells = suite_cells(rows)
    print()
    print(format_suite(cells))
    if args.out:
        sources = {t.name: t.source for t in SUITE}
        report = {"meta": {"date": time.strftime("%Y-%m-%d"), "model": layout.model,
                           "page_size": layout.page_size, "window": layout.window,
                           "limit": args.limit, "policies": policies, "budgets": budgets,
                           "seconds": round(time.monotonic() - started, 1),
                           "sources": {n: sources[n] for n in rows}},
                  "cells": [asdict(c) | {"of_optimal": round(c.of_optimal, 6),
                                         "of_best_fixed": round(c.of_best_fixed, 6),
                                         "holds": c.holds} for c in cells],
                  "rows": {n: [asdict(r) for r in trace_rows] for n, trace_rows in rows.items()}}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
        print(f"gcache replay: wrote {args.out}")
    return 0
