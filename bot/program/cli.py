"""The `qwenbot` command: run (Telegram), chat (terminal), ask (one turn), eval (a question set), export (a
session's history), transcribe (a recording), migrate, tools, mcp, docs, doctor, backup, restore, health.

Every failure the user can fix (a bad setting, a missing model, an unreachable server) ends the command with
one clear line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from agent.errors import SpeechError
from agent.memory import Memory, Session
from agent.traces import render_trace
from bot.program.audit import audit
from bot.program.config import ConfigError, Settings
from bot.program.doc_reports import adding_text, chunks, documents_text
from bot.program.evaluation import EvalFileError, compare, copy_database, evaluate, load_cases, rescore, summary
from bot.program.export import render_export
from bot.program.logs import add_secrets, configure_logging, redact_token_shapes
from bot.program.mcp_reports import added_text, servers_text
from bot.program.retrieval import (DEFAULT_K, corpus_files, default_corpus, evaluate_retrieval, load_retrieval_cases,
                                   retrieval_summary)
from bot.program.services import (build_transcriber, docs_tools, document_library, mcp_hub, open_settings_database,
                                   start_services)
from bot.program.terminal import CHAT_GREETING, PromptReader, answer_once, chat_loop, make_reader, make_view
from core.errors import BotError
from db import Database
from db.backup import backup_database, restore_database
from tools import build_registry
from tools.docs_convert import SUFFIXES
from tools.docs_index import DEFAULT_FORM, FORMS
from tools.docs_store import DocumentLibrary, Upload
from tools.errors import DocumentError, McpConfigError
from tools.mcp import McpHub
from tools.mcp_store import parse_headers, read_config, url_server
from tools.settings import GLOBAL, ToolSettings

log = logging.getLogger("qwenbot")

# Failures a user can act on: shown as one line, never as a traceback.
USER_ERRORS = (BotError, OSError)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command per job."""
    parser = argparse.ArgumentParser(prog="qwenbot", description="A Qwen ReAct assistant for Telegram.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run the Telegram bot (settings from .env)")
    migrate = commands.add_parser("migrate", help="create or upgrade the database and print what was applied")
    for command in (run, migrate):
        command.add_argument("--new-database", action="store_true",
                             help="start a new, empty database where one existed and is gone (without this, a "
                                  "lost database stops the command instead of being replaced silently)")
    tools = commands.add_parser("tools", help="list the registered tools and whether they are enabled")
    tools.add_argument("--chat", default=GLOBAL, help="a chat key (e.g. tg:12345 or cli) to show that chat's state")
    ask = commands.add_parser(
        "ask", help="ask one question and print the final answer (a fresh session each run, unless --session)",
        description="Ask one question and print the final answer. Each run is a question on its own, in a fresh "
                    "session: nothing an earlier run asked or answered is in its prompt. Give --session NAME to "
                    "continue a conversation across runs (its history, summary and last observations).")
    ask.add_argument("question", help="the question")
    ask.add_argument("--trace", action="store_true", help="also print each step of the reasoning")
    ask.add_argument("--session", default=None, metavar="NAME",
                     help="continue the session NAME (e.g. cli:notes) with its history; default: a fresh session "
                          "of its own each run")
    ask.add_argument("--quiet", "-q", action="store_true", help="print only the answer (for scripts)")
    chat = commands.add_parser("chat", help="an interactive session in the terminal (/reset, /trace, /quit; "
                                            "Ctrl-C stops an answer); reads piped questions one per line")
    chat.add_argument("--session", default="cli:chat", help="history session id (default: cli:chat)")
    chat.add_argument("--quiet", "-q", action="store_true", help="print only the answers")
    evaluation = commands.add_parser("eval", help="run a question set (JSONL) through the agent and print the score")
    evaluation.add_argument("file", type=Path, help='questions, one JSON object a line: {"q": ..., "expect": [...]}')
    evaluation.add_argument("--report", type=Path, help="also write every answer and figure to this JSON file")
    evaluation.add_argument("--turn-timeout", type=float, metavar="SECONDS",
                            help="TURN_TIMEOUT_SECONDS for this run (all questions queue for one model at once)")
    evaluation.add_argument("--compare", type=Path, metavar="OLD.json",
                            help="also print which questions changed since an earlier --report")
    evaluation.add_argument("--rescore", type=Path, metavar="OLD.json",
                            help="score an earlier --report again as this version scores, without the model")
    evaluation.add_argument("--retrieval", action="store_true",
                            help='document search only: recall@k of the chunk that answers each question; lines '
                                 'are {"q": ..., "doc": NAME, "heading": "Section › Part"} (no model)')
    evaluation.add_argument("--corpus", type=Path, action="append", metavar="PATH",
                            help="--retrieval: a document or folder to index (repeatable; default: the corpus "
                                 "folder beside FILE, e.g. evals/docs/corpus for evals/docs.jsonl)")
    evaluation.add_argument("--tokenizer", choices=sorted(FORMS), default=DEFAULT_FORM.name,
                            help=f"--retrieval: how the scratch index is built (default {DEFAULT_FORM.name}, "
                                 "the shipped one)")
    evaluation.add_argument("-k", type=int, default=DEFAULT_K, help=f"--retrieval: results looked at ({DEFAULT_K})")
    export = commands.add_parser("export", help="print a session's history as Markdown (as /export sends it)")
    export.add_argument("session", help="the session id: tg:<chat id> (a topic adds :<topic id>), cli:chat, …")
    export.add_argument("--no-steps", action="store_true", help="leave each turn's steps out")
    commands.add_parser("doctor", help="check settings, token, database, model and disk; a line per check")
    transcribe = commands.add_parser("transcribe", help="print what a recording says, with the speech backend the "
                                                        "bot uses (ASR_BACKEND, ASR_MODEL)")
    transcribe.add_argument("file", type=Path, help="a recording: a Telegram voice note (.oga), .ogg, .mp3, .wav, …")
    add_mcp_parser(commands)
    add_docs_parser(commands)
    add_backup_parsers(commands)
    return parser


