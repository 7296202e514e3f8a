"""How documents are reported to admins, the same from Telegram (/docs, a file sent: in the sender's language) and
`qwenbot docs` (in English).

Also the sources line the bot appends to an answer that used documents, in the asker's language.
"""

from __future__ import annotations

from typing import Sequence

from agent.apologies import is_apology
from agent.steps import TurnResult
from bot.program.texts import add_texts, text
from tools.docs import cited_chunks
from tools.docs_convert import megabytes
from tools.docs_store import Added, DocumentInfo, DocumentLibrary
from tools.settings import GLOBAL

SOURCES = {"zh": "📎 来源：", "en": "📎 Sources: "}
TEXTS = {
    "doc_chunk": {"zh": "{count} 段", "en": "{count} chunk"},
    "doc_chunks": {"zh": "{count} 段", "en": "{count} chunks"},
    "doc_every_chat": {"zh": "所有聊天", "en": "every chat"},
    "doc_this_chat": {"zh": "仅本聊天", "en": "this chat only"},
    "doc_that_chat": {"zh": "仅 {scope}", "en": "{scope} only"},
    "doc_unchanged": {"zh": "ℹ️ {name} 已经以 {label} 收录（同一个文件）：没有变化。",
                      "en": "ℹ️ {name} is already indexed as {label} (the same file): nothing changed."},
    "doc_added": {"zh": "✅ 已添加 {label}「{title}」：{chunks}，{size}，可在{where}搜索{share}。",
                  "en": "✅ Added {label} “{title}”: {chunks}, {size}, searchable in {where}{share}."},
    "doc_replaced": {"zh": "✅ 已替换 {label}「{title}」：{chunks}（原来 {was} 段），{size}，可在{where}搜索{share}。",
                     "en": "✅ Replaced {label} “{title}”: {chunks} (was {was}), {size}, searchable in {where}{share}."},
    "doc_share": {"zh": "；/doc_scope {id} global 可以让所有聊天搜索它", "en": "; /doc_scope {id} global shares it with every chat"},
    "doc_line": {"zh": "{label}「{title}」· {chunks} · {size} · {where} · {who} 于 {day} 添加",
                 "en": "{label} “{title}” · {chunks} · {size} · {where} · added by {who} on {day}"},
    "doc_none": {"zh": "还没有文档。管理员把文件发给我就能添加（在群里：用 /doc_add 作为文件的说明）。",
                 "en": "No documents yet. An admin adds one by sending a file (in a group: with /doc_add as its caption)."},
    "doc_removed": {"zh": "✅ 已删除 {label} 和它的 {chunks}。", "en": "✅ Removed {label} and its {chunks}."},
    "doc_scoped": {"zh": "✅ {label} 现在可在{where}搜索。", "en": "✅ {label} is now searchable in {where}."},
}
add_texts(TEXTS)


def chunks(count: int, lang: str = "en") -> str:
    """`1 chunk`, `22 chunks` (in `lang`)."""
    return text("doc_chunk" if count == 1 else "doc_chunks", lang, count=count)


def where(scope: str, here: str | None = None, lang: str = "en") -> str:
    """A scope in words: everywhere, this chat, or the chat key."""
    if scope == GLOBAL:
        return text("doc_every_chat", lang)
    return text("doc_this_chat", lang) if scope == here else text("doc_that_chat", lang, scope=scope)


def adding_text(added: Added, here: str | None = None, lang: str = "en") -> str:
    """One line on what adding a file did."""
    document = added.document
    if added.outcome == "unchanged":
        return text("doc_unchanged", lang, name=document.name, label=document.label())
    share = "" if document.scope == GLOBAL else text("doc_share", lang, id=document.id)
    values = dict(label=document.label(), title=document.title, chunks=chunks(document.chunk_count, lang),
                  size=megabytes(document.size_bytes), where=where(document.scope, here, lang), share=share)
    if added.outcome == "replaced":
        return text("doc_replaced", lang, was=added.previous_chunks, **values)
    return text("doc_added", lang, **values)


def document_line(document: DocumentInfo, here: str | None = None, lang: str = "en") -> str:
    """A document in a listing: id, name, title, chunks, size, scope, who added it and when."""
    who = document.added_by_name or (str(document.added_by) if document.added_by else "qwenbot docs add")
    return text("doc_line", lang, label=document.label(), title=document.title,
                chunks=chunks(document.chunk_count, lang), size=megabytes(document.size_bytes),
                where=where(document.scope, here, lang), who=who, day=document.added_at[:10])


def documents_text(documents: Sequence[DocumentInfo], here: str | None = None, lang: str = "en") -> str:
    """The listing of /docs and `qwenbot docs list`."""
    if not documents:
        return text("doc_none", lang)
    return "\n".join(document_line(document, here, lang) for document in documents)


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
