"""The terminal's view of a turn (`qwenbot ask` and `qwenbot chat`) and the `chat` loop with its Ctrl-C.

On a terminal each step shows as it happens: a spinner while the model thinks, the tool and its input, the
observation dimmed, then the answer as it is written. Output that is not a terminal stays plain text: steps on
stderr, one line each, and the answer, whole, on stdout, so a script reads exactly the answer. `--quiet` keeps only
the answer.

In `chat`, Ctrl-C stops the running question (its generation too: the model stops at its next token, a server's
stream is closed) and returns to the prompt; a second Ctrl-C, Ctrl-C or Ctrl-D at the prompt, or /quit leave.
Questions can also be piped in, one per line.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Callable, Iterator, Protocol, TextIO

from rich.console import Console
from rich.status import Status
from rich.text import Text

from agent.errors import LLMCancelled, LLMError, LLMTimeout
from agent.events import AnswerText, ModelCall, ToolFinished, ToolStarted, TurnEvent
from agent.llm.base import CancelToken
from agent.memory import Session
from agent.steps import TurnResult
from agent.apologies import apology, language_of
from agent.traces import render_trace
from bot.program.doc_reports import with_sources
from bot.program.services import Services

OBSERVATION_CHARS = 300  # an observation is shown cut to this many characters (the model reads it whole)
QUIT_COMMANDS = ("/quit", "/exit")
CHAT_GREETING = ("Ask anything. /reset forgets this session, /trace shows the last turn's steps, /quit leaves. "
                 "Ctrl-C stops an answer.")


class TurnView(Protocol):
    """How a turn shows in the terminal."""

    def on_event(self, event: TurnEvent) -> None:
        """A step, an observation or more of the answer (agent/events.py)."""

    def answer(self, text: str) -> None:
        """The turn's final answer (or an apology): print what was not shown yet."""

    def notice(self, text: str) -> None:
        """A line about the session itself: stopped, history cleared, the trace."""

    def interrupted(self) -> None:
        """The turn ended without an answer (stopped, failed): leave the screen tidy for what comes next."""


def make_view(*, quiet: bool, stdout: TextIO | None = None, stderr: TextIO | None = None) -> TurnView:
    """A live view on a terminal, plain lines elsewhere; only the answer with `quiet`."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    if quiet:
        return PlainView(stdout, None)
    if stdout.isatty():
        return LiveView(Console(file=stdout))
    return PlainView(stdout, stderr)


class PlainView:
    """No escape codes: steps as plain lines on `steps` (None: not shown), the answer whole on `out`."""

    def __init__(self, out: TextIO, steps: TextIO | None):
        self.out = out
        self.steps = steps

    def on_event(self, event: TurnEvent) -> None:
        if self.steps is None:
            return
        if isinstance(event, ToolStarted):
            print(f"→ {event.tool} {event.raw_input}".rstrip(), file=self.steps, flush=True)
        elif isinstance(event, ToolFinished):
            print(f"  {_one_line(event.observation)}", file=self.steps, flush=True)

    def answer(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def notice(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def interrupted(self) -> None:
        pass


class LiveView:
    """A terminal: spinner, steps, dimmed observations, the answer streamed (rich draws all of it)."""

    def __init__(self, console: Console):
        self.console = console
        self.spinner: Status = console.status("thinking…", spinner="dots")
        self.spinning = False
        self.printed = ""  # the answer text printed so far in this turn

    def on_event(self, event: TurnEvent) -> None:
        if isinstance(event, ModelCall):
            self._spin("thinking…" if event.step == 1 else f"thinking… (step {event.step})")
        elif isinstance(event, ToolStarted):
            self._still()
            self.console.print(Text.assemble(("🔧 ", ""), (event.tool, "bold cyan"), " ", event.raw_input),
                               soft_wrap=True)
            self._spin(f"{event.tool}…")
        elif isinstance(event, ToolFinished):
            self._still()
            self.console.print(Text(_one_line(event.observation), style="dim"), soft_wrap=True)
        elif isinstance(event, AnswerText):
            self._show_answer(event.text)

    def answer(self, text: str) -> None:
        self._still()
        if self.printed and text.startswith(self.printed):
            self._write(text[len(self.printed):])
        else:
            if self.printed:
                self.console.print()
            self._write(text)
        self.console.print()
        self.printed = ""

    def notice(self, text: str) -> None:
        self._still()
        if self.printed:
            self.console.print()
            self.printed = ""
        self.console.print(Text(text, style="yellow"), soft_wrap=True)

    def interrupted(self) -> None:
        self._still()  # a spinner left running would keep the cursor hidden after the program ends
        if self.printed:
            self.console.print()
            self.printed = ""

    def _show_answer(self, text: str) -> None:
        self._still()
        if text.startswith(self.printed):
            self._write(text[len(self.printed):])
        else:  # taken back (the model went on to call a tool), or rewritten
            self.console.print()
            self.console.print(Text("(that was not the answer yet)", style="dim"))
            self.printed = ""
            self._write(text)
        self.printed = text

    def _write(self, text: str) -> None:
        self.console.print(text, end="", markup=False, highlight=False, emoji=False, soft_wrap=True)

    def _spin(self, what: str) -> None:
        if self.printed:  # the answer is being written on this line: no spinner over it
            return
        self.spinner.update(what)
        if not self.spinning:
            self.spinner.start()
            self.spinning = True

    def _still(self) -> None:
        if self.spinning:
            self.spinner.stop()
            self.spinning = False


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= OBSERVATION_CHARS else flat[: OBSERVATION_CHARS - 1] + "…"


# --- asking ----------------------------------------------------------------------------------------------------

async def answer_once(services: Services, session: Session, question: str, view: TurnView,
                      cancel: CancelToken | None = None) -> TurnResult:
    """Run one turn, showing it in `view`. `LLMError`s propagate."""
    try:
        result = await services.agent.run(session, question, on_event=view.on_event, cancel=cancel)
    except BaseException:
        view.interrupted()
        raise
    view.answer(await with_sources(services.documents, result, language_of(question)))
    return result


# --- chatting --------------------------------------------------------------------------------------------------

class LineReader(Protocol):
    """Where the chat's questions come from."""

    async def read(self) -> str | None:
        """The next line; None to leave (end of input, or Ctrl-C at the prompt)."""


