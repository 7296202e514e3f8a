"""The Telegram application: handler registration in one place, start-up and shutdown, polling or webhook.

    app = build_application(settings)              # or build_application(settings, llm=ScriptedLLM([...]))
    await serve(app, settings, stop_event)         # until stop_event is set (SIGINT/SIGTERM in `qwenbot run`)

`post_init` starts the services (database, model, agent) and registers the command menu; `post_shutdown` closes
them. `serve` feeds updates through the journal in bot/telegram/intake.py and, on stop, lets running turns finish for
SHUTDOWN_GRACE_SECONDS before stopping the rest (their updates are handled again after the restart).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
from typing import Awaitable, Callable

from telegram import BotCommand, BotCommandScopeChat, Update
from telegram.ext import Application, ApplicationBuilder, CommandHandler, ContextTypes, MessageHandler, filters

from agent.llm.base import LLM
from bot.program import systemd
from bot.program.config import Settings
from bot.program.endpoint import Endpoint
from bot.program.health import HealthCheck
from bot.program.logs import add_secrets
from bot.program.metrics import BotMetrics
from bot.program.services import Services, naming_database_path, start_services
from bot.telegram import admin, admin_chats, admin_docs, admin_mcp, handlers
from bot.telegram.context import (DELIVERIES, HEALTH, METRICS, PROGRESS, SERVICES, TELEGRAM_CALLS, TURNS, BotContext,
                                  runtime_data)
from bot.telegram.intake import ALLOWED_UPDATES, POLL_TIMEOUT_SECONDS, Dispatcher, Poller, UpdateJournal, journal_source
from bot.telegram.ratelimit import BotRateLimiter
from bot.telegram.replies import quietly
from bot.telegram.requests import CALLS_POOL_SIZE, UPDATES_POOL_SIZE, MeteredRequest, TelegramCalls, keep_in_touch
from bot.telegram.webhook import WebhookServer
from bot.telegram.turns import BY_DATABASE_GONE
from db import DatabaseGone, InstanceLock

log = logging.getLogger(__name__)

ServicesFactory = Callable[[Settings], Awaitable[Services]]

# The command menu (setMyCommands): (command, English, Chinese).
USER_COMMANDS = [
    ("ask", "ask a question (in groups)", "提问（群聊中使用）"),
    ("help", "how to ask, and the commands", "使用说明"),
    ("start", "what this bot does", "这个机器人能做什么"),
    ("reset", "forget this chat's history", "忘记本聊天的历史"),
    ("cancel", "stop the running answer", "停止正在进行的回答"),
    ("trace", "steps of the last answer", "上一次回答的步骤"),
    ("tools", "tools enabled here", "本聊天可用的工具"),
    ("docs", "documents I can search here", "本聊天可搜索的文档"),
    ("memory", "what I keep of older turns", "我对较早对话的摘要"),
    ("quota", "your share left today", "你今天还剩的额度"),
    ("export", "this chat's history as a file", "把本聊天的记录导出为文件"),
]
ADMIN_COMMANDS = [
    ("tool_on", "NAME [global] [destructive]: enable a tool"),
    ("tool_off", "NAME [global]: disable a tool"),
    ("require_tool", "on|off|default [global]: tool call before answering"),
    ("courses", "list the courses"),
    ("course_add", "NAME LESSONS PER_WEEK HOURS"),
    ("course_set", "NAME FIELD VALUE"),
    ("course_del", "NAME"),
    ("allow", "ID: give a user or group access"),
    ("deny", "ID: take access away"),
    ("admins", "who has access"),
    ("stats", "[DAYS]: usage figures"),
    ("mcp_list", "MCP servers and their tools"),
    ("mcp_add", "NAME URL [Header=value]: connect an MCP server"),
    ("mcp_refresh", "NAME: list a server's tools again"),
    ("mcp_del", "NAME: remove an MCP server"),
    ("doc_add", "[global], replying to a file: add a document"),
    ("doc_del", "ID: remove a document"),
    ("doc_scope", "ID global|here: where a document is searched"),
    ("persona", "TEXT|reset: this chat's persona"),
    ("quota_set", "USER turns|tokens N|default: a user's daily limit"),
]


def build_application(settings: Settings, *, llm: LLM | None = None,
                      services_factory: ServicesFactory | None = None, new_database: bool = False) -> Application:
    """The application for `settings`; tests pass a scripted `llm` (or a whole `services_factory`).
    `new_database`: make a new database where one was lost (`qwenbot run --new-database`, db/marker.py)."""
    add_secrets(settings.secrets())  # python-telegram-bot logs the Bot API URL as the bot is built
    async def start(settings: Settings) -> Services:
        return await start_services(settings, llm=llm, new_database=new_database)

    calls = TelegramCalls()  # every Bot API call tallied, for /metrics and /healthz
    application = (
        ApplicationBuilder()
        .token(settings.telegram.telegram_bot_token)
        .base_url(settings.telegram.telegram_base_url)
        .request(MeteredRequest(calls, connection_pool_size=CALLS_POOL_SIZE))
        .get_updates_request(MeteredRequest(calls, connection_pool_size=UPDATES_POOL_SIZE))
        .base_file_url(settings.telegram.file_url())
        .context_types(ContextTypes(context=BotContext))
        .rate_limiter(BotRateLimiter(overall_max_rate=settings.telegram.telegram_messages_per_second,
                                     group_max_rate=settings.telegram.telegram_group_messages_per_minute,
                                     max_retries=2))
        .updater(None)  # updates come through bot/telegram/intake.py, journaled
        .post_init(_post_init(settings, services_factory or start))
        .post_shutdown(_post_shutdown)
        .build()
    )
    application.bot_data.update({TELEGRAM_CALLS: calls, METRICS: BotMetrics(calls)})
    register_handlers(application)
    return application


def register_handlers(application: Application) -> None:
    """Every handler, in one place. Only new messages are handled: an edited message is not answered twice.

    A command inside a forwarded message is someone else's text: it is not run (a private chat shows /help).
    """
    new = filters.UpdateType.MESSAGE
    private = filters.ChatType.PRIVATE
    typed = new & ~filters.FORWARDED
    commands = {
        "start": handlers.start, "help": handlers.help_command, "ask": handlers.ask, "reset": handlers.reset,
        "cancel": handlers.cancel, "trace": handlers.trace,
        "tool_on": admin.tool_on, "tool_off": admin.tool_off, "require_tool": admin.require_tool,
        "courses": admin.courses,
        "course_add": admin.course_add, "course_set": admin.course_set, "course_del": admin.course_del,
        "allow": admin.allow, "deny": admin.deny, "admins": admin.admins, "stats": admin.stats,
        "mcp_add": admin_mcp.mcp_add, "mcp_list": admin_mcp.mcp_list, "mcp_del": admin_mcp.mcp_del,
        "mcp_refresh": admin_mcp.mcp_refresh,
        "docs": handlers.docs, "doc_add": admin_docs.doc_add, "doc_del": admin_docs.doc_del,
        "doc_scope": admin_docs.doc_scope,
        "memory": handlers.memory, "quota": handlers.quota, "export": handlers.export,
        "persona": admin_chats.persona, "quota_set": admin_chats.quota_set,
    }
    # `/tools all` and `/docs all` (admins) before plain `/tools` and `/docs`: the first matching handler wins.
    application.add_handler(CommandHandler("tools", admin.tools_all, filters=typed & filters.Regex(r"^\S+\s+all\s*$")))
    application.add_handler(CommandHandler("tools", handlers.tools, filters=typed))
    application.add_handler(CommandHandler("docs", admin_docs.docs_all,
                                           filters=typed & filters.Regex(r"^\S+\s+all\s*$")))
    for name, callback in commands.items():
        application.add_handler(CommandHandler(name, callback, filters=typed))
    application.add_handler(MessageHandler(new & filters.StatusUpdate.MIGRATE, handlers.on_migrate))
    # Documents: a file with /doc_add as its caption (typed, not forwarded: a forwarded caption is someone else's
    # text), anywhere; any file in a private chat (forwarding one to the bot is how an admin hands it over). Image
    # files are pictures to ask about, not documents to search.
    application.add_handler(MessageHandler(
        typed & filters.Document.ALL & filters.CaptionRegex(admin_docs.CAPTION_COMMAND), admin_docs.doc_add_caption))
    application.add_handler(MessageHandler(new & private & filters.Document.ALL & ~filters.Document.IMAGE,
                                           admin_docs.on_private_file))
    application.add_handler(MessageHandler(new & filters.TEXT & ~filters.COMMAND, handlers.on_text))
    application.add_handler(MessageHandler(new & (filters.VOICE | filters.AUDIO | filters.VIDEO_NOTE),
                                           handlers.on_recording))
    application.add_handler(MessageHandler(new & (filters.PHOTO | filters.Document.IMAGE), handlers.on_picture))
    application.add_handler(MessageHandler(new & private & filters.COMMAND, handlers.unknown_command))
    application.add_handler(MessageHandler(new & private & ~filters.TEXT & ~filters.StatusUpdate.ALL,
                                           handlers.non_text))
    application.add_error_handler(handlers.on_error)


def _post_init(settings: Settings, start: ServicesFactory) -> Callable[[Application], Awaitable[None]]:
    async def post_init(application: Application) -> None:
        """Start the services, share them with the handlers, register the command menu."""
        services = await start(settings)
        application.bot_data.update(runtime_data(settings, services))
        application.bot_data[METRICS].attach(services)
        await register_commands(application, settings)
    return post_init


async def _post_shutdown(application: Application) -> None:
    """Close the model and the database (after every handler has ended, and the last delivery is written)."""
    if (deliveries := application.bot_data.get(DELIVERIES)) is not None:
        await deliveries.settled()
    services: Services | None = application.bot_data.pop(SERVICES, None)
    if services is not None:
        await services.close()


async def register_commands(application: Application, settings: Settings) -> None:
    """The command menu for everyone (English and Chinese), and with admin commands for each admin.

    A failure is logged and ignored: the menu is a convenience, never a reason not to start.
    """
    bot = application.bot
    await quietly(bot.set_my_commands([BotCommand(c, en) for c, en, _ in USER_COMMANDS]), "setMyCommands")
    await quietly(bot.set_my_commands([BotCommand(c, zh) for c, _, zh in USER_COMMANDS], language_code="zh"),
                  "setMyCommands (zh)")
    admin_menu = [BotCommand(c, en) for c, en, _ in USER_COMMANDS] + [BotCommand(c, d) for c, d in ADMIN_COMMANDS]
    for admin_id in sorted(settings.access.admin_user_ids):
        # Fails with "chat not found" until the admin has written to the bot once; that is fine.
        await quietly(bot.set_my_commands(admin_menu, scope=BotCommandScopeChat(admin_id)), "setMyCommands (admin)")


# --- running ---------------------------------------------------------------------------------------------------

async def serve(application: Application, settings: Settings, stop: asyncio.Event, *,
                poll_timeout: float = POLL_TIMEOUT_SECONDS) -> None:
    """Run the bot until `stop` is set (or the intake fails for good, e.g. a rejected token), then shut down.

    First the database's instance lock (db/instance_lock.py): one serving process per database, a second one
    waits INSTANCE_LOCK_WAIT_SECONDS for it (a rolling restart) and then gives up with `DatabaseInUse`. Then, with
    METRICS_PORT set, /metrics and /healthz (bot/program/endpoint.py): up while the model loads, saying so.
    """
    lock = InstanceLock(settings.storage.database_path)
    with naming_database_path():
        if not await lock.acquire(settings.storage.instance_lock_wait_seconds, stop):
            return  # stopped while waiting for the other process
    health = HealthCheck(settings, asyncio.get_running_loop(), application.bot_data[TELEGRAM_CALLS])
    application.bot_data[HEALTH] = health
    try:
        endpoint = open_endpoint(settings, application.bot_data[METRICS], health)
        try:
            await application.initialize()
            try:
                await application.post_init(application)
                health.attach(application.bot_data[SERVICES])
                await application.start()
                try:
                    await _take_updates(application, settings, stop, poll_timeout)
                finally:
                    await application.stop()
            finally:
                await application.shutdown()
                await application.post_shutdown(application)
        finally:
            if endpoint is not None:
                endpoint.stop()
    finally:
        lock.release()  # after the database is closed: the next process finds everything written


def open_endpoint(settings: Settings, metrics: BotMetrics, health: HealthCheck) -> Endpoint | None:
    """/metrics and /healthz on METRICS_HOST:METRICS_PORT, serving; None when METRICS_PORT is 0 (off)."""
    port = settings.metrics.metrics_port
    if not port:
        return None
    return Endpoint(settings.metrics.metrics_host, port, metrics.registry, health.run).start()


async def _take_updates(application: Application, settings: Settings, stop: asyncio.Event,
                        poll_timeout: float) -> None:
    services: Services = application.bot_data[SERVICES]
    journal = UpdateJournal(services.db, journal_source(application.bot.id, settings),
                            max_question_chars=settings.turns.max_question_chars)
    dispatcher = Dispatcher(application, journal, application.bot_data[TURNS])
    await journal.claim_legacy()
    await journal.report_foreign()
    await journal.prune()
    await journal.husk_handled()  # rows a version before the husks kept whole
    await application.bot_data[PROGRESS].clean_up(application.bot)  # left on screen by a killed process
    await dispatcher.replay()
    intake = await _start_intake(application, settings, dispatcher, poll_timeout)
    stopping = asyncio.create_task(stop.wait())
    # The database file deleted or replaced under us (db/file_watch.py): stop rather than write to a ghost.
    watch = asyncio.create_task(services.db.file.watch(settings.storage.database_check_seconds), name="database-watch")
    helpers = _health_helpers(application, settings)
    systemd.notify("READY=1")
    try:
        await asyncio.wait([intake.task, stopping, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        systemd.notify("STOPPING=1")
        stopping.cancel()
        watch.cancel()
        for helper in helpers:
            helper.cancel()
        await intake.close()
        if watch.done() and not watch.cancelled() and isinstance(watch.exception(), DatabaseGone):
            # Nothing can be stored any more: stop every turn now, and each tells its asker (bot/telegram/questions.py).
            application.bot_data[TURNS].cancel_all(BY_DATABASE_GONE)
        await dispatcher.finish(settings.turns.shutdown_grace_seconds)
    for task in (watch, intake.task):
        if task.done() and not task.cancelled() and task.exception():
            raise task.exception()  # e.g. InvalidToken, DatabaseGone: `qwenbot run` reports it in one line


def _health_helpers(application: Application, settings: Settings) -> list[asyncio.Task]:
    """What keeps the health checks true while serving, when anything asks them (METRICS_PORT, or systemd's
    WatchdogSec): a getMe whenever Telegram has not been reached for half of HEALTH_TELEGRAM_SECONDS, and the
    watchdog pinged while healthy."""
    interval = systemd.watchdog_seconds()
    if not settings.metrics.metrics_port and interval is None:
        return []
    every = settings.metrics.health_telegram_seconds / 2
    helpers = [asyncio.create_task(keep_in_touch(application.bot, application.bot_data[TELEGRAM_CALLS], every),
                                   name="telegram-keep-in-touch")]
    if interval is not None:
        helpers.append(asyncio.create_task(systemd.watchdog(application.bot_data[HEALTH].run, interval / 2),
                                           name="systemd-watchdog"))
    return helpers


class _Intake:
    """Where updates come from (the poller, or the webhook server), as a task to watch and cancel."""

    def __init__(self, task: asyncio.Task):
        self.task = task

    async def close(self) -> None:
        # Cancelling stops fetching (or closes the webhook server); the bot's HTTP client stays open for the
        # handlers still sending answers: `Application.shutdown` closes it once they are done.
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _start_intake(application: Application, settings: Settings, dispatcher: Dispatcher,
                        poll_timeout: float) -> _Intake:
    webhook = settings.webhook
    if not webhook.webhook_url:
        poller = Poller(application.bot, dispatcher, timeout=poll_timeout)
        return _Intake(asyncio.create_task(poller.run(), name="poller"))

    async def accept(update: Update) -> None:
        await dispatcher.accept([update])

    secret = webhook.webhook_secret_token or secrets.token_urlsafe(32)
    add_secrets([secret])  # python-telegram-bot logs setWebhook's parameters at DEBUG
    server = WebhookServer(application.bot, accept, url=webhook.webhook_url, listen=webhook.webhook_listen,
                           port=webhook.webhook_port, secret=secret,
                           max_body_bytes=webhook.webhook_max_body_bytes, allowed_updates=ALLOWED_UPDATES)
    return _Intake(asyncio.create_task(server.run(), name="webhook"))


def run(settings: Settings, *, new_database: bool = False) -> None:
    """`qwenbot run`: serve until SIGINT or SIGTERM."""
    asyncio.run(_run_until_signal(settings, new_database))


async def _run_until_signal(settings: Settings, new_database: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    mode = f"webhook at {settings.webhook.webhook_url}" if settings.webhook.webhook_url else "long polling"
    log.info("starting the bot (%s)", mode)
    await serve(build_application(settings, new_database=new_database), settings, stop)
    log.info("stopped")
