"""``GCacheTier``: GCache as a secondary tier of vLLM's own KV offloading (``OffloadingConnector``
with ``TieringOffloadingSpec``), under its CPU primary tier.

Configured in ``kv_connector_extra_config``::

    {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ...,
     "secondary_tiers": [{"type": "GCacheTier", "module_path": "gcache_vllm.tier",
                          "gcache_master": "10.0.0.1:7600"}]}

vLLM's tiering manager calls every method in the scheduler process, under its lock, and none of
them may block: ``submit_store`` (a cascade: chunks of the CPU tier into GCache) and
``submit_load`` (a promotion: GCache into freshly allocated CPU chunks) queue jobs that run on
this tier's job threads (each a batched SDK call: one request per server, the bytes between
the CPU tier's shared memory and GCache with no staging copy), and ``get_finished_jobs`` hands
out what finished. ``lookup`` answers from a per-step batched probe (``tier_lookup``): RETRY
the first time, then HIT or MISS. A dead or slow server is a MISS or a failed job, after the
client's timeout, on those threads: never a stalled step. A failed store is reported as such,
which vLLM's backpressure counts (``failure_threshold``) as it counts slow stores.

Keys: one object per chunk (the CPU tier's row, every worker's part of it), named by vLLM's
``OffloadKey`` (the chunk's chained block hash and its KV cache group) within a namespace of
what makes a row's bytes mean the same to two engines: vLLM's own storage identity of the
offloading config (model, dtype, groups, parallel layout; ``FileMapper``), the row's size, the
weights' fingerprint (when the model is a local directory) and ``gcache_namespace``. Two
engines of one model share; two models never collide. Sliding-window groups are vLLM's to
handle: their chunks are keys of their own group.

Events (``enable_kv_events``): what the tier stores is announced as vLLM KV events with medium
CPU (GCache holds KV in host memory), the configured locality and ownership ``gcache``; the
rule for withdrawing them is ``tier_events``.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import traceback
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from queue import Empty, Queue
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from gcache.kv import (
    KV_ONLY,
    LOADER_ONLY,
    ConfigError,
    EnginePages,
    client_from_settings,
    gcache_settings,
    weights_fingerprint,
)
from gcache_vllm._compat import get_logger
from gcache_vllm.tier_events import Announced
from gcache_vllm.tier_lookup import LookupBatcher

log = get_logger(__name__)

POOL = "chunk"
OWNERSHIP = "gcache"
# What the tier reads of the gcache_* settings: the cluster, the client's own, the namespace.
REFUSED = tuple(name for name in KV_ONLY if name != "namespace") + LOADER_ONLY


class GCacheTier(SecondaryTierManager):
    """vLLM ``SecondaryTierManager`` over a GCache cluster (module docstring)."""

    medium: ClassVar[Medium] = Medium.CPU

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, *, locality: str = "REMOTE",
                 enable_kv_events: bool = False, job_threads: int = 2,
                 event_ttl_s: float = 300.0, **settings: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        foreign = sorted(k for k in settings if not k.startswith("gcache_"))
        if foreign:
            raise ConfigError("secondary_tiers", foreign, "the GCache tier takes locality, "
                              "enable_kv_events, job_threads, event_ttl_s, backpressure and "
                              "gcache_* settings (connectors/vllm/README.md)")
        gcache = gcache_settings(settings, unused=REFUSED)
        if int(job_threads) < 1:
            raise ConfigError("job_threads", job_threads, "at least 1")
        self.locality = Locality(str(locality).upper())
        events_on = getattr(getattr(offloading_spec, "kv_events_config", None),
                            "enable_kv_cache_events", False)
        self.announced = Announced(float(event_ttl_s)) if enable_kv_events and events_on \
            else None
        self.client = client_from_settings(gcache)
        self.pages = EnginePages(self.client, "vllm-tier", _namespace(offloading_spec,
                                 self.block_size_bytes, str(gcache.get("namespace", ""))))
        self.pages.add_pool(POOL, row_bytes=self.block_size_bytes)
        self._rows = primary_kv_view.cast("B")          # chunk c: [c * row, (c + 1) * row)
        self.lookups = LookupBatcher(self._present)
        self._jobs = ThreadPoolExecutor(int(job_threads), thread_name_prefix="gcache-tier-job")
        self._in_flight: set[Future] = set()
        self._finished: Queue[tuple[JobResult, TransferJob]] = Queue()
        self._lock = threading.Lock()                   # the job set, beside vLLM's lock
        self.counters = {"store_jobs": 0, "load_jobs": 0, "stored": 0, "loaded": 0,
                         "failed_stores": 0, "failed_loads": 0}
        log.info("gcache tier: %s, %d-byte chunks, locality %s, events %s", self.client,
                 self.block_size_bytes, self.locality.value,
                 "on" if self.announced else "off")

    # ---- lookup -----------------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        known = self.lookups.answer(req_context.req_id, key)
        if known is None:
            return LookupResult.RETRY
        return LookupResult.HIT if known else LookupResult.MISS

    def _present(self, keys: list) -> list[bool]:
        found = self.pages.present(POOL, [key.hex() for key in keys], 1)
        self._mark(held=[k for k, ok in zip(keys, found) if ok],
                   gone=[k for k, ok in zip(keys, found) if not ok])
        return found

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self.lookups.flush()

    # ---- jobs -------------------------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        self.counters["store_jobs"] += 1
        self._submit(self._store, job_metadata)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self.counters["load_jobs"] += 1
        self._submit(self._load, job_metadata)

    def _submit(self, work: Any, job: TransferJob) -> None:
        try:
            future = self._jobs.submit(self._run, work, job)
        except RuntimeError as exc:                     # shut down: the job fails, reported
            log.error("gcache tier: job %d refused: %s", job.job_id, exc)
            self._finished.put((JobResult(job.job_id, False, successful_keys=()), job))
            return
        with self._lock:
            self._in_flight.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def _run(self, work: Any, job: TransferJob) -> None:
        began = time.perf_counter()
        chunks: list[list[memoryview]] = []
        try:
            chunks = self._chunks(job)
            done = work(job, chunks)
        except Exception as exc:
            # the traceback as text: a record that a handler keeps must not keep, through the
            # frames, this job's views of the CPU tier (vLLM could not unmap it)
            log.error("gcache tier: job %d failed: %s", job.job_id,
                      "".join(traceback.format_exception(exc)))
            done = [False] * len(job.keys)
        finally:
            _release(job, chunks)
        keys = list(job.keys)
        ok = [key for key, landed in zip(keys, done) if landed]
        result = JobResult(job.job_id, len(ok) == len(keys),
                           successful_keys=None if len(ok) == len(keys) else ok,
                           transfer_time=time.perf_counter() - began,
                           transfer_bytes=len(ok) * self.block_size_bytes)
        self._finished.put((result, job))

    def _chunks(self, job: TransferJob) -> list[list[memoryview]]:
        """Each chunk's row of the CPU tier. An id outside it fails the job (a slice would
        quietly be short, and a short value stored under the chunk's key)."""
        row, count = self.block_size_bytes, len(self._rows) // self.block_size_bytes
        outside = [int(c) for c in job.chunk_ids if not 0 <= int(c) < count]
        if outside:
            raise ValueError(f"chunk ids {outside} outside the CPU tier's {count} chunks")
        return [[self._rows[int(c) * row:(int(c) + 1) * row]] for c in job.chunk_ids]

    def _store(self, job: TransferJob, chunks: list[list[memoryview]]) -> list[bool]:
        return self.pages.write(POOL, [key.hex() for key in job.keys], chunks)

    def _load(self, job: TransferJob, chunks: list[list[memoryview]]) -> list[bool]:
        return self.pages.read(POOL, [key.hex() for key in job.keys], chunks)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        while True:
            try:
                result, job = self._finished.get_nowait()
            except Empty:
                break
            out.append(result)
            keys = list(job.keys)
            landed = keys if result.success else list(result.successful_keys or ())
            moved, failures = ("loaded", "failed_loads") if job.is_promotion \
                else ("stored", "failed_stores")
            self.counters[moved] += len(landed)
            self.counters[failures] += not result.success
            if job.is_promotion and not result.success:
                arrived = set(landed)
                lost = [key for key in keys if key not in arrived]
                self.lookups.forget(job.req_context.req_id, lost)
                self._mark(gone=lost)
            elif not job.is_promotion:
                self._mark(held=landed)
        return out

    def _mark(self, *, held: Iterable[OffloadKey] = (), gone: Iterable[OffloadKey] = ()) -> None:
        """What GCache was found to hold, or not, for the events (when they are on)."""
        if self.announced is not None:
            with self._lock:
                self.announced.held(held)
                self.announced.gone(gone)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.announced is None:
            return ()
        with self._lock:
            runs = self.announced.take()
        return [OffloadingEvent(keys=keys, medium=self.medium, removed=removed,
                                locality=self.locality, ownership=OWNERSHIP)
                for keys, removed in runs]

    # ---- requests and lifecycle -------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext(policy=OffloadPolicy.CHUNK_LEVEL)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.lookups.finished(req_context.req_id)

    def has_pending_work(self) -> bool:
        with self._lock:
            jobs = bool(self._in_flight)
        return jobs or not self._finished.empty() or self.lookups.pending()

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished (none touches the CPU tier after)."""
        with self._lock:
            running = list(self._in_flight)
        wait(running)

    def shutdown(self) -> None:
        """Threads stopped, the client closed, and no view of the CPU tier left: vLLM unmaps
        it after, and keeps it mapped (leaked) while any view is alive. Each job released its
        own views when it ended (``_release``); the collector runs in case a reference cycle
        still holds one of the tier's."""
        self._jobs.shutdown(wait=True)
        self.lookups.close()
        self.client.close()
        gc.collect()
        self._rows.release()