def add_mcp_parser(commands: argparse._SubParsersAction) -> None:
    """`qwenbot mcp list|add|del`: the admin commands /mcp_list, /mcp_add, /mcp_del, for people at the server."""
    mcp = commands.add_parser("mcp", help="MCP servers: list, add or delete them (as /mcp_list, /mcp_add, /mcp_del)")
    actions = mcp.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="the servers (config file and database) and their last listed tools")
    add = actions.add_parser("add", help="connect a server over HTTP, list its tools (all off) and store it")
    add.add_argument("name", help="its name; its tools are called NAME.tool")
    add.add_argument("url", help="streamable HTTP endpoint (…/mcp), or an SSE one ending in /sse")
    add.add_argument("headers", nargs="*", metavar="Header=value", help="HTTP headers sent with every request")
    delete = actions.add_parser("del", help="forget a server, its tools and their settings")
    delete.add_argument("name")


def add_docs_parser(commands: argparse._SubParsersAction) -> None:
    """`qwenbot docs add|list|del|search`: the team's documents, as admins manage them from Telegram."""
    docs = commands.add_parser("docs", help="the team's documents: add, list, delete or search them")
    actions = docs.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add files (.md .txt .pdf .docx .html), or every such file in a folder")
    add.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    add.add_argument("--scope", default=GLOBAL, help="where they may be searched: global (default) or a chat key "
                                                    "(e.g. tg:-1001234567890)")
    listing = actions.add_parser("list", help="the documents, with scope, chunks, size and who added them")
    listing.add_argument("--chat", help="only those a chat key sees (default: all)")
    delete = actions.add_parser("del", help="remove a document and its chunks")
    delete.add_argument("id", type=int)
    search = actions.add_parser("search", help="print the top chunks for a query, as docs_search returns them")
    search.add_argument("query")
    search.add_argument("--chat", default=GLOBAL, help="search as this chat key sees (default: global documents)")


def add_backup_parsers(commands: argparse._SubParsersAction) -> None:
    """`qwenbot backup PATH` (safe while the bot runs) and `qwenbot restore PATH` (only while it does not)."""
    backup = commands.add_parser("backup", help="copy the database to PATH, safely while the bot runs")
    backup.add_argument("path", help="the backup file, or a folder (existing, or ending in /) to put a dated file in")
    restore = commands.add_parser("restore", help="replace the database with the backup at PATH (the bot stopped); "
                                                  "the old one is kept as <database>.before-restore")
    restore.add_argument("path", type=Path, help="a file written by qwenbot backup")
    commands.add_parser("health", help="ask the running bot's /healthz (METRICS_PORT); exit 0 when healthy, 1 when "
                                       "not: for container healthchecks and timers")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `qwenbot` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "doctor":  # reports a bad setting as one of its checks, with the others
        from bot.program.doctor import doctor_main

        return doctor_main()
    try:
        settings = Settings.from_env()
        configure_logging(settings.logging.log_level, secrets=settings.secrets(),
                          log_format=settings.logging.log_format)
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
        db = await open_settings_database(settings, new_database=args.new_database)
        await db.close()
        log.info("database %s", db.path)
        for name in db.applied:
            print(f"applied {name}")
        if not db.applied:
            print(f"{settings.storage.database_path} is up to date")
        return 0
    return run_async(job)


