"""A request's prompt tokens, as the engine will see them.

The router must hash exactly the tokens the engine will prefill, or every lookup misses. vLLM's
rules (its OpenAI server): ``/v1/completions`` tokenizes a text prompt with special tokens
(``add_special_tokens``, default true) and takes a list of token ids as they are;
``/v1/chat/completions`` renders the messages with the tokenizer's chat template
(``add_generation_prompt`` default true, ``continue_final_message``, ``chat_template_kwargs``)
and tokenizes the text without special tokens (``add_special_tokens`` default false). The
tokenizer is the model's own (``transformers.AutoTokenizer``), loaded once per model.

A request that batches several prompts is routed by its first: one engine serves the whole
request.

Media (image, audio, video parts of chat messages) cannot be followed here: the engine replaces
each with placeholder tokens that its KV keys hash as the media item (``gcache.mm``), which
takes the engine's processor to compute. ``lookup_tokens`` therefore stops where a chat
request's first media part begins: the router looks up hits up to there, never taking a
text-only prompt's KV for an image prompt's (``prompt_tokens``, the text's tokens, still sizes
the request).
"""

from __future__ import annotations

import threading
from typing import Any

from gcache.errors import ConfigError, InvalidRequest, MissingDependency


class Tokenizers:
    """The tokenizer of each served model, loaded on first use (thread-safe)."""

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = dict(paths)
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __contains__(self, model: object) -> bool:
        return model in self.paths

    def get(self, model: str) -> Any:
        with self._lock:
            if model not in self._loaded:
                try:
                    from transformers import AutoTokenizer
                except ImportError as exc:
                    raise MissingDependency("gcache-router tokenizes with transformers: pip "
                                            "install 'gcache-kv[router]'") from exc
                try:
                    self._loaded[model] = AutoTokenizer.from_pretrained(self.paths[model])
                except (OSError, ValueError) as exc:
                    raise ConfigError("models", f"{model}={self.paths[model]}",
                                      f"its tokenizer cannot be loaded: {exc}") from exc
            return self._loaded[model]

    def load_all(self) -> None:
        """Load every tokenizer now, so that a wrong one stops the router at start."""
        for model in self.paths:
            self.get(model)


def prompt_tokens(tokenizer: Any, path: str, body: dict[str, Any]) -> list[int]:
    """The token ids the engine will prefill for ``body`` sent to ``path``. Raises
    ``InvalidRequest`` naming what is missing or malformed."""
    if path.endswith("/chat/completions"):
        return _chat_tokens(tokenizer, body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]           # a batch: routed by its first prompt
    if isinstance(prompt, str):
        special = body.get("add_special_tokens", True)
        return list(tokenizer(prompt, add_special_tokens=bool(special))["input_ids"])
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                        and t >= 0 for t in prompt):
        return list(prompt)
    raise InvalidRequest("'prompt' must be a string, a list of token ids, or a list of either")


def _chat_tokens(tokenizer: Any, body: dict[str, Any]) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or \
            not all(isinstance(m, dict) and "role" in m for m in messages):
        raise InvalidRequest("'messages' must be a non-empty list of objects with a 'role'")
    if not isinstance(body.get("chat_template_kwargs") or {}, dict):
        raise InvalidRequest("'chat_template_kwargs' must be an object")
    try:
        return _rendered(tokenizer, body, messages,
                         add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                         continue_final_message=bool(body.get("continue_final_message", False)))
    except Exception as exc:     # a template raises what it likes (jinja2's TemplateError...)
        raise InvalidRequest(f"the messages cannot be rendered with the model's chat "
                             f"template: {type(exc).__name__}: {exc}") from exc


def _rendered(tokenizer: Any, body: dict[str, Any], messages: list[dict[str, Any]], *,
              add_generation_prompt: bool, continue_final_message: bool) -> list[int]:
    """``messages`` through the chat template and the tokenizer, with ``body``'s template,
    template kwargs and special-tokens choice, as the engine renders a chat request."""
    text = tokenizer.apply_chat_template(
        [_plain(m) for m in messages], tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        chat_template=body.get("chat_template"), **(body.get("chat_template_kwargs") or {}))
    special = body.get("add_special_tokens", False)
    return list(tokenizer(text, add_special_tokens=bool(special))["input_ids"])


def lookup_tokens(tokenizer: Any, path: str, body: dict[str, Any],
                  tokens: list[int]) -> list[int]:
    """The leading part of ``tokens`` (``prompt_tokens`` of this request) whose KV keys the
    router can compute: all of them, unless a chat message holds media, then those before the
    first media part."""
    messages = body.get("messages") if path.endswith("/chat/completions") else None
    before = _before_media(messages) if isinstance(messages, list) else None
    if not before:
        return tokens if before is None else []
    try:
        known = _rendered(tokenizer, body, before, add_generation_prompt=False,
                          continue_final_message=True)
    except Exception:           # a template that will not end mid-conversation: no tokens
        return []
    same = 0
    while same < min(len(known), len(tokens)) and known[same] == tokens[same]:
        same += 1
    return tokens[:same]


def _before_media(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The conversation up to its first media part (that message keeps the text parts before
    it); None when there is no media part."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type", "text") != "text":
                text = [p for p in content[:j] if isinstance(p, dict)]
                return messages[:i] + ([{**message, "content": text}] if text else [])
    return None


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message whose content is a list of text parts, joined as vLLM joins them."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [part.get("text", "") for part in content
                 if isinstance(part, dict) and part.get("type") == "text"]
        return {**message, "content": "\n".join(texts)}
    return message
