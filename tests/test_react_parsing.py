"""Pure parsing of ReAct replies and native tool calls: every failure shape real models produce."""

from __future__ import annotations

import pytest

from agent.llm.base import Completion, ToolCall
from agent.native import native_answer_so_far, parse_native
from agent.react import final_answer_so_far, parse_react, plain_answer_so_far
from agent.steps import FinalAnswer, FormatProblem, ToolRequest
from tools.calculator import CALCULATOR
from tools.registry import Tool


async def _noop(**kwargs) -> str:
    return ""


COURSE = Tool("course_query", "课程信息数据库", "courses", {
    "type": "object", "properties": {"course_name": {"type": "string"}}, "required": ["course_name"]}, _noop)
LISTING = Tool("course_list", "课程列表", "all courses", {"type": "object", "properties": {}}, _noop)
TOOLS = [COURSE, LISTING, CALCULATOR]


def request(text: str) -> ToolRequest:
    decision = parse_react(text, TOOLS)
    assert isinstance(decision, ToolRequest), decision
    return decision


def test_qwen_trace_from_the_docs():
    decision = request('Thought: 我应该使用课程信息数据库。\nAction: course_query\nAction Input: {"course_name": "大模型技术实战"}\n')
    assert decision.tool == "course_query"
    assert decision.arguments == {"course_name": "大模型技术实战"}
    assert decision.thought == "我应该使用课程信息数据库。"
    assert decision.input_error is None


@pytest.mark.parametrize("tail", ["\nObserv", "\nObservation", "\nO", "\nObservation:", "\nObservation: 200 (made up)"])
def test_half_or_whole_stop_word_at_the_end(tail):
    decision = request('Thought: x\nAction: course_query\nAction Input: {"course_name": "大模型"}' + tail)
    assert decision.arguments == {"course_name": "大模型"}
    assert not decision.trace_text.endswith(("O", "Observ", "Observation"))


def test_missing_action_input_for_a_tool_that_needs_arguments():
    decision = request("Thought: x\nAction: course_query\n")
    assert decision.arguments is None
    assert "Action Input is missing" in decision.input_error


def test_missing_action_input_for_a_tool_without_parameters_is_fine():
    decision = request("Thought: list them\nAction: course_list\n")
    assert decision.tool == "course_list" and decision.arguments == {}


def test_action_before_final_answer_runs_the_action():
    decision = request('Thought: x\nAction: course_query\nAction Input: {"course_name": "a"}\nFinal Answer: 200')
    assert decision.tool == "course_query"
    assert "Final Answer" not in decision.trace_text


def test_final_answer_before_action_is_the_answer():
    decision = parse_react("Thought: I know\nFinal Answer: 200节\nAction: course_query\nAction Input: {}", TOOLS)
    assert decision == FinalAnswer("I know", "200节")


def test_json_in_a_code_fence():
    decision = request('Thought: x\nAction: course_query\nAction Input: ```json\n{"course_name": "深度学习实战"}\n```\n')
    assert decision.arguments == {"course_name": "深度学习实战"}


@pytest.mark.parametrize("raw", ["{'course_name': '机器学习实战'}", '{"course_name": "机器学习实战",}',
                                 "{course_name: '机器学习实战'}", '{"course_name": "机器学习实战"} // the course'])
def test_json5_style_input(raw):
    assert request(f"Thought: x\nAction: course_query\nAction Input: {raw}\n").arguments == {"course_name": "机器学习实战"}


@pytest.mark.parametrize("raw", ["机器学习实战", '"机器学习实战"', "'机器学习实战'"])
def test_plain_string_for_a_one_parameter_tool(raw):
    assert request(f"Thought: x\nAction: course_query\nAction Input: {raw}\n").arguments == {"course_name": "机器学习实战"}


def test_not_json_for_a_tool_with_structure_is_an_input_error():
    decision = request("Thought: x\nAction: course_query\nAction Input: {course_name = 大模型\n")
    assert decision.arguments is None and "not valid JSON" in decision.input_error


def test_json_followed_by_words():
    decision = request('Thought: x\nAction: calculator\nAction Input: {"expression": "3*2"} (hours per week)\n')
    assert decision.arguments == {"expression": "3*2"}


@pytest.mark.parametrize("name", ["course query", "Course_Query", "`course_query`", "[course_query]", " course-query "])
def test_tool_name_with_spaces_or_odd_case(name):
    assert request(f'Thought: x\nAction: {name}\nAction Input: {{"course_name": "a"}}\n').tool == "course_query"


def test_unknown_tool_name_is_kept_for_the_registry_to_refuse():
    decision = request('Thought: x\nAction: web_search\nAction Input: {"q": "a"}\n')
    assert decision.tool == "web_search"


def test_inline_call_syntax():
    assert request('Thought: x\nAction: course_query({"course_name": "AI数据分析"})\n').arguments == {"course_name": "AI数据分析"}


def test_many_actions_take_the_first():
    decision = request('Thought: x\nAction: course_query\nAction Input: {"course_name": "a"}\n'
                       'Action: calculator\nAction Input: {"expression": "1+1"}\n')
    assert decision.tool == "course_query" and "calculator" not in decision.trace_text


def test_bold_markers_and_full_width_colon():
    decision = request('**Thought:** x\n**Action:** course_query\nAction Input：{"course_name": "a"}\n')
    assert decision.arguments == {"course_name": "a"}


