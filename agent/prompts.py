"""The Qwen ReAct prompt, exactly as in Qwen's own examples, rendered from the tools enabled in a chat.

The article's copy of these templates has typos ("as best you con", a missing "tools:"); these are the originals.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

from tools.registry import Tool

TOOL_DESC = """{name_for_model}: Call this tool to interact with the {name_for_human} API. What is the {name_for_human} API useful for? {description_for_model} Parameters: {parameters} Format the arguments as a JSON object."""  # noqa: E501

PROMPT_REACT = """Answer the following questions as best you can. You have access to the following tools:

{tool_descs}

Use the following format:

Question: the input question you must answer
Thought: you should always think about what to do
Action: the action to take, should be one of [{tool_names}]
Action Input: the input to the action
Observation: the result of the action
... (this Thought/Action/Action Input/Observation can be repeated zero or more times)
Thought: I now know the final answer
Final Answer: the final answer to the original input question

Begin!

Question: {query}"""

SYSTEM_MESSAGE = (
    "You are a helpful assistant for a team, answering in a chat. "
    "Always answer in the same language as the user's question (Chinese questions get Chinese answers)."
)

REACT_STOP = "Observation:"

FORMAT_REMINDER = (
    "Your reply did not follow the format. Either call a tool with\n"
    "Action: one of [{tool_names}]\nAction Input: a JSON object with the arguments\n"
    "or, if you know the answer, reply with\nThought: I now know the final answer\nFinal Answer: the answer"
)
TOOL_FIRST_PROBLEM = "the question is about a tool's subject: a tool must be called before the final answer"
TOOL_FIRST_REMINDER = (
    "Do not answer from memory: look it up first. Call a tool with\n"
    "Action: one of [{tool_names}]\nAction Input: a JSON object with the arguments"
)
REPEATED_CALL_NOTE = (
    "(You already called {tool} with exactly these arguments; this is the same result as before. "
    "Do not call it again: use it, or give your Final Answer.)"
)
STEP_LIMIT_NOTE = "You have used all your steps. Give your Final Answer now, from what you already know."

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def tool_description(tool: Tool) -> str:
    """One tool in TOOL_DESC form, parameters in the article's list form."""
    return TOOL_DESC.format(
        name_for_model=tool.name,
        name_for_human=tool.human_name,
        description_for_model=tool.description,
        parameters=json.dumps(tool.parameter_list, ensure_ascii=False),
    )


def react_prompt(tools: Sequence[Tool], query: str) -> str:
    """The full ReAct prompt for `query` with `tools` (descriptions joined by a blank line, names by ',')."""
    return PROMPT_REACT.format(
        tool_descs="\n\n".join(tool_description(tool) for tool in tools),
        tool_names=",".join(tool.name for tool in tools),
        query=query,
    )


def format_reminder(tools: Sequence[Tool]) -> str:
    """What the model is told after a reply that fits neither an action nor a final answer."""
    return FORMAT_REMINDER.format(tool_names=",".join(tool.name for tool in tools))


def tool_first_reminder(tools: Sequence[Tool]) -> str:
    """What the model is told when it answered before calling a tool the question required."""
    return TOOL_FIRST_REMINDER.format(tool_names=",".join(tool.name for tool in tools))


def is_chinese(text: str) -> bool:
    """Whether a question is written in Chinese (or another CJK script): apologies follow its language."""
    return bool(_CJK.search(text))


def apology(question: str, reason: str) -> str:
    """A short, honest answer for a turn that could not finish; `reason` is 'steps', 'format' or 'error'."""
    chinese = is_chinese(question)
    texts = {
        "steps": ("抱歉，我在允许的步骤内没能得出答案。请换个说法或把问题拆小一点再问。",
                  "Sorry, I could not reach an answer within my step limit. Try rephrasing or splitting the question."),
        "format": ("抱歉，我这次没能整理出答案（发送 /trace 可查看原因）。请换个说法再问一次。",
                   "Sorry, I could not put an answer together this time (send /trace to see why). "
                   "Please ask again, perhaps in other words."),
        "error": ("抱歉，模型暂时出了问题，这次没能回答。请稍后再试。",
                  "Sorry, the model ran into a problem and could not answer. Please try again in a moment."),
        "timeout": ("抱歉，这次思考时间太长，已停止。请稍后再试或把问题问得简单些。",
                    "Sorry, that took too long and was stopped. Please try again, or ask something simpler."),
    }
    return texts[reason][0 if chinese else 1]
