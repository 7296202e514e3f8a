"""How documents are reported to admins, the same from Telegram (/docs, a file sent) and `qwenbot docs`.

Also the sources line the bot appends to an answer that used documents, in the asker's language.
"""

from __future__ import annotations

from typing import Sequence

from agent.apologies import is_apology
from agent.steps import TurnResult
from tools.docs import cited_chunks
from tools.docs_convert import megabytes
from tools.docs_store import Added, DocumentInfo, DocumentLibrary
from tools.settings import GLOBAL

SOURCES = {"zh": "📎 来源：", "en": "📎 Sources: "}


def chunks(count: int) -> str:
    """`1 chunk`, `22 chunks`."""
    return f"{count} chunk{'' if count == 1 else 's'}"


def where(scope: str, here: str | None = None) -> str:
    """A scope in words: everywhere, this chat, or the chat key."""
    if scope == GLOBAL:
        return "every chat"
    return "this chat only" if scope == here else f"{scope} only"


def adding_text(added: Added, here: str | None = None) -> str:
    """One line on what adding a file did."""
    document = added.document
    if added.outcome == "unchanged":
        return (f"ℹ️ {document.name} is already indexed as {document.label()} (the same file): nothing changed.")
    verb = "Added" if added.outcome == "added" else "Replaced"
    was = f" (was {added.previous_chunks})" if added.outcome == "replaced" else ""
    share = "" if document.scope == GLOBAL else f"; /doc_scope {document.id} global shares it with every chat"
    return (f"✅ {verb} {document.label()} “{document.title}”: {chunks(document.chunk_count)}{was}, "
            f"{megabytes(document.size_bytes)}, searchable in {where(document.scope, here)}{share}.")


def document_line(document: DocumentInfo, here: str | None = None) -> str:
    """A document in a listing: id, name, title, chunks, size, scope, who added it and when."""
    who = document.added_by_name or (str(document.added_by) if document.added_by else "qwenbot docs add")
    return (f"{document.label()} “{document.title}” · {chunks(document.chunk_count)} · "
            f"{megabytes(document.size_bytes)} · {where(document.scope, here)} · added by {who} on "
            f"{document.added_at[:10]}")


def documents_text(documents: Sequence[DocumentInfo], here: str | None = None) -> str:
    """The listing of /docs and `qwenbot docs list`."""
    if not documents:
        return "No documents yet. An admin adds one by sending a file (in a group: with /doc_add as its caption)."
    return "\n".join(document_line(document, here) for document in documents)


def sources_line(documents: Sequence[DocumentInfo], lang: str) -> str:
    """The line appended to an answer that used documents: their titles (and file names), in `lang`."""
    names = [f"{d.title} ({d.name})" if d.title != d.name else d.name for d in documents]
    separator = "；" if lang == "zh" else "; "
    return SOURCES.get(lang, SOURCES["en"]) + separator.join(names)


async def answer_sources(library: DocumentLibrary, result: TurnResult) -> list[DocumentInfo]:
    """The documents a turn's answer used: those of the chunks it cites, else of every chunk its documents tools
    showed (tools/docs.py's `cited_chunks`). None for an apology: it used nothing."""
    if is_apology(result.answer):
        return []
    shown = [(step.action, step.observation) for step in result.tool_steps if step.error is None]
    return await library.documents_of(cited_chunks(shown, result.answer))


async def with_sources(library: DocumentLibrary, result: TurnResult, lang: str) -> str:
    """The turn's answer, with the sources line under it when it used documents."""
    documents = await answer_sources(library, result)
    return f"{result.answer}\n\n{sources_line(documents, lang)}" if documents else result.answer
