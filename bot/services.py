"""The wiring: the bot's shared services, built from `Settings`, started once and closed once.

This is the only place that reads `Settings` into objects of `agent/` and `tools/` (which never import `bot/`).
The Telegram application keeps the services in `bot_data`; the terminal commands use them directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.llm import LLM
from agent.grammar import GrammarLimits
from agent.loop import Agent, AgentLimits
from agent.memory import Memory
from agent.options import ChatOptions
from agent.tokens import qwen_token_counter
from bot.config import Settings
from db import Database, open_database
from tools import build_registry
from tools.courses import CourseCatalog
from tools.registry import ToolRegistry
from tools.settings import ToolSettings


@dataclass
class Services:
    """Everything a handler or command needs, wired together."""

    settings: Settings
    db: Database
    llm: LLM
    registry: ToolRegistry
    tool_settings: ToolSettings
    memory: Memory
    catalog: CourseCatalog
    agent: Agent
    options: ChatOptions

    async def close(self) -> None:
        """Stop the model, then close the database."""
        try:
            await self.llm.close()
        finally:
            await self.db.close()


async def start_services(settings: Settings, llm: LLM | None = None) -> Services:
    """Open the database, start the model (`llm`, or the configured backend), build the agent."""
    db = await open_database(settings.database_path, busy_timeout_seconds=settings.database_busy_timeout_seconds)
    try:
        llm = llm or build_llm(settings)
        await llm.start()
    except BaseException:
        await db.close()
        raise
    catalog = CourseCatalog(db)
    registry = build_registry(db, settings.tool_timeout_seconds, settings.course_names_free_text)
    tool_settings = ToolSettings(db, registry)
    memory = Memory(db)
    options = ChatOptions(db)
    agent = Agent(llm, registry, tool_settings, memory, agent_limits(settings), options)
    return Services(settings, db, llm, registry, tool_settings, memory, catalog, agent, options)


def agent_limits(settings: Settings) -> AgentLimits:
    """The agent's limits and decoding rules from MAX_STEPS, MAX_NEW_TOKENS, CONSTRAINED_DECODING and the rest."""
    grammar = GrammarLimits(settings.thought_max_tokens, settings.tool_string_max_chars)
    return AgentLimits(settings.max_steps, settings.max_new_tokens, settings.history_token_budget,
                       settings.observation_max_chars, settings.turn_timeout_seconds, settings.agent_mode,
                       grammar if settings.constrained_decoding else None, settings.require_tool_call)


def build_llm(settings: Settings) -> LLM:
    """The backend LLM_BACKEND names; nothing loads or connects until `start()`, and heavy imports happen only
    for the backend chosen."""
    if settings.llm_backend == "local":
        from agent.llm.local import LocalLLM

        return LocalLLM(settings.model, device_map=settings.model_device_map, dtype=settings.model_dtype,
                        batch_size=settings.batch_size, batch_wait_ms=settings.batch_wait_ms,
                        converted_dir=settings.model_converted_dir, prefix_cache_mb=settings.prefix_cache_mb,
                        native_tools=settings.agent_mode == "native")
    if settings.llm_backend == "openai":
        from agent.llm.openai import OpenAILLM

        return OpenAILLM(base_url=settings.openai_base_url, model=settings.openai_model or settings.model,
                         api_key=settings.openai_api_key, timeout_seconds=settings.openai_timeout_seconds,
                         max_retries=settings.openai_max_retries,
                         count_tokens=qwen_token_counter(settings.tokenizer_vocab_path),
                         grammar=settings.openai_grammar)
    from agent.llm.scripted import ScriptedLLM

    return ScriptedLLM.from_file(settings.scripted_replies_path, delay=settings.scripted_delay_seconds,
                                 count_tokens=qwen_token_counter(settings.tokenizer_vocab_path))