class PromptReader:
    """A terminal: prompt_toolkit's prompt, with line editing and history; Ctrl-C or Ctrl-D leave."""

    def __init__(self) -> None:
        from prompt_toolkit import PromptSession

        self.session: PromptSession = PromptSession()

    async def read(self) -> str | None:
        try:
            return await self.session.prompt_async("> ")
        except (KeyboardInterrupt, EOFError):
            return None


class PipeReader:
    """Piped standard input: one question per line, no prompt."""

    def __init__(self, source: TextIO | None = None):
        self.source = source or sys.stdin

    async def read(self) -> str | None:
        line = await asyncio.to_thread(self.source.readline)
        return line.rstrip("\n") if line else None


def make_reader() -> LineReader:
    """A prompt on a terminal, plain lines from a pipe."""
    return PromptReader() if sys.stdin.isatty() and sys.stdout.isatty() else PipeReader()


async def chat_loop(services: Services, session: Session, view: TurnView, reader: LineReader) -> None:
    """Read questions until /quit, end of input or a second Ctrl-C; answer each, streamed."""
    while (line := await reader.read()) is not None:
        text = line.strip()
        if text in QUIT_COMMANDS:
            return
        if text in ("/reset", "/trace"):
            view.notice(await session_command(services, session, text))
        elif text and await ask_interruptibly(services, session, text, view) == "leave":
            return


async def session_command(services: Services, session: Session, command: str) -> str:
    """What /reset and /trace say."""
    if command == "/reset":
        removed = await services.memory.reset(session.id)
        return f"History cleared ({removed} messages)."
    turn = await services.memory.last_turn(session.id)
    return render_trace(turn.steps) if turn else "No turn yet."


async def ask_interruptibly(services: Services, session: Session, question: str, view: TurnView) -> str:
    """One turn that Ctrl-C stops; "leave" when Ctrl-C came twice, else "stay"."""
    cancel = CancelToken()
    turn = asyncio.ensure_future(answer_once(services, session, question, view, cancel))
    presses = 0

    def interrupted() -> None:
        nonlocal presses
        presses += 1
        cancel.cancel()  # the model stops at its next token; the turn ends with LLMCancelled
        if presses > 1:
            turn.cancel()  # the second press does not wait for that

    with _sigint_handler(interrupted):
        try:
            await turn
        except (LLMCancelled, asyncio.CancelledError):
            view.notice("⏹ Stopped." + ("" if presses > 1 else " (Ctrl-C again at the prompt, or /quit, leaves.)"))
        except LLMError as error:
            view.answer(apology("timeout" if isinstance(error, LLMTimeout) else "error", language_of(question)))
    return "leave" if presses > 1 else "stay"


@contextlib.contextmanager
def _sigint_handler(callback: Callable[[], None]) -> Iterator[None]:
    """Route SIGINT to `callback` on the event loop while a turn runs (at the prompt, prompt_toolkit reads Ctrl-C
    as a key)."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals on this platform
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
