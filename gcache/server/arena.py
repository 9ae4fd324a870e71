"""The hot tier's memory: one shared-memory file cut into fixed-size segments, claimed as spans.

Invariants (not thread-safe: the tier's lock guards an arena):
- A claim takes a *span*: one segment, or consecutive segments holding one large record alone.
  Records are appended to the open segment; when it is full another span is claimed.
- Every span has one owner (``Segment.owner``: a tenant's id, or 0 for the administrator's
  keys, ``tenant_keys``), and each owner has an open segment of its own, so a tenant's values
  live in spans of its own and its oldest values are whole spans. ``held`` counts the bytes of
  each owner's spans (a one-segment span's fill, a larger span whole), what its quota is
  measured by; ``windows`` says which owners a window touches (``Candidate.own``,
  ``protected``), so the eviction rule can keep tenants within their quotas.
- Every span starts with a header (``SPAN``, two checked copies) carrying its age (claim order)
  and the record sequence number its claim consumed: every record written in the span later is
  newer, every leftover of the span's previous use older, so a restart tells them apart.
- The arena chooses nothing and calls nothing above it: it lists its windows as plain
  candidates (``windows``), frees the spans its owner emptied (``free``) and claims the window
  the owner chose (``claim``); ``gcache.eviction`` holds the rule, ``reclaim`` runs it.
- A span that a lease or a write pins (``Segment.pins``), that holds a kept value
  (``Segment.kept``: a file's part, put with ``FLAG_PINNED``) or, behind a cold tier, whose
  values are not all on disk yet (``clean``) is never offered as a candidate.

The file lives in /dev/shm (or ``arena_dir``: a tmpfs mounted with huge pages) and outlives the
process: a restarted server re-attaches to it (``recovery`` rebuilds the index). The headers'
checks are BLAKE2b keyed with a secret kept beside the arena in ``<name>.key`` (0600), which
clients never see (they are handed the arena's descriptor only). The arena is locked
(``lockf``) while a server uses it, so a second server started on the same name refuses to
start instead of allocating the same segments; POSIX locks belong to the process, so clients
holding the descriptor never keep the lock alive. Pages are touched at start (``prefault``):
first touches cost about 10x a warm copy on these machines and must not land on the hot path.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import mmap
import os
import uuid
from array import array
from collections.abc import Container, Iterator
from dataclasses import dataclass, field

import numpy as np

from gcache.config import SHM_NAME_RULE, SHM_NAME_TEXT
from gcache.errors import ConfigError
from gcache.eviction import FREE, NEVER_WRITTEN, Candidate, is_young
from gcache.record_layout import SPAN_HEADER_BYTES, span_segments
from gcache.server.arena_file import check_room, load_or_create_secret
from gcache.server.huge_pages import advise_huge_pages
from gcache.server.span_header import write_span_header

log = logging.getLogger(__name__)
ARENA_DIR = "/dev/shm"
PAGE = 4096


@dataclass(slots=True)
class Segment:
    index: int
    seq: int = -1                 # -1 free; otherwise the age of the span this segment heads
    fill: int = 0                 # bytes used (heads only)
    pins: int = 0                 # leases and writes in flight (heads only)
    kept: int = 0                 # kept values committed here and current, or being written
    span: int = 1                 # segments in this span (heads only)
    head: int = -1                # index of the span's head; -1 when free
    # the index's hashes of the keys committed here (heads only), so that freeing the span
    # finds their index slots without a key object per record or a scan of the whole index
    hashes: array[int] = field(default_factory=lambda: array("Q"))
    clean: bool = False           # its live records are safe elsewhere (demoted or re-appended)
    # ``Arena.written`` just after the last value a client committed here (heads only)
    fresh_mark: int = NEVER_WRITTEN
    # value bytes here that can no longer hit, as the tier's last sweep counted them (heads of
    # one-segment spans only)
    unreachable: int = 0
    owner: int = 0                # whose values it holds (heads only): a tenant id, 0 admin


class Arena:
    """Shared-memory segments, their spans and claims."""

    def __init__(self, *, name: str, size_bytes: int, segment_size: int, prefault: bool,
                 directory: str = ARENA_DIR) -> None:
        count = size_bytes // segment_size
        if count < 2:
            raise ConfigError("memory", size_bytes, "must hold at least two segments")
        if not SHM_NAME_RULE.match(name):
            raise ConfigError("shm_name", name, SHM_NAME_TEXT)
        self.name = name
        if not os.path.isdir(directory):
            raise ConfigError("arena_dir", directory, "is not a directory (a tmpfs such as "
                              "/dev/shm, or one mounted with huge pages: docs/rdma.md)")
        self.path = os.path.join(directory, name)
        self.segment_size = segment_size
        self.size_bytes = count * segment_size
        self.fd = self._open_locked(name, size_bytes)   # kept open: clients get a copy
        self.arena_id = uuid.uuid4().hex  # tells clients a restarted server's arena is new
        self.view = memoryview(self._mmap)
        advise_huge_pages(self._mmap)      # before the first touch places any page
        if prefault:
            self._prefault()
        self.segments = [Segment(i) for i in range(count)]
        self.free_segments = count
        self._open: dict[int, Segment] = {}        # owner -> its open segment
        self.held: collections.Counter[int] = collections.Counter()   # owner -> span bytes
        self._next_seq = 0                # span ages
        self._next_record_seq = 1         # record sequence numbers (see the module docstring)
        self.written = 0                  # bytes of values clients committed, copies not counted
        # heads the tier's last sweep found holding values that can no longer hit
        self.counted_spans: list[int] = []

    def _open_locked(self, name: str, size_bytes: int) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ConfigError("shm_name", name, f"cannot create {self.path}: {exc}") from exc
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise ConfigError("shm_name", name, f"{self.path} is in use by another running "
                              "server; give each server its own --shm-name") from exc
        try:
            check_room(fd, self.path, self.size_bytes)
            os.fchmod(fd, 0o600)
            self.attached = os.fstat(fd).st_size == self.size_bytes   # a previous life's arena
            # a key file means a format 3 or later server has used this arena: format 2 spans
            # left in it are stale, never migrated (``recovery``)
            self.secret, self.had_secret = load_or_create_secret(self.path,
                                                                  attached=self.attached)
        except ConfigError:
            os.close(fd)
            raise
        except OSError as exc:
            os.close(fd)
            raise ConfigError("shm_name", name, f"cannot use {self.path}: {exc}") from exc
        try:
            if not self.attached:
                os.ftruncate(fd, 0)                  # another size: start empty
            os.ftruncate(fd, self.size_bytes)
            self._mmap = mmap.mmap(fd, self.size_bytes, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            raise ConfigError("memory", size_bytes, f"cannot map {self.path}: {exc}") from exc
        return fd

    @property
    def address(self) -> int:
        """Where the mapping starts in this process (what NIXL registers)."""
        pages = np.frombuffer(self._mmap, dtype=np.uint8)
        try:
            return pages.ctypes.data
        finally:
            del pages                     # no export left behind: close() must unmap

    def _prefault(self) -> None:
        populate = getattr(mmap, "MADV_POPULATE_WRITE", None)
        if populate is not None:
            try:
                self._mmap.madvise(populate)
                return
            except OSError:
                pass       # kernels before 5.14: touch one byte per page instead
        pages = np.frombuffer(self._mmap, dtype=np.uint8)[::PAGE]
        if self.attached:
            int(pages.sum())           # read-touch: the arena holds a previous life's data
        else:
            pages[:] = 0

    # ---- claims -----------------------------------------------------------------------------

    def allocate_open(self, n_bytes: int, owner: int = 0) -> tuple[Segment, int] | None:
        """``n_bytes`` from ``owner``'s open segment, or None when it has no room."""
        head = self.fits_open(n_bytes, owner)
        if head is None:
            return None
        offset = head.index * self.segment_size + head.fill
        head.fill += n_bytes
        self.held[owner] += n_bytes
        return head, offset

    def fits_open(self, n_bytes: int, owner: int = 0) -> Segment | None:
        """``owner``'s open segment when ``n_bytes`` fit in it."""
        head = self._open.get(owner)
        return head if head is not None and head.fill + n_bytes <= self.segment_size else None

    def span_of(self, n_bytes: int) -> int:
        """Segments a claim for ``n_bytes`` takes."""
        return span_segments(n_bytes, self.segment_size)

    def windows(self, span: int, *, ignore_pins: bool = False, clean_only: bool = False,
                count_unreachable: bool = False, claimant: int = 0,
                over_quota: Container[int] | None = None) -> Iterator[Candidate]:
        """Every window of ``span`` consecutive segments that could be reclaimed, as the
        eviction rule's candidates, in order: none touches a span pinned (unless
        ``ignore_pins``), holding kept values or, with ``clean_only``, not clean. With
        ``count_unreachable`` a one-segment window carries its span's unreachable bytes.
        ``claimant``: the owner the room is for; ``over_quota``: the owners over their quota
        (None: no quotas, no span is protected)."""
        segments = self.segments
        for start in range(len(segments) - span + 1):
            age, young, mark, movable = FREE, False, NEVER_WRITTEN, True
            own, protected = True, False
            for index in range(start, start + span):
                seg = segments[index]
                if seg.head < 0:
                    continue
                head = segments[seg.head]
                if ((head.pins > 0 and not ignore_pins) or head.kept > 0
                        or (clean_only and not head.clean)):
                    movable = False
                    break
                age, young = max(age, head.seq), young or self.is_young(head)
                mark = max(mark, head.fresh_mark)
                if head.owner != claimant:
                    own = False
                    protected = protected or (over_quota is not None
                                              and head.owner not in over_quota)
            if not movable:
                continue
            unreachable = 0
            if count_unreachable and span == 1 and age != FREE:
                head = segments[segments[start].head]
                unreachable = head.unreachable if head.span == 1 else 0
            yield Candidate(start, age, mark, young, unreachable, self.segment_size, protected,
                            own)

    def heads_in(self, start: int, span: int) -> list[Segment]:
        """The heads of the spans a window touches, in order."""
        heads = sorted({self.segments[i].head for i in range(start, start + span)} - {-1})
        return [self.segments[h] for h in heads]

    def free(self, head: Segment) -> None:
        """Give a span's segments back (its owner has forgotten its records)."""
        if self.is_open(head):
            del self._open[head.owner]
        self.held[head.owner] -= self.held_by(head)
        if self.held[head.owner] <= 0:
            del self.held[head.owner]
        head.owner = 0
        self.free_segments += head.span
        for index in range(head.index, head.index + head.span):
            seg = self.segments[index]
            seg.head, seg.seq, seg.fill, seg.span, seg.pins, seg.kept = -1, -1, 0, 1, 0, 0
            seg.unreachable = 0
        head.hashes = array("Q")

    def claim(self, start: int, n_bytes: int, owner: int = 0) -> tuple[Segment, int]:
        """Claim the free window at ``start`` for ``owner``'s first record of ``n_bytes``;
        returns the span's head and the record's offset. A one-segment span becomes the
        owner's open segment."""
        span = self.span_of(n_bytes)
        self._open.pop(owner, None)
        head = self.segments[start]
        head.owner = owner
        head.seq, head.span, head.pins, head.clean = self._next_seq, span, 0, False
        head.kept = head.unreachable = 0
        head.fill, head.fresh_mark = SPAN_HEADER_BYTES + n_bytes, NEVER_WRITTEN
        self._next_seq += 1
        self.free_segments -= span
        for index in range(start, start + span):
            self.segments[index].head = start
        # The claim takes a sequence number of its own: every record written here from now on
        # is newer than it, every leftover of the span's previous use older.
        write_span_header(self.view, start * self.segment_size, self.secret, span=span,
                          claim_seq=self.next_record_seq(), age=head.seq)
        if span == 1:
            self._open[owner] = head
        self.held[owner] += self.held_by(head)
        return head, start * self.segment_size + SPAN_HEADER_BYTES

    def seal_open(self, owner: int = 0) -> None:
        """Stop appending to ``owner``'s open segment: its next record claims a new span."""
        self._open.pop(owner, None)

    def is_open(self, head: Segment) -> bool:
        return self._open.get(head.owner) is head

    def held_by(self, head: Segment) -> int:
        """The bytes a span holds of its owner's quota: its fill, or all of a larger span."""
        return head.span * self.segment_size if head.span > 1 else head.fill

    def set_owner(self, head: Segment, owner: int) -> None:
        """A recovered span's owner (recovery tells it from a key of the span's records)."""
        self.held[head.owner] -= self.held_by(head)
        if self.held[head.owner] <= 0:
            del self.held[head.owner]
        head.owner = owner
        self.held[owner] += self.held_by(head)

    def is_young(self, head: Segment) -> bool:
        """Whether a client committed a value in this span within the last quarter arena of
        client commits (``gcache.eviction.is_young``)."""
        return is_young(head.fresh_mark, self.written, self.size_bytes)

    def mark_committed(self, head: Segment, n_bytes: int) -> None:
        """A client's value of ``n_bytes`` in ``head`` became visible just now: the span is
        young from here. Only commits count, never claims nor copies: a write held up between
        ALLOC and COMMIT is young from its COMMIT, and allocations never committed age
        nothing."""
        self.written += n_bytes
        head.fresh_mark = self.written

    def next_record_seq(self) -> int:
        seq = self._next_record_seq
        self._next_record_seq += 1
        return seq

    def restore(self, heads: list[tuple[int, int, int, int, array[int]]],
                max_record_seq: int) -> None:
        """Adopt spans found by recovery: (start, span, age, fill, hashes) each; none is
        open."""
        for start, span, age, fill, hashes in heads:
            head = self.segments[start]
            head.seq, head.span, head.fill, head.pins, head.hashes = age, span, fill, 0, hashes
            head.owner = 0
            self.held[0] += self.held_by(head)
            self.free_segments -= span
            for index in range(start, start + span):
                self.segments[index].head = start
            self._next_seq = max(self._next_seq, age + 1)
        self._next_record_seq = max(self._next_record_seq, max_record_seq + 1)

    # ---- behind a cold tier ------------------------------------------------------------------

    def oldest_dirty(self) -> Segment | None:
        """The oldest unpinned span head not yet clean and holding no kept value; the open
        segment is sealed when it is the only one left, so a demoter can always progress."""
        heads = [s for s in self.segments
                 if s.head == s.index and not s.clean and s.pins == 0 and s.kept == 0]
        sealed = [s for s in heads if not self.is_open(s)]
        if not sealed and heads:
            self._open.clear()
            sealed = heads
        return min(sealed, key=lambda s: s.seq, default=None)

    def has_dirty_unpinned(self) -> bool:
        return any(s.head == s.index and not s.clean and s.pins == 0 and s.kept == 0
                   for s in self.segments)

    def headroom_segments(self) -> int:
        """Segments a claim could take now without waiting: free ones and the unpinned members
        of clean spans."""
        count = 0
        for seg in self.segments:
            head = self.segments[seg.head] if seg.head >= 0 else None
            count += head is None or (head.clean and head.pins == 0 and not self.is_open(head))
        return count

    # ---- lookups ----------------------------------------------------------------------------

    def segment_of(self, offset: int) -> Segment:
        """The head of the span holding ``offset``."""
        return self.segments[self.segments[offset // self.segment_size].head]

    def span_bytes(self, head: Segment) -> tuple[int, int]:
        """The arena offsets a span covers, [start, end)."""
        start = head.index * self.segment_size
        return start, start + head.span * self.segment_size

    @property
    def used_bytes(self) -> int:
        return sum(s.span * self.segment_size if s.span > 1 else s.fill
                   for s in self.segments if s.head == s.index)

    def pinned_spans(self) -> tuple[int, int]:
        """(spans pinned by leases or writes, spans holding kept values)."""
        heads = [s for s in self.segments if s.head == s.index]
        return sum(s.pins > 0 for s in heads), sum(s.kept > 0 for s in heads)

    def close(self, *, unlink: bool) -> None:
        """Unmap and close (once: a descriptor number closed twice may be someone else's)."""
        if self.fd < 0:
            return
        try:
            self.view.release()
            self._mmap.close()
        except BufferError:
            pass           # a handler thread still holds a slice; the process is exiting anyway
        os.close(self.fd)
        self.fd = -1
        if unlink:
            for path in (self.path, self.path + ".key"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
