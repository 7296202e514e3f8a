"""The agent: one bounded loop from a question to an answer, recording a typed step per iteration.

Model calls are awaited (the model works elsewhere: its own thread, or a server); tools run on the event loop
through the registry, which turns every tool failure into an observation. Errors of the model's making go back to
the model; failures it cannot fix (the backend failing, a time-out, /cancel) propagate as `LLMError`s, after the
failed turn's trace is stored for /stats. Only a finished turn reaches the history.

The same safety nets hold in both modes and on every backend: a question naming known entities looks them up
first, held to them (agent/entities.py); a repeated call, or a spent tool budget, ends the search and asks for the
answer; every final answer is reviewed before a user reads it (agent/review.py: garbage cut, numbers grounded).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Sequence

from agent.conversations import Conversation, TurnRules, arguments_key, start_conversation
from agent.entities import Entities, link_entities
from agent.errors import LLMCancelled, LLMError, LLMTimeout, TurnNotSaved
from agent.events import AnswerText, EventSink, ModelCall, ToolFinished, ToolStarted, TurnEvent
from agent.garbage import streamable
from agent.grammar import GrammarLimits
from agent.grounding import Grounds
from agent.images import Picture
from agent.history import history_messages
from agent.llm.base import LLM, MAX_NEW_TOKENS, CancelToken, Completion, Message, TextSink
from agent.memory import HistoryView, Memory, Session, TurnRecord, utc_now
from agent.apologies import apology, language_of
from agent.options import ChatOptions
from agent.prompts import REPEATED_CALL_NOTE, TOOL_FIRST_PROBLEM, format_reminder, tool_first_reminder
from agent.review import AnswerReview, Verdict
from agent.steps import FinalAnswer, FormatProblem, Step, StepKind, ToolRequest, TurnResult, TurnStatus
from agent.summaries import Summarizer
from agent.unicode import clean_text
from db import DatabaseBusy, DatabaseGone
from tools.registry import Tool, ToolRegistry, tools_for_turn
from tools.settings import ToolSettings

log = logging.getLogger(__name__)
STREAM_CHECK_GROWTH = 16  # a streamed answer is checked for garbage again once it grew by 1/16 of itself

__all__ = ["Agent", "AgentLimits", "Session", "TurnResult"]


@dataclass(frozen=True)
class AgentLimits:
    """The agent's limits. These defaults are the only ones: `Settings` takes its defaults from here."""

    max_steps: int = 6
    max_new_tokens: int = MAX_NEW_TOKENS
    history_token_budget: int = 2000
    observation_max_chars: int = 2000
    turn_timeout_seconds: float = 180.0
    mode: str = "react"
    # Where the ReAct instructions and tools go: the system message, or Qwen's place, the question's message.
    react_layout: str = "system"
    # Decode every step under the grammar of the enabled tools (None: unconstrained).
    grammar: GrammarLimits | None = GrammarLimits()
    # The default of the first-step policy: a question naming an entity a tool knows (a course in the database)
    # must get a tool call before the final answer. A chat's own setting (agent/options.py) wins.
    require_tool_call: bool = True
    # Numbers in a final answer must come from the question, an observation or the calculator (agent/review.py).
    grounded_answers: bool = True
    # Tool calls a question naming known entities may make beyond one per entity before its answer is asked for.
    extra_tool_calls: int = 1
    # What the next turn keeps of the last turn's observations (a follow-up is answered without a second lookup).
    last_observations_tokens: int = 300
    # The persona of chats that have none of their own (/persona sets one): added to the system prompt.
    default_persona: str = ""


