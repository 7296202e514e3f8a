"""Updates from Telegram to the handlers, at least once: a journal in SQLite, long polling, the webhook queue.

Telegram forgets an update once a `getUpdates` call passes an `offset` above its id. So each batch is written to
the `telegram_updates` journal *before* the next call confirms it, and marked handled when its handler ends.
After a crash or a shutdown that interrupted turns, the unhandled updates are handled again on start-up; an
update Telegram sends twice is recognised by its id (and a turn already stored is not stored twice: the agent's
`source_key`). Ids are unique only for one bot at one Bot API server, so each row carries its source (the bot id
and TELEGRAM_BASE_URL): another server's ids starting again at 1 are new updates, and what is skipped is logged.
Webhook updates go through the same journal (bot/telegram/webhook.py). What a row keeps is the update until it is
handled, and only its husk after (bot/telegram/journal_payloads.py): no text stays in the journal for days.

Update ids that start over at the same address. Telegram itself never gives one id to two updates, and never
answers a `getUpdates` with an id below the offset it was given (it forgets those). But ids do start over: a local
Bot API server restarted without its working folder starts its queue at a random id (td's TQueue,
`EventId::create_random`), a test server at 1, and Telegram's own after a week without updates at a random one.
Nothing else tells: `getMe` and `getWebhookInfo` answer the same before and after. So the ids themselves are the
evidence, and the policy is:

- the poller sends an `offset` only to confirm the batch it just journaled, never again after an error or an
  empty answer, so a restarted server is never told to forget updates it has not delivered yet (a server that
  did not restart just sends the unconfirmed batch again, which the journal recognises and skips);
- the journal takes an update as the start of a new *epoch* of its source when its id is already journaled for
  another update (chat, message or date differ), when a turn is stored under its key although the journal
  no longer holds it (pruned), or when it lies more than REWIND_GAP below the highest id of the current epoch. An
  epoch is a source of its own (`<source>#<n>`, in `update_epochs`), so its ids and the keys of the turns they ask
  for never meet the earlier ones': nothing is skipped, nothing is answered from another question's turn;
- a redelivery (the same update under the same id) is skipped in any case: nothing is answered twice.

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
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import urlsplit

from telegram import Bot, Update
from telegram.error import InvalidToken, RetryAfter, TelegramError
from telegram.ext import Application

from agent.unicode import clean_text, has_surrogates
from bot.program.config import Settings
from bot.telegram import journal_payloads
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
# An update id this far below the highest one journaled means a server that started over: Telegram's ids grow by
# one an update, and webhook posts come out of order by no more than its parallel connections (100 at most).
REWIND_GAP = 10_000


def journal_source(bot_id: int, settings: Settings) -> str:
    """Where update ids come from, and are unique: '<bot id>@<Bot API base URL>' (a token or a password in the URL
    masked: the source is written into every journal row and turn key)."""
    url, token = settings.telegram.telegram_base_url, settings.telegram.telegram_bot_token
    url = url.replace(token, "{token}") if token else url
    password = urlsplit(url).password
    return f"{bot_id}@{url.replace(f':{password}@', ':{password}@') if password else url}"


def epoch_source(base: str, epoch: int) -> str:
    """The journal source of a source's `epoch`: the first keeps the plain name (rows and turns from before)."""
    return base if epoch <= 1 else f"{base}#{epoch}"


def turn_source_key(source: str, update_id: int) -> str:
    """The `source_key` of the turn an update asks for: a redelivered update is stored and asked once."""
    return f"{_turn_key_prefix(source)}{update_id}"


def _turn_key_prefix(source: str) -> str:
    return f"tg:{source}:update:"


LEGACY_TURN_KEY_PREFIX = "tg:update:"  # turns asked for before updates had a source (migration 0009)


@dataclass(frozen=True)
class Journaled:
    """An update as the journal holds it, with its source (its epoch's) and the key of the turn it asks for."""

    update: Update
    source: str

    @property
    def key(self) -> str:
        """The `source_key` of the turn the update asks for."""
        return turn_source_key(self.source, self.update.update_id)


