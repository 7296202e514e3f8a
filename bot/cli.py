"""The `qwenbot` command: run (Telegram), chat (terminal), ask (one turn), migrate, tools, doctor.

Every failure the user can fix (a bad setting, a missing model, an unreachable server) ends the command with
one clear line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Awaitable, Callable, Sequence

from agent.memory import Session
from agent.traces import render_trace
from bot.config import ConfigError, Settings
from bot.logs import configure_logging, redact_token_shapes
from bot.services import open_settings_database, start_services
from bot.terminal import CHAT_GREETING, PromptReader, answer_once, chat_loop, make_reader, make_view
from db import BotError
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
    ask.add_argument("--quiet", "-q", action="store_true", help="print only the answer (for scripts)")
    chat = commands.add_parser("chat", help="an interactive session in the terminal (/reset, /trace, /quit; "
                                            "Ctrl-C stops an answer); reads piped questions one per line")
    chat.add_argument("--session", default="cli:chat", help="history session id (default: cli:chat)")
    commands.add_parser("doctor", help="check settings, token, database, model and disk; a line per check")
    chat.add_argument("--quiet", "-q", action="store_true", help="print only the answers")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `qwenbot` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "doctor":  # reports a bad setting as one of its checks, with the others
        from bot.doctor import doctor_main

        return doctor_main()
    try:
        settings = Settings.from_env()
        configure_logging(settings.log_level, secrets=[settings.telegram_bot_token, settings.openai_api_key])
        return COMMANDS[args.command](settings, args)
    except USER_ERRORS as error:
        # A token pasted into the wrong variable may be part of the message (a path, say): never show it.
        print(f"qwenbot: {redact_token_shapes(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def run_async(job: Callable[[], Awaitable[int]]) -> int:
    """Run a coroutine function to completion on a fresh event loop."""
    return asyncio.run(job())


def migrate_command(settings: Settings, args: argparse.Namespace) -> int:
    """Create or upgrade the database; print each migration applied, or that there was nothing to do."""
    async def job() -> int:
        db = await open_settings_database(settings)
        await db.close()
        log.info("database %s", db.path)
        for name in db.applied:
            print(f"applied {name}")
        if not db.applied:
            print(f"{settings.database_path} is up to date")
        return 0
    return run_async(job)


def tools_command(settings: Settings, args: argparse.Namespace) -> int:
    """Print every registered tool with its state (globally, or in one chat)."""
    async def job() -> int:
        db = await open_settings_database(settings)
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
    """One turn, shown as it runs (steps, then the answer as it is written); with --trace, every step after it."""
    async def job() -> int:
        view = make_view(quiet=args.quiet)
        services = await start_services(settings)
        try:
            result = await answer_once(services, cli_session(args.session), args.question, view)
        finally:
            await services.close()
        if args.trace:
            print("\n" + render_trace(result.steps))
        return 0
    return run_async(job)


def chat_command(settings: Settings, args: argparse.Namespace) -> int:
    """An interactive session on the same agent and memory: /reset, /trace, /quit; Ctrl-C stops an answer."""
    async def job() -> int:
        services = await start_services(settings)
        reader = make_reader()
        if isinstance(reader, PromptReader):
            print(CHAT_GREETING)
        try:
            await chat_loop(services, cli_session(args.session), make_view(quiet=args.quiet), reader)
        finally:
            await services.close()
        return 0
    return run_async(job)


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
}

if __name__ == "__main__":
    sys.exit(main())
