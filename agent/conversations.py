"""How each agent mode talks to the model: what a request holds, how a reply is read, where results go.

ReAct keeps the whole trace inside one assistant message that the backend continues (`Observation: …` then
`Thought:`); native mode appends `tool` messages after the assistant's tool calls, as the chat template expects.
Each request also carries the grammar of the reply it expects (agent/grammar.py), when the turn is constrained:
the conversation knows where the trace stands (a fresh step, one after `Thought:`, the answer after
`Final Answer:`), whether a tool call is still required before the answer, which tools are held to the entities
the question names (agent/entities.py), and which numbers an answer may write (`answer_numbers`).

Once the search has ended (a repeated call, the tool budget spent, the step limit) the conversation asks for the
answer (`add_final_request`): in ReAct the trace is continued at `Final Answer:` (under the grammar, nothing else
can follow), in native mode tools are no longer offered and a note asks for the answer; either way the next reply
is read as the answer, whatever it holds.

Text that is data (the question, the history, tool results) enters a prompt defused (agent/untrusted.py): a user
cannot write a step of the trace, or a turn of the chat template, into it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from agent.grammar import (Grammar, GrammarLimits, native_answer_grammar, native_grammar, react_final_grammar,
                           react_step_grammar)
from agent.images import Picture, with_pictures
from agent.llm.base import Completion, Message, ModelRequest
from agent.native import native_answer_so_far, parse_native, strip_thinking
from agent.prompts import (ANSWER_NOW_NOTE, REACT_STOP, REACT_STOPS, STEP_LIMIT_NOTE, react_instructions, react_prompt,
                           react_question, system_message)
from agent.react import final_answer_so_far, parse_react, plain_answer_so_far, segments, strip_half_stop
from agent.steps import Decision, FinalAnswer, FormatProblem, ToolRequest
from agent.untrusted import defuse
from tools.registry import Tool


@dataclass(frozen=True)
class TurnRules:
    """How a turn is decoded: under a grammar (with these limits) or not, which tools, if any, it must call one of
    before its final answer (the first-step policy: the tools that know an entity the question names), and the
    tools as its grammar holds them (linked to those entities; the prompt shows the tools unchanged)."""

    grammar: GrammarLimits | None = None
    required_tools: tuple[str, ...] = ()
    react_layout: str = "system"  # where the ReAct instructions go (agent/prompts.py: REACT_LAYOUTS)
    held_tools: tuple[Tool, ...] = ()  # replace the turn's tools of the same name in grammars
    left_out: tuple[str, ...] = ()  # tools the grammars leave out (the prompt still shows them)
    persona: str = ""  # the chat's persona, added to the system message (agent/prompts.py: `system_message`)


class Conversation(Protocol):
    """One turn's exchange with the model, in one mode."""

    mode: str
    tool_required: bool  # a tool call must come before the final answer (cleared by the first call)
    first_tools: list[Tool]  # the tools that call may use
    answer_requested: bool  # the search has ended: the next reply is the answer
    answer_numbers: tuple[str, ...] | None  # the numbers an answer may write under the grammar (None: any)

    def request(self) -> ModelRequest:
        """What the next model call gets."""

    def read(self, completion: Completion) -> list[ToolRequest] | Decision:
        """What the reply asks for."""

    def add_results(self, completion: Completion, results: Sequence[tuple[ToolRequest, str]]) -> None:
        """Append the tool calls of `completion` and their observations."""

    def add_reminder(self, completion: Completion, reminder: str) -> None:
        """Append a reply that broke the format, and what the format is."""

    def add_final_request(self, note: str | None = STEP_LIMIT_NOTE) -> None:
        """Ask for the final answer now, telling the model why (`note`: the step limit; None: the search ended)."""

    def read_final(self, completion: Completion) -> str:
        """The answer in a reply to `add_final_request`, or '' if there is none."""

    def answer_so_far(self, text: str) -> str | None:
        """The final answer in a reply still being generated, as far as it is sure; None if it is none (yet)."""