class UpdateJournal:
    """The `telegram_updates` table: what arrived from `base` (one bot at one Bot API server, in epochs), what was
    handled."""

    def __init__(self, db: Database, source: str, *, max_question_chars: int | None = None):
        self.db = db
        self.base = source
        self.source = source  # the current epoch's, as `admit` last found it
        self.max_question_chars = max_question_chars  # a longer text is journaled cut (journal_payloads.admitted)

    async def admit(self, updates: Sequence[Update]) -> list[Journaled]:
        """Write the updates not seen before, in one transaction; return them, in order. Those skipped are logged;
        a server that started its ids over starts a new epoch (see the module's docstring)."""
        if not updates:
            return []
        ids = [update.update_id for update in updates]
        # Urgent, and a few statements per batch rather than one per update: the next batch (with any /help in it)
        # waits for this one, so it must not queue behind the writes of every turn a burst is finishing.
        async with self.db.transaction(urgent=True) as conn:
            epoch, high_water = await _current_epoch(conn, self.base)
            source = epoch_source(self.base, epoch)
            seen = await _journaled(conn, source, min(ids), max(ids))
            restart = await _restart_point(conn, source, updates, seen, high_water)
            if restart is not None:
                epoch, source, high_water = epoch + 1, epoch_source(self.base, epoch + 1), None
                redelivered = {u.update_id: seen[u.update_id] for u in updates[:restart] if u.update_id in seen}
                seen = redelivered  # those before the new ids are still the old server's, sent again
            fresh = [readable(update, self.max_question_chars) for update in
                     {u.update_id: u for u in updates if u.update_id not in seen}.values()]
            await conn.executemany(
                "INSERT OR IGNORE INTO telegram_updates (source, update_id, payload) VALUES (?, ?, ?)",
                [(source, update.update_id, payload) for update, payload in fresh])
            if fresh:
                await _advance_epoch(conn, self.base, epoch, max(high_water or 0, *(u.update_id for u, _ in fresh)))
        if restart is not None:
            log.warning("update %s is not the update journaled under that id before: the Bot API server started its "
                        "update ids over; its updates are journaled as %s from now on", updates[restart].update_id,
                        source)
        self.source = source
        _log_skipped([u for u in updates if u.update_id in seen])
        return [Journaled(update, source) for update, _ in fresh]

    async def mark_handled(self, item: Journaled) -> None:
        """Record that the update's handler ended; the row keeps only the update's husk from now on (and after a
        command that carried secrets, the write-ahead log is emptied of the page that held them)."""
        payload = item.update.to_dict()
        husk = json.dumps(journal_payloads.handled(payload), ensure_ascii=False)
        async with self.db.transaction() as conn:
            await conn.execute(
                "UPDATE telegram_updates SET handled_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), payload = ? "
                "WHERE source = ? AND update_id = ?", (husk, item.source, item.update.update_id))
        if journal_payloads.carries_secrets(payload) and not await self.db.checkpoint():
            log.info("update %s: the write-ahead log could not be emptied now; the next checkpoint overwrites it",
                     item.update.update_id)

    async def unhandled(self, bot: Bot) -> list[Journaled]:
        """Updates written but never handled (a crash, or turns stopped by shutdown), of every epoch of this
        source, in the order they arrived."""
        rows = await self.db.fetchall(
            f"SELECT source, payload FROM telegram_updates WHERE handled_at IS NULL AND {_OWN} "
            "ORDER BY received_at, update_id", (self.base, self.base, self.base))
        return [Journaled(Update.de_json(json.loads(payload), bot), source) for source, payload in rows]

    async def claim_legacy(self) -> None:
        """Take the rows journaled before updates had a source (migration 0009) as this source's, and the keys
        of the turns they asked for with them."""
        async with self.db.transaction() as conn:
            claimed = (await conn.execute("UPDATE OR IGNORE telegram_updates SET source = ? WHERE source = ''",
                                          (self.base,))).rowcount
            await conn.execute("UPDATE OR IGNORE turns SET source_key = ? || substr(source_key, ?) "
                               "WHERE source_key LIKE ? || '%'",
                               (_turn_key_prefix(self.base), len(LEGACY_TURN_KEY_PREFIX) + 1,
                                LEGACY_TURN_KEY_PREFIX))
        if claimed:
            log.info("%d journaled update(s) from before the journal had sources are taken as %s's", claimed,
                     self.base)

    async def report_foreign(self) -> None:
        """Log updates another bot or Bot API server left unhandled: they are not handled here (their ids mean
        other updates at this server, and their answers would go through the wrong bot)."""
        rows = await self.db.fetchall("SELECT source, count(*) FROM telegram_updates "
                                      f"WHERE NOT {_OWN} AND handled_at IS NULL GROUP BY source",
                                      (self.base, self.base, self.base))
        for source, count in rows:
            log.warning("%d update(s) from %s were left unhandled; this run serves %s and skips them", count,
                        source, self.base)

    async def husk_handled(self) -> int:
        """Reduce handled updates that still hold their text (journaled before handled updates were husked) to
        their husks, and empty the write-ahead log of what they held; how many."""
        rows = await self.db.fetchall("SELECT source, update_id, payload FROM telegram_updates WHERE handled_at IS "
                                      "NOT NULL AND (instr(payload, '\"text\"') OR instr(payload, '\"caption\"'))")
        husks = [(json.dumps(journal_payloads.handled(json.loads(payload)), ensure_ascii=False), source, update_id)
                 for source, update_id, payload in rows]
        if husks:
            async with self.db.transaction() as conn:
                await conn.executemany("UPDATE telegram_updates SET payload = ? WHERE source = ? AND update_id = ?",
                                       husks)
            await self.db.checkpoint()
            log.info("%d handled update(s) in the journal reduced to what recognises them", len(husks))
        return len(husks)

    async def prune(self, days: int = KEEP_HANDLED_DAYS) -> None:
        """Forget updates older than `days` that were handled, or that another source left (never handled here);
        and the delivery records of answers as old (bot/telegram/deliveries.py), which matter only while their
        update may be handled again."""
        since = f"-{days} days"
        async with self.db.transaction() as conn:
            await conn.execute(
                f"DELETE FROM telegram_updates WHERE (handled_at IS NOT NULL OR NOT ({_OWN} OR source = '')) "
                "AND received_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)", (self.base, self.base, self.base, since))
            await conn.execute("DELETE FROM answer_deliveries WHERE delivered_at < "
                               "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)", (since,))


