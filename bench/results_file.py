"""Where every benchmark writes its figures: ``bench/results/<name>-latest.json``, which
``update_readme.py`` renders into the README (dated copies too, when asked)."""

from __future__ import annotations

import json
import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def write_results(name: str, report: dict, *, dated: bool = False) -> str:
    """Write ``report`` as ``<name>-latest.json`` (and ``<name>-<date>.json`` with ``dated``);
    returns the latest file's path."""
    os.makedirs(RESULTS, exist_ok=True)
    names = [f"{name}-latest.json"] + ([f"{name}-{report['date']}.json"] if dated else [])
    for filename in names:
        with open(os.path.join(RESULTS, filename), "w") as fh:
            json.dump(report, fh, indent=2)
    path = os.path.join(RESULTS, names[0])
    print(f"wrote {path}")
    return path
