"""The tool registry: every tool's success, and every failure coming back as a readable result."""

from __future__ import annotations

import asyncio
import json

import pytest
from jsonschema.exceptions import SchemaError

from tools import Tool, ToolRegistry
from tools.errors import ToolError

TEXT_SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "description": "any text"}},
               "required": ["text"], "additionalProperties": False}
NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}


def tool(name: str, function, parameters=NO_ARGS, **extra) -> Tool:
    return Tool(name=name, human_name=name.title(), description=f"the {name} tool", parameters=parameters,
                function=function, **extra)


async def test_shipped_tools_are_registered_in_prompt_order(registry):
    assert registry.names[:3] == ["course_query", "course_list", "calculator"]
    assert [t.name for t in registry] == registry.names
    assert "calculator" in registry and "eval" not in registry
    assert registry.get("course_query").human_name == "课程信息数据库"
    assert registry.get("nothing") is None


async def test_course_query_succeeds(registry):
    result = await registry.call("course_query", {"course_name": "大模型技术实战"})
    assert result.ok and result.error is None
    assert json.loads(result.output) == {"课程名称": "大模型技术实战", "课时": 200, "每周更新次数": 3, "每次更新小时": 2}
    assert result.tool == "course_query" and result.arguments == {"course_name": "大模型技术实战"}


async def test_course_list_succeeds(registry):
    result = await registry.call("course_list", {})
    assert result.ok
    assert [json.loads(line)["课程名称"] for line in result.output.splitlines()] == [
        "大模型技术实战", "机器学习实战", "深度学习实战", "AI数据分析"]


async def test_calculator_succeeds(registry):
    result = await registry.call("calculator", {"expression": "3 * 2"})
    assert result.ok
    assert result.output == "3 * 2 = 6"


async def test_calculator_refusal_is_a_tool_error(registry):
    result = await registry.call("calculator", {"expression": "__import__('os')"})
    assert result.error == "tool_error"
    assert result.output.startswith("Error: ")


async def test_unknown_tool_lists_the_available_ones(registry):
    result = await registry.call("course_search", {"course_name": "x"})
    assert result.error == "unknown_tool" and not result.ok
    assert "course_search" in result.output
    assert f"Available tools: {', '.join(registry.names)}." in result.output
    assert "course_query, course_list, calculator" in result.output


async def test_a_tool_outside_the_allowed_set_is_unknown(registry):
    result = await registry.call("calculator", {"expression": "1+1"}, allowed=["course_query", "course_list"])
    assert result.error == "unknown_tool"
    assert "Available tools: course_query, course_list." in result.output
    # `allowed` may be any iterable, a generator included.
    result = await registry.call("calculator", {"expression": "1+1"}, allowed=(n for n in ["course_list"]))
    assert result.error == "unknown_tool"
    assert "Available tools: course_list." in result.output
    result = await registry.call("calculator", {"expression": "1+1"}, allowed=[])
    assert "Available tools: none." in result.output
    assert (await registry.call("calculator", {"expression": "1+1"}, allowed=iter(["calculator"]))).ok


@pytest.mark.parametrize("arguments, reason", [
    ({"course_name": 5}, "5 is not of type 'string'"),
    ({}, "'course_name' is a required property"),
    ({"course_name": "大模型", "limit": 3}, "'limit' was unexpected"),
    ({"course_name": ""}, "should be non-empty"),
    ("大模型技术实战", "expected a JSON object, got str"),
    ([], "expected a JSON object, got list"),
    (None, "expected a JSON object, got NoneType"),
])
async def test_schema_violations_give_the_reason(registry, arguments, reason):
    result = await registry.call("course_query", arguments)
    assert result.error == "invalid_arguments"
    assert result.output.startswith("Error: invalid arguments for course_query: ")
    assert reason in result.output


