"""``ModelLayout``: where a model's KV lives, read from its Hugging Face style ``config.json``.

Owns the facts every other ``gcache.kv`` module computes with: which layers are full attention
and which are sliding window (SWA), the window ``W``, the page size ``P``, and the KV geometry of
each layer *type* — sliding and full layers can differ (MiMo-V2's sliding layers carry twice the
KV heads of its full ones, and K and V head dims differ), so bytes per token are per type.

Invariants: every layer is exactly one of ``full_layers`` / ``swa_layers``; a layout with SWA
layers has a window; the geometry is the one tensor-parallel rank holds (KV heads are split over
``tp_size`` ranks, or replicated when there are fewer heads than ranks, as the engines do).

The layer map is read, never inferred from a period: MiMo spells it ``hybrid_layer_pattern``
(0 = full, 1 = sliding), gpt-oss and Gemma 3 spell it ``layer_types``, older Gemma 3 configs give
``sliding_window_pattern`` (every n-th layer global), and Mistral-style configs apply one
``sliding_window`` to every layer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from gcache.errors import ConfigError

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1}
SHIPPED_CONFIGS = ("mimo-v2.5", "mimo-v2.5-pro", "gpt-oss-20b", "gemma-3-1b", "llama-3.2-1b")


@dataclass(frozen=True, slots=True)
class LayerGeometry:
    """KV shape of one layer type on one tensor-parallel rank."""

    kv_heads: int          # KV heads this rank holds
    k_head_dim: int        # elements per head in K
    v_head_dim: int        # elements per head in V (0 for MLA, whose latent is all in "K")
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return self.kv_heads * (self.k_head_dim + self.v_head_dim) * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class ModelLayout:
    """A model's KV layout as one tensor-parallel rank sees it. Build with ``from_config``."""

    model: str                         # a name for key namespacing, e.g. "mimo-v2.5-pro"
    num_layers: int
    swa_layers: tuple[int, ...]        # sorted layer indices that use a sliding window
    window: int                        # W in tokens; 0 when there are no SWA layers
    full: LayerGeometry                # geometry of a full-attention layer
    swa: LayerGeometry                 # geometry of a sliding layer (== full when not distinct)
    page_size: int = 64                # P: tokens per page, the engine's block size
    tp_rank: int = 0
    tp_size: int = 1
    full_layers: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        _require(self.num_layers >= 1, "num_layers", self.num_layers, "must be at least 1")
        _require(self.page_size >= 1, "page_size", self.page_size, "must be at least 1")
        _require(0 <= self.tp_rank < self.tp_size, "tp_rank", self.tp_rank,
                 f"must be in [0, tp_size={self.tp_size})")
        bad = [i for i in self.swa_layers if not 0 <= i < self.num_layers]
        _require(not bad, "swa_layers", bad, f"must index layers 0..{self.num_layers - 1}")
        _require(list(self.swa_layers) == sorted(set(self.swa_layers)), "swa_layers",
                 self.swa_layers, "must be sorted and unique")
        _require(not self.swa_layers or self.window >= 1, "window", self.window,
                 "must be at least 1 when there are sliding layers")
        swa = set(self.swa_layers)
        object.__setattr__(self, "full_layers",
                           tuple(i for i in range(self.num_layers) if i not in swa))
        if not self.swa_layers:
            object.__setattr__(self, "window", 0)

    # ---- derived sizes --------------------------------------------------------------------------

    def is_swa(self, layer: int) -> bool:
        return layer in self.swa_layers

    def layer_bytes_per_token(self, layer: int) -> int:
        return (self.swa if self.is_swa(layer) else self.full).bytes_per_token

    def tail_tokens(self, boundary_pages: int) -> int:
        """Tokens of SWA KV needed to resume after ``boundary_pages`` pages: the last W, or the
        whole prefix when it is shorter than the window."""
        return min(self.window, boundary_pages * self.page_size)

    def full_page_bytes(self) -> int:
        """Bytes of one page over all full-attention layers."""
        return len(self.full_layers) * self.full.bytes_per_token * self.page_size

    def tail_bytes(self, boundary_pages: int) -> int:
        """Bytes of one window tail over all SWA layers."""
        return len(self.swa_layers) * self.swa.bytes_per_token * self.tail_tokens(boundary_pages)

    def all_layers_page_bytes(self) -> int:
        """Bytes of one page over every layer: what full-layer storage keeps per page."""
        return (len(self.full_layers) * self.full.bytes_per_token
                + len(self.swa_layers) * self.swa.bytes_per_token) * self.page_size

    def fingerprint(self) -> str:
        """Everything that changes the bytes of a page; mixed into every page key."""
        def g(x: LayerGeometry) -> str:
            return f"{x.kv_heads}x({x.k_head_dim}+{x.v_head_dim})x{x.dtype_bytes}"

        swa = ",".join(map(str, self.swa_layers))
        return (f"{self.model}|L{self.num_layers}|swa[{swa}]|W{self.window}|P{self.page_size}"
                f"|full:{g(self.full)}|swa:{g(self.swa)}|tp{self.tp_rank}/{self.tp_size}")

    def scaled(self, factor: int) -> ModelLayout:
        """The same layout with every layer's bytes per token divided by ``factor``: the shape of
        a workload at a size a test cluster can hold. Ratios between layer types are kept, so the
        factor must divide both types' bytes per token exactly."""
        for kind, g in (("full", self.full), ("swa", self.swa)):
            _require(factor >= 1 and g.bytes_per_token % factor == 0, "scale", factor,
                     f"must divide the {kind} layers' {g.bytes_per_token} bytes per token")

        def shrink(g: LayerGeometry) -> LayerGeometry:
            return LayerGeometry(1, g.bytes_per_token // factor, 0, 1)

        return ModelLayout(model=f"{self.model}/scaled{factor}", num_layers=self.num_layers,
                           swa_layers=self.swa_layers, window=self.window,
                           full=shrink(self.full), swa=shrink(self.swa),
                           page_size=self.page_size, tp_rank=self.tp_rank, tp_size=self.tp_size)

    # ---- construction ---------------------------------------------------------------------------

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | os.PathLike[str], *,
                    page_size: int = 64, tp_rank: int = 0, tp_size: int = 1,
                    model: str | None = None) -> ModelLayout:
        """Read a layout from a ``config.json`` (a mapping, a path, or a shipped config's name:
        one of ``SHIPPED_CONFIGS``). Raises ``ConfigError`` naming a missing or bad field."""
        name, cfg = _load(config)
        cfg = dict(cfg.get("text_config") or {}, **{k: v for k, v in cfg.items()
                                                   if k != "text_config"})
        num_layers = _int(cfg, "num_hidden_layers")
        swa_layers = _swa_layers(cfg, num_layers)
        window = _window(cfg) if swa_layers else 0
        dtype_bytes = _dtype_bytes(cfg)
        full = _geometry(cfg, "", dtype_bytes, tp_size)
        swa = _geometry(cfg, "swa_", dtype_bytes, tp_size) if "swa_num_key_value_heads" in cfg \
            else full
        return cls(model=model or cfg.get("_name_or_path") or name, num_layers=num_layers,
                   swa_layers=tuple(swa_layers), window=window, full=full, swa=swa,
                   page_size=page_size, tp_rank=tp_rank, tp_size=tp_size)


