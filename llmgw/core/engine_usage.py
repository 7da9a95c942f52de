"""What an engine's chat answer reports of the tokens it read from its prefix cache.

Owns: where each engine puts that count: vLLM and SGLang in
``usage.prompt_tokens_details.cached_tokens`` (only with vLLM's
``--enable-prompt-tokens-details`` and SGLang's ``--enable-cache-report``, which llmgw
renders for both: llmgw.core.engines), llama-server there too at build 11434
(``usage_json_oaicompat``, tools/server/server-task.cpp) and in ``timings.cache_n``
(``server_slot_stats::to_json``), the one count its older builds give.

Must not: do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping


def cached_tokens(usage: Mapping[str, object], timings: object = None) -> int:
    """The prompt tokens an engine read from its prefix cache (0 when it says nothing)."""
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        counted = _count(details.get("cached_tokens"))
        if counted:
            return counted
    if isinstance(timings, Mapping):
        return _count(timings.get("cache_n"))
    return 0


def cached_prompt_tokens(usage: Mapping[str, object] | None) -> int:
    """The cached prompt tokens of a usage in either API's words: chat completions'
    (``cached_tokens``) or the Messages API's (``cache_read_input_tokens``, which
    llama-server's own /v1/messages reports at build 11434)."""
    if usage is None:
        return 0
    return cached_tokens(usage) or _count(usage.get("cache_read_input_tokens"))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
