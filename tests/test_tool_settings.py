"""Enabling and disabling tools per chat and globally, persisted in the database file."""

from __future__ import annotations

import sqlite3

import pytest

from db import open_database
from tools import Tool, ToolRegistry, build_registry
from tools.settings import GLOBAL, ToolSettings


def state_of(states, name: str) -> tuple[bool, str]:
    """(enabled, source) of the tool `name` among `states`."""
    (state,) = [s for s in states if s.tool.name == name]
    return state.enabled, state.source


@pytest.fixture
def tool_settings(db, registry) -> ToolSettings:
    return ToolSettings(db, registry)


async def test_every_tool_is_enabled_by_default(tool_settings, registry):
    states = await tool_settings.states("tg:1")
    assert [(s.tool.name, s.enabled, s.source) for s in states] == [
        (name, True, "default") for name in registry.names]
    assert [t.name for t in await tool_settings.enabled_tools("tg:1")] == registry.names


def without(registry, *names: str) -> list[str]:
    return [name for name in registry.names if name not in names]


async def test_global_off_applies_to_every_chat(tool_settings, registry):
    await tool_settings.set_enabled("course_list", False)
    for chat in ("tg:1", "tg:2", "cli"):
        assert state_of(await tool_settings.states(chat), "course_list") == (False, "global")
        assert [t.name for t in await tool_settings.enabled_tools(chat)] == without(registry, "course_list")


async def test_a_chat_setting_wins_over_the_global_one(tool_settings, registry):
    await tool_settings.set_enabled("course_list", False, GLOBAL)
    await tool_settings.set_enabled("course_list", True, "tg:1")
    await tool_settings.set_enabled("calculator", False, "tg:1")
    assert state_of(await tool_settings.states("tg:1"), "course_list") == (True, "chat")
    assert state_of(await tool_settings.states("tg:1"), "calculator") == (False, "chat")
    assert state_of(await tool_settings.states("tg:2"), "course_list") == (False, "global")
    assert state_of(await tool_settings.states("tg:2"), "calculator") == (True, "default")
    assert [t.name for t in await tool_settings.enabled_tools("tg:1")] == without(registry, "calculator")
    assert [t.name for t in await tool_settings.enabled_tools("tg:2")] == without(registry, "course_list")


async def test_the_global_row_is_not_mistaken_for_a_chat(tool_settings):
    await tool_settings.set_enabled("calculator", False, GLOBAL)
    assert state_of(await tool_settings.states(GLOBAL), "calculator") == (False, "global")
    assert state_of(await tool_settings.states(GLOBAL), "course_list") == (True, "default")
    assert state_of(await tool_settings.states("tg:1"), "calculator") == (False, "global")


async def test_switching_back_and_forth_keeps_one_row(tool_settings, db_path):
    for enabled in (False, True, False):
        await tool_settings.set_enabled("calculator", enabled, "tg:5")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT scope, tool_name, enabled FROM tool_settings").fetchall() == [
            ("tg:5", "calculator", 0)]
    assert state_of(await tool_settings.states("tg:5"), "calculator") == (False, "chat")


async def test_settings_survive_a_restart(db, db_path):
    first = ToolSettings(db, build_registry(db))
    await first.set_enabled("course_list", False)
    await first.set_enabled("course_list", True, "tg:-100123")
    await first.set_enabled("calculator", False, "tg:-100123")
    await db.close()

    reopened = await open_database(db_path)
    try:
        again = ToolSettings(reopened, build_registry(reopened))
        assert state_of(await again.states("tg:-100123"), "course_list") == (True, "chat")
        assert state_of(await again.states("tg:-100123"), "calculator") == (False, "chat")
        assert state_of(await again.states("tg:7"), "course_list") == (False, "global")
        assert state_of(await again.states("tg:7"), "calculator") == (True, "default")
    finally:
        await reopened.close()


async def test_an_unknown_tool_is_refused_and_nothing_is_stored(tool_settings, db_path):
    with pytest.raises(KeyError):
        await tool_settings.set_enabled("eval", False)
    with pytest.raises(KeyError):
        await tool_settings.set_enabled("course_query ", False, "tg:1")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM tool_settings").fetchone() == (0,)


async def test_a_tool_off_by_default_can_be_turned_on(db):
    async def secret() -> str:
        return "42"

    hidden = Tool(name="secret", human_name="Secret", description="d", function=secret, enabled_by_default=False,
                  parameters={"type": "object", "properties": {}})
    settings = ToolSettings(db, ToolRegistry.of([hidden]))
    assert state_of(await settings.states("tg:1"), "secret") == (False, "default")
    await settings.set_enabled("secret", True, "tg:1")
    assert [t.name for t in await settings.enabled_tools("tg:1")] == ["secret"]
    assert await settings.enabled_tools("tg:2") == []


async def test_a_disabled_tool_cannot_be_called_in_that_chat(tool_settings, registry):
    await tool_settings.set_enabled("calculator", False, "tg:1")
    allowed = [t.name for t in await tool_settings.enabled_tools("tg:1")]
    result = await registry.call("calculator", {"expression": "3*2"}, allowed=allowed)
    assert result.error == "unknown_tool"
    assert "calculator" not in result.output.split("Available tools:")[1]
    allowed = [t.name for t in await tool_settings.enabled_tools("tg:2")]
    assert (await registry.call("calculator", {"expression": "3*2"}, allowed=allowed)).output == "3*2 = 6"
