"""Faults of the model and of tools, through Telegram: the user gets a short apology or a bounded answer, never a
traceback; the next turn works; the database holds what happened and nothing half-done.

Model: an error in generation, out-of-memory, a bug in the backend, a turn past TURN_TIMEOUT_SECONDS. (The real
local backend's model thread surviving an exception or an out-of-memory inside `generate` is tested on the real
model in tests/test_local_backend.py.)
Tools: an exception, a hang past TOOL_TIMEOUT_SECONDS, a huge result, a model that keeps calling a hanging tool.
Tools are registered on the running bot's registry, the same object the agent reads, like a shipped tool.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import pytest

from agent.errors import LLMError, LLMOutOfMemory
from agent.llm.scripted import Request
from bot.telegram.i18n import TEXTS
from tests.fakes.telegram_bot import ALICE, RunningBot, final, private_chat, start_bot, telegram_server
from tools.registry import Tool

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

CHAT = private_chat(ALICE)  # Alice writes in Chinese: the bot answers in Chinese
APOLOGIES = {TEXTS[key]["zh"] for key in ("model_error", "timeout", "apology")}
LEAKS = ("Traceback", "Error", "error", "CUDA", "BATCH_SIZE", "line ", ".py")


def assert_short_apology(reply: str) -> None:
    """One of the bot's apologies: short, and nothing of the failure behind it."""
    assert reply in APOLOGIES
    assert len(reply) < 60 and not any(leak in reply for leak in LEAKS)


async def assert_only_the_good_turn_is_in_the_history(bot: RunningBot, question: str, answer: str) -> None:
    """The failed turn left a trace (status error) but no message in the history; every update is handled."""
    assert await bot.query("SELECT role, content FROM messages ORDER BY id") == [
        ("user", question), ("assistant", answer)]
    await bot.all_handled()


# --- the model -------------------------------------------------------------------------------------------------

LOOKUP = ('Thought: 查一下课程。\nAction: course_query\nAction Input: {"course_name": "大模型技术实战"}\n'
          'Observation:')

MODEL_FAILURES = {
    "an error in generation": [LLMError("CUDA error: device-side assert triggered (worker.py line 212)")],
    "out of memory after a tool call": [LOOKUP, LLMOutOfMemory("CUDA out of memory: lower BATCH_SIZE")],
    "a bug in the backend": [RuntimeError("Traceback: KeyError in generate()")],
}


@pytest.mark.parametrize("failure", MODEL_FAILURES.values(), ids=MODEL_FAILURES.keys())
async def test_a_failing_model_gets_the_turn_a_short_apology_and_the_next_turn_works(start_bot, telegram_server,
                                                                                     failure):
    bot = await start_bot([*failure, final("好了")])
    assert_short_apology(await bot.ask(CHAT, ALICE, "第一个问题"))
    assert await bot.ask(CHAT, ALICE, "第二个问题") == "好了"
    assert "第一个问题" not in bot.llm.requests[-1].text  # the failed turn is not in the next prompt
    await assert_only_the_good_turn_is_in_the_history(bot, "第二个问题", "好了")


async def test_out_of_memory_keeps_the_failed_turns_trace_for_trace_and_stats(start_bot, telegram_server):
    bot = await start_bot(MODEL_FAILURES["out of memory after a tool call"])
    assert_short_apology(await bot.ask(CHAT, ALICE, "大模型技术实战多少节？"))
    assert await bot.query("SELECT status, source_key FROM turns") == [("error", None)]
    assert await bot.query("SELECT kind, error FROM steps") == [("tool", None)]


async def test_a_turn_past_its_time_limit_gets_an_apology_and_the_model_is_free_at_once(start_bot, telegram_server):
    bot = await start_bot([final("太晚了"), final("这次很快")], delay=30, turn_timeout_seconds=0.3)
    assert_short_apology(await bot.ask(CHAT, ALICE, "慢问题"))  # within `ask`'s wait, not the model's 30 s

    bot.llm.delay = 0
    assert await bot.ask(CHAT, ALICE, "快问题") == "太晚了"  # the timed-out call consumed no reply
    await assert_only_the_good_turn_is_in_the_history(bot, "快问题", "太晚了")


# --- tools -----------------------------------------------------------------------------------------------------

