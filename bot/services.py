"""The wiring: the bot's shared services, built from `Settings`, started once and closed once.

This is the only place that reads `Settings` into objects of `agent/` and `tools/` (which never import `bot/`).
The Telegram application keeps the services in `bot_data`; the terminal commands use them directly.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from agent.llm import LLM
from agent.grammar import GrammarLimits
from agent.loop import Agent, AgentLimits
from agent.memory import Memory
from agent.options import ChatOptions
from agent.tokens import qwen_token_counter
from bot.config import Settings
from bot.logs import add_secrets
from db import Database, DatabaseOpenError, open_database
from tools import build_registry
from tools.courses import CourseCatalog
from tools.mcp import McpHub, McpLimits
from tools.mcp_store import read_config
from tools.registry import ToolRegistry
from tools.settings import ToolSettings

log = logging.getLogger(__name__)


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
    mcp: McpHub
    options: ChatOptions

    async def close(self) -> None:
        """Close the MCP connections, stop the model, then close the database."""
        try:
            await self.mcp.close()
            await self.llm.close()
        finally:
            await self.db.close()


async def open_settings_database(settings: Settings) -> Database:
    """The database at DATABASE_PATH; a path that cannot be used is reported naming the variable."""
    with naming_database_path():
        return await open_database(settings.database_path,
                                   busy_timeout_seconds=settings.database_busy_timeout_seconds)


@contextmanager
def naming_database_path() -> Iterator[None]:
    """A database path that cannot be used (not creatable, a folder, not SQLite) is reported naming DATABASE_PATH:
    db/ knows paths, not the settings they come from."""
    try:
        yield
    except DatabaseOpenError as error:
        raise DatabaseOpenError(f"{error}; check DATABASE_PATH") from error


async def start_services(settings: Settings, llm: LLM | None = None) -> Services:
    """Open the database, start the model (`llm`, or the configured backend), build the agent; MCP servers connect
    in the background (their last known tools are registered at once)."""
    mcp_config = read_config(settings.mcp_config_path)  # a broken file stops the start, before anything opens
    db = await open_settings_database(settings)
    log.info("database %s", db.path)
    try:
        llm = llm or build_llm(settings)
        log.info("model %s", describe_model(settings, llm))
        await llm.start()
    except BaseException:
        await db.close()
        raise
    catalog = CourseCatalog(db)
    registry = build_registry(db, settings.tool_timeout_seconds, settings.course_names_free_text)
    mcp = mcp_hub(settings, db, registry, mcp_config)
    try:
        await mcp.start()
    except BaseException:
        await llm.close()
        await db.close()
        raise
    add_secrets(mcp.secrets())
    tool_settings = ToolSettings(db, registry)
    memory = Memory(db)
    options = ChatOptions(db)
    agent = Agent(llm, registry, tool_settings, memory, agent_limits(settings), options)
    return Services(settings, db, llm, registry, tool_settings, memory, catalog, agent, mcp, options)


def mcp_hub(settings: Settings, db: Database, registry: ToolRegistry, config: list | None = None) -> McpHub:
    """The MCP hub for `settings` (the config file read unless `config` is given), not started yet."""
    limits = McpLimits(settings.mcp_connect_timeout_seconds, settings.mcp_retry_seconds,
                       settings.mcp_max_tools_per_server, settings.mcp_description_max_chars)
    return McpHub(db, registry, config=read_config(settings.mcp_config_path) if config is None else config,
                  limits=limits)


def agent_limits(settings: Settings) -> AgentLimits:
    """The agent's limits and decoding rules from MAX_STEPS, MAX_NEW_TOKENS, CONSTRAINED_DECODING and the rest."""
    grammar = GrammarLimits(settings.thought_max_tokens, settings.tool_string_max_chars)
    return AgentLimits(settings.max_steps, settings.max_new_tokens, settings.history_token_budget,
                       settings.observation_max_chars, settings.turn_timeout_seconds, settings.agent_mode,
                       settings.react_layout, grammar if settings.constrained_decoding else None,
                       settings.require_tool_call)


def build_llm(settings: Settings) -> LLM:
    """The backend LLM_BACKEND names; nothing loads or connects until `start()`, and heavy imports happen only
    for the backend chosen."""
    if settings.llm_backend == "local":
        from agent.llm.engine.speculative import SpeculativeLimits
        from agent.llm.local import LocalLLM

        return LocalLLM(settings.model, device_map=settings.model_device_map, dtype=settings.model_dtype,
                        batch_size=settings.batch_size, batch_wait_ms=settings.batch_wait_ms,
                        converted_dir=settings.model_converted_dir, prefix_cache_mb=settings.prefix_cache_mb,
                        base_dir=settings.data_dir, cache_dir=settings.model_cache_dir,
                        native_tools=settings.agent_mode == "native",
                        speculative=SpeculativeLimits(settings.speculative_tokens, settings.speculative_step_tokens))
    if settings.llm_backend == "openai":
        from agent.llm.openai import OpenAILLM

        from agent.llm.openai_stream import StreamLimits

        limits = StreamLimits(settings.openai_connect_timeout_seconds, settings.openai_first_token_seconds,
                              settings.openai_silence_seconds)
        return OpenAILLM(base_url=settings.openai_base_url, model=settings.openai_model or settings.model,
                         api_key=settings.openai_api_key, limits=limits,
                         startup_seconds=settings.openai_startup_seconds, max_retries=settings.openai_max_retries,
                         count_tokens=qwen_token_counter(settings.tokenizer_vocab_path),
                         grammar=settings.openai_grammar)
    from agent.llm.scripted import ScriptedLLM

    return ScriptedLLM.from_file(settings.scripted_replies_path, delay=settings.scripted_delay_seconds,
                                 token_seconds=settings.scripted_token_seconds,
                                 count_tokens=qwen_token_counter(settings.tokenizer_vocab_path))


def describe_model(settings: Settings, llm: LLM) -> str:
    """Which model runs, and where it comes from, for the start-up log (a server's URL without credentials)."""
    url = getattr(llm, "url", None)
    if url is not None:
        return f"{getattr(llm, 'model', settings.model)} on the server at {url}"
    if llm.name == "local":
        return f"{settings.model} (local; relative paths in {settings.data_dir}, hub cache {settings.model_cache_dir})"
    return f"{llm.name} backend"
