"""``gcache explain``: why a token sequence's prefix hits where it does, and what a miss lacks.

It builds the page keys ``gcache.kv.KVStore`` builds (the vLLM connector's and the demo's; the
model name the keys carry, the operator's namespace and the weights' fingerprint as the vLLM
connector joins them), asks the cluster through ``KVStore.probe``, so the window-safe boundary
printed is the one an engine gets, never a second reading of the rule, and then looks further
for the answer's reasons: which paged layers each page has, which sliding layers each window
tail has, who owns the keys that are missing (the SDK's placement, from the masters' map or
the ring over ``--servers``) and whether that server answers STAT.

SGLang's connector keys pages by the engine's own page hashes (``EnginePages``), which a token
list cannot rebuild: this command does not cover it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
from collections.abc import Callable, Sequence

from gcache.cli.top import Stat, Targets, add_target_flags, stats_of, targets_of
from gcache.errors import InvalidRequest
from gcache.keys import key_hash
from gcache.kv import GROUP_HEAD_TOKENS, KVStore, ModelLayout, Probe, weights_fingerprint
from gcache.kv.page_keys import page_key, tail_key
from gcache.kv.policy import DEFAULT_POLICY
from gcache.sdk import Client

LISTED_KEYS = 8           # missing keys named one by one; the rest are counted per server


def read_tokens(args: argparse.Namespace) -> list[int]:
    """Token ids from ``--tokens``, ``--tokens-file`` (comma or space separated, or a JSON
    list) or ``--prompt`` with ``--tokenizer``. Raises InvalidRequest for anything else."""
    if args.prompt is not None:
        return _tokenize(args.prompt, args.tokenizer)
    if args.tokens_file is not None:
        with open(args.tokens_file, encoding="utf-8") as fh:
            text = fh.read()
    else:
        text = args.tokens
    if text.lstrip().startswith("["):
        try:
            values = json.loads(text)
        except ValueError as exc:
            raise InvalidRequest(f"the token list is not JSON: {exc}") from None
        words = [str(v) for v in values]
    else:
        words = [w for w in re.split(r"[,\s]+", text.strip()) if w]
    bad = next((w for w in words if not w.isdigit()), None)
    if bad is not None:
        raise InvalidRequest(f"token {bad!r} is not a non-negative integer")
    return [int(w) for w in words]


def _tokenize(prompt: str, tokenizer: str | None) -> list[int]:
    if not tokenizer:
        raise InvalidRequest("--prompt needs --tokenizer PATH (a local tokenizer directory)")
    try:       # optional, and untyped: by name, so mypy needs no stubs for it
        auto_tokenizer = importlib.import_module("transformers").AutoTokenizer
    except ImportError:
        raise InvalidRequest("--prompt needs the transformers package, which is not "
                             "installed; give the token ids with --tokens or --tokens-file"
                             ) from None
    encoder = auto_tokenizer.from_pretrained(tokenizer, local_files_only=True)
    ids: list[int] = encoder(prompt)["input_ids"]
    return ids


def layout_of(args: argparse.Namespace) -> ModelLayout:
    """The layout, named as the keys name the model: ``--key-model`` (default the config's
    name), then ``|ns:NS`` and ``|weights:FP`` as the vLLM connector appends them."""
    def read(model: str | None) -> ModelLayout:
        return ModelLayout.from_config(args.model, page_size=args.page_size,
                                       tp_rank=args.tp_rank, tp_size=args.tp_size, model=model)

    name = args.key_model or read(None).model
    if args.namespace:
        name += f"|ns:{args.namespace}"
    if args.weights:
        fingerprint = weights_fingerprint(args.weights)
        if fingerprint is None:
            raise InvalidRequest(f"--weights {args.weights} holds no *.safetensors file")
        name += f"|weights:{fingerprint}"
    return read(name)


def ranges(numbers: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` as ``"1-3, 7"``; "none" for none."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


class Explainer:
    """One sequence's probe, with the extra lookups and placement that explain it."""

    def __init__(self, store: KVStore, client: Client, targets: Targets,
                 stats: dict[str, Stat | None], probe: Probe) -> None:
        self.store, self.client, self.targets, self.stats = store, client, targets, stats
        self.probe, self.layout = probe, store.layout
        self.hashes = list(probe.hashes)
        # each page's placement group, and a group's key -> owner, made once
        self.groups = store.key_groups(self.hashes, [page_key(h, 0) for h in self.hashes])
        self._owners: dict[str, Callable[[bytes], str | None]] = {}
        self.tails_found: dict[str, int] = {}     # tail keys seen to exist -> their page

    def owner(self, page: int, key: str) -> str | None:
        """The address of the server of ``key`` (of page ``page``), as the SDK places it (None:
        no live server)."""
        group = self.groups[page]
        if group not in self._owners:
            self._owners[group] = self.targets.placed.owners(key_hash(group.encode()))
        return self._owners[group](key.encode())

    def describe(self, address: str | None) -> str:
        """A server as ``id address up`` (or down: it did not answer STAT)."""
        if address is None:
            return "no server (none is live in the map)"
        name = self.targets.names.get(address, address)
        state = "up" if self.stats.get(address) is not None else "down (no STAT answer)"
        return f"{address} {state}" if name == address else f"{name} {address} {state}"

    def missing_lines(self, page: int, keys: list[str]) -> list[str]:
        """``keys`` of page ``page`` with their servers (past ``LISTED_KEYS``, counted)."""
        lines = [f"  {key} on {self.describe(self.owner(page, key))}"
                 for key in keys[:LISTED_KEYS]]
        rest: dict[str | None, int] = {}
        for key in keys[LISTED_KEYS:]:
            address = self.owner(page, key)
            rest[address] = rest.get(address, 0) + 1
        return lines + [f"  ... and {n} more on {self.describe(a)}" for a, n in rest.items()]

    def tail_layers_present(self, boundaries: list[int]) -> dict[int, list[int]]:
        """Per boundary (pages), the sliding layers whose window tail before it exists."""
        keys = [tail_key(self.hashes[b - 1], layer)
                for b in boundaries for layer in self.store.tail_layers]
        pages = [b - 1 for b in boundaries for _ in self.store.tail_layers]
        found = self.client.batch_exists(keys, group=[self.groups[i] for i in pages])
        present = {k for k, ok in zip(keys, found) if ok}
        self.tails_found.update((k, i) for i, k, ok in zip(pages, keys, found) if ok)
        return {b: [layer for layer in self.store.tail_layers
                    if tail_key(self.hashes[b - 1], layer) in present] for b in boundaries}

    def lines(self, n_tokens: int) -> list[str]:
        layout, probe, page = self.layout, self.probe, self.layout.page_size
        n = probe.n_pages
        out = [f"model {layout.model!r}: {layout.num_layers} layers, {len(layout.full_layers)} "
               f"full-attention + {len(layout.swa_layers)} sliding (W={layout.window}), page "
               f"{page} tokens, policy {self.store.policy.name}, "
               f"{len(self.store.paged_layers)} paged layers",
               f"tokens: {n_tokens}, full pages: {n}"
               + (f"; the last {n_tokens - n * page} tokens are a partial page, never stored"
                  if n_tokens % page else "")]
        out += self._page_lines()
        out += self._tail_lines()
        out += self._boundary_lines()
        out += self._server_lines()
        return out

    def _page_lines(self) -> list[str]:
        probe, paged = self.probe, self.store.paged_layers
        if not paged:
            return ["full-attention pages: none stored (every layer slides)"]
        have = [i for i, h in enumerate(self.hashes)
                if all(page_key(h, layer) in probe.present_keys for layer in paged)]
        out = [f"full-attention pages present (every paged layer): {ranges(have)} "
               f"({len(have)} of {probe.n_pages})"]
        if probe.shared_pages == probe.n_pages:
            return out + ["first missing full-attention page: none"]
        i = probe.shared_pages
        lacking = [layer for layer in paged
                   if page_key(self.hashes[i], layer) not in probe.present_keys]
        out.append(f"first missing full-attention page: {i} (tokens [{i * self.layout.page_size}"
                   f", {(i + 1) * self.layout.page_size})), lacking {len(lacking)} of "
                   f"{len(paged)} paged layers; its missing keys and their servers:")
        return out + self.missing_lines(i, [page_key(self.hashes[i], layer)
                                            for layer in lacking])

    def _tail_lines(self) -> list[str]:
        if not self.store.tail_layers:
            return ["window tails: none (no sliding layer is stored as tails"
                    + (", policy full-layer)" if self.layout.swa_layers else ")")]
        first = self.store.tail_layers[0]
        seen = [b for b in range(1, self.probe.n_pages + 1)
                if tail_key(self.hashes[b - 1], first) in self.probe.present_keys]
        tails = self.tail_layers_present(seen)
        whole = [b for b, layers in tails.items() if len(layers) == len(self.store.tail_layers)]
        part = {b: len(layers) for b, layers in tails.items() if b not in whole}
        out = [f"window tails present, every sliding layer (boundary in pages): {ranges(whole)}"]
        if part:
            out.append("window tails with some sliding layers missing: " + ", ".join(
                f"{b} ({k} of {len(self.store.tail_layers)})" for b, k in sorted(part.items())))
        return out

    def _boundary_lines(self) -> list[str]:
        probe, page = self.probe, self.layout.page_size
        # where a hit could reach with every tail present: the probe's own limit
        hit = probe.hit_pages
        limit = probe.shared_pages if self.store.paged_layers else probe.n_pages
        out = [f"window-safe boundary: {probe.hit_tokens} tokens ({hit} of {probe.n_pages} "
               "pages)"]
        if probe.n_pages == 0:
            return out + ["  why: no full page; fewer than a page of tokens is never stored"]
        if hit == probe.n_pages:
            return out + ["  why: every full page hits" + (", with its window tail"
                                                         if self.store.tail_layers else "")]
        if hit == limit:
            return out + [f"  why: it stops at the first missing full-attention page ({limit})"
                          + (f"; the window tail at {hit} is complete" if hit and
                             self.store.tail_layers else "")]
        reason = (f"pages {ranges(range(limit))} are all present" if self.store.paged_layers
                  else "the model has no full-attention layer")
        where = f"boundary {limit}" if hit + 1 == limit else f"any boundary in {hit + 1}..{limit}"
        out.append(f"  why: {reason}, but no complete window tail covers the window before "
                   f"{where}" + (f"; the last complete one is at {hit}" if hit else ""))
        layers = self.tail_layers_present([limit])[limit]
        missing = [tail_key(self.hashes[limit - 1], layer) for layer in self.store.tail_layers
                   if layer not in layers]
        start = max(0, limit * page - self.layout.window)
        out.append(f"  the window tail at {limit} (tokens [{start}, {limit * page})) would "
                   "reach it; its missing keys and their servers:")
        return out + self.missing_lines(limit - 1, missing)

    def _server_lines(self) -> list[str]:
        """Per server: this sequence's page keys it holds of those it owns, and its tails."""
        owned: dict[str | None, list[int]] = {a: [0, 0, 0] for a in self.targets.addresses}
        for i, h in enumerate(self.hashes):
            for layer in self.store.paged_layers:
                key = page_key(h, layer)
                counts = owned.setdefault(self.owner(i, key), [0, 0, 0])
                counts[key in self.probe.present_keys] += 1
        for key, i in self.tails_found.items():
            owned.setdefault(self.owner(i, key), [0, 0, 0])[2] += 1
        return ["servers (this sequence's keys there):",
                *(f"  {self.describe(a)}: {have} of the {have + lack} page keys it owns, "
                  f"{tails} window-tail keys" for a, (lack, have, tails) in owned.items())]