def tools_command(settings: Settings, args: argparse.Namespace) -> int:
    """Print every tool (MCP tools from their last listing) with its source, access and state."""
    async def job(db: Database, hub: McpHub) -> int:
        for state in await ToolSettings(db, hub.registry).states(args.chat):
            tool = state.tool
            mark = "on " if state.enabled else "off"
            print(f"{mark}  {tool.name:<24} {tool.source:<14} {tool.access:<11} {tool.human_name} ({state.source})")
        return 0
    return with_mcp(settings, job)


def mcp_command(settings: Settings, args: argparse.Namespace) -> int:
    """List, add or delete MCP servers; a running bot sees an added server at /mcp_refresh NAME or its restart."""

    async def job(db: Database, hub: McpHub) -> int:
        if args.action == "list":
            print(servers_text(hub))
        elif args.action == "add":
            spec = url_server(args.name, args.url, parse_headers(args.headers))
            add_secrets(spec.secrets)
            listing = await hub.add(spec, added_by=None)
            await audit(db, None, None, "mcp_add", f"{spec.name} {spec.where} (qwenbot mcp add)")
            print(added_text(spec, listing))
        else:
            removed = await hub.remove(args.name)
            await audit(db, None, None, "mcp_del", f"{args.name} (qwenbot mcp del)")
            print(f"Removed {args.name}" + (f" and its tools ({', '.join(removed)})." if removed else "."))
        return 0
    return with_mcp(settings, job)


def docs_command(settings: Settings, args: argparse.Namespace) -> int:
    """Add, list, delete or search documents in the bot's database (a running bot sees the changes at once)."""
    async def job() -> int:
        db = await open_settings_database(settings)
        try:
            library = document_library(settings, db)
            if args.action == "add":
                return await add_documents(library, args.paths, args.scope)
            if args.action == "list":
                print(documents_text(await library.documents(args.chat)))
            elif args.action == "del":
                removed = await library.remove(args.id)
                print(f"Removed {removed.label()} and its {chunks(removed.chunk_count)}.")
            else:
                chat = None if args.chat == GLOBAL else args.chat
                print(await docs_tools(settings, library).search(args.query, chat))
            return 0
        finally:
            await db.close()
    return run_async(job)


async def add_documents(library: DocumentLibrary, paths: Sequence[Path], scope: str) -> int:
    """Add each file (each supported file of a folder): a line each, refusals on stderr; 2 when any was refused."""
    failed = False
    for path in document_files(paths):
        try:
            added = await library.add(Upload(path.name, path.read_bytes(), scope=scope,
                                             added_by_name="qwenbot docs add"))
        except (DocumentError, OSError) as error:
            print(f"qwenbot: {error if isinstance(error, DocumentError) else f'{path}: {error}'}", file=sys.stderr)
            failed = True
            continue
        print(f"{path}: {adding_text(added)}")
    return 2 if failed else 0


