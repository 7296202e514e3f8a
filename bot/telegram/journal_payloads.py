"""What the update journal keeps of an update: enough to handle it until it is handled, enough to recognise it after.

The journal (bot/telegram/intake.py) holds an update from its arrival until its handler ends, so that a crash loses
nothing: until then it needs the update whole. Afterwards it needs only what tells the update apart from another
under the same id (its chat, message id and date), to recognise a redelivery, for the days it keeps ids. Keeping
more would keep what no one needs and someone may not want kept: an `/mcp_add` command's headers, a token a user
pasted, a stranger's megabyte of text, for days, in the file that gets copied into backups. So:

- on arrival, a text (or caption) far longer than any question the bot takes is cut: the bot refuses it by its
  length, and a cut text is still too long to take (`admitted`);
- once handled, the update is reduced to its husk: the ids and dates of the update and its message, the chat's id
  and type, the sender's id (and first name, without which python-telegram-bot cannot read a user); no text, no
  entities, no other names (`handled`). A husk is still an update the library reads, should anything read it.
"""

from __future__ import annotations

from typing import Any

# Commands whose text carries secrets: once handled, the write-ahead log is emptied too (it holds the page the
# update was first written to until the log is reused).
SECRET_COMMANDS = ("/mcp_add",)
# Beyond MAX_QUESTION_CHARS: a group question's mention (@ and up to 32 characters) and the spaces around it.
TEXT_SLACK_CHARS = 100
# What a handled update's message keeps, and what its chat and sender keep.
HUSK_MESSAGE_FIELDS = ("message_id", "date", "message_thread_id", "migrate_to_chat_id", "migrate_from_chat_id")
HUSK_PARTY_FIELDS = ("id", "type", "is_bot", "first_name")
CUT_MARK = "…"


def admitted(update: dict[str, Any], max_question_chars: int | None) -> dict[str, Any]:
    """The update as journaled on arrival: whole, but a text or caption longer than `max_question_chars` plus a
    mention is cut there (its handler refuses it as too long either way), with the entities that lay beyond."""
    if max_question_chars is None:
        return update
    limit = max_question_chars + TEXT_SLACK_CHARS
    return {key: _cut_message(value, limit) if isinstance(value, dict) else value for key, value in update.items()}


def _cut_message(message: dict[str, Any], limit: int) -> dict[str, Any]:
    cut = dict(message)
    for field, entities in (("text", "entities"), ("caption", "caption_entities")):
        text = cut.get(field)
        if isinstance(text, str) and len(text) > limit:
            cut[field] = text[:limit] + CUT_MARK
            if entities in cut:  # offsets are in UTF-16 units: keep only those wholly inside the cut text, roughly
                cut[entities] = [e for e in cut[entities] if e.get("offset", 0) + e.get("length", 0) <= limit]
    return cut


def handled(update: dict[str, Any]) -> dict[str, Any]:
    """The husk a handled update leaves in the journal: what recognises it, nothing anyone wrote."""
    return {key: _husk(value) if isinstance(value, dict) else value for key, value in update.items()
            if key == "update_id" or isinstance(value, dict)}


def _husk(message: dict[str, Any]) -> dict[str, Any]:
    husk = {field: message[field] for field in HUSK_MESSAGE_FIELDS if field in message}
    for party in ("chat", "from", "sender_chat"):
        if isinstance(message.get(party), dict):
            husk[party] = {field: message[party][field] for field in HUSK_PARTY_FIELDS if field in message[party]}
    return husk


def carries_secrets(update: dict[str, Any]) -> bool:
    """Whether the update is a command whose words are secrets (an `/mcp_add` with its headers)."""
    texts = [value.get("text") or "" for value in update.values() if isinstance(value, dict)]
    return any(text.split(maxsplit=1)[0].split("@")[0] in SECRET_COMMANDS for text in texts if text.strip())
