"""MutableKeys on its own: what it hides when, what it deletes, what it keeps across a restart."""

from __future__ import annotations

import struct

from gcache.server.mutable_keys import MutableKeys
from tests.helpers import wait_until


def _open(tmp_path, deleted: list[bytes]) -> MutableKeys:
    return MutableKeys(str(tmp_path / "s.mutable"), deleted.append)


def test_without_masters_nothing_is_kept_or_hidden(tmp_path):
    keys = MutableKeys(None, lambda key: None)
    keys.written(b"k", content_addressed=False)
    keys.out_of_map("dead")
    assert not keys.hidden(b"k") and keys.count() == 0


def test_a_restart_hides_mutable_keys_until_a_master_answers_then_unhides_them(tmp_path):
    deleted: list[bytes] = []
    first = _open(tmp_path, deleted)
    first.in_map(5)
    first.written(b"doc", content_addressed=False)
    first.written(b"page", content_addressed=True)
    first.close()
    again = _open(tmp_path, deleted)
    assert again.hidden(b"doc") and not again.hidden(b"page")
    again.in_map(5)                                  # the map did not move meanwhile
    assert not again.hidden(b"doc") and deleted == []


def test_a_moved_map_deletes_the_hidden_keys_and_forgets_them(tmp_path):
    deleted: list[bytes] = []
    first = _open(tmp_path, deleted)
    first.in_map(5)
    for key in (b"a", b"b"):
        first.written(key, content_addressed=False)
    first.close()
    again = _open(tmp_path, deleted)
    again.in_map(7)
    wait_until(lambda: sorted(deleted) == [b"a", b"b"], 5)
    wait_until(lambda: again.count() == 0, 5)
    again.close()
    assert _open(tmp_path, deleted).count() == 0     # the log was rewritten


def test_out_of_map_hides_at_once_and_a_new_put_is_current(tmp_path):
    deleted: list[bytes] = []
    keys = _open(tmp_path, deleted)
    keys.in_map(1)
    keys.written(b"a", content_addressed=False)
    keys.written(b"b", content_addressed=False)
    keys.out_of_map("dead")
    assert keys.hidden(b"a") and keys.hidden(b"b")
    keys.written(b"a", content_addressed=False)     # put again: the old value goes first
    assert deleted == [b"a"] and not keys.hidden(b"a")
    keys.in_map(3)
    wait_until(lambda: b"b" in deleted, 5)
    assert deleted.count(b"a") == 1 and keys.is_mutable(b"a") and not keys.is_mutable(b"b")


def test_a_log_cut_short_by_a_crash_keeps_its_whole_records(tmp_path):
    deleted: list[bytes] = []
    keys = _open(tmp_path, deleted)
    keys.written(b"whole", content_addressed=False)
    keys.close()
    with open(tmp_path / "s.mutable", "ab") as fh:
        fh.write(struct.pack("<HQ", 9, 0) + b"par")    # 9 key bytes announced, 3 written
    again = _open(tmp_path, deleted)
    assert again.count() == 1 and again.is_mutable(b"whole")


def test_drop_unless_deletes_the_keys_another_server_owns_now(tmp_path):
    deleted: list[bytes] = []
    keys = _open(tmp_path, deleted)
    keys.in_map(1)
    keys.written(b"mine", content_addressed=False, group=7)
    keys.written(b"theirs", content_addressed=False, group=9)
    keys.written(b"page", content_addressed=True)
    seen: list[tuple[bytes, int]] = []

    def owned(key: bytes, group: int) -> bool:
        seen.append((key, group))
        return key == b"mine"

    assert keys.drop_unless(owned) == 1
    assert sorted(seen) == [(b"mine", 7), (b"theirs", 9)] and deleted == [b"theirs"]
    keys.close()
    assert _open(tmp_path, deleted).count() == 1       # the log was rewritten