def weather_tool(function: Callable[[str], Awaitable[str]]) -> Tool:
    """A tool with one string parameter, running `function`."""
    async def weather(city: str) -> str:
        return await function(city)

    return Tool("weather", "Weather", "Current weather of a city.",
                {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                 "required": ["city"]}, weather, progress="🌤 查询天气")


def register(bot: RunningBot, tool: Tool) -> None:
    """Add `tool` to the running bot's registry, which the agent reads each turn."""
    bot.application.bot_data["services"].registry.register(tool)


def call_weather(city: str) -> str:
    """A model output calling the weather tool."""
    return f'Thought: 查天气。\nAction: weather\nAction Input: {{"city": "{city}"}}\nObservation:'


def observation_of(request: Request) -> str:
    """The last Observation the model was shown in `request` (ReAct mode continues the trace in one message)."""
    return request.last_content.rsplit("Observation:", 1)[-1].split("\nThought:")[0].strip()


async def test_a_tool_that_raises_becomes_an_observation_and_the_turn_ends_with_an_answer(start_bot,
                                                                                           telegram_server):
    async def broken(city: str) -> str:
        raise RuntimeError(f"sensor in {city} offline")

    bot = await start_bot([call_weather("北京"), final("天气服务坏了，稍后再试。")])
    register(bot, weather_tool(broken))
    assert await bot.ask(CHAT, ALICE, "北京天气？") == "天气服务坏了，稍后再试。"

    assert observation_of(bot.llm.requests[1]) == "Error: weather failed: RuntimeError: sensor in 北京 offline"
    assert await bot.query("SELECT kind, error FROM steps ORDER BY position") == [
        ("tool", "exception"), ("final", None)]


async def test_a_tool_that_hangs_is_stopped_at_its_time_limit_and_the_turn_ends(start_bot, telegram_server):
    async def hangs(city: str) -> str:
        await asyncio.sleep(3600)
        return "never"

    bot = await start_bot([call_weather("上海"), final("天气服务没有响应。")], tool_timeout_seconds=0.3)
    register(bot, weather_tool(hangs))
    assert await bot.ask(CHAT, ALICE, "上海天气？") == "天气服务没有响应。"  # within `ask`'s wait, not the tool's hour

    assert observation_of(bot.llm.requests[1]) == "Error: weather did not finish within 0.3 seconds."
    assert await bot.query("SELECT error FROM steps WHERE kind = 'tool'") == [("timeout",)]


async def test_a_huge_tool_result_reaches_the_model_and_the_database_bounded(start_bot, telegram_server):
    async def flood(city: str) -> str:
        return "晴" * 5_000_000  # 5 million characters

    bot = await start_bot([call_weather("广州"), final("广州晴。")], observation_max_chars=1000)
    register(bot, weather_tool(flood))
    assert await bot.ask(CHAT, ALICE, "广州天气？") == "广州晴。"

    seen = observation_of(bot.llm.requests[1])
    assert seen == "晴" * 1000 + "… [truncated: 4999000 more characters]"
    assert len(bot.llm.requests[1].last_content) < len(bot.llm.requests[0].last_content) + 1200
    assert await bot.query("SELECT max(length(observation)) FROM steps") == [(len(seen),)]
    trace = await bot.ask(CHAT, ALICE, "/trace")
    assert len(trace) < 1000  # /trace shortens each observation too


async def test_a_model_that_keeps_calling_a_hanging_tool_is_stopped_by_the_step_limit(start_bot, telegram_server):
    async def hangs(city: str) -> str:
        await asyncio.sleep(3600)
        return "never"

    calls = [call_weather(city) for city in ("北京", "上海", "广州")]  # different cities: each really runs
    bot = await start_bot([*calls, final("天气服务一直没有响应，我查不到。")], max_steps=3, tool_timeout_seconds=0.2)
    register(bot, weather_tool(hangs))
    assert await bot.ask(CHAT, ALICE, "三个城市的天气？") == "天气服务一直没有响应，我查不到。"  # not 3 hours

    assert await bot.query("SELECT status, model_calls FROM turns") == [("step_limit", 4)]
    assert await bot.query("SELECT error FROM steps WHERE kind = 'tool'") == [("timeout",)] * 3