class ReactConversation:
    """The Qwen ReAct text format; without tools, a plain chat."""

    mode = "react"

    def __init__(self, history: Sequence[Message], question: str, tools: Sequence[Tool],
                 rules: TurnRules = TurnRules(), pictures: Sequence[Picture] = ()):
        self.tools = list(tools)
        self.limits = rules.grammar if self.tools else None
        self.grammar_tools = _held(self.tools, rules)
        self.first_tools = [tool for tool in self.grammar_tools if tool.name in rules.required_tools]
        self.tool_required = bool(self.first_tools)
        self.messages = _with_question_pictures(
            _react_messages(_defused(history), defuse(question), self.tools, rules.react_layout,
                            system_message(rules.persona)), pictures)
        self.trace = ""  # the assistant's text so far; the backend continues it
        self.answer_requested = False
        self.answer_numbers: tuple[str, ...] | None = None

    def request(self) -> ModelRequest:
        continuing = [{"role": "assistant", "content": self.trace}] if self.trace else []
        return ModelRequest(self.messages + continuing, REACT_STOPS if self.tools else (), None, self._grammar())

    def _grammar(self) -> Grammar | None:
        if self.limits is None:
            return None
        if self.answer_requested:
            return react_final_grammar(self.limits, self.answer_numbers)
        tools = self.first_tools if self.tool_required else self.grammar_tools
        return react_step_grammar(tools, continuing=bool(self.trace), tool_required=self.tool_required,
                                  limits=self.limits, numbers=self.answer_numbers)

    def read(self, completion: Completion) -> list[ToolRequest] | Decision:
        if self.answer_requested:
            return _answer(self.read_final(completion))
        if not self.tools:
            return _plain_answer(completion.text)
        decision = parse_react(completion.text, self.tools)
        return [decision] if isinstance(decision, ToolRequest) else decision

    def add_results(self, completion: Completion, results: Sequence[tuple[ToolRequest, str]]) -> None:
        request, observation = results[0]
        self.tool_required = False
        self.trace += f"{request.trace_text}\n{REACT_STOP} {defuse(observation)}\nThought:"

    def add_reminder(self, completion: Completion, reminder: str) -> None:
        if self.answer_requested:  # the reply was the answer: the reminder follows it, and the answer is asked again
            self.trace += f" {completion.text.strip()}\n{REACT_STOP} {reminder}\nThought:{_ANSWER_NOW}"
            return
        self.trace += f"{completion.text.rstrip()}\n{REACT_STOP} {reminder}\nThought:"

    def add_final_request(self, note: str | None = STEP_LIMIT_NOTE) -> None:
        self.answer_requested = True
        # The trace ends with the last Observation and an open "Thought:". The note joins that Observation, and
        # the Thought is completed, so the model continues the format where its Final Answer goes. Without a note
        # (a repeated call: the search ended) the Thought is simply completed.
        opened = "\nThought:"
        if note is None and self.trace.endswith(opened):
            self.trace += _ANSWER_NOW
            return
        if self.trace.endswith(opened):
            self.trace = self.trace[:-len(opened)] + f"\n({note})"
        else:  # no open Thought (no step was taken): the note is the observation
            self.trace = f"{self.trace.rstrip()}\n{REACT_STOP} {note}".lstrip()
        self.trace += f"\nThought:{_ANSWER_NOW}"

    def read_final(self, completion: Completion) -> str:
        # The trace ends at "Final Answer:", so the reply's lead is the answer; a model that starts the step over
        # ("Thought: …\nFinal Answer: 200") gives it after its own marker.
        text = strip_half_stop(completion.text.split(f"\n{REACT_STOP}")[0])
        lead, parts = segments(text)
        return next((p.text for p in parts if p.marker == "final answer"), "") or lead

    def answer_so_far(self, text: str) -> str | None:
        if self.answer_requested or not self.tools:
            return plain_answer_so_far(text, lead_first=self.answer_requested)
        return final_answer_so_far(text)