def document_files(paths: Sequence[Path]) -> list[Path]:
    """The files named, and the supported files inside the folders named (other types there are skipped)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
        else:
            found.append(path)  # a missing or unsupported file gets its own line when it is added
    return found


def with_mcp(settings: Settings, job: Callable[[Database, McpHub], Awaitable[int]]) -> int:
    """Run `job` on the database and an MCP hub holding every tool (MCP ones as last listed; nothing connects
    unless the job asks to)."""
    async def run() -> int:
        config = read_config(settings.mcp.mcp_config_path)  # a broken file stops here, before the database opens
        db = await open_settings_database(settings)
        documents = docs_tools(settings, document_library(settings, db))
        registry = build_registry(db, settings.tools.tool_timeout_seconds, documents=documents)
        hub = mcp_hub(settings, db, registry, config)
        try:
            await hub.start(connect=False)
            return await job(db, hub)
        except KeyError as error:
            raise McpConfigError(f"no MCP server named {error.args[0]!r} in the database") from None
        finally:
            await hub.close()
            await db.close()
    return run_async(run)


def ask_command(settings: Settings, args: argparse.Namespace) -> int:
    """One turn, shown as it runs (steps, then the answer as it is written); with --trace, every step after it."""
    async def job() -> int:
        view = make_view(quiet=args.quiet)
        services = await start_services(settings)
        try:
            result = await answer_once(services, cli_session(args.session or fresh_session_id()), args.question,
                                       view)
        finally:
            await services.close()
        if args.trace:
            print("\n" + render_trace(result.steps))
        return 0
    return run_async(job)


def eval_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run a question set through the real agent, on a copy of the database; print the score and the failures.
    With --retrieval, only the document search, on a scratch index of the corpus."""
    if args.retrieval:
        return retrieval_command(settings, args)
    cases = load_cases(args.file)
    timeout = args.turn_timeout or settings.agent.turn_timeout_seconds
    old = read_report(args.compare) if args.compare else None
    saved = read_report(args.rescore) if args.rescore else None

    async def job() -> int:
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / "eval.sqlite3"
            await asyncio.to_thread(copy_database, settings.storage.database_path, copy)
            # The copy's sealed secrets open with the real database's key, wherever the copy is.
            run = settings.replaced(database_path=copy, turn_timeout_seconds=timeout,
                                    secrets_key_path=str(settings.storage.secrets_key_file))
            if saved is not None:
                db = await open_settings_database(run)
                try:
                    report = await rescore(saved, cases, build_registry(db, settings.tools.tool_timeout_seconds))
                finally:
                    await db.close()
            else:
                services = await start_services(run)
                try:
                    report = await evaluate(services.agent, cases)
                finally:
                    await services.close()
        report.about = {key: saved[key] for key in ABOUT if key in saved} if saved else evaluated(settings)
        print("\n".join(summary(report, str(args.rescore or args.file))))
        if old is not None:
            print("\n".join(["", *compare(report, old)]))
        if args.report:
            args.report.write_text(json.dumps(report.as_json(), ensure_ascii=False, indent=2), encoding="utf-8")
        return 0
    return run_async(job)


ABOUT = ("model", "backend", "mode", "constrained", "require_tool_call", "grounded_answers")


def read_report(path: Path) -> dict:
    """A report written by `qwenbot eval --report`; one that cannot be read is an `EvalFileError` naming it."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise EvalFileError(f"cannot read the report {path}: {error}") from None
    if not isinstance(report, dict) or not isinstance(report.get("questions"), list):
        raise EvalFileError(f"{path} is not a report of qwenbot eval --report")
    return report


def retrieval_command(settings: Settings, args: argparse.Namespace) -> int:
    """recall@k of docs_search on a question set; print a line per question and the figures."""
    cases = load_retrieval_cases(args.file)
    corpus = corpus_files(args.corpus or [default_corpus(args.file)])

    async def job() -> int:
        report = await evaluate_retrieval(cases, corpus, settings.docs.limits(), FORMS[args.tokenizer], args.k)
        print("\n".join(retrieval_summary(report, str(args.file))))
        if args.report:
            args.report.write_text(json.dumps(report.as_json(), ensure_ascii=False, indent=2), encoding="utf-8")
        return 0
    return run_async(job)


def evaluated(settings: Settings) -> dict[str, object]:
    """What a run evaluated, for its report: the model and how it was driven."""
    backend, agent = settings.model.llm_backend, settings.agent
    model = settings.openai.openai_model or settings.model.model if backend == "openai" else settings.model.model
    return {"model": model, "backend": backend, "mode": agent.agent_mode,
            "constrained": agent.constrained_decoding, "require_tool_call": agent.require_tool_call,
            "grounded_answers": agent.grounded_answers}


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


def transcribe_command(settings: Settings, args: argparse.Namespace) -> int:
    """Print the transcript of a recording (stdout), and its language and length (stderr); a file that is not a
    recording, or a backend that cannot transcribe, is one line and exit status 2."""
    transcriber = build_transcriber(settings)
    if transcriber is None:
        why = " and faster-whisper is not installed" if settings.voice.asr_backend == "auto" else ""
        raise ConfigError(f"speech is off (ASR_BACKEND={settings.voice.asr_backend}{why})")
    data = args.file.read_bytes()  # a missing file is an OSError: one line

    async def job() -> int:
        try:
            transcript = await transcriber.transcribe(data)
        except SpeechError as error:
            raise type(error)(f"{args.file}: {error}") from None
        finally:
            await transcriber.close()
        print(transcript.text)
        print(f"({transcript.language or 'language not given'}, {transcript.audio_seconds:.1f} s of audio)",
              file=sys.stderr)
        return 0
    return run_async(job)


def backup_command(settings: Settings, args: argparse.Namespace) -> int:
    """Copy the database at DATABASE_PATH to PATH with SQLite's online backup; print where and how large."""
    storage = settings.storage
    report = backup_database(storage.database_path, args.path,
                             busy_timeout_seconds=storage.database_busy_timeout_seconds)
    print(f"backed up {storage.database_path} to {report.path} ({report.size_bytes:,} bytes, schema "
          f"{report.schema}, integrity ok)")
    return 0


