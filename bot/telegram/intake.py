"""Updates from Telegram to the handlers, at least once: a journal in SQLite, long polling, the webhook queue.

Telegram forgets an update once a `getUpdates` call passes an `offset` above its id. So each batch is written to
the `telegram_updates` journal *before* the next call confirms it, and marked handled when its handler ends.
After a crash or a shutdown that interrupted turns, the unhandled updates are handled again on start-up; an
update Telegram sends twice is recognised by its id (and a turn already stored is not stored twice: the agent's
`source_key`). Ids are unique only for one bot at one Bot API server, so each row carries its source (the bot id
and TELEGRAM_BASE_URL): another server's ids starting again at 1 are new updates, and what is skipped is logged.
Webhook updates go through the same journal (bot/telegram/webhook.py).

Each update is handled in its own task, started in update order, so handlers can take their place in line
(bot/telegram/turns.py) in the order the updates came; other chats go on in parallel and `/help` never waits for
a turn. The dispatcher hands each update to its handler with the update's journal key attached (the turn's
`source_key`, through the turn scheduler): nothing outside this module builds one or calls back into it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from typing import Sequence

from telegram import Bot, Update
from telegram.error import InvalidToken, RetryAfter, TelegramError
from telegram.ext import Application

from agent.unicode import clean_text, has_surrogates
from bot.program.config import Settings
from bot.telegram.replies import quietly, retry_after_seconds
from bot.telegram.turns import TurnScheduler
from db import Database, DatabaseError

log = logging.getLogger(__name__)

POLL_TIMEOUT_SECONDS = 30
ALLOWED_UPDATES = ["message"]  # edits, channel posts, reactions... are never even fetched
KEEP_HANDLED_DAYS = 3  # Telegram redelivers unconfirmed updates for 24 hours: keep ids well beyond that
PRUNE_EVERY = 1000  # handled updates between two prunings of the journal
BACKOFF_SECONDS = (0.5, 1, 2, 5, 10, 30)
FINISH_BOUND_SECONDS = 10  # after cancelling, how long cancelled turns get to wind down


def journal_source(bot_id: int, settings: Settings) -> str:
    """Where update ids come from, and are unique: '<bot id>@<Bot API base URL>' (a token in the URL masked)."""
    url, token = settings.telegram.telegram_base_url, settings.telegram.telegram_bot_token
    return f"{bot_id}@{url.replace(token, '{token}') if token else url}"


def turn_source_key(source: str, update_id: int) -> str:
    """The `source_key` of the turn an update asks for: a redelivered update is stored and asked once."""
    return f"{_turn_key_prefix(source)}{update_id}"


def _turn_key_prefix(source: str) -> str:
    return f"tg:{source}:update:"


LEGACY_TURN_KEY_PREFIX = "tg:update:"  # turns asked for before updates had a source (migration 0009)


class UpdateJournal:
    """The `telegram_updates` table: what arrived from `source` (one bot at one Bot API server), what was handled."""

    def __init__(self, db: Database, source: str):
        self.db = db
        self.source = source

    def turn_key(self, update_id: int) -> str:
        """The `source_key` of the turn update `update_id` asks for."""
        return turn_source_key(self.source, update_id)

    async def admit(self, updates: Sequence[Update]) -> list[Update]:
        """Write the updates not seen before, in one transaction; return them, in order. Those skipped are logged."""
        if not updates:
            return []
        ids = [update.update_id for update in updates]
        # Urgent, and a few statements per batch rather than one per update: the next batch (with any /help in it)
        # waits for this one, so it must not queue behind the writes of every turn a burst is finishing.
        async with self.db.transaction(urgent=True) as conn:
            async with conn.execute("SELECT update_id, payload FROM telegram_updates "
                                    "WHERE source = ? AND update_id BETWEEN ? AND ?",
                                    (self.source, min(ids), max(ids))) as cursor:
                seen = {row[0]: row[1] for row in await cursor.fetchall()}
            fresh = [readable(update) for update in
                     {u.update_id: u for u in updates if u.update_id not in seen}.values()]
            await conn.executemany(
                "INSERT OR IGNORE INTO telegram_updates (source, update_id, payload) VALUES (?, ?, ?)",
                [(self.source, update.update_id, payload) for update, payload in fresh])
        _log_skipped([u for u in updates if u.update_id in seen], seen)
        return [update for update, _ in fresh]

    async def mark_handled(self, update_id: int) -> None:
        """Record that the update's handler ended."""
        async with self.db.transaction() as conn:
            await conn.execute(
                "UPDATE telegram_updates SET handled_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
                "WHERE source = ? AND update_id = ?", (self.source, update_id))

    async def unhandled(self, bot: Bot) -> list[Update]:
        """Updates written but never handled (a crash, or turns stopped by shutdown), oldest first."""
        rows = await self.db.fetchall(
            "SELECT payload FROM telegram_updates WHERE source = ? AND handled_at IS NULL ORDER BY update_id",
            (self.source,))
        return [Update.de_json(json.loads(payload), bot) for (payload,) in rows]

    async def claim_legacy(self) -> None:
        """Take the rows journaled before updates had a source (migration 0009) as this source's, and the keys
        of the turns they asked for with them."""
        async with self.db.transaction() as conn:
            claimed = (await conn.execute("UPDATE OR IGNORE telegram_updates SET source = ? WHERE source = ''",
                                          (self.source,))).rowcount
            await conn.execute("UPDATE OR IGNORE turns SET source_key = ? || substr(source_key, ?) "
                               "WHERE source_key LIKE ? || '%'",
                               (_turn_key_prefix(self.source), len(LEGACY_TURN_KEY_PREFIX) + 1,
                                LEGACY_TURN_KEY_PREFIX))
        if claimed:
            log.info("%d journaled update(s) from before the journal had sources are taken as %s's", claimed,
                     self.source)

    async def report_foreign(self) -> None:
        """Log updates another bot or Bot API server left unhandled: they are not handled here (their ids mean
        other updates at this server, and their answers would go through the wrong bot)."""
        rows = await self.db.fetchall("SELECT source, count(*) FROM telegram_updates "
                                      "WHERE source != ? AND handled_at IS NULL GROUP BY source", (self.source,))
        for source, count in rows:
            log.warning("%d update(s) from %s were left unhandled; this run serves %s and skips them", count,
                        source, self.source)

    async def prune(self, days: int = KEEP_HANDLED_DAYS) -> None:
        """Forget updates older than `days` that were handled, or that another source left (never handled here);
        and the delivery records of answers as old (bot/telegram/deliveries.py), which matter only while their
        update may be handled again."""
        since = f"-{days} days"
        async with self.db.transaction() as conn:
            await conn.execute(
                "DELETE FROM telegram_updates WHERE (handled_at IS NOT NULL OR source NOT IN (?, '')) "
                "AND received_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)", (self.source, since))
            await conn.execute("DELETE FROM answer_deliveries WHERE delivered_at < "
                               "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)", (since,))