def _release(job: TransferJob, chunks: list[list[memoryview]]) -> None:
    """Let go of a finished job's views of the CPU tier. The rule: once a job is reported, the
    tier neither writes into its chunks (vLLM reuses them) nor keeps them mapped. A view that
    something still exports (a numpy array over it) breaks it: logged, as lost data would be."""
    for chunk in chunks:
        for view in chunk:
            try:
                view.release()
            except BufferError:
                log.error("gcache tier: a view of job %d's chunks is still exported after the job",
                          job.job_id)


def _namespace(spec: Any, row_bytes: int, namespace: str) -> dict[str, object]:
    """What makes a chunk's bytes interchangeable between engines (module docstring)."""
    mapper = FileMapper.from_offloading_spec("gcache", spec,
                                             blocks_per_file=spec.blocks_per_chunk,
                                             parallel_agnostic=True)
    model = spec.config.model.name
    fingerprint = weights_fingerprint(model) if model and os.path.isdir(model) else None
    if fingerprint is None:
        log.warning("gcache tier: %s is not a local model directory with safetensors; keys "
                    "name the model by name alone (set a new gcache_namespace when its "
                    "weights change)", model)
    return {"identity": mapper.base_path, "rank": mapper.rank, "row_bytes": row_bytes,
            "weights": fingerprint, "tenant": namespace}
