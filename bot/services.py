"""The bot's shared services, started once and closed once: database, model, tools, memory, agent.

The Telegram application keeps them in `bot_data`; the terminal commands use them directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.llm import LLM, build_llm
from agent.loop import Agent, AgentLimits
from agent.memory import Memory
from bot.config import Settings
from bot.logs import add_secrets
from migrations import Database, open_database
from tools import build_registry
from tools.courses import CourseCatalog
from tools.mcp import McpHub, McpLimits
from tools.mcp_store import read_config
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
    mcp: McpHub

    async def close(self) -> None:
        """Close the MCP connections, stop the model, then close the database."""
        try:
            await self.mcp.close()
            await self.llm.close()
        finally:
            await self.db.close()


async def start_services(settings: Settings, llm: LLM | None = None) -> Services:
    """Open the database, start the model (`llm`, or the configured backend), build the agent; MCP servers connect
    in the background (their last known tools are registered at once)."""
    mcp_config = read_config(settings.mcp_config_path)  # a broken file stops the start, before anything opens
    db = await open_database(settings.database_path, busy_timeout_seconds=settings.database_busy_timeout_seconds)
    try:
        llm = llm or build_llm(settings)
        await llm.start()
    except BaseException:
        await db.close()
        raise
    catalog = CourseCatalog(db)
    registry = build_registry(db, settings.tool_timeout_seconds)
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
    agent = Agent(llm, registry, tool_settings, memory, AgentLimits.from_settings(settings))
    return Services(settings, db, llm, registry, tool_settings, memory, catalog, agent, mcp)


def mcp_hub(settings: Settings, db: Database, registry: ToolRegistry, config: list | None = None) -> McpHub:
    """The MCP hub for `settings` (the config file read unless `config` is given), not started yet."""
    limits = McpLimits(settings.mcp_connect_timeout_seconds, settings.mcp_retry_seconds,
                       settings.mcp_max_tools_per_server, settings.mcp_description_max_chars)
    return McpHub(db, registry, config=read_config(settings.mcp_config_path) if config is None else config,
                  limits=limits)
