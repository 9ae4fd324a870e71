"""The hot tier's memory: one shared-memory file cut into fixed-size segments, used as a log.

Invariants:
- An allocation is a *record* (object header, key, padding, value) placed in one segment, or,
  when it is larger than a segment, in a *span* of consecutive segments that holds it alone.
- Records are appended to the one open segment; when it is full it is sealed and a new one is
  taken. Every segment (span) carries the sequence number of its opening, which is its age.
- Space is made by evicting whole spans: the candidate window of consecutive segments whose
  newest member is oldest, skipping any window that touches a pinned span. For a one-segment
  allocation that is simply "a free segment, else the oldest unpinned one", except that a
  span the tier counted as mostly values that can no longer hit goes first
  (``Segment.unreachable``).
- A pinned span (a lease or a write in flight) is never evicted or reused; nor is a span that
  holds a current pinned value (``Segment.held``: a file's part, put with ``FLAG_PINNED``),
  for as long as it does, within the tier's pin budget.

The file lives in /dev/shm (or ``arena_dir``: a tmpfs mounted with huge pages, ``huge_pages``)
and outlives the process, so a restarted server re-attaches to it
(``recovery`` rebuilds the index). For that the arena is self-describing: every claimed span
starts with a ``SEGMENT`` header (two checked copies) carrying the record sequence number of its
claim, and every record (``RECORD``) carries its own sequence number, which is always larger:
the claim consumes a number of its own. Bytes left over from a span's previous use therefore
have smaller numbers and are never mistaken for records. Every record header carries a check
(BLAKE2b keyed with the arena's secret, of its fields, the key and the state it is meant to
reach), so a flipped bit in a key or a length makes the record unreadable instead of another
key's value, and a header forged inside a stored value never passes; records start at
``ALIGN`` boundaries, so recovery can find the next record past one it cannot read. A value
becomes valid only when its state is flipped to COMMITTED after its checksum was checked; a
delete appends a TOMBSTONE (twice: one flipped byte must not undo a delete). Replacing, moving
or deleting a key marks its old record SUPERSEDED, so a restart never takes an older version
for the current one, even when the current one lives only in the cold tier. Pages are touched
at start (``prefault``): first touches cost about 10x a warm copy on these machines and must not
land on the hot path.

The secret lives beside the arena in ``<name>.key`` (0600), which clients never see (they are
handed the arena's descriptor only). The arena is locked (``lockf``) while a server uses it, so
a second server started on the same name by mistake refuses to start instead of allocating the
same segments. POSIX locks belong to the process, so same-host clients holding the arena's
descriptor never keep the lock alive (but a second descriptor for the file opened and closed in
the server's own process would release it: the server opens it once).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import mmap
import os
import struct
import uuid
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from gcache.config import SHM_NAME_RULE, SHM_NAME_TEXT, format_size
from gcache.errors import ConfigError, NoSpace
from gcache.server.huge_pages import advise_huge_pages

log = logging.getLogger(__name__)
ARENA_DIR = "/dev/shm"

# magic, state, read byte (``READ_BIT``: leased since written; ``PINNED_BIT``: put pinned;
# both outside the check, so marking them rewrites nothing, and a flipped bit there can only
# keep a value in memory or let it go, never change what it reads as; its top six bits the
# length of the parent key, ``PARENT_SHIFT``, which the check covers), key_len, length,
# checksum, seq, group (xxh3_64 of the placement group the key was put with; 0 for none: a
# draining server needs it to find each key's owner), header check (``header_check``). The key
# follows the header, then the parent key (``FLAG_PARENT``: the object this one's use depends
# on), then, aligned, the value. A record without a parent is laid out and checked exactly as
# before parents existed, so arenas written before them are read as they were.

RECORD = struct.Struct("<IBBHQQQQQ")
RECORD_MAGIC = 0x33424F47            # b"GOB3" (b"GOB2" had no header check, b"GOBJ" no group)
_CHECKED = struct.Struct("<BHQQQQ")  # state, key_len, length, checksum, seq, group
SECRET_BYTES = 32                    # the header checks' key, in ``<arena>.key`` (0600)
STATE_PENDING, STATE_COMMITTED, STATE_TOMBSTONE = 1, 2, 3
# A committed record whose key was written again, moved or deleted since: flipped in place (its
# value bytes stay, for readers holding a lease), so at most one record per key is COMMITTED and
# a restart can never take an older version for the current one.
STATE_SUPERSEDED = 4
READ_BIT, PINNED_BIT = 0x01, 0x02
PARENT_SHIFT = 2                     # the read byte's bits from here: the parent key's length
_LENGTH = struct.Struct("<Q")        # a record's length (at 8) or sequence number (at 24)
SEGMENT = struct.Struct("<IIQQQ")    # magic, span, claim record seq, age, check
SEGMENT_MAGIC = 0x32475347           # b"GSG2" (b"GSEG" had one copy and no check)
_SEGMENT_CHECKED = struct.Struct("<IQQ")
SEGMENT_HEADER_BYTES = 64
ALIGN = 64
PAGE = 4096


def header_check(secret: bytes, state: int, key: bytes | memoryview, length: int, checksum: int,
                 seq: int, group: int, parent: bytes | memoryview = b"") -> int:
    """A keyed hash (BLAKE2b, 8 bytes) of a record's fields and key, for the state the record is
    meant to reach. Keyed, because recovery looks for records among bytes that earlier values
    left behind: a client that stored a forged header inside a value must not be able to make
    it valid."""
    hasher = hashlib.blake2b(_CHECKED.pack(state, len(key), length, checksum, seq, group),
                             digest_size=8, key=secret, person=b"gcache-record")
    hasher.update(key)
    if parent:                  # its length too: the read byte holding it is not checked else
        hasher.update(bytes((len(parent),)))
        hasher.update(parent)
    return int.from_bytes(hasher.digest(), "little")


def segment_check(secret: bytes, span: int, claim_seq: int, age: int) -> int:
    digest = hashlib.blake2b(_SEGMENT_CHECKED.pack(span, claim_seq, age), digest_size=8,
                             key=secret, person=b"gcache-span").digest()
    return int.from_bytes(digest, "little")


def write_segment_header(view: memoryview, offset: int, secret: bytes, *, span: int,
                         claim_seq: int, age: int) -> None:
    """Two checked copies of a span's header, so one flipped byte cannot lose the span."""
    check = segment_check(secret, span, claim_seq, age)
    for copy in (0, SEGMENT.size):
        SEGMENT.pack_into(view, offset + copy, SEGMENT_MAGIC, span, claim_seq, age, check)