def test_no_final_answer_at_all_is_a_format_problem_with_usable_text():
    decision = parse_react("大模型技术实战一共200节。", TOOLS)
    assert isinstance(decision, FormatProblem) and decision.usable_text == "大模型技术实战一共200节。"


@pytest.mark.parametrize("reply", ["", "   \n ", "Thought:", "\nObserv"])
def test_empty_reply_is_a_format_problem_without_usable_text(reply):
    decision = parse_react(reply, TOOLS)
    assert isinstance(decision, FormatProblem) and decision.usable_text == ""


def test_empty_final_answer():
    assert isinstance(parse_react("Thought: x\nFinal Answer:", TOOLS), FormatProblem)


def test_multiline_final_answer():
    assert parse_react("Thought: ok\nFinal Answer: line one\nline two", TOOLS).answer == "line one\nline two"


def test_huge_action_input_is_refused_not_parsed():
    decision = request("Thought: x\nAction: course_query\nAction Input: " + '{"course_name": "' + "a" * 30_000 + '"}')
    assert decision.arguments is None and "longer than" in decision.input_error


def test_deeply_nested_input_is_refused():
    nested = '{"course_name": ' + "[" * 50 + "1" + "]" * 50 + "}"
    decision = request(f"Thought: x\nAction: course_query\nAction Input: {nested}\n")
    assert decision.arguments is None and "nest" in decision.input_error


# --- native tool calls ------------------------------------------------------------------------------------------


def test_native_tool_call_block():
    text = '<tool_call>\n{"name": "course_query", "arguments": {"course_name": "大模型技术实战"}}\n</tool_call>'
    [call] = parse_native(Completion(text), TOOLS)
    assert (call.tool, call.arguments) == ("course_query", {"course_name": "大模型技术实战"})


def test_native_tool_call_inside_thinking_is_ignored():
    text = ('<think>maybe <tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call></think>'
            "大模型技术实战有200节。")
    assert parse_native(Completion(text), TOOLS) == FinalAnswer(
        'maybe <tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>', "大模型技术实战有200节。")


def test_native_several_calls_and_unclosed_last_block():
    text = ('<tool_call>{"name": "course_query", "arguments": {"course_name": "a"}}</tool_call>\n'
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}')
    calls = parse_native(Completion(text), TOOLS)
    assert [(c.tool, c.arguments) for c in calls] == [("course_query", {"course_name": "a"}),
                                                      ("calculator", {"expression": "2*3"})]


def test_native_malformed_call_is_an_input_error():
    [call] = parse_native(Completion("<tool_call>{not json at all</tool_call>"), TOOLS)
    assert call.arguments is None and "not valid JSON" in call.input_error


def test_native_server_parsed_calls():
    completion = Completion("", tool_calls=(ToolCall("calculator", '{"expression": "3*2"}', "id1"),))
    [call] = parse_native(completion, TOOLS)
    assert (call.tool, call.arguments, call.call_id) == ("calculator", {"expression": "3*2"}, "id1")


def test_native_empty_reply():
    assert isinstance(parse_native(Completion("<think>hmm</think>"), TOOLS), FormatProblem)


# --- replies still being generated (what streams to the user) ------------------------------------------------

FULL = 'Thought: 我知道了\nFinal Answer: 一共 **200** 节。\n第二段。'


@pytest.mark.parametrize("cut, shown", [
    (len("Thought: 我知道了\nFin"), None),  # a marker half written: nothing yet
    (len("Thought: 我知道了\nFinal Answer"), None),
    (len("Thought: 我知道了\nFinal Answer: 一"), "一"),
    (len("Thought: 我知道了\nFinal Answer: 一共 **200** 节。\n"), "一共 **200** 节。"),
    (len(FULL), "一共 **200** 节。\n第二段。"),
])
def test_the_final_answer_shows_as_it_is_written_and_never_the_thought(cut, shown):
    assert final_answer_so_far(FULL[:cut]) == shown


def test_an_answer_line_that_might_become_a_marker_waits_and_the_stop_word_never_shows():
    text = "Final Answer: 200节\nObs"
    assert final_answer_so_far(text) == "200节"  # "Obs" may be the stop word: held back
    assert final_answer_so_far(text + "ervation: invented") == "200节"
    assert final_answer_so_far("Final Answer: 200节\nThe end") == "200节\nThe end"  # "The" is no marker


def test_a_reply_that_acts_first_shows_no_answer_even_with_a_final_answer_after():
    assert final_answer_so_far('Thought: x\nAction: course_query\nAction Input: {}\nFinal Answer: 100') is None
    assert final_answer_so_far("Thought: still thinking about it") is None


def test_the_whole_reply_streams_to_what_parse_react_answers():
    for reply in (FULL, "Final Answer: 200", "Thought: ok\n**Final Answer:** 大模型技术实战有200节"):
        decision = parse_react(reply, TOOLS)
        assert isinstance(decision, FinalAnswer) and final_answer_so_far(reply) == decision.answer


def test_plain_answers_and_native_answers_so_far():
    assert plain_answer_so_far("你好，我") == "你好，我"
    assert plain_answer_so_far(" 200节\nThought: x", lead_first=True) == "200节"
    assert native_answer_so_far("<think>hmm</think>一共200节") == "一共200节"
    assert native_answer_so_far("<think>still thinking") is None
    assert native_answer_so_far("让我查一下。<to") == "让我查一下。"  # may be a <tool_call> starting
    assert native_answer_so_far('让我查一下。<tool_call>{"name"') is None
