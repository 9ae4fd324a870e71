"""Time to first token on real SGLang engines (CPU): computed, GCache as HiCache's L3, GCache as
the external cache linker.

``python bench/engine.py --sglang`` in ``.venv-sglang`` (the CPU test shim installed, as ``make
test`` installs it). The 99 M parameter Llama of ``bench/engine.py`` (random weights, 8 layers,
4 KV heads of 64) and the Gemma 3 beside it (three sliding-window layers of 1024 tokens for
each full one), page size 64. For each prompt length, one document with a new question of
``QUESTION`` tokens at the end of every request:

- ``computed``: an engine without a prefix cache computes the whole prompt;
- ``radix``: SGLang's own radix-cache hit, the limit: the same engine computed the document
  for an earlier question, and the request computes only its new question;
- ``hicache``: a fresh engine with HiCache (host pool twice the device pool) and GCache as its
  L3 (``gcache_sglang.storage``, zero copy, prefetch ``wait_complete``), after another engine
  computed the document and saved it; the device and host caches are flushed before every
  request, so every prefix comes from GCache through the host pool;
- ``linker``: the same with GCache as the external cache linker (``gcache_sglang.linker``): no
  host pool, the prefix goes from GCache into the device pool layer by layer.

Every engine is a ``sglang.launch_server`` process; TTFT is the wall time of a ``/generate`` of
one token over HTTP on this host; tokens loaded are what SGLang reports as cached. Every engine
runs with ``--enable-metrics``, and a request's load phases (``gcache.kv.load_phases``: probe,
fetch, layer_wait, and the bytes placed) are the growth of the connector's Prometheus series on
the engine's ``/metrics`` across that request. Each engine
serves a first request that is not counted (one-off costs: the first forward's allocations,
GCache's connections). Writes ``bench/results/engine-sglang-latest.json``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = 64
ADMIN = "bench-admin"
CONDITIONS = ("computed", "radix", "hicache", "linker")
LAYERS = 8                                # bench/engine.py's models
LINKER_OBJECT = PAGE * 4 * 64 * 4        # a page of one layer's K (or V): 4 KV heads of 64, fp32


def prompt(document: int, length: int, question: int, *, vocab: int, extra: int) -> list[int]:
    """Document ``document``'s first ``length`` tokens, then question ``question``."""
    body = np.random.default_rng(document).integers(10, vocab, length)
    tail = np.random.default_rng(10**6 + question).integers(10, vocab, extra)
    return [int(t) for t in np.concatenate([body, tail])]


class Server:
    """One ``sglang.launch_server`` on CPU, by condition."""

    def __init__(self, model: pathlib.Path, condition: str, servers: list[str], port: int,
                 log: pathlib.Path, max_tokens: int) -> None:
        gcache = {"gcache_servers": ",".join(servers), "gcache_timeout_ms": 5000}
        args = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
                "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1",
                "--port", str(port), "--page-size", str(PAGE), "--max-total-tokens",
                str(max_tokens), "--chunked-prefill-size", str(max_tokens),
                # SGLang's own guess on CPU (-1.1 with 8K prompts) leaves no room for the pool;
                # --max-total-tokens bounds the pool, this only lets it be allocated
                "--mem-fraction-static", "0.3",
                "--enable-cache-report", "--enable-metrics", "--admin-api-key", ADMIN]
        if condition == "computed":
            args += ["--disable-radix-cache"]
        elif condition == "radix":
            pass
        elif condition == "hicache":
            args += ["--enable-hierarchical-cache", "--hicache-ratio", "2",
                     "--hicache-io-backend", "direct", "--hicache-mem-layout",
                     "page_first_direct", "--hicache-storage-prefetch-policy", "wait_complete",
                     "--hicache-storage-backend", "dynamic",
                     "--hicache-storage-backend-extra-config", json.dumps({
                         "backend_name": "gcache", "module_path": "gcache_sglang.storage",
                         "class_name": "GCacheHiCacheStorage", "interface_v1": 1,
                         "prefetch_threshold": PAGE,
                         "hicache_storage_pass_prefix_keys": True, **gcache})]
        else:
            args += ["--enable-unified-cache-external-linker",
                     "--unified-cache-external-linker-backend", "dynamic",
                     "--unified-cache-external-linker-config", json.dumps({
                         "linker_module_path": "gcache_sglang.linker", "linker": "GCacheLinker",
                         "linker_extra_config": gcache})]
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "SGLANG_PLUGINS": "cpu_testshim"}
        self.url = f"http://127.0.0.1:{port}"
        sys.path.insert(0, str(ROOT / "connectors"))
        from engine_testing.shm import GroupFiles, names
        self._log = open(log, "wb")
        before = names()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        # its /dev/shm files (load snapshots, multiprocessing's semaphores) outlive an engine
        # ended by a signal: ``stop`` removes those its process group used
        self.files = GroupFiles(self.proc.pid, before)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            self.files.collect()                 # an engine that fails to start leaves its own
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"sglang exited ({log})")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    self.files.collect()
                    return
            except OSError:
                time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"sglang not ready ({log})")

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {ADMIN}"})
        with urllib.request.urlopen(request, timeout=1800) as reply:
            raw = reply.read()
        return json.loads(raw) if raw.startswith(b"{") else {"text": raw.decode()}

    def ttft(self, ids: list[int]) -> tuple[float, int]:
        began = time.perf_counter()
        reply = self.post("/generate", {"input_ids": ids, "sampling_params": {
            "temperature": 0, "max_new_tokens": 1, "ignore_eos": True}})
        return time.perf_counter() - began, int(reply["meta_info"].get("cached_tokens", 0))

    def load_totals(self) -> dict[str, float]:
        """The connector's load phases so far (seconds) and ``bytes`` placed, from the
        engine's ``/metrics`` (its scheduler's series, SGLang's multiprocess registry)."""
        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as reply:
            text = reply.read().decode()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("engine") != "sglang":
                    continue
                if sample.name == "gcache_kv_load_phase_seconds_sum":
                    totals[sample.labels["phase"]] = sample.value
                elif sample.name == "gcache_kv_load_bytes_total":
                    totals["bytes"] = sample.value
        return totals

    def flush(self) -> None:
        for _ in range(100):
            try:
                if "Cache flushed" in self.post("/flush_cache", {}).get("text", ""):
                    return
            except urllib.error.HTTPError as exc:
                if exc.code != 400:              # 400: refused while L3 writes are in flight
                    raise
            time.sleep(0.2)
        raise RuntimeError("flush_cache refused")

    def stop(self) -> None:
        """Kill the engine's process group and remove the /dev/shm files it used."""
        self.files.end(self.proc)
        self._log.close()