def read_segment_header(view: memoryview, offset: int,
                        secret: bytes) -> tuple[int, int, int] | None:
    """(span, claim seq, age) from the first copy that passes its check, or None."""
    for copy in (0, SEGMENT.size):
        magic, span, claim_seq, age, check = SEGMENT.unpack_from(view, offset + copy)
        if magic == SEGMENT_MAGIC and check == segment_check(secret, span, claim_seq, age):
            return span, claim_seq, age
    return None


def load_or_create_secret(arena_path: str, *, attached: bool) -> bytes:
    """The key of an arena's header checks, kept beside it in ``<arena>.key`` (0600): clients
    map the arena, never this file. A re-attached arena keeps its key; a new one (or one whose
    key is gone, whose records then cannot be trusted) gets a fresh one."""
    path = arena_path + ".key"
    if attached:
        try:
            with open(path, "rb") as fh:
                secret = fh.read()
            if len(secret) == SECRET_BYTES:
                return secret
        except FileNotFoundError:
            pass
        log.warning("arena.key_missing path=%s: the previous records cannot be verified and "
                    "are dropped", path)
    secret = os.urandom(SECRET_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secret)
    finally:
        os.close(fd)
    return secret


def record_size(names_len: int, length: int) -> int:
    """Bytes a record occupies whose key and parent key take ``names_len`` bytes together and
    whose value takes ``length``, the value start aligned to ``ALIGN``."""
    return _align(_align(RECORD.size + names_len) + length)


def value_offset(record_offset: int, names_len: int) -> int:
    """Where the value of a record starts (``names_len``: its key's and parent's bytes)."""
    return record_offset + _align(RECORD.size + names_len)


