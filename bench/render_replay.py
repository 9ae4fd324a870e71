"""Tables of the hit-rate benchmarks: ``make replay`` (``gcache replay --cluster``: policies by
budget on the conversation trace, the model against a real cluster) and ``make replay-suite``
(``gcache replay --suite``: every trace against its optimum). Rendered by
``bench/update_readme.py`` into docs/benchmarks/hit-rate.md; plots are named from the repository's
root, as every renderer's are."""

from __future__ import annotations

from gcache.kv.replay import CLUSTER_SAMPLE_EVERY, OPTIMAL


def render_replay(report: dict) -> str:
    meta, rows = report["meta"], report["rows"]
    lines = [
        f"Measured {meta['date']} by `make replay` (`gcache replay --cluster`) over "
        f"{meta['requests']} requests of `{meta['trace']}`, layout {meta['model']} (page "
        f"{meta['page_size']} tokens, W = {meta['window']}). Budget: a fraction of the full-layer "
        f"working set ({meta['working_set_bytes'] / 2**40:.1f} TiB). Token hit rate counts "
        "window-safe hits only; the default policy is marked *.",
        "",
    ]
    model_rows = [r for r in rows if r["source"] == "model"]
    lines += _hit_table(model_rows, with_bytes=True)
    default = [r for r in model_rows if r["is_default"]]
    if default and default[0].get("of_optimal") is not None:
        budgets = sorted({r["budget_fraction"] for r in default})
        cell = {r["budget_fraction"]: r for r in default}
        lines += ["", f"The `{OPTIMAL}` row is the most any eviction and tail placement could hit "
                  "with the future known (`gcache.kv.optimal`; exact where every hit fits, "
                  "else an upper bound). The default policy against it, and the share of the "
                  "bytes it held that could not hit (behind a missing page of their prefix), "
                  "summed over every lookup:", "",
                  "| default policy | " + " | ".join(f"{b:.0%}" for b in budgets) + " |",
                  "|---|" + "---:|" * len(budgets),
                  "| of optimal | " + " | ".join(f"{cell[b]['of_optimal']:.3f}"
                                                 for b in budgets) + " |",
                  "| unreachable share | " + " | ".join(
                      f"{cell[b]['unreachable_share']:.3f}" for b in budgets) + " |"]
    cluster = [r for r in rows if r["source"] == "cluster"]
    if cluster:
        model = {(r["policy"], r["budget_fraction"]): r["hit_rate"] for r in rows
                 if r["source"] == "model-subset"}
        worst = max(abs(r["hit_rate"] - model[(r["policy"], r["budget_fraction"])])
                    for r in cluster)
        lines += ["", f"Real cluster (2 `gcache-server`s, values scaled 1/{meta['scale']}), first "
                  f"{cluster[0]['requests']} requests, against the in-process model on the same "
                  f"requests (largest difference {worst * 100:.2f} points):", ""]
        lines += _hit_table(cluster, model=model)
        if all(r.get("unreachable_share") is not None for r in cluster):
            shares = {(r["policy"], r["budget_fraction"]): r["unreachable_share"] for r in rows
                      if r["source"] == "model-subset"}
            lines += ["", "Unreachable share of the bytes held, as the servers' sweeps found it "
                      f"(STAT `tier.unreachable_bytes` over `tier.bytes`, read every "
                      f"{CLUSTER_SAMPLE_EVERY} requests; a server counts only parents it owns, "
                      "so it sees less than the model, whose share is summed over every "
                      "lookup):", ""]
            lines += _hit_table(cluster, model=shares, field="unreachable_share")
    lines += ["", "![hit rate versus budget](bench/results/replay-latest.png)"]
    return "\n".join(lines)


def _hit_table(rows: list[dict], *, with_bytes: bool = False, model: dict | None = None,
               field: str = "hit_rate") -> list[str]:
    """Policies by budget: each row's ``field`` (and the model's beside it, from ``model``)."""
    budgets = sorted({r["budget_fraction"] for r in rows})
    cell = {(r["policy"], r["budget_fraction"]): r for r in rows}
    head = "| policy | " + " | ".join(f"{b:.0%}" for b in budgets) + " |"
    head += " bytes vs full-layer |" if with_bytes else ""
    lines = [head, "|---|" + "---:|" * (len(budgets) + with_bytes)]
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mark = " *" if cell[(policy, budgets[0])]["is_default"] else ""
        values = []
        for b in budgets:
            text = f"{cell[(policy, b)][field]:.3f}"
            if model is not None:
                text += f" (model {model[(policy, b)]:.3f})"
            values.append(text)
        line = f"| {policy}{mark} | " + " | ".join(values) + " |"
        if with_bytes:
            line += " – |" if policy == OPTIMAL else \
                f" {cell[(policy, budgets[-1])]['storage_ratio']:.3f} |"
        lines.append(line)
    return lines


def render_replay_suite(report: dict) -> str:
    """The suite table of ``gcache replay --suite --out`` (``gcache.kv.suite.format_suite``)."""
    from gcache.kv.suite import SuiteCell, format_suite

    meta = report["meta"]
    cells = [SuiteCell(c["trace"], c["budget_fraction"], c["default"], c["optimal"],
                       c["best_fixed"], c["best_fixed_policy"]) for c in report["cells"]]
    sources = "; ".join(f"`{name}`: {source}" for name, source in meta["sources"].items())
    return "\n".join([
        f"Measured {meta['date']} by `make replay-suite` (`gcache replay --suite`, "
        f"{meta['seconds']:.0f} s), layout {meta['model']} (page {meta['page_size']} tokens, "
        f"W = {meta['window']}); budgets are fractions of each trace's full-layer working set, "
        f"hit rates count window-safe hits only. Traces: {sources}.", "",
        format_suite(cells)])