def median_phases(requests: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over the requests (seconds; ``bytes`` placed); none recorded for a
    condition without GCache."""
    names = sorted({name for phases in requests for name in phases})
    return {name: round(float(np.median([phases.get(name, 0.0) for phases in requests])),
                        4 if name != "bytes" else 0) for name in names}


def bench_model(kind: str, lengths: list[int], repeats: int, work: pathlib.Path,
                cluster) -> list[dict]:
    from bench.engine import QUESTION, VOCAB, sdk_get_into, write_model
    from gcache.cli.ports import free_port
    model = write_model(work / kind, kind)
    max_tokens = 4 * (max(lengths) + QUESTION + PAGE)
    rows = []

    def ids(n: int, q: int) -> list[int]:
        return prompt(n, n, q, vocab=VOCAB, extra=QUESTION)

    warm = prompt(1, 512, 0, vocab=VOCAB, extra=0)
    for condition in CONDITIONS:
        if condition in ("hicache", "linker"):   # another engine computes and saves first
            saver = Server(model, condition, cluster.addresses, free_port(),
                           work / f"{kind}-{condition}-save.log", max_tokens)
            try:
                for n in lengths:
                    saver.ttft(ids(n, 0))
                time.sleep(5.0)                  # its last writes land
            finally:
                saver.stop()
        server = Server(model, condition, cluster.addresses, free_port(),
                        work / f"{kind}-{condition}.log", max_tokens)
        try:
            server.ttft(warm)
            for n in lengths:
                if condition == "radix":         # the document in this engine's own cache
                    server.ttft(ids(n, 0))
                times, loaded, phases = [], [], []
                for q in range(1, repeats + 1):
                    if condition in ("hicache", "linker"):
                        server.flush()           # every prefix from GCache, none kept
                    before = server.load_totals()
                    seconds, cached = server.ttft(ids(n, q))
                    after = server.load_totals()
                    times.append(seconds)
                    loaded.append(cached)
                    phases.append({k: v - before.get(k, 0.0) for k, v in after.items()})
                rows.append({"model": kind, "condition": condition, "length": n + QUESTION,
                             "ttft_s": {"p50": round(float(np.percentile(times, 50)), 4),
                                        "min": round(min(times), 4), "samples": len(times)},
                             "tokens_loaded": int(np.median(loaded)),
                             "phases": median_phases(phases)})
                placed = rows[-1]["phases"].get("bytes", 0)
                if condition == "linker" and placed:
                    # the limit of its load: the same bytes in its objects (one page of one
                    # layer's K or V), one batch per layer, from the same servers
                    rows[-1]["sdk_get_into_s"] = sdk_get_into(
                        cluster.addresses, "shm", int(placed), layers=LAYERS, size=LINKER_OBJECT)
                print(f"{kind:>7} {condition:>9} {n + QUESTION:>6} tokens: TTFT p50 "
                      f"{rows[-1]['ttft_s']['p50']:.3f} s, loaded {rows[-1]['tokens_loaded']}"
                      + "".join(f", {k} {v * 1000:.0f} ms" for k, v in
                                rows[-1]["phases"].items() if k != "bytes"), flush=True)
        finally:
            server.stop()
    return rows


def run(models: list[str], lengths: list[int], repeats: int, out: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from gcache.cli.local_cluster import LocalCluster
    started = time.monotonic()
    rows, failed = [], {}
    with tempfile.TemporaryDirectory(prefix="gcache-bench-sglang-") as tmp, \
            LocalCluster(2, memory="1536MiB", server_args=("--segment-size", "16MiB"),
                         log_dir=os.path.join(tmp, "gcache")) as cluster:
        for kind in models:
            try:
                rows += bench_model(kind, lengths, repeats, pathlib.Path(tmp), cluster)
            except (RuntimeError, TimeoutError, OSError) as exc:
                # a model SGLang's CPU engine cannot serve is reported, not hidden
                failed[kind] = str(exc)[-2000:]
                print(f"{kind}: failed: {exc}", flush=True)
    report = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "page": PAGE,
              "repeats": repeats, "rows": rows, "failed": failed,
              "seconds": round(time.monotonic() - started)}
    with open(out, "w") as fh:
        json.dump(report, fh, indent=1)
    print(f"wrote {out} ({report['seconds']} s)")
    return report


def main(argv: list[str]) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="llama,gemma3")
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" /
                                             "engine-sglang-latest.json"))
    args = parser.parse_args(argv)
    run(args.models.split(","), [int(n) for n in args.lengths.split(",")], args.repeats,
        args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