def parent_len(read_byte: int) -> int:
    return read_byte >> PARENT_SHIFT


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class RecordFields(NamedTuple):     # a tuple: a frozen dataclass took 1.5 us to build
    key: bytes
    length: int
    checksum: int
    seq: int
    group: int
    state: int
    read: bool           # leased since it was written (``mark_read``)
    parent: bytes = b""  # the key this one's use depends on (``FLAG_PARENT``); b"" for none


NEVER_WRITTEN = -(1 << 62)


@dataclass(slots=True)
class Segment:
    index: int
    seq: int = -1                 # -1 free; otherwise the age of the span this segment heads
    fill: int = 0                 # bytes used (heads only)
    pins: int = 0                 # leases and writes in flight (heads only)
    # pinned values (a file's parts) committed here and current (heads only): the span is
    # never evicted nor demoted while any is, however old (``tier`` keeps the count)
    held: int = 0
    span: int = 1                 # segments in this span (heads only)
    head: int = -1                # index of the span's head; -1 when free
    # the index's hashes of the keys committed here (heads only), so that evicting the span
    # finds their index slots without a key object per record or a scan of the whole index
    hashes: array[int] = field(default_factory=lambda: array("Q"))
    clean: bool = False           # its live records are safe elsewhere (demoted or re-appended)
    # ``Arena.written`` just after the last value a client committed here (heads only): the
    # span is young (``Arena.is_young``) until a quarter arena more has been committed
    fresh_mark: int = NEVER_WRITTEN
    # value bytes here that can no longer hit, as the tier's last count found them (heads of
    # one-segment spans only; ``HotTier.sweep_unreachable``): a span mostly made of them is
    # reclaimed before older ones (``_choose_window``)
    unreachable: int = 0


def _check_room(fd: int, path: str, size_bytes: int) -> None:
    """Refuse an arena its tmpfs cannot hold: the mapping would succeed and the first touch of a
    page past the room (the prefault, or a write) would kill the server with SIGBUS, which a
    restart policy turns into a crash loop. Pages the file holds already count as room: an
    attached arena keeps them, another one's are freed when it is emptied."""
    held = os.fstat(fd).st_blocks * 512
    fs = os.fstatvfs(fd)
    free = fs.f_bavail * fs.f_frsize
    if size_bytes - held > free:
        raise ConfigError("memory", size_bytes, f"{os.path.dirname(path)} has "
                          f"{format_size(free)} free for {path}; size it over memory "
                          "(docs/operations.md) or lower memory")


