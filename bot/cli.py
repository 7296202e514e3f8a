"""The `qwenbot` command: run (Telegram), chat (terminal), ask (one turn), eval (a question set), migrate, tools.

Every failure the user can fix (a bad setting, a missing model, an unreachable server) ends the command with
one clear line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from agent.errors import LLMError, LLMTimeout
from agent.memory import Session
from agent.apologies import apology, language_of
from agent.traces import render_trace
from bot.config import ConfigError, Settings
from bot.evaluation import copy_database, evaluate, load_cases, summary
from bot.logs import configure_logging
from bot.services import Services, start_services
from db import BotError, open_database
from tools import build_registry
from tools.settings import GLOBAL, ToolSettings

log = logging.getLogger("qwenbot")

# Failures a user can act on: shown as one line, never as a traceback.
USER_ERRORS = (BotError, OSError)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command per job."""
    parser = argparse.ArgumentParser(prog="qwenbot", description="A Qwen ReAct assistant for Telegram.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("run", help="run the Telegram bot (settings from .env)")
    commands.add_parser("migrate", help="create or upgrade the database and print what was applied")
    tools = commands.add_parser("tools", help="list the registered tools and whether they are enabled")
    tools.add_argument("--chat", default=GLOBAL, help="a chat key (e.g. tg:12345 or cli) to show that chat's state")
    ask = commands.add_parser("ask", help="ask one question and print the final answer")
    ask.add_argument("question", help="the question")
    ask.add_argument("--trace", action="store_true", help="also print each step of the reasoning")
    ask.add_argument("--session", default="cli:ask", help="history session id (default: cli:ask)")
    chat = commands.add_parser("chat", help="an interactive session in the terminal (/reset, /trace, /quit)")
    chat.add_argument("--session", default="cli:chat", help="history session id (default: cli:chat)")
    evaluation = commands.add_parser("eval", help="run a question set (JSONL) through the agent and print the score")
    evaluation.add_argument("file", type=Path, help='questions, one JSON object a line: {"q": ..., "expect": [...]}')
    evaluation.add_argument("--report", type=Path, help="also write every answer and figure to this JSON file")
    evaluation.add_argument("--turn-timeout", type=float, metavar="SECONDS",
                            help="TURN_TIMEOUT_SECONDS for this run (all questions queue for one model at once)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `qwenbot` console script."""
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        configure_logging(settings.log_level, secrets=[settings.telegram_bot_token, settings.openai_api_key])
        return COMMANDS[args.command](settings, args)
    except USER_ERRORS as error:
        print(f"qwenbot: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def run_async(job: Callable[[], Awaitable[int]]) -> int:
    """Run a coroutine function to completion on a fresh event loop."""
    return asyncio.run(job())


def migrate_command(settings: Settings, args: argparse.Namespace) -> int:
    """Create or upgrade the database; print each migration applied, or that there was nothing to do."""
    async def job() -> int:
        db = await open_database(settings.database_path, busy_timeout_seconds=settings.database_busy_timeout_seconds)
        await db.close()
        for name in db.applied:
            print(f"applied {name}")
        if not db.applied:
            print(f"{settings.database_path} is up to date")
        return 0
    return run_async(job)


def tools_command(settings: Settings, args: argparse.Namespace) -> int:
    """Print every registered tool with its state (globally, or in one chat)."""
    async def job() -> int:
        db = await open_database(settings.database_path, busy_timeout_seconds=settings.database_busy_timeout_seconds)
        try:
            registry = build_registry(db, settings.tool_timeout_seconds)
            for state in await ToolSettings(db, registry).states(args.chat):
                mark = "on " if state.enabled else "off"
                print(f"{mark}  {state.tool.name:<14} {state.tool.human_name} ({state.source})")
        finally:
            await db.close()
        return 0
    return run_async(job)


def ask_command(settings: Settings, args: argparse.Namespace) -> int:
    """One turn: print the final answer (and with --trace, each step first)."""
    async def job() -> int:
        services = await start_services(settings)
        try:
            result = await services.agent.run(cli_session(args.session), args.question)
        finally:
            await services.close()
        if args.trace:
            print(render_trace(result.steps), end="\n\n")
        print(result.answer)
        return 0
    return run_async(job)


def eval_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run a question set through the real agent, on a copy of the database; print the score and the failures."""
    cases = load_cases(args.file)
    timeout = args.turn_timeout or settings.turn_timeout_seconds

    async def job() -> int:
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / "eval.sqlite3"
            await asyncio.to_thread(copy_database, settings.database_path, copy)
            run = dataclasses.replace(settings, database_path=copy, turn_timeout_seconds=timeout)
            services = await start_services(run)
            try:
                report = await evaluate(services.agent, cases)
            finally:
                await services.close()
        report.about = evaluated(settings)
        print("\n".join(summary(report, str(args.file))))
        if args.report:
            args.report.write_text(json.dumps(report.as_json(), ensure_ascii=False, indent=2), encoding="utf-8")
        return 0
    return run_async(job)


def evaluated(settings: Settings) -> dict[str, object]:
    """What a run evaluated, for its report: the model and how it was driven."""
    model = settings.openai_model or settings.model if settings.llm_backend == "openai" else settings.model
    return {"model": model, "backend": settings.llm_backend, "mode": settings.agent_mode,
            "constrained": settings.constrained_decoding, "require_tool_call": settings.require_tool_call}


def chat_command(settings: Settings, args: argparse.Namespace) -> int:
    """An interactive session on the same agent and memory: /reset, /trace, /quit."""
    async def job() -> int:
        services = await start_services(settings)
        print("Ask anything. /reset forgets this session, /trace shows the last turn's steps, /quit leaves.")
        try:
            await chat_loop(services, cli_session(args.session))
        finally:
            await services.close()
        return 0
    return run_async(job)


async def chat_loop(services: Services, session: Session) -> None:
    """Read lines until /quit or end of input; answer each question."""
    while (line := await read_line("> ")) is not None:
        text = line.strip()
        if text in ("/quit", "/exit"):
            return
        if text:
            print(await chat_reply(services, session, text), flush=True)


async def chat_reply(services: Services, session: Session, text: str) -> str:
    """What the terminal shows for one line of input."""
    if text == "/reset":
        removed = await services.memory.reset(session.id)
        return f"History cleared ({removed} messages)."
    if text == "/trace":
        turn = await services.memory.last_turn(session.id)
        return render_trace(turn.steps) if turn else "No turn yet."
    try:
        return (await services.agent.run(session, text)).answer
    except LLMError as error:
        log.warning("turn failed: %s", error)
        return apology("timeout" if isinstance(error, LLMTimeout) else "error", language_of(text))


async def read_line(prompt: str) -> str | None:
    """One line from the terminal, read off the event loop; None at end of input."""
    try:
        return await asyncio.to_thread(input, prompt)
    except EOFError:
        return None


def cli_session(session_id: str) -> Session:
    """A terminal session: its own history, tool settings of the 'cli' chat."""
    return Session(id=session_id, chat_key="cli", kind="cli")


def run_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run the Telegram bot (long polling, or a webhook when WEBHOOK_URL is set) until SIGINT or SIGTERM."""
    # Imported here: the terminal commands do not need python-telegram-bot.
    from telegram.error import InvalidToken, TelegramError

    from bot.app import run

    settings.require_telegram_token()
    try:
        run(settings)
    except InvalidToken:
        raise ConfigError("Telegram refused TELEGRAM_BOT_TOKEN: check it with @BotFather") from None
    except TelegramError as error:
        raise ConnectionError(f"cannot talk to Telegram at {settings.telegram_base_url}: {error}") from None
    return 0


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "migrate": migrate_command,
    "tools": tools_command,
    "run": run_command,
    "ask": ask_command,
    "chat": chat_command,
    "eval": eval_command,
}

if __name__ == "__main__":
    sys.exit(main())