@dataclass
class TurnState:
    """What one turn has done so far (kept outside the loop so a failed turn can still be recorded)."""

    tools: list[Tool]
    cancel: CancelToken
    on_event: EventSink | None
    session: Session
    user_id: int | None = None
    user_key: str = ""  # whose calls these are, for the model's fair shares (`user_key`)
    steps: list[Step] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    format_problems: int = 0
    answer_shown: str = ""  # the answer text the caller was last shown (streaming)
    answer_checked: int = 0  # the length of the streamed answer text last checked for garbage
    review: AnswerReview | None = None  # the safety nets every final answer passes
    tool_calls: int = 0
    tool_budget: int | None = None  # tool calls before the answer is asked for (None: only the step limit)

    def emit(self, event: TurnEvent) -> None:
        """Tell the caller what happens; a failing sink is logged and never breaks the turn."""
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:
            log.warning("the turn's event sink failed on %s", type(event).__name__, exc_info=True)

    def show_answer(self, text: str, *, streaming: bool = False) -> None:
        """Stream the answer so far, when it changed: garbage cut as it appears (agent/garbage.py).

        While `streaming`, the text is checked again only once it grew by a sixteenth (the check reads the whole
        text: at every token, a 10,000-character answer cost the event loop minutes). The finished answer is
        judged whole by the review, so a skipped check never lets garbage through, it only shows it later."""
        if streaming and len(text) - self.answer_checked < max(1, self.answer_checked // STREAM_CHECK_GROWTH):
            return
        self.answer_checked = len(text)
        text = streamable(clean_text(text))  # whole so far: a split surrogate pair is joined again here
        if text != self.answer_shown:
            self.answer_shown = text
            self.emit(AnswerText(text))

    def record(self, kind: StepKind, **fields: Any) -> Step:
        """Append a step of `kind`."""
        step = Step(position=len(self.steps) + 1, kind=kind, **fields)
        self.steps.append(step)
        return step

    def result(self, answer: str, status: TurnStatus, started: float) -> TurnResult:
        """The turn's outcome."""
        return TurnResult(answer, list(self.steps), status, None, self.model_calls, self.prompt_tokens,
                          self.completion_tokens, int((time.perf_counter() - started) * 1000))


class Agent:
    """Answers questions with a model and tools, remembering each session's turns."""

    def __init__(self, llm: LLM, registry: ToolRegistry, tool_settings: ToolSettings, memory: Memory,
                 limits: AgentLimits = AgentLimits(), options: ChatOptions | None = None,
                 summarizer: Summarizer | None = None):
        self.llm = llm
        self.registry = registry
        self.tool_settings = tool_settings
        self.memory = memory
        self.limits = limits
        self.options = options
        self.summarizer = summarizer  # folds long histories into a summary after a turn (None: never)

    async def run(self, session: Session, question: str, *, user_id: int | None = None,
                  source_key: str | None = None, on_event: EventSink | None = None,
                  cancel: CancelToken | None = None, pictures: Sequence[Picture] = (),
                  input_kind: str = "text") -> TurnResult:
        """Answer `question` in `session`; store the finished turn; return the answer and its steps.

        A database another process holds past its busy timeout when the turn is to be stored raises
        `TurnNotSaved`, which carries the result and a way to store it later.

        `on_event` sees the turn as it runs (agent/events.py): steps, observations, the answer as it is written.
        `pictures` go to the model with the question (the caller checked that it sees: `LLM.sees_images`);
        `input_kind` says how the question was asked ('text', 'voice': `question` is its transcript, 'photo'), for
        /trace and the history's note of a picture (agent/memory.py).
        """
        started, started_at = time.perf_counter(), utc_now()
        question = clean_text(question)  # e.g. undecodable bytes of a command line: SQLite could not store them
        tools = await tools_for_turn(await self.tool_settings.enabled_tools(session.chat_key))
        state = TurnState(tools, cancel or CancelToken(), on_event, session, user_id, user_key(session, user_id))
        history = await self._history(session)
        grammar = self.limits.grammar.within(self.limits.max_new_tokens) if self.limits.grammar else None
        entities = await link_entities(tools, question)
        rules = TurnRules(grammar, await self._tools_required(session, entities), self.limits.react_layout,
                          entities.held_tools, entities.left_out, await self._persona(session))
        conversation = start_conversation(self.limits.mode, history, question, state.tools, rules, pictures)
        self._arm_safety_nets(state, conversation, question, history, entities, bool(pictures))
        # The record's result is a placeholder until the turn ends, one way or the other.
        record = TurnRecord(question, state.result("", TurnStatus.ERROR, started), started_at, self.limits.mode,
                            user_id, source_key, input_kind)
        try:
            result = await self._run_bounded(conversation, state, question, started)
        except (LLMError, asyncio.CancelledError) as error:
            await self._store_failure(session, record, state, started, error)
            raise
        save = partial(self.memory.save_turn, session, replace(record, result=result))
        try:
            turn_id = await save()
        except DatabaseBusy as error:  # the answer is there: the caller may deliver it and store it later
            raise TurnNotSaved(str(error), result, save) from error
        if self.summarizer is not None:
            self.summarizer.after_turn(session.id, state.user_key)
        return replace(result, turn_id=turn_id)

    async def _history(self, session: Session) -> list:
        """What the model sees of the session's past: its summary, the newest turns that fit the budget, and the
        last turn's observations (agent/history.py)."""
        count = self.llm.count_tokens
        view: HistoryView = await self.memory.history_view(session.id, count, self.limits.history_token_budget)
        last_steps = await self.memory.turn_steps(view.turns[-1].turn_id, tools_only=True) if view.turns else []
        return history_messages(view, last_steps, count, self.limits.last_observations_tokens)

    async def _persona(self, session: Session) -> str:
        """The chat's persona (its own, else the global one, else DEFAULT_PERSONA)."""
        if self.options is None:
            return self.limits.default_persona
        return await self.options.persona(session.chat_key, self.limits.default_persona)

    async def _tools_required(self, session: Session, entities: Entities) -> tuple[str, ...]:
        """The first-step policy: the tools one of which this question must call before its final answer (those
        that know an entity it names), or none."""
        required = self.limits.require_tool_call
        if self.options is not None:
            required = await self.options.require_tool_call(session.chat_key, required)
        return entities.tool_names if required else ()

    def _arm_safety_nets(self, state: TurnState, conversation: Conversation, question: str,
                         history: list[Message], entities: Entities, pictures: bool = False) -> None:
        """The turn's answer review (grounded on the question and the chat so far) and its tool budget. A question
        with pictures has its numbers unchecked: a model that sees may read them off the picture, a source the check
        cannot read (garbage is still cut)."""
        grounds = Grounds(question, (str(m.get("content") or "") for m in history)) \
            if self.limits.grounded_answers and not pictures else None
        state.review = AnswerReview(question, grounds)
        state.tool_budget = entities.tool_budget(self.limits.extra_tool_calls)
        _hold_numbers(conversation, state)

    async def _run_bounded(self, conversation: Conversation, state: TurnState, question: str,
                           started: float) -> TurnResult:
        try:
            async with asyncio.timeout(self.limits.turn_timeout_seconds):
                return await self._loop(conversation, state, question, started)
        except TimeoutError:
            state.cancel.cancel()
            raise LLMTimeout(f"the turn took longer than {self.limits.turn_timeout_seconds:g} seconds") from None

    async def _loop(self, conversation: Conversation, state: TurnState, question: str, started: float) -> TurnResult:
        while state.model_calls < self.limits.max_steps:
            completion = await self._complete(conversation, state)
            decision = conversation.read(completion)
            if isinstance(decision, FinalAnswer) and conversation.tool_required:
                decision = FormatProblem(TOOL_FIRST_PROBLEM)
            if not isinstance(decision, FinalAnswer):
                state.show_answer("")  # text that looked like an answer while it streamed was not one
            if isinstance(decision, FinalAnswer):
                ended = self._on_answer(conversation, state, completion, decision)
            elif isinstance(decision, FormatProblem):
                ended = self._on_format_problem(conversation, state, completion, decision, question)
            else:
                ended = await self._on_tool_requests(conversation, state, completion, decision)
            if ended is not None:
                return state.result(*ended, started)
        return await self._final_at_limit(conversation, state, question, started)

    def _on_answer(self, conversation: Conversation, state: TurnState, completion: Completion,
                   decision: FinalAnswer) -> tuple[str, TurnStatus] | None:
        """The answer, once the safety nets accept it; turned back once with a reminder; else the honest answer."""
        assert state.review is not None
        review = state.review.review(decision.answer)
        state.record(StepKind.FINAL, thought=decision.thought, error=review.error,
                     observation=review.answer if review.verdict is Verdict.ACCEPT else decision.answer)
        if review.verdict is Verdict.ACCEPT:
            return review.answer, TurnStatus.ANSWERED
        if review.verdict is Verdict.REMIND:
            state.show_answer("")
            conversation.add_reminder(completion, review.reminder)
            return None
        return review.answer, TurnStatus.GAVE_UP

    async def _on_tool_requests(self, conversation: Conversation, state: TurnState, completion: Completion,
                                requests: list[ToolRequest]) -> None:
        """Run the calls and add their observations; a repeated call, or the tool budget spent, ends the search:
        the repeat is not run again, and the next step is the answer from what was observed."""
        acted = [await self._act(request, state) for request in requests]
        fresh = [(request, observation) for request, observation, repeated in acted if not repeated]
        if fresh:
            conversation.add_results(completion, fresh)
        if state.review is not None and state.review.grounds is not None:
            for _, observation in fresh:
                state.review.grounds.observe(observation)
        state.tool_calls += len(requests)
        spent = state.tool_budget is not None and state.tool_calls >= state.tool_budget
        if (len(fresh) < len(acted) or spent) and not conversation.answer_requested:
            conversation.add_final_request(None)
        _hold_numbers(conversation, state)
        return None

    def _on_format_problem(self, conversation: Conversation, state: TurnState, completion: Completion,
                           problem: FormatProblem, question: str) -> tuple[str, TurnStatus] | None:
        """Remind the model of the format once; the second time, end the turn with an apology. A reply that holds
        no answer when the answer was asked for ends the turn with the honest answer.

        Never the reply itself: a reply that fits no format is rambling, not an answer, even when it reads like one.
        """
        state.format_problems += 1
        if conversation.answer_requested:
            state.record(StepKind.FINAL, thought=completion.text[:500], error="no_answer", observation=problem.reason)
            return apology("unconfirmed", language_of(question)), TurnStatus.GAVE_UP
        error = "tool_required" if problem.reason == TOOL_FIRST_PROBLEM else "parse"
        state.record(StepKind.FORMAT_ERROR, thought=completion.text[:500], error=error, observation=problem.reason)
        if state.format_problems >= 2:
            return apology("format", language_of(question)), TurnStatus.GAVE_UP
        if error == "tool_required":
            reminder = tool_first_reminder(conversation.first_tools)
        else:
            reminder = format_reminder(state.tools)
        conversation.add_reminder(completion, reminder)
        return None

    async def _final_at_limit(self, conversation: Conversation, state: TurnState, question: str,
                              started: float) -> TurnResult:
        """One last call asking for the answer from what is known, reviewed with no reminder left to give; an honest
        apology if that gives nothing."""
        if not conversation.answer_requested:
            conversation.add_final_request()
            _hold_numbers(conversation, state)
        completion = await self._complete(conversation, state)
        answer = conversation.read_final(completion)
        if not answer:
            state.record(StepKind.LIMIT, error="no_answer")
            return state.result(apology("steps", language_of(question)), TurnStatus.STEP_LIMIT, started)
        assert state.review is not None
        review = state.review.review(answer, may_remind=False)
        state.record(StepKind.LIMIT, observation=review.answer if review.verdict is Verdict.ACCEPT else answer,
                     error=review.error)
        return state.result(review.answer, TurnStatus.STEP_LIMIT, started)

    async def _complete(self, conversation: Conversation, state: TurnState) -> Completion:
        if state.cancel.cancelled:
            raise LLMCancelled("the turn was cancelled")
        request = conversation.request()
        state.emit(ModelCall(state.model_calls + 1))
        completion = await self.llm.complete(replace(request, max_new_tokens=self.limits.max_new_tokens,
                                                     cancel=state.cancel, on_text=_answer_stream(conversation, state),
                                                     user_key=state.user_key))
        state.model_calls += 1
        state.prompt_tokens += completion.prompt_tokens
        state.completion_tokens += completion.completion_tokens
        return completion

    async def _act(self, request: ToolRequest, state: TurnState) -> tuple[ToolRequest, str, bool]:
        """Run (or refuse) one tool request; record its step; return its observation, and whether it repeats a
        call made before (then it is not run again: the note says so)."""
        started = time.perf_counter()
        key = arguments_key(request.tool, request.arguments)
        kind, error = StepKind.TOOL, None
        state.emit(ToolStarted(request.tool, _label(self.registry.get(request.tool), request.tool), request.raw_input,
                               request.arguments))
        if request.arguments is not None and key in state.seen:
            kind, observation = StepKind.REPEATED, REPEATED_CALL_NOTE.format(tool=request.tool)
        elif request.input_error and (not request.tool or request.tool in (t.name for t in state.tools)):
            error, observation = "invalid_arguments", f"Error: {request.input_error}"
        else:
            observation, error = await self._call_tool(request, state)
            if request.arguments is not None:
                state.seen[key] = observation
        state.record(kind, thought=request.thought, action=request.tool, action_input=request.raw_input,
                     observation=observation, error=error, duration_ms=int((time.perf_counter() - started) * 1000))
        state.emit(ToolFinished(request.tool, observation, error))
        return request, observation, kind is StepKind.REPEATED

    async def _call_tool(self, request: ToolRequest, state: TurnState) -> tuple[str, str | None]:
        allowed = [tool.name for tool in state.tools]
        result = await self.registry.call(request.tool, request.arguments if request.arguments is not None else {},
                                          allowed=allowed, before_run=partial(self._audit, state),
                                          chat_key=state.session.chat_key)
        return truncate(result.output, self.limits.observation_max_chars), result.error

    async def _audit(self, state: TurnState, tool: Tool, arguments: dict[str, Any]) -> None:
        """A tool that may change data is audited with its arguments before every call."""
        if not tool.read_only:
            await self.tool_settings.audit_call(tool, arguments, state.user_id, state.session.chat_id,
                                                state.session.chat_key)

    async def _store_failure(self, session: Session, record: TurnRecord, state: TurnState, started: float,
                             error: BaseException) -> None:
        """Keep the failed turn's trace for /trace and /stats; never in the history, never under its source key."""
        status = TurnStatus.CANCELLED if isinstance(error, (LLMCancelled, asyncio.CancelledError)) else TurnStatus.ERROR
        result = state.result(f"({type(error).__name__}: {error})", status, started)
        try:
            await self.memory.save_turn(session, replace(record, result=result, source_key=None), to_history=False)
        except Exception as failure:
            if self.memory.db.closed:  # shutdown closed it while this turn wound down; its update is kept unhandled
                log.info("the failed turn was not stored: the database is closed (shutting down)")
            elif isinstance(failure, DatabaseGone):  # the bot is stopping for it (db/file_watch.py)
                log.info("the failed turn was not stored: %s", failure)
            else:
                log.warning("could not store the failed turn", exc_info=True)


def _answer_stream(conversation: Conversation, state: TurnState) -> TextSink | None:
    """The model's text sink while the caller listens: the answer, as far as the reply so far holds one, goes up
    as `AnswerText`; Thought and Action text never does."""
    if state.on_event is None:
        return None
    pieces: list[str] = []

    def take(piece: str) -> None:
        pieces.append(piece)
        answer = conversation.answer_so_far("".join(pieces))
        if answer is not None:
            state.show_answer(answer, streaming=True)
    return take


def _hold_numbers(conversation: Conversation, state: TurnState) -> None:
    """Let the grammar's answers write only the numbers grounded so far (when answers are grounded)."""
    grounds = state.review.grounds if state.review is not None else None
    conversation.answer_numbers = grounds.literals() if grounds is not None else None


def user_key(session: Session, user_id: int | None) -> str:
    """Whose model calls a turn makes, for the model's fair shares: its user, or its session when no user is known
    (the terminal, an evaluation)."""
    return f"user:{user_id}" if user_id is not None else f"session:{session.id}"


def _label(tool: Tool | None, name: str) -> str:
    """A tool's progress label for people; an unknown tool's name as the model wrote it."""
    return tool.progress if tool is not None else f"🔧 {name}"


def truncate(text: str, limit: int) -> str:
    """At most `limit` characters, with a note saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [truncated: {len(text) - limit} more characters]"

