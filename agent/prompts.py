"""The Qwen ReAct prompt, exactly as in Qwen's own examples, rendered from the tools enabled in a chat.

The article's copy of these templates has typos ("as best you con", a missing "tools:"); these are the originals.
Two layouts place the same text (REACT_LAYOUT): Qwen's examples put the instructions and the tools in the
question's message, after the history ("question"); "system" puts them in the system message and leaves
"Question: …" to the user, so every chat's prompt starts with the same tokens and a chat's earlier turns stay a
prefix of its next one (both cached by the local engine and by llama.cpp's servers).
"""

from __future__ import annotations

import json
from typing import Sequence

from tools.registry import Tool

TOOL_DESC = """{name_for_model}: Call this tool to interact with the {name_for_human} API. What is the {name_for_human} API useful for? {description_for_model} Parameters: {parameters} Format the arguments as a JSON object."""  # noqa: E501

# Qwen's PROMPT_REACT is these two joined by a blank line.
REACT_INSTRUCTIONS = """Answer the following questions as best you can. You have access to the following tools:

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

Begin!"""
REACT_QUESTION = "Question: {query}"
REACT_LAYOUTS = ("system", "question")

SYSTEM_MESSAGE = (
    "You are a helpful assistant for a team, answering in a chat. "
    "Always answer in the same language as the user's question (Chinese questions get Chinese answers)."
)

# A chat's persona (/persona, DEFAULT_PERSONA) is added to the system message, after the assistant's own line and
# before the ReAct instructions: it may change the tone and the role, never the format or the tool rules.
PERSONA_NOTE = (
    "Persona for this chat, set by its admins. It shapes your tone and role only: the answer format and the rules "
    "for tools below still apply exactly as written.\n{persona}"
)

REACT_STOP = "Observation:"
# A model that starts a new "Question:" line has ended its step and begun inventing the next exchange (small
# models do it right after their answer): the reply ends there, as at "Observation:".
REACT_NEW_QUESTION = "\nQuestion:"
REACT_STOPS = (REACT_STOP, REACT_NEW_QUESTION)

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
# Recorded as the observation of a repeated call (the trace shows it): the call is not run again, and the model is
# asked for its answer instead (agent/loop.py).
REPEATED_CALL_NOTE = (
    "(You already called {tool} with exactly these arguments: not run again; the answer is asked for now.)"
)
STEP_LIMIT_NOTE = "You have used all your steps. Give your Final Answer now, from what you already know."
# Native mode's request for the answer once the search has ended (a repeated call, the tool budget spent).
ANSWER_NOW_NOTE = "You have the results you need above. Give your final answer now, from what you observed."
# What the safety nets tell the model when they turn an answer back (agent/review.py).
UNGROUNDED_REMINDER = (
    "Your Final Answer has numbers that nothing you observed holds: {numbers}. The observations hold: {summary}. "
    "Give your Final Answer again using only those numbers (or a calculator result), or say that you could not "
    "find it."
)
GARBAGE_REMINDER = (
    "Your Final Answer was not an answer ({problem}). Give your Final Answer again in one short sentence, from the "
    "observations, or say that you could not find it."
)


def system_message(persona: str = "") -> str:
    """The system message's own text: the assistant's line, and the chat's persona when it has one."""
    persona = persona.strip()
    return f"{SYSTEM_MESSAGE}\n\n{PERSONA_NOTE.format(persona=persona)}" if persona else SYSTEM_MESSAGE


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
    return f"{react_instructions(tools)}\n\n{react_question(query)}"


def react_instructions(tools: Sequence[Tool]) -> str:
    """The ReAct prompt up to its question: the format and `tools`, the same for every question."""
    return REACT_INSTRUCTIONS.format(
        tool_descs="\n\n".join(tool_description(tool) for tool in tools),
        tool_names=",".join(tool.name for tool in tools),
    )


def react_question(query: str) -> str:
    """The ReAct prompt's last line: the question."""
    return REACT_QUESTION.format(query=query)


def format_reminder(tools: Sequence[Tool]) -> str:
    """What the model is told after a reply that fits neither an action nor a final answer."""
    return FORMAT_REMINDER.format(tool_names=",".join(tool.name for tool in tools))


def tool_first_reminder(tools: Sequence[Tool]) -> str:
    """What the model is told when it answered before calling a tool the question required."""
    return TOOL_FIRST_REMINDER.format(tool_names=",".join(tool.name for tool in tools))


def model_notes() -> tuple[str, ...]:
    """Every note the loop writes for the model, as templates: none may reach a user (agent/garbage.py)."""
    return (REPEATED_CALL_NOTE, STEP_LIMIT_NOTE, ANSWER_NOW_NOTE, FORMAT_REMINDER, TOOL_FIRST_REMINDER,
            UNGROUNDED_REMINDER, GARBAGE_REMINDER)
