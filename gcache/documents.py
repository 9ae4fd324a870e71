"""Small JSON documents GCache stores as values (key schemes, file manifests): one reader that
checks the format tag, so every kind refuses a foreign or damaged value the same way."""

from __future__ import annotations

import json
from typing import Any

from gcache.errors import InvalidRequest


def encode_document(fmt: str, fields: dict[str, Any]) -> bytes:
    return json.dumps({"format": fmt, **fields}, sort_keys=True).encode()


def decode_document(raw: bytes, fmt: str, what: str) -> dict[str, Any]:
    """The fields of a document of format ``fmt``. Raises ``InvalidRequest`` naming ``what``
    for a value that is not JSON, not an object, or of another format."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest(f"not a {what}: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest(f"not a {what}: a JSON {type(doc).__name__}")
    if doc.get("format") != fmt:
        raise InvalidRequest(f"a {what} of format {doc.get('format')!r}; this reader knows "
                             f"{fmt!r}")
    return doc