def restore_command(settings: Settings, args: argparse.Namespace) -> int:
    """Replace the database at DATABASE_PATH with a backup, unless a bot serves it; print what was kept."""
    report = restore_database(args.path, settings.storage.database_path)
    print(f"restored {report.path} from {args.path} (schema {report.schema}, integrity ok)")
    if report.previous is not None:
        print(f"the database as it was is kept in {report.previous}")
    if report.pending:
        print(f"{len(report.pending)} newer migration(s) apply at the next start or `qwenbot migrate`: "
              f"{', '.join(report.pending)}")
    return 0


def health_command(settings: Settings, args: argparse.Namespace) -> int:
    """Ask the running bot's /healthz; print what it says; 0 when healthy, 1 when not (or when nothing answers)."""
    import httpx

    metrics = settings.metrics
    if not metrics.metrics_port:
        raise ConfigError("the health endpoint is off: set METRICS_PORT (and restart the bot) to ask it")
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(metrics.metrics_host, metrics.metrics_host)
    url = f"http://{host if ':' not in host else f'[{host}]'}:{metrics.metrics_port}/healthz"
    try:
        response = httpx.get(url, timeout=metrics.health_check_timeout_seconds * 3)
    except httpx.HTTPError as error:
        print(f"unhealthy: nothing answers at {url} ({error})")
        return 1
    print(response.text.rstrip())
    return 0 if response.status_code == 200 else 1


def cli_session(session_id: str) -> Session:
    """A terminal session: its own history, tool settings of the 'cli' chat."""
    return Session(id=session_id, chat_key="cli", kind="cli")


def fresh_session_id() -> str:
    """A session id no earlier `qwenbot ask` used: each run is a question on its own."""
    return f"cli:ask:{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def export_command(settings: Settings, args: argparse.Namespace) -> int:
    """Print the history of session `args.session` as Markdown (steps included, unless --no-steps); a session
    with no history is one line on stderr and status 1."""
    async def job() -> int:
        db = await open_settings_database(settings)
        try:
            memory = Memory(db)
            turns = await memory.exported_turns(args.session, with_steps=not args.no_steps)
            summary = await memory.summary(args.session)
        finally:
            await db.close()
        if not turns:
            print(f"qwenbot: no history in session {args.session!r}", file=sys.stderr)
            return 1
        document = render_export(args.session, turns, summary, lang="en", with_steps=not args.no_steps,
                                 max_bytes=settings.conversations.export_max_bytes)
        sys.stdout.write(document.text)
        return 0
    return run_async(job)


def run_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run the Telegram bot (long polling, or a webhook when WEBHOOK_URL is set) until SIGINT or SIGTERM."""
    # Imported here: the terminal commands do not need python-telegram-bot.
    from telegram.error import InvalidToken, TelegramError

    from bot.telegram.app import run

    settings.require_telegram_token()
    try:
        run(settings, new_database=args.new_database)
    except InvalidToken:
        raise ConfigError("Telegram refused TELEGRAM_BOT_TOKEN: check it with @BotFather") from None
    except TelegramError as error:
        raise ConnectionError(f"cannot talk to Telegram at {settings.telegram.telegram_base_url}: {error}") from None
    return 0


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "migrate": migrate_command,
    "tools": tools_command,
    "mcp": mcp_command,
    "run": run_command,
    "ask": ask_command,
    "chat": chat_command,
    "eval": eval_command,
    "export": export_command,
    "transcribe": transcribe_command,
    "docs": docs_command,
    "backup": backup_command,
    "restore": restore_command,
    "health": health_command,
}

if __name__ == "__main__":
    sys.exit(main())
