"""Placement on the conversation trace: how evenly the KV lands on the servers, and how many
sequences one server's death breaks, for each rule a page's placement group could follow.

Every request of ``../shared/data/traces/conversation_trace.jsonl`` (Mooncake's FAST'25
"Conversation" workload) is a chain of 512-token blocks whose ids name the prefix through them;
each distinct block is one stored page of equal size, placed by ``gcache.placement.Ring`` on
``--servers`` equal servers with ``group_width`` 2, exactly as the SDK places a key:

- ``head T``: what ``gcache.kv.page_keys.groups_of`` does (``group_head_tokens`` T, default
  1024): the pages within the first T tokens (the head, where a shared system prompt lives)
  take the first page's group, every deeper page the group of the first page past the head;
- ``first page`` (the rule before): every page of a sequence takes its first page's group;
- ``no group``: every page by its own hash;
- ``depth 2``: page i takes the group of page ``min(i, 1)`` of its own prefix (the first page
  alone, everything deeper with the second page): balanced, but an engine's pages are far
  smaller than the trace's 512-token blocks, and there page 1 is inside a shared prompt.

Balance is max / mean bytes per server (target <= 1.3); the blast radius is the share of requests
(each needs all its pages) that lose a page when one server dies, worst server and mean over
servers. Prints a table and writes ``bench/results/placement-latest.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

from gcache.kv.page_keys import head_groups, head_pages
from gcache.placement import DEFAULT_VNODES, Ring

BLOCK_TOKENS = 512             # the trace's block (page) size
TRACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                     "traces", "conversation_trace.jsonl")


def load(path: str, limit: int | None) -> list[list[int]]:
    with open(path, encoding="utf-8") as fh:
        chains = [json.loads(line)["hash_ids"] for line in fh if line.strip()]
    return chains[:limit] if limit else chains


def _page(block: int) -> bytes:
    return f"page/{block}".encode()


def group_rule(name: str):
    """The group of page ``i`` of ``chain``, as a function of the chain's first i + 1 blocks."""
    if name == "first page":
        return lambda chain, i: _page(chain[0])
    if name == "no group":
        return lambda chain, i: None
    if name == "depth 2":
        return lambda chain, i: _page(chain[min(i, 1)])
    head = head_pages(BLOCK_TOKENS, int(name.split()[-1]))
    return lambda chain, i: head_groups([_page(b).decode() for b in chain[:i + 1]],
                                        head)[i].encode()


def measure(chains: list[list[int]], rule: str, ring: Ring, width: int) -> dict:
    group_of = group_rule(rule)
    owner: dict[int, str] = {}
    for chain in chains:
        for i, block in enumerate(chain):
            if block not in owner:
                owner[block] = ring.owner(_page(block), group=group_of(chain, i),
                                          group_width=width)
    per_server = dict.fromkeys(ring.servers, 0)
    for server in owner.values():
        per_server[server] += 1
    mean = statistics.mean(per_server.values())
    broken = dict.fromkeys(ring.servers, 0)
    for chain in chains:
        for server in {owner[b] for b in chain}:
            broken[server] += 1
    shares = [n / len(chains) for n in broken.values()]
    return {"pages": len(owner), "max_over_mean": max(per_server.values()) / mean,
            "death_breaks_worst": max(shares), "death_breaks_mean": statistics.mean(shares)}


RULES = ("head 1024", "head 512", "head 2048", "first page", "no group", "depth 2")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--group-width", type=int, default=2)
    parser.add_argument("--vnodes", default=f"64,{DEFAULT_VNODES}",
                        help="ring points per server, comma separated (default: before and now)")
    parser.add_argument("--limit", type=int, default=None, help="first N requests only")
    args = parser.parse_args()
    chains = load(args.trace, args.limit)
    points = [int(v) for v in args.vnodes.split(",")]
    rows: dict[str, dict] = {}
    for vnodes in points:
        ring = Ring.uniform([f"server-{i}" for i in range(args.servers)], vnodes=vnodes)
        for rule in RULES:
            rows.setdefault(rule, {})[str(vnodes)] = measure(chains, rule, ring,
                                                             args.group_width)
    print(f"placement on {len(chains)} requests, {args.servers} servers, group_width "
          f"{args.group_width}\n")
    print(f"{'rule':<12}{'points':>7}{'pages':>9}{'max/mean':>10}{'death breaks (worst)':>22}"
          f"{'(mean)':>9}")
    for rule, by_points in rows.items():
        for vnodes, row in by_points.items():
            print(f"{rule:<12}{vnodes:>7}{row['pages']:>9}{row['max_over_mean']:>10.2f}"
                  f"{row['death_breaks_worst']:>22.1%}{row['death_breaks_mean']:>9.1%}")
    write_results("placement", {"date": dt.date.today().isoformat(), "requests": len(chains),
                                "servers": args.servers, "group_width": args.group_width,
                                "vnodes": points, "block_tokens": BLOCK_TOKENS,
                                "rules": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