# Rows of this source, any epoch: the plain name, or the name followed by '#' (no LIKE: a URL may hold '_' or '%').
_OWN = "(source = ? OR substr(source, 1, length(?) + 1) = ? || '#')"


async def _current_epoch(conn: Any, base: str) -> tuple[int, int | None]:
    """The source's current epoch and the highest id journaled in it (1 and None before the first update)."""
    async with conn.execute("SELECT epoch, high_water FROM update_epochs WHERE base = ?", (base,)) as cursor:
        row = await cursor.fetchone()
    return (1, None) if row is None else (int(row[0]), row[1])


async def _advance_epoch(conn: Any, base: str, epoch: int, high_water: int) -> None:
    await conn.execute(
        "INSERT INTO update_epochs (base, epoch, high_water) VALUES (?, ?, ?) ON CONFLICT (base) DO UPDATE SET "
        "high_water = excluded.high_water, started_at = CASE WHEN epoch = excluded.epoch THEN started_at "
        "ELSE strftime('%Y-%m-%dT%H:%M:%fZ', 'now') END, epoch = excluded.epoch", (base, epoch, high_water))


async def _journaled(conn: Any, source: str, low: int, high: int) -> dict[int, str]:
    """The payloads journaled under `source` with ids from `low` to `high`."""
    async with conn.execute("SELECT update_id, payload FROM telegram_updates "
                            "WHERE source = ? AND update_id BETWEEN ? AND ?", (source, low, high)) as cursor:
        return {row[0]: row[1] for row in await cursor.fetchall()}


async def _restart_point(conn: Any, source: str, updates: Sequence[Update], seen: dict[int, str],
                         high_water: int | None) -> int | None:
    """The index of the first update that shows its server started its ids over, or None."""
    keys = [turn_source_key(source, u.update_id) for u in updates if u.update_id not in seen]
    asked: set[str] = set()
    if keys:
        async with conn.execute(f"SELECT source_key FROM turns WHERE source_key IN ({', '.join('?' * len(keys))})",
                                keys) as cursor:
            asked = {row[0] for row in await cursor.fetchall()}
    for index, update in enumerate(updates):
        journaled = seen.get(update.update_id)
        if journaled is not None:
            if _identity(update.to_dict()) != _identity(json.loads(journaled)):
                return index  # the id was given to another update
        elif turn_source_key(source, update.update_id) in asked:
            return index  # a turn was asked under this id, and the journal has pruned its update since
        elif high_water is not None and update.update_id < high_water - REWIND_GAP:
            return index  # far below anything this server gave before
    return None


def _log_skipped(skipped: list[Update]) -> None:
    """Say what `admit` skipped: a redelivery (the same update again)."""
    for update in skipped:
        log.info("update %s is already in the journal (sent again); skipped", update.update_id)