async def test_invalid_arguments_never_reach_the_tool():
    calls = []

    async def record(text: str) -> str:
        calls.append(text)
        return text

    registry = ToolRegistry.of([tool("echo", record, TEXT_SCHEMA)])
    assert (await registry.call("echo", {"text": 1})).error == "invalid_arguments"
    assert (await registry.call("echo", {"text": "hi"})).output == "hi"
    assert calls == ["hi"]


async def test_a_tool_raising_is_reported_not_raised():
    async def broken() -> str:
        raise RuntimeError("the disk is on fire")

    result = await ToolRegistry.of([tool("broken", broken)]).call("broken", {})
    assert result.error == "exception"
    assert result.output == "Error: broken failed: RuntimeError: the disk is on fire"
    assert "Traceback" not in result.output


async def test_a_tool_error_is_the_tools_own_words():
    async def picky() -> str:
        raise ToolError("I only work on Tuesdays")

    result = await ToolRegistry.of([tool("picky", picky)]).call("picky", {})
    assert result.error == "tool_error"
    assert result.output == "Error: I only work on Tuesdays"


async def test_a_slow_tool_times_out_promptly_and_is_cancelled():
    finished = []

    async def slow() -> str:
        try:
            await asyncio.sleep(3600)
        finally:
            finished.append("cleaned up")
        return "too late"

    registry = ToolRegistry.of([tool("slow", slow)], timeout_seconds=0.2)
    result = await asyncio.wait_for(registry.call("slow", {}), 120)  # the tool alone would take an hour
    assert result.error == "timeout"
    assert result.output == "Error: slow did not finish within 0.2 seconds."
    assert finished == ["cleaned up"]


async def test_non_text_output_is_json():
    async def numbers() -> dict:
        return {"课时": 200}

    result = await ToolRegistry.of([tool("numbers", numbers)]).call("numbers", {})
    assert result.ok and result.output == '{"课时": 200}'


async def test_duration_is_measured():
    async def nap() -> str:
        await asyncio.sleep(0.05)
        return "ok"

    result = await ToolRegistry.of([tool("nap", nap)]).call("nap", {})
    assert result.duration_ms >= 40


def test_a_name_registered_twice_is_refused():
    async def noop() -> str:
        return ""

    registry = ToolRegistry.of([tool("noop", noop)])
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(tool("noop", noop))


def test_an_invalid_schema_is_refused_when_the_tool_is_made():
    async def noop() -> str:
        return ""

    with pytest.raises(SchemaError):
        tool("noop", noop, {"type": "object", "properties": {"x": {"type": "strnig"}}})


def test_parameter_list_is_the_articles_form(registry):
    assert registry.get("course_query").parameter_list[0] == {
        "name": "course_name",
        "description": "课程名称，所需查询信息的课程名称",
        "required": True,
        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
    }
    assert registry.get("course_list").parameter_list == []
    rendered = json.dumps(registry.get("calculator").parameter_list, ensure_ascii=False)
    assert json.loads(rendered)[0]["name"] == "expression"


def test_parameter_list_marks_optional_parameters():
    async def search(query: str, limit: int = 5) -> str:
        return query

    schema = {"type": "object", "required": ["query"], "properties": {
        "query": {"type": "string", "description": "what to look for"},
        "limit": {"type": "integer", "minimum": 1}}}
    listed = {p["name"]: p for p in tool("search", search, schema).parameter_list}
    assert listed["query"]["required"] is True and listed["limit"]["required"] is False
    assert listed["limit"] == {"name": "limit", "description": "", "required": False,
                               "schema": {"type": "integer", "minimum": 1}}


def test_single_parameter_and_openai_spec(registry):
    assert registry.get("course_query").single_parameter == "course_name"
    assert registry.get("course_list").single_parameter is None
    spec = registry.get("calculator").openai_spec()
    assert spec["type"] == "function"
    assert spec["function"]["name"] == "calculator"
    assert spec["function"]["parameters"]["required"] == ["expression"]