def run(args: argparse.Namespace) -> int:
    tokens = read_tokens(args)
    layout = layout_of(args)
    targets = targets_of(args)
    stats = stats_of(list(targets.addresses), token=targets.config.token,
                     timeout_s=targets.config.timeout_s)
    cfg = dataclasses.replace(targets.config, suspect_s=0.0, transport="tcp")
    with Client(config=cfg) as client, \
            KVStore(client, layout, policy=args.policy,
                    group_head_tokens=args.group_head_tokens) as store:
        explainer = Explainer(store, client, targets, stats, store.probe(tokens))
        print("\n".join(explainer.lines(len(tokens))))
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("explain", help="why a token sequence's prefix hits where it does: "
                         "pages and window tails present, the window-safe boundary, and who "
                         "owns what is missing")
    cmd.add_argument("--model", required=True,
                     help="config.json path or a shipped config name (gcache.kv.SHIPPED_CONFIGS)")
    given = cmd.add_mutually_exclusive_group(required=True)
    given.add_argument("--tokens", help="token ids, comma or space separated")
    given.add_argument("--tokens-file", help="a file of token ids (separated, or a JSON list)")
    given.add_argument("--prompt", help="text to tokenize with --tokenizer (as a completion "
                       "prompt: special tokens added, no chat template; needs transformers)")
    cmd.add_argument("--tokenizer", help="local tokenizer directory for --prompt")
    cmd.add_argument("--key-model", help="the model name the keys carry (default: the "
                     "config's name; the vLLM connector's is vllm/<served model>)")
    cmd.add_argument("--namespace", help="gcache_namespace of the engine's settings")
    cmd.add_argument("--weights", help="the served weights' directory, when the engine keys "
                     "by their fingerprint (the vLLM connector does when it finds them)")
    cmd.add_argument("--page-size", type=int, default=64, help="tokens per page: the engine's "
                     "block size")
    cmd.add_argument("--tp-rank", type=int, default=0)
    cmd.add_argument("--tp-size", type=int, default=1)
    cmd.add_argument("--policy", default=DEFAULT_POLICY, help="the store policy (full-layer "
                     "stores sliding layers as pages)")
    cmd.add_argument("--group-head-tokens", type=int, default=GROUP_HEAD_TOKENS,
                     help="gcache_group_head_tokens of the engine's settings")
    add_target_flags(cmd)
    cmd.set_defaults(run=run)