def _identity(update: dict) -> tuple:
    """What tells two updates apart besides their id: the message's chat, id and date (what a handled update's
    husk keeps: bot/telegram/journal_payloads.py). Message ids are Telegram's own, so a restarted Bot API server's
    updates differ from the earlier ones of the same ids in them."""
    message = next((value for value in update.values() if isinstance(value, dict)), {})
    return (message.get("chat", {}).get("id"), message.get("message_id"), message.get("date"))


def readable(update: Update, max_question_chars: int | None = None) -> tuple[Update, str]:
    """The update as handlers may take it, and its JSON for the journal: UTF-8 text as written (not `\\uXXXX`
    escapes, which take twice the room for Chinese), with any lone surrogate replaced (agent/unicode.py), since
    neither SQLite nor a Bot API call can encode one; a text far over `max_question_chars` is journaled cut
    (journal_payloads.admitted), the handler taking it whole."""
    payload = json.dumps(journal_payloads.admitted(update.to_dict(), max_question_chars), ensure_ascii=False)
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
        self.tasks: dict[str, asyncio.Task] = {}  # by journal key: ids of two epochs may meet
        self.handled = 0

    async def accept(self, updates: Sequence[Update]) -> None:
        """Journal the updates, then start handling the new ones (in order)."""
        for item in await self.journal.admit(updates):
            self._start(item)

    async def replay(self) -> int:
        """Start handling what an earlier run left unhandled; how many."""
        pending = [item for item in await self.journal.unhandled(self.application.bot) if item.key not in self.tasks]
        for item in pending:
            self._start(item)
        if pending:
            log.info("handling %d update(s) left unhandled by the previous run", len(pending))
        return len(pending)

    def _start(self, item: Journaled) -> None:
        self.tasks[item.key] = asyncio.create_task(self._handle(item), name=f"update:{item.key}")

    async def _handle(self, item: Journaled) -> None:
        update = item.update
        # The one place the journal key is attached: a turn the update asks for is stored under it. (By update id:
        # two epochs' updates of one id handled at the same moment could swap keys; a server restarts far less
        # often than a turn takes.)
        self.turns.attach_journal_key(update.update_id, item.key)
        try:
            # Handler errors go to the application's error handler; process_update itself does not raise.
            await self.application.process_update(update)
        finally:
            self.turns.detach_journal_key(update.update_id)
            try:
                if not self.turns.take_kept(item.key):
                    await self._mark_handled(item)
            finally:
                # Only now: `finish` waits for what is in `tasks`, and the database must outlive the marking.
                self.tasks.pop(item.key, None)

    async def _mark_handled(self, item: Journaled) -> None:
        self.handled += 1
        update_id = item.update.update_id
        try:
            await self.journal.mark_handled(item)
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
    """Long polling: fetch, journal, then let the next call's offset confirm the batch.

    The offset is sent once, with the call right after its batch was journaled, and dropped whatever that call
    brings: an empty answer, a failure. A server that restarted meanwhile (its ids started over) is then never
    told to forget ids it has not delivered yet; one that did not restart sends the unconfirmed batch again, and
    the journal skips it (see the module's docstring).
    """

    def __init__(self, bot: Bot, dispatcher: Dispatcher, *, timeout: float = POLL_TIMEOUT_SECONDS):
        self.bot = bot
        self.dispatcher = dispatcher
        self.timeout = timeout
        self.offset: int | None = None  # the confirmation the next call carries, if any
        self._failures = 0

    async def run(self) -> None:
        """Poll until cancelled; a rejected token ends it (there is nothing to retry)."""
        await quietly(self.bot.delete_webhook(drop_pending_updates=False), "deleteWebhook")
        while True:
            try:
                updates, next_offset = await self._fetch()
                self.offset = None  # carried by a call that was answered: confirmed
                if updates:
                    await self.dispatcher.accept(updates)
                    self.offset = next_offset
                self._failures = 0
            except InvalidToken:
                raise
            except RetryAfter as error:
                await asyncio.sleep(retry_after_seconds(error))  # refused before it was read: the offset stands
            except Exception as error:
                # Network trouble, a 5xx, a webhook still set (Conflict), the database busy: wait, then fetch
                # again without an offset, so nothing fetched but not journaled is lost, and a server that
                # restarted is not told to forget what it has not delivered.
                self.offset = None
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
