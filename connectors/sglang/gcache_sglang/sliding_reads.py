"""Whether the engine's attention reads a loaded sliding window where SGLang placed it.

A hybrid sliding-window model keeps its sliding layers in a pool of their own (``SWAKVPool``).
A token has a slot in the full-attention pool (``req_to_token``) and, while it is in the
window, one in the sliding pool; ``full_to_swa_index_mapping`` says which
(``swa_memory_pool.py:248``). A linker load makes the two numbers differ: the tree gives the
hit's every page a fresh full slot but only its last window pages a sliding slot
(``components/swa.py:1277-1287``) and maps the one to the other (``:1304-1308``).

SGLang 0.5.23's ``torch_native`` backend (the CPU engine's, on a CPU without AMX) reads a
sliding layer's K and V at the *full* slot numbers, untranslated:
``layers/attention/torch_native_backend.py:139-141`` (extend) and ``:240-242`` (decode) index
``get_key_buffer(layer)``, which for a sliding layer is the sliding pool's buffer
(``swa_memory_pool.py:206-212``), with ``req_to_token``'s row. Its writes are translated
(``swa_out_cache_loc``, ``:52-59``), and ``intel_amx`` translates its reads too
(``intel_amx_backend.py:166-196``), as the GPU backends do. In a fresh engine both
allocators hand out the same numbers in step, so computing reads the right rows by
coincidence; after a load the sliding layers read rows that hold other tokens' KV. Measured
(tiny Gemma 4, window 32, a 6-page load): the first computed token's window, positions 65-95,
was read from sliding rows 97-127 while the loaded window, byte-equal to what the computing
engine had offloaded, sat in rows 33-63; the greedy tokens differed from the first. With the
reads translated the same load answered Hugging Face's tokens exactly.

So on such a backend the linker serves no sliding-window loads (a lookup misses and the model
computes its prefix; its nodes are still stored). The backend is SGLang's resolved one (its
runtime context, published in the scheduler), not the raw ``--attention-backend`` (on a CPU
without AMX SGLang turns ``intel_amx`` into ``torch_native`` after parsing).
"""

from __future__ import annotations

from collections.abc import Iterable

# SGLang 0.5.23 attention backends that read a sliding layer at full-pool slot numbers.
MISREADING = frozenset({"torch_native"})


def attention_backends(server_args: object) -> tuple[str, ...]:
    """The engine's (prefill, decode) attention backends: SGLang's resolved pair where its
    runtime context is published, else the server args' own fields; () when neither names one."""
    try:
        from sglang.srt.runtime_context import attention_backends as resolved
        pair = tuple(resolved())
    except Exception:                  # no published context: a linker built outside an engine
        pair = ()
    if not any(pair):
        base = getattr(server_args, "attention_backend", None)
        pair = (getattr(server_args, "prefill_attention_backend", None) or base,
                getattr(server_args, "decode_attention_backend", None) or base)
    return tuple(str(name) for name in pair if name)


def refusal(server_args: object, backends: Iterable[str] = MISREADING) -> str | None:
    """Why a sliding-window load must not be served on this engine: which of its attention
    backends, among ``backends``, would read a loaded window from the wrong slots; None when
    none would (the load is served)."""
    known = set(backends)
    found = sorted({name for name in attention_backends(server_args) if name in known})
    if not found:
        return None
    return (f"SGLang's {'/'.join(found)} attention reads sliding layers at full-pool slot "
            "numbers (gcache_sglang.sliding_reads); the model computes its prefixes, which are "
            "still stored")