def _log_skipped(skipped: list[Update], journaled: dict[int, str]) -> None:
    """Say what `admit` skipped: a redelivery (the same update again), or another update under a known id."""
    for update in skipped:
        if _identity(update.to_dict()) == _identity(json.loads(journaled[update.update_id])):
            log.info("update %s is already in the journal (sent again); skipped", update.update_id)
        else:
            log.warning("update %s is not the update journaled under that id (did the Bot API server start its "
                        "ids over?); skipped", update.update_id)


def _identity(update: dict) -> tuple:
    """What tells two updates apart besides their id: the message's chat, id and date."""
    message = next((value for value in update.values() if isinstance(value, dict)), {})
    return (message.get("chat", {}).get("id"), message.get("message_id"), message.get("date"))


def readable(update: Update) -> tuple[Update, str]:
    """The update as handlers may take it, and its JSON for the journal: UTF-8 text as written (not `\\uXXXX`
    escapes, which take twice the room for Chinese), with any lone surrogate replaced (agent/unicode.py), since
    neither SQLite nor a Bot API call can encode one."""
    payload = json.dumps(update.to_dict(), ensure_ascii=False)
    if not has_surrogates(payload):
        return update, payload
    payload = clean_text(payload)  # surrogates only occur inside JSON strings, so the JSON stays valid
    try:
        bot: Bot | None = update.get_bot()
    except RuntimeError:  # an update built without a bot (tests)
        bot = None
    return Update.de_json(json.loads(payload), bot), payload


