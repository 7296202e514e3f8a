"""The rendered ReAct prompt is Qwen's template, character for character: a template edit cannot slip through."""

from __future__ import annotations

from agent.prompts import react_prompt, tool_description
from tools.calculator import CALCULATOR
from tools.courses import CourseCatalog

QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"

# Filled in by hand from Qwen's TOOL_DESC and PROMPT_REACT (see DESIGN.md), not by calling the template.
EXPECTED_COURSE_PROMPT = (
    "Answer the following questions as best you can. You have access to the following tools:\n"
    "\n"
    "course_query: Call this tool to interact with the 课程信息数据库 API. What is the 课程信息数据库 API useful for? "
    "课程信息数据库存储有各课程的详细信息，包括目前的上线课时，每周更新次数以及每次更新的小时数。通过输入课程名称，可以返回该课程的详细信息。"
    ' Parameters: [{"name": "course_name", "description": "课程名称，所需查询信息的课程名称", "required": true, '
    '"schema": {"type": "string", "minLength": 1, "maxLength": 200}}, '
    '{"name": "fields", "description": "可选：只返回这些字段（lessons 课时, updates_per_week 每周更新次数, '
    'hours_per_update 每次更新小时）；不填则返回全部", "required": false, "schema": {"type": "array", "items": '
    '{"enum": ["lessons", "updates_per_week", "hours_per_update"]}, "minItems": 1, "maxItems": 3}}]'
    ' Format the arguments as a JSON object.\n'
    "\n"
    "Use the following format:\n"
    "\n"
    "Question: the input question you must answer\n"
    "Thought: you should always think about what to do\n"
    "Action: the action to take, should be one of [course_query]\n"
    "Action Input: the input to the action\n"
    "Observation: the result of the action\n"
    "... (this Thought/Action/Action Input/Observation can be repeated zero or more times)\n"
    "Thought: I now know the final answer\n"
    "Final Answer: the final answer to the original input question\n"
    "\n"
    "Begin!\n"
    "\n"
    "Question: 请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"
)


def course_tool():
    return CourseCatalog(db=None).tools()[0]


def test_course_prompt_equals_the_hand_filled_template():
    assert react_prompt([course_tool()], QUESTION) == EXPECTED_COURSE_PROMPT


def test_several_tools_are_joined_by_a_blank_line_and_names_by_a_comma():
    prompt = react_prompt([course_tool(), CALCULATOR], QUESTION)
    assert f"{tool_description(course_tool())}\n\n{tool_description(CALCULATOR)}\n\nUse the following format" in prompt
    assert "should be one of [course_query,calculator]\n" in prompt


def test_parameters_are_in_the_articles_list_form():
    course_name, fields = course_tool().parameter_list
    assert course_name == {"name": "course_name", "description": "课程名称，所需查询信息的课程名称", "required": True,
                           "schema": {"type": "string", "minLength": 1, "maxLength": 200}}
    assert fields["name"] == "fields" and fields["required"] is False  # the article's one argument stays enough
