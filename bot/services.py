"""The bot's shared services, started once and closed once: database, model, tools, memory, agent.

The Telegram application keeps them in `bot_data`; the terminal commands use them directly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent.llm import LLM, build_llm
from agent.loop import Agent, AgentLimits
from agent.memory import Memory
from bot.config import Settings
from migrations import Database, open_database
from tools import build_registry
from tools.courses import CourseCatalog
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

    async def close(self) -> None:
        """Stop the model, then close the database."""
        try:
            await self.llm.close()
        finally:
            await self.db.close()


async def start_services(settings: Settings, llm: LLM | None = None) -> Services:
    """Open the database, start the model (`llm`, or the configured backend), build the agent."""
    db = await open_database(settings.database_path, busy_timeout_seconds=settings.database_busy_timeout_seconds)
    log.info("database %s", db.path)
    try:
        llm = llm or build_llm(settings)
        log.info("model %s", describe_model(settings, llm))
        await llm.start()
    except BaseException:
        await db.close()
        raise
    catalog = CourseCatalog(db)
    registry = build_registry(db, settings.tool_timeout_seconds)
    tool_settings = ToolSettings(db, registry)
    memory = Memory(db)
    agent = Agent(llm, registry, tool_settings, memory, AgentLimits.from_settings(settings))
    return Services(settings, db, llm, registry, tool_settings, memory, catalog, agent)


def describe_model(settings: Settings, llm: LLM) -> str:
    """Which model runs, and where it comes from, for the start-up log (a server's URL without credentials)."""
    url = getattr(llm, "url", None)
    if url is not None:
        return f"{getattr(llm, 'model', settings.model)} on the server at {url}"
    if llm.name == "local":
        return f"{settings.model} (local; relative paths in {settings.data_dir}, hub cache {settings.model_cache_dir})"
    return f"{llm.name} backend"
