"""Model backends behind one async interface (`agent.llm.base.LLM`), chosen by `LLM_BACKEND`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.llm.base import LLM, CancelToken, Completion, Message, ToolCall

if TYPE_CHECKING:
    from bot.config import Settings

__all__ = ["LLM", "CancelToken", "Completion", "Message", "ToolCall", "build_llm"]


def build_llm(settings: "Settings") -> LLM:
    """The backend `settings.llm_backend` names; heavy imports happen only for the one chosen."""
    if settings.llm_backend == "local":
        from agent.llm.local import LocalLLM

        return LocalLLM.from_settings(settings)
    if settings.llm_backend == "openai":
        from agent.llm.openai import OpenAILLM

        return OpenAILLM.from_settings(settings)
    from agent.llm.scripted import ScriptedLLM
    from agent.tokens import qwen_token_counter

    return ScriptedLLM.from_file(settings.scripted_replies_path, delay=settings.scripted_delay_seconds,
                                 count_tokens=qwen_token_counter(settings.tokenizer_vocab_path))