def _load(config: Mapping[str, Any] | str | os.PathLike[str]) -> tuple[str, Mapping[str, Any]]:
    if isinstance(config, Mapping):
        return str(config.get("model_type", "model")), config
    path = os.fspath(config)
    if path in SHIPPED_CONFIGS:
        configs = resources.files("gcache.kv").joinpath("model_configs")
        text = configs.joinpath(f"{path}.json").read_text()
        return path, json.loads(text)
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise ConfigError("model", path, "is neither a file nor one of the shipped configs "
                          f"{', '.join(SHIPPED_CONFIGS)}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError("model", path, f"cannot be read as JSON: {exc}") from exc
    base = os.path.basename(os.path.dirname(os.path.abspath(path))) \
        if os.path.basename(path) == "config.json" else os.path.splitext(os.path.basename(path))[0]
    return base, cfg


def _swa_layers(cfg: Mapping[str, Any], num_layers: int) -> list[int]:
    if "hybrid_layer_pattern" in cfg:
        pattern = _layer_list(cfg, "hybrid_layer_pattern", num_layers)
        bad = [v for v in pattern if v not in (0, 1)]
        _require(not bad, "hybrid_layer_pattern", bad, "entries must be 0 (full) or 1 (sliding)")
        return [i for i, v in enumerate(pattern) if v == 1]
    if "layer_types" in cfg:
        types = _layer_list(cfg, "layer_types", num_layers)
        known = {"sliding_attention", "full_attention"}
        bad = sorted({t for t in types if t not in known})
        _require(not bad, "layer_types", bad, f"entries must be one of {sorted(known)}")
        return [i for i, t in enumerate(types) if t == "sliding_attention"]
    if cfg.get("sliding_window_pattern"):
        period = _int(cfg, "sliding_window_pattern")   # every period-th layer is global
        return [i for i in range(num_layers) if (i + 1) % period != 0]
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        return list(range(num_layers))                  # Mistral style: one window everywhere
    return []


def _layer_list(cfg: Mapping[str, Any], key: str, num_layers: int) -> list[Any]:
    values = cfg[key]
    _require(isinstance(values, list) and len(values) == num_layers, key,
             f"{len(values) if isinstance(values, list) else type(values).__name__}",
             f"must list one entry per layer (num_hidden_layers={num_layers})")
    entries: list[Any] = values      # JSON entries; a list, or _require raised
    return entries


def _window(cfg: Mapping[str, Any]) -> int:
    for key in ("sliding_window", "sliding_window_size"):
        if cfg.get(key):
            return _int(cfg, key)
    raise ConfigError("sliding_window", None, "is required when the config has sliding layers")


def _dtype_bytes(cfg: Mapping[str, Any]) -> int:
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise ConfigError("torch_dtype", dtype, f"must be one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def _geometry(cfg: Mapping[str, Any], prefix: str, dtype_bytes: int, tp_size: int) -> LayerGeometry:
    if not prefix and "kv_lora_rank" in cfg:       # MLA: one latent "head", replicated on ranks
        return LayerGeometry(1, _int(cfg, "kv_lora_rank") + _int(cfg, "qk_rope_head_dim"), 0,
                             dtype_bytes)
    heads_key = f"{prefix}num_attention_heads"
    kv_key = f"{prefix}num_key_value_heads"
    kv_heads = _int(cfg, kv_key) if kv_key in cfg else _int(cfg, heads_key)
    if f"{prefix}head_dim" in cfg:
        k_dim = _int(cfg, f"{prefix}head_dim")
    else:
        k_dim = _int(cfg, "hidden_size") // _int(cfg, heads_key)
    v_dim = _int(cfg, f"{prefix}v_head_dim") if f"{prefix}v_head_dim" in cfg else k_dim
    return LayerGeometry(max(1, kv_heads // tp_size), k_dim, v_dim, dtype_bytes)


def _int(cfg: Mapping[str, Any], key: str) -> int:
    if key not in cfg:
        raise ConfigError(key, None, "is required in the model config")
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "must be a positive integer")
    return value


def _require(ok: bool, key: str, value: object, rule: str) -> None:
    if not ok:
        raise ConfigError(key, value, rule)