class Arena:
    """Shared-memory segments and their allocation. Not thread-safe: the tier's lock guards it.

    ``on_evict(head_segment)`` is called before a span is reused, so the owner can drop (or, in
    the tiering issue, demote) the records it holds.
    """

    def __init__(self, *, name: str, size_bytes: int, segment_size: int, prefault: bool,
                 on_evict: Callable[[Segment], None], directory: str = ARENA_DIR) -> None:
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
            _check_room(fd, self.path, self.size_bytes)
        except ConfigError:
            os.close(fd)
            raise
        try:
            os.fchmod(fd, 0o600)
            self.attached = os.fstat(fd).st_size == self.size_bytes   # a previous life's arena
            self.secret = load_or_create_secret(self.path, attached=self.attached)
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
        self.fd = fd                      # kept open: same-host clients are handed a copy
        self.arena_id = uuid.uuid4().hex  # tells clients a restarted server's arena is new
        self.view = memoryview(self._mmap)
        advise_huge_pages(self._mmap)      # before the first touch places any page
        if prefault:
            self._prefault()
        self.segments = [Segment(i) for i in range(count)]
        self._open: Segment | None = None
        self._next_seq = 0                # span ages
        self._next_record_seq = 1         # record sequence numbers (see the module docstring)
        self.written = 0                  # bytes of values clients committed, copies not counted
        # claims that evicted a young span (``is_young``) without a cold tier: values
        # acknowledged not long before went, for want of an older span nothing pinned
        self.young_reclaims = 0
        self._on_evict = on_evict
        self.require_clean = False    # with a cold tier, only clean spans may be reused
        # heads the tier's last sweep found holding values that can no longer hit
        # (``Segment.unreachable``): the only spans ``_mostly_unreachable`` looks at
        self.counted_spans: list[int] = []

    @property
    def address(self) -> int:
        """Where the mapping starts in this process (what NIXL registers)."""
        array = np.frombuffer(self._mmap, dtype=np.uint8)
        try:
            return array.ctypes.data
        finally:
            del array                     # no export left behind: close() must unmap

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

    # ---- allocation -------------------------------------------------------------------------

    def allocate(self, n_bytes: int, *, use_reserve: bool = False, fresh: bool = True,
                 young_ok: bool = True) -> tuple[Segment, int]:
        """Reserve ``n_bytes``; returns the head segment and the absolute offset.

        With ``require_clean``, the last reusable segment is a reserve that only a caller
        passing ``use_reserve`` (the demoter, re-appending) may open, so cleaning can always
        make progress. ``fresh``: a client's value, not a copy of one already stored; a copy
        never reclaims a young span (``is_young``), and a fresh value does so only when every
        other candidate is young too, and never without ``young_ok``. Raises NoSpace when every
        window large enough touches a pinned span (or, for a copy or without ``young_ok``, a
        young one).
        """
        if n_bytes > self.size_bytes:
            raise NoSpace(f"{n_bytes} bytes exceed the arena's {self.size_bytes}")
        placed = self.allocate_open(n_bytes)
        if placed is not None:
            return placed
        span = self.span_of(n_bytes)
        if self.require_clean and not use_reserve and self.headroom_segments() <= span:
            raise NoSpace(f"{span} segment(s) needed; the last reusable one is the cleaner's")
        start = self._choose_window(span, spare_young=not (fresh and young_ok))
        if start is None:
            pinned = sum(s.head == s.index and s.pins > 0 for s in self.segments)
            held = sum(s.head == s.index and s.held > 0 for s in self.segments)
            raise NoSpace(f"no {span} unpinned consecutive segment(s) of {self.segment_size} "
                          f"bytes to evict ({pinned} of {len(self.segments)} spans pinned, "
                          f"{held} holding pinned values"
                          f"{'' if fresh and young_ok else '; young ones spared'})")
        self._open = None            # a failed claim keeps the open segment's room for others
        heads = {self.segments[i].head for i in range(start, start + span)} - {-1}
        if not self.require_clean:         # with a cold tier their values are on disk
            self.young_reclaims += any(self.is_young(self.segments[h]) for h in heads)
        for index in sorted(heads):
            self._evict_span(self.segments[index])
        head = self.segments[start]
        head.seq, head.span, head.pins, head.clean = self._next_seq, span, 0, False
        head.held = head.unreachable = 0
        head.fill, head.fresh_mark = SEGMENT_HEADER_BYTES + n_bytes, NEVER_WRITTEN
        self._next_seq += 1
        for index in range(start, start + span):
            self.segments[index].head = start
        # The claim takes a sequence number of its own: every record written here from now on
        # is newer than it, every leftover of the span's previous use older.
        write_segment_header(self.view, start * self.segment_size, self.secret, span=span,
                             claim_seq=self.next_record_seq(), age=head.seq)
        if span == 1:
            self._open = head
        return head, start * self.segment_size + SEGMENT_HEADER_BYTES

    def allocate_open(self, n_bytes: int) -> tuple[Segment, int] | None:
        """``n_bytes`` from the open segment, or None when it has no room: never evicts."""
        head = self._open
        if head is None or head.fill + n_bytes > self.segment_size:
            return None
        offset = head.index * self.segment_size + head.fill
        head.fill += n_bytes
        return head, offset

    def fits_open(self, n_bytes: int) -> Segment | None:
        """The open segment when ``n_bytes`` fit in it (``allocate`` would put them there)."""
        head = self._open
        return head if head is not None and head.fill + n_bytes <= self.segment_size else None

    def is_young(self, head: Segment) -> bool:
        """Whether a client committed a value in this span within the last quarter arena of
        client commits. Second chances re-append read values at the young end, ahead of values
        written before them that nobody has read yet; without this a sweep of copies in a
        small arena could come round to a value acknowledged a moment before."""
        return self.written - head.fresh_mark < self.size_bytes // 4

    def mark_committed(self, head: Segment, n_bytes: int) -> None:
        """A client's value of ``n_bytes`` in ``head`` became visible just now: the span is
        young from here, not from its allocation. A write held up between ALLOC and COMMIT
        while other writers claimed a quarter arena had its span age out meanwhile, and the
        first claim after the commit took it: a value acknowledged 0.3 ms before, gone when
        read back (the fault suite's hostile-peers scenario, about 1 run in 10). Only commits
        count, not claims: peers that allocate and die (that scenario's, 40 MiB/s of ALLOCs
        never committed) aged every span twice as fast as the values really written."""
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
            for index in range(start, start + span):
                self.segments[index].head = start
            self._next_seq = max(self._next_seq, age + 1)
        self._next_record_seq = max(self._next_record_seq, max_record_seq + 1)

    def span_of(self, n_bytes: int) -> int:
        """Segments a claim for ``n_bytes`` takes."""
        return -(-(SEGMENT_HEADER_BYTES + n_bytes) // self.segment_size)

    def pins_hold_older(self, n_bytes: int) -> bool:
        """Whether a window with no young span would be free for ``n_bytes`` but for pins: then
        a wait for a pin to drop may spare the young spans."""
        return self._choose_window(self.span_of(n_bytes), spare_young=True,
                                   ignore_pins=True) is not None

    def _choose_window(self, span: int, *, spare_young: bool = False,
                       ignore_pins: bool = False) -> int | None:
        """Start of the window whose newest occupied member is oldest, among those with no
        young span (``is_young``) if any, else (unless ``spare_young``) the one among all
        whose last client write is oldest (a span claimed early may hold the value committed
        last); free segments age -1."""
        best, best_age = None, None
        young_best, young_mark = None, None
        age: int | None                   # None: a pinned (or unclean) span rules the window out
        for start in range(len(self.segments) - span + 1):
            age, young, mark = -1, False, NEVER_WRITTEN
            for index in range(start, start + span):
                seg = self.segments[index]
                if seg.head < 0:
                    continue
                head = self.segments[seg.head]
                if ((head.pins > 0 and not ignore_pins) or head.held > 0
                        or (self.require_clean and not head.clean)):
                    age = None
                    break
                age, young = max(age, head.seq), young or self.is_young(head)
                mark = max(mark, head.fresh_mark)
            if age is None:
                continue
            if young:
                if young_mark is None or mark < young_mark:
                    young_best, young_mark = start, mark
            elif best_age is None or age < best_age:
                best, best_age = start, age
                if age == -1:
                    break
        if best_age != -1 and span == 1 and not ignore_pins and not self.require_clean:
            broken = self._mostly_unreachable()          # a free segment still goes first
            if broken is not None:
                return broken
        return young_best if best is None and not spare_young else best

    def _mostly_unreachable(self) -> int | None:
        """The one-segment span with the most bytes that can no longer hit, when they are at
        least half of it, and it is neither pinned, holding pinned values, nor young: its
        values that can still hit and were read get their second chance as from any other
        span, and the rest could not have hit anyway. Without it those bytes would wait for
        every older span to go first (objects below a missing page of their prefix go first;
        a sweep's count, so up to ``unreachable_sweep_s`` old)."""
        best, most = None, self.segment_size // 2 - 1
        for index in self.counted_spans:
            seg = self.segments[index]
            if (seg.head == seg.index and seg.span == 1 and seg.unreachable > most
                    and seg.pins == 0 and seg.held == 0 and not self.is_young(seg)):
                best, most = seg.index, seg.unreachable
        return best

    def oldest_dirty(self) -> Segment | None:
        """The oldest unpinned span head not yet clean and holding no pinned value; the open
        segment is sealed when it is the only one left, so a demoter can always make
        progress."""
        heads = [s for s in self.segments
                 if s.head == s.index and not s.clean and s.pins == 0 and s.held == 0]
        sealed = [s for s in heads if s is not self._open]
        if not sealed and heads:
            self._open = None
            sealed = heads
        return min(sealed, key=lambda s: s.seq, default=None)

    def has_dirty_unpinned(self) -> bool:
        return any(s.head == s.index and not s.clean and s.pins == 0 and s.held == 0
                   for s in self.segments)

    def headroom_segments(self) -> int:
        """Segments that an allocation could take now without waiting: free ones and the
        unpinned members of clean spans."""
        count = 0
        for seg in self.segments:
            head = self.segments[seg.head] if seg.head >= 0 else None
            count += head is None or (head.clean and head.pins == 0 and head is not self._open)
        return count

    def _evict_span(self, head: Segment) -> None:
        self._on_evict(head)
        for index in range(head.index, head.index + head.span):
            seg = self.segments[index]
            seg.head, seg.seq, seg.fill, seg.span, seg.pins, seg.held = -1, -1, 0, 1, 0, 0
            seg.unreachable = 0
        head.hashes = array("Q")

    # ---- records ----------------------------------------------------------------------------

    def write_record_header(self, offset: int, *, state: int, key: bytes, length: int,
                            checksum: int, seq: int, group: int = 0,
                            final_state: int | None = None, pinned: bool = False,
                            parent: bytes = b"") -> None:
        """Write a record header, key and parent key (the space is ``record_size`` of both).
        ``final_state`` is the state ``set_record_state`` will flip it to (the header check
        covers that one); default ``state``. ``pinned``: the value is kept in memory against
        eviction (``PINNED_BIT``)."""
        check = header_check(self.secret, state if final_state is None else final_state, key,
                             length, checksum, seq, group, parent)
        read = (PINNED_BIT if pinned else 0) | len(parent) << PARENT_SHIFT
        RECORD.pack_into(self.view, offset, RECORD_MAGIC, state, read,
                         len(key), length, checksum, seq, group, check)
        start = offset + RECORD.size
        self.view[start:start + len(key)] = key
        self.view[start + len(key):start + len(key) + len(parent)] = parent

    def set_record_state(self, offset: int, state: int) -> None:
        self.view[offset + 4] = state

    def mark_read(self, offset: int) -> None:
        """Note in the record's spare byte (outside its header check) that it was leased: a
        record read since it was (re-)appended earns a second chance in memory."""
        self.view[offset + 5] |= READ_BIT

    def is_pinned(self, offset: int) -> bool:
        return bool(self.view[offset + 5] & PINNED_BIT)

    def holds_key(self, offset: int, key: bytes) -> bool:
        """Whether the record at ``offset`` is ``key``'s."""
        view = self.view
        key_len = view[offset + 6] | view[offset + 7] << 8
        return key_len == len(key) and \
            view[offset + RECORD.size:offset + RECORD.size + key_len] == key

    def read_record(self, offset: int) -> RecordFields:
        _, state, read, key_len, length, checksum, seq, group, _ = \
            RECORD.unpack_from(self.view, offset)
        start = offset + RECORD.size
        key = bytes(self.view[start:start + key_len])
        parent = bytes(self.view[start + key_len:start + key_len + parent_len(read)])
        return RecordFields(key, length, checksum, seq, group, state, bool(read & READ_BIT),
                            parent)

    def key_of(self, offset: int) -> bytes:
        """The key of the record at ``offset``."""
        view = self.view
        start = offset + RECORD.size
        return bytes(view[start:start + (view[offset + 6] | view[offset + 7] << 8)])

    def parent_of(self, offset: int) -> bytes:
        """The parent key of the record at ``offset`` (b"" for none)."""
        view = self.view
        n = parent_len(view[offset + 5])
        if not n:
            return b""
        start = offset + RECORD.size + (view[offset + 6] | view[offset + 7] << 8)
        return bytes(view[start:start + n])

    def record_length(self, offset: int) -> int:
        length: int = _LENGTH.unpack_from(self.view, offset + 8)[0]
        return length

    def sum_lengths(self, offsets: list[int]) -> int:
        """The sum of these records' lengths, in one gather (records are ``ALIGN``-aligned,
        so each length is one aligned 8-byte word)."""
        if not offsets:
            return 0
        words = np.frombuffer(self._mmap, dtype="<u8")
        try:
            return int(words[(np.asarray(offsets, dtype=np.int64) + 8) // 8].sum())
        finally:
            del words                 # no export of the mapping left behind: close() unmaps

    def record_seq(self, offset: int) -> int:
        seq: int = _LENGTH.unpack_from(self.view, offset + 24)[0]
        return seq

    def segment_of(self, offset: int) -> Segment:
        return self.segments[self.segments[offset // self.segment_size].head]

    @property
    def used_bytes(self) -> int:
        return sum(s.span * self.segment_size if s.span > 1 else s.fill
                   for s in self.segments if s.head == s.index)

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
