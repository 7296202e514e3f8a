"""The bot's shared services, started once and closed once: database, model, tools, memory, agent.

The Telegram application keeps them in `bot_data`; the terminal commands use them directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.llm import LLM, build_llm
from agent.loop import Agent, AgentLimits
from agent.memory import Memory
from agent.options import ChatOptions
from bot.config import Settings
from migrations import Database, open_database
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
    agent = Agent(llm, registry, tool_settings, memory, AgentLimits.from_settings(settings), options)
    return Services(settings, db, llm, registry, tool_settings, memory, catalog, agent, options)