class NativeConversation:
    """Tool calls through the chat template (`tools=`), results as `tool` messages."""

    mode = "native"

    def __init__(self, history: Sequence[Message], question: str, tools: Sequence[Tool],
                 rules: TurnRules = TurnRules(), pictures: Sequence[Picture] = ()):
        self.tools = list(tools)
        self.offer_tools = bool(self.tools)
        self.limits = rules.grammar
        self.grammar_tools = _held(self.tools, rules)
        self.first_tools = [tool for tool in self.grammar_tools if tool.name in rules.required_tools]
        self.tool_required = bool(self.first_tools)
        self.answer_requested = False
        self.answer_numbers: tuple[str, ...] | None = None
        self.messages: list[Message] = [{"role": "system", "content": system_message(rules.persona)},
                                        *_defused(history),
                                        {"role": "user", "content": with_pictures(defuse(question), pictures)}]

    def request(self) -> ModelRequest:
        specs = [tool.openai_spec() for tool in self.tools] if self.offer_tools else None
        grammar = None
        if specs and self.limits is not None:
            tools = self.first_tools if self.tool_required else self.grammar_tools
            grammar = native_grammar(tools, tool_required=self.tool_required, limits=self.limits,
                                     numbers=self.answer_numbers)
        elif self.answer_requested and self.limits is not None:
            grammar = native_answer_grammar(self.limits, self.answer_numbers)
        return ModelRequest(list(self.messages), (), specs, grammar)

    def read(self, completion: Completion) -> list[ToolRequest] | Decision:
        if self.answer_requested:
            return _answer(self.read_final(completion))
        return parse_native(completion, self.tools)

    def add_results(self, completion: Completion, results: Sequence[tuple[ToolRequest, str]]) -> None:
        self.tool_required = False
        text, _ = strip_thinking(completion.text)
        content = text.split("<tool_call>")[0].strip()
        calls = [{"id": r.call_id or f"call_{i}", "type": "function",
                  "function": {"name": r.tool, "arguments": r.arguments if r.arguments is not None else r.raw_input}}
                 for i, (r, _) in enumerate(results)]
        self.messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        for call, (request, observation) in zip(calls, results):
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "name": request.tool,
                                  "content": defuse(observation)})

    def add_reminder(self, completion: Completion, reminder: str) -> None:
        self.messages.append({"role": "assistant", "content": completion.text})
        self.messages.append({"role": "user", "content": reminder})

    def add_final_request(self, note: str | None = STEP_LIMIT_NOTE) -> None:
        self.offer_tools = False
        self.answer_requested = True
        self.messages.append({"role": "user", "content": note or ANSWER_NOW_NOTE})

    def read_final(self, completion: Completion) -> str:
        text, _ = strip_thinking(completion.text)
        return text.split("<tool_call>")[0].strip()

    def answer_so_far(self, text: str) -> str | None:
        return native_answer_so_far(text)


def _react_messages(history: Sequence[Message], question: str, tools: Sequence[Tool], layout: str,
                    system: str) -> list[Message]:
    """The messages of a ReAct turn, under the `system` message's own text. In the "system" layout the instructions
    and tools follow it in the system message and every question, past ones too, reads `Question: …`: the prompt
    then grows only at its end from one turn to the next, so its start stays cached; "question" is Qwen's examples
    exactly."""
    if not tools:
        return [{"role": "system", "content": system}, *history, {"role": "user", "content": question}]
    if layout == "question":
        return [{"role": "system", "content": system}, *history,
                {"role": "user", "content": react_prompt(tools, question)}]
    past = [{**m, "content": react_question(m["content"])} if m["role"] == "user" else m for m in history]
    return [{"role": "system", "content": f"{system}\n\n{react_instructions(tools)}"}, *past,
            {"role": "user", "content": react_question(question)}]


# The end of a ReAct trace that asks for the answer (after "Thought:").
_ANSWER_NOW = " I now know the final answer\nFinal Answer:"


def _held(tools: Sequence[Tool], rules: TurnRules) -> list[Tool]:
    """The grammar's tools: `tools` with each held one in its place, those left out dropped (never all of them)."""
    by_name = {tool.name: tool for tool in rules.held_tools}
    held = [by_name.get(tool.name, tool) for tool in tools if tool.name not in rules.left_out]
    return held or [by_name.get(tool.name, tool) for tool in tools]


def _answer(text: str) -> Decision:
    """The reply to a request for the answer: the answer, or nothing usable."""
    return FinalAnswer("", text) if text else FormatProblem("the reply to the request for the answer is empty")

def _with_question_pictures(messages: list[Message], pictures: Sequence[Picture]) -> list[Message]:
    """The turn's messages with its pictures in the question's message, the last one (only this turn's question
    carries pictures: the history keeps a note of them, not the pictures)."""
    if not pictures:
        return messages
    return [*messages[:-1], {**messages[-1], "content": with_pictures(messages[-1]["content"], pictures)}]


def _defused(history: Sequence[Message]) -> list[Message]:
    """The history as data: each message's text defused (an earlier answer may quote what a user wrote)."""
    return [{**message, "content": defuse(str(message.get("content") or ""))} for message in history]


def _plain_answer(text: str) -> Decision:
    lead, parts = segments(text)
    answer = next((p.text for p in parts if p.marker == "final answer"), "") or lead or text.strip()
    return FinalAnswer("", answer) if answer else FormatProblem("the reply is empty")


def start_conversation(mode: str, history: Sequence[Message], question: str, tools: Sequence[Tool],
                       rules: TurnRules = TurnRules(), pictures: Sequence[Picture] = ()) -> Conversation:
    """The conversation for `mode` ('react' or 'native'); `pictures` go with the question (to a model that sees)."""
    kind = NativeConversation if mode == "native" else ReactConversation
    return kind(history, question, tools, rules, pictures)


def arguments_key(tool: str, arguments: Any) -> str:
    """A canonical form of a call, to notice the same call made twice."""
    return tool + ":" + json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)