class Dispatcher:
    """Runs each journaled update through the application in its own task, and records when it is handled.

    An update whose turn shutdown stopped before its answer was delivered (bot/telegram/turns.py) stays unhandled,
    and the next start handles it again: a stored turn is answered from the store, not from the model.
    """

    def __init__(self, application: Application, journal: UpdateJournal, turns: TurnScheduler):
        self.application = application
        self.journal = journal
        self.turns = turns
        self.tasks: dict[int, asyncio.Task] = {}
        self.handled = 0

    async def accept(self, updates: Sequence[Update]) -> None:
        """Journal the updates, then start handling the new ones (in order)."""
        for update in await self.journal.admit(updates):
            self._start(update)

    async def replay(self) -> int:
        """Start handling what an earlier run left unhandled; how many."""
        pending = [u for u in await self.journal.unhandled(self.application.bot) if u.update_id not in self.tasks]
        for update in pending:
            self._start(update)
        if pending:
            log.info("handling %d update(s) left unhandled by the previous run", len(pending))
        return len(pending)

    def _start(self, update: Update) -> None:
        self.tasks[update.update_id] = asyncio.create_task(self._handle(update), name=f"update:{update.update_id}")

    async def _handle(self, update: Update) -> None:
        # The one place the journal key is attached: a turn the update asks for is stored under it.
        self.turns.attach_journal_key(update.update_id, self.journal.turn_key(update.update_id))
        try:
            # Handler errors go to the application's error handler; process_update itself does not raise.
            await self.application.process_update(update)
        finally:
            self.turns.detach_journal_key(update.update_id)
            try:
                if not self.turns.take_kept(update.update_id):
                    await self._mark_handled(update.update_id)
            finally:
                # Only now: `finish` waits for what is in `tasks`, and the database must outlive the marking.
                self.tasks.pop(update.update_id, None)

    async def _mark_handled(self, update_id: int) -> None:
        self.handled += 1
        try:
            await self.journal.mark_handled(update_id)
            if self.handled % PRUNE_EVERY == 0:
                await self.journal.prune()
        except DatabaseError as error:  # busy, or gone: the update is handled again after a restart
            log.warning("could not mark update %s handled: %s", update_id, error)
        except Exception:
            log.warning("could not mark update %s handled", update_id, exc_info=True)

    async def finish(self, grace_seconds: float) -> None:
        """Let running handlers end within `grace_seconds`; then cancel the turns left and wait for them. Answers
        Telegram has not taken yet stay unhandled in the journal: the next start sends them."""
        self.turns.closing = True
        await _wait(list(self.tasks.values()), grace_seconds)
        if self.tasks:
            stopped = self.turns.cancel_all()
            log.info("shutdown: stopped %d turn(s); their updates are handled after the restart", stopped)
            await _wait(list(self.tasks.values()), FINISH_BOUND_SECONDS)
        for task in list(self.tasks.values()):
            task.cancel()  # a handler that ignores cancellation (a hung send): stop waiting for it
        await _wait(list(self.tasks.values()), 1)


async def _wait(tasks: list[asyncio.Task], timeout: float) -> None:
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


class Poller:
    """Long polling: fetch, journal, then let the next call's offset confirm the batch."""

    def __init__(self, bot: Bot, dispatcher: Dispatcher, *, timeout: float = POLL_TIMEOUT_SECONDS):
        self.bot = bot
        self.dispatcher = dispatcher
        self.timeout = timeout
        self.offset: int | None = None
        self._failures = 0

    async def run(self) -> None:
        """Poll until cancelled; a rejected token ends it (there is nothing to retry)."""
        await quietly(self.bot.delete_webhook(drop_pending_updates=False), "deleteWebhook")
        while True:
            try:
                updates, next_offset = await self._fetch()
                if updates:
                    await self.dispatcher.accept(updates)
                self.offset = next_offset
                self._failures = 0
            except InvalidToken:
                raise
            except RetryAfter as error:
                await asyncio.sleep(retry_after_seconds(error))
            except Exception as error:
                # Network trouble, a 5xx, a webhook still set (Conflict), the database busy: wait, then fetch
                # again from the same offset, so nothing fetched but not journaled is lost.
                await self._back_off(error)

    async def _fetch(self) -> tuple[list[Update], int | None]:
        """The next batch, and the offset that will confirm it."""
        try:
            updates = await self.bot.get_updates(offset=self.offset, timeout=self.timeout,
                                                 allowed_updates=ALLOWED_UPDATES)
        except TelegramError:
            raise
        except Exception:  # Telegram answered, but the library cannot read an update of the batch (logged)
            return await self._fetch_readable()
        return updates, (updates[-1].update_id + 1 if updates else self.offset)

    async def _fetch_readable(self) -> tuple[list[Update], int | None]:
        """The batch again, read update by update: one that cannot be read is skipped (else it would come back
        forever, and the bot would answer nobody again)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # do_api_request points to get_updates: that is what failed
            raw = await self.bot.do_api_request("getUpdates", api_kwargs={
                "offset": self.offset, "timeout": 0, "allowed_updates": ALLOWED_UPDATES})
        readable = []
        for item in raw:
            try:
                readable.append(Update.de_json(item, self.bot))
            except Exception as error:
                log.error("update %s cannot be read (%s); skipping it", item.get("update_id"), error)
        return readable, (raw[-1]["update_id"] + 1 if raw else self.offset)

    async def _back_off(self, error: Exception) -> None:
        pause = BACKOFF_SECONDS[min(self._failures, len(BACKOFF_SECONDS) - 1)]
        self._failures += 1
        log.warning("getting updates failed (%s); retrying in %g s", error, pause)
        await asyncio.sleep(pause)
