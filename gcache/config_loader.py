"""Loading a process's configuration: the one loader that fills a config dataclass.

Precedence, lowest to highest: field defaults < TOML file section < ``GCACHE_<SECTION>_<KEY>``
environment variables < command-line flags (``GCACHE_TOKEN`` sets the cluster token of any
process, below its own ``GCACHE_<SECTION>_TOKEN``). Unknown keys are errors, never ignored, so a
typo in a config file cannot silently fall back to a default. Only ``load_config`` reads
``os.environ``; the dataclasses and their rules are ``gcache.config``'s.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from gcache.config import parse_size
from gcache.errors import ConfigError

if TYPE_CHECKING:
    import argparse

    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


def _coerce(cls: type, name: str, raw: Any) -> Any:
    hint = typing.get_type_hints(cls)[name]
    if hint is int:
        return parse_size(raw, key=name) if not isinstance(raw, float) else int(raw)
    if hint is float:
        try:
            return float(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(name, raw, "must be a number") from exc
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(name, raw, "must be true or false")
    if hint == tuple[str, ...]:
        items = raw.split(",") if isinstance(raw, str) else list(raw)
        return tuple(str(item).strip() for item in items if str(item).strip())
    if raw is None:
        return None
    return str(raw)


def load_config(cls: type[C], section: str, *, path: str | None = None,
                env: Mapping[str, str] | None = None,
                flags: Mapping[str, Any] | None = None) -> C:
    """Build ``cls`` from defaults < TOML ``[section]`` < ``GCACHE_<SECTION>_*`` < ``flags``.

    ``flags`` holds only the flags the user gave (None values are ignored). Raises ConfigError
    for an unknown key, a value of the wrong form, or a value that breaks a field's rule.
    """
    known = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                document = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError("config", path, f"must be a readable TOML file ({exc})") from exc
        for name, raw in document.get(section, {}).items():
            if name not in known:
                raise ConfigError(f"[{section}].{name}", raw,
                                  f"unknown key; known: {sorted(known)}")
            values[name] = _coerce(cls, name, raw)
    prefix = f"GCACHE_{section.upper()}_"
    environment = os.environ if env is None else env
    if "token" in known and "GCACHE_TOKEN" in environment:
        values["token"] = environment["GCACHE_TOKEN"]      # one token for every daemon
    for var, raw in environment.items():
        if var.startswith(prefix):
            name = var[len(prefix):].lower()
            if name not in known:
                raise ConfigError(var, raw, f"unknown key; known: {sorted(known)}")
            values[name] = _coerce(cls, name, raw)
    for name, raw in (flags or {}).items():
        if raw is None:
            continue
        if name not in known:
            raise ConfigError(name, raw, f"unknown key; known: {sorted(known)}")
        values[name] = _coerce(cls, name, raw)
    if "token_file" in known:
        _read_token_file(values, environment)
    return cls(**values)


CREDENTIAL = "gcache-token"     # systemd ``LoadCredential=gcache-token:PATH`` (deploy/systemd)


def _read_token_file(values: dict[str, Any], environment: Mapping[str, str]) -> None:
    """Put the token of ``token_file`` (or, when neither is set, of systemd's credential
    ``gcache-token``) into ``values``, so it never has to sit in a command line or the unit's
    environment. A file and a token from another layer is ambiguous, so refused."""
    path = values.get("token_file") or ""
    credentials = environment.get("CREDENTIALS_DIRECTORY", "")
    if not path and values.get("token") is None and credentials:
        candidate = os.path.join(credentials, CREDENTIAL)
        path = candidate if os.path.exists(candidate) else ""
    if not path:
        return
    if values.get("token") is not None:
        raise ConfigError("token_file", path, "give the token or a token file, not both "
                          "(GCACHE_TOKEN, --token or a config's token is set too)")
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise ConfigError("token_file", path, f"must be a readable file ({exc.strerror})") from None
    if not token:
        raise ConfigError("token_file", path, "is empty")
    values["token"], values["token_file"] = token, path


def config_from_args(cls: type[C], section: str, args: argparse.Namespace) -> C:
    """``load_config`` for a daemon's parsed command line: every flag except ``--config`` and
    ``--log-level`` is a field; ``--config`` names the TOML file."""
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "log_level")}
    return load_config(cls, section, path=args.config, flags=flags)


def redacted(config: DataclassInstance) -> dict[str, Any]:
    """The config as a dict with secrets replaced, for the one start-up log line."""
    out = dataclasses.asdict(config)
    if out.get("token"):
        out["token"] = "***"
    return out
