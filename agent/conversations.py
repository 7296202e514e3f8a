"""How each agent mode talks to the model: what a request holds, how a reply is read, where results go.

ReAct keeps the whole trace inside one assistant message that the backend continues (`Observation: …` then
`Thought:`); native mode appends `tool` messages after the assistant's tool calls, as the chat template expects.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, Sequence

from agent.llm.base import Completion, Message
from agent.native import native_answer_so_far, parse_native, strip_thinking
from agent.prompts import REACT_STOP, STEP_LIMIT_NOTE, SYSTEM_MESSAGE, react_prompt
from agent.react import final_answer_so_far, parse_react, plain_answer_so_far, segments
from agent.steps import Decision, FinalAnswer, FormatProblem, ToolRequest
from tools.registry import Tool

class Conversation(Protocol):
    """One turn's exchange with the model, in one mode."""

    mode: str

    def request(self) -> tuple[list[Message], tuple[str, ...], list[dict[str, Any]] | None]:
        """(messages, stop strings, tool specs) for the next model call."""

    def read(self, completion: Completion) -> list[ToolRequest] | Decision:
        """What the reply asks for."""

    def add_results(self, completion: Completion, results: Sequence[tuple[ToolRequest, str]]) -> None:
        """Append the tool calls of `completion` and their observations."""

    def add_reminder(self, completion: Completion, reminder: str) -> None:
        """Append a reply that broke the format, and what the format is."""

    def add_final_request(self) -> None:
        """Ask for the final answer now (the step limit is reached)."""

    def read_final(self, completion: Completion) -> str:
        """The answer in a reply to `add_final_request`, or '' if there is none."""

    def answer_so_far(self, text: str) -> str | None:
        """The final answer in a reply still being generated, as far as it is sure; None if it is none (yet)."""


class ReactConversation:
    """The Qwen ReAct text format; without tools, a plain chat."""

    mode = "react"

    def __init__(self, history: Sequence[Message], question: str, tools: Sequence[Tool]):
        self.tools = list(tools)
        prompt = react_prompt(self.tools, question) if self.tools else question
        self.messages: list[Message] = [{"role": "system", "content": SYSTEM_MESSAGE}, *history,
                                        {"role": "user", "content": prompt}]
        self.trace = ""  # the assistant's text so far; the backend continues it
        self.answer_requested = False  # the step limit is reached: the next reply is the answer

    def request(self) -> tuple[list[Message], tuple[str, ...], None]:
        continuing = [{"role": "assistant", "content": self.trace}] if self.trace else []
        return self.messages + continuing, ((REACT_STOP,) if self.tools else ()), None

    def read(self, completion: Completion) -> list[ToolRequest] | Decision:
        if not self.tools:
            return _plain_answer(completion.text)
        decision = parse_react(completion.text, self.tools)
        return [decision] if isinstance(decision, ToolRequest) else decision

    def add_results(self, completion: Completion, results: Sequence[tuple[ToolRequest, str]]) -> None:
        request, observation = results[0]
        self.trace += f"{request.trace_text}\n{REACT_STOP} {observation}\nThought:"

    def add_reminder(self, completion: Completion, reminder: str) -> None:
        self.trace += f"{completion.text.rstrip()}\n{REACT_STOP} {reminder}\nThought:"

    def add_final_request(self) -> None:
        self.answer_requested = True
        # The trace ends with the last Observation and an open "Thought:". The note joins that Observation, and
        # the Thought is completed, so the model continues the format where its Final Answer goes.
        opened = "\nThought:"
        if self.trace.endswith(opened):
            self.trace = self.trace[:-len(opened)] + f"\n({STEP_LIMIT_NOTE})"
        else:  # no open Thought (no step was taken): the note is the observation
            self.trace = f"{self.trace.rstrip()}\n{REACT_STOP} {STEP_LIMIT_NOTE}".lstrip()
        self.trace += "\nThought: I now know the final answer\nFinal Answer:"

    def read_final(self, completion: Completion) -> str:
        lead, parts = segments(completion.text)
        return lead or next((p.text for p in parts if p.marker == "final answer"), "")

    def answer_so_far(self, text: str) -> str | None:
        if self.answer_requested or not self.tools:
            return plain_answer_so_far(text, lead_first=self.answer_requested)
        return final_answer_so_far(text)


class NativeConversation:
    """Tool calls through the chat template (`tools=`), results as `tool` messages."""

    mode = "native"

    def __init__(self, history: Sequence[Message], question: str, tools: Sequence[Tool]):
        self.tools = list(tools)
        self.offer_tools = bool(self.tools)
        self.messages: list[Message] = [{"role": "system", "content": SYSTEM_MESSAGE}, *history,
                                        {"role": "user", "content": question}]

    def request(self) -> tuple[list[Message], tuple[str, ...], list[dict[str, Any]] | None]:
        specs = [tool.openai_spec() for tool in self.tools] if self.offer_tools else None
        return list(self.messages), (), specs

    def read(self, completion: Completion) -> list[ToolRequest] | Decision:
        return parse_native(completion, self.tools)

    def add_results(self, completion: Completion, results: Sequence[tuple[ToolRequest, str]]) -> None:
        text, _ = strip_thinking(completion.text)
        content = text.split("<tool_call>")[0].strip()
        calls = [{"id": r.call_id or f"call_{i}", "type": "function",
                  "function": {"name": r.tool, "arguments": r.arguments if r.arguments is not None else r.raw_input}}
                 for i, (r, _) in enumerate(results)]
        self.messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        for call, (request, observation) in zip(calls, results):
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "name": request.tool,
                                  "content": observation})

    def add_reminder(self, completion: Completion, reminder: str) -> None:
        self.messages.append({"role": "assistant", "content": completion.text})
        self.messages.append({"role": "user", "content": reminder})

    def add_final_request(self) -> None:
        self.offer_tools = False
        self.messages.append({"role": "user", "content": STEP_LIMIT_NOTE})

    def read_final(self, completion: Completion) -> str:
        text, _ = strip_thinking(completion.text)
        return text.split("<tool_call>")[0].strip()

    def answer_so_far(self, text: str) -> str | None:
        return native_answer_so_far(text)


def _plain_answer(text: str) -> Decision:
    lead, parts = segments(text)
    answer = next((p.text for p in parts if p.marker == "final answer"), "") or lead or text.strip()
    return FinalAnswer("", answer) if answer else FormatProblem("the reply is empty")


def start_conversation(mode: str, history: Sequence[Message], question: str, tools: Sequence[Tool]) -> Conversation:
    """The conversation for `mode` ('react' or 'native')."""
    kind = NativeConversation if mode == "native" else ReactConversation
    return kind(history, question, tools)


def arguments_key(tool: str, arguments: Any) -> str:
    """A canonical form of a call, to notice the same call made twice."""
    return tool + ":" + json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)
