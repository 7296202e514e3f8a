"""The documents tools the model calls: `docs_search` (a query → the best passages) and `docs_read` (a chunk id →
that chunk whole, with its neighbours). Read-only; each chat sees only the documents its scope allows.

Both answer within OBSERVATION_MAX_CHARS, so the loop never cuts an observation short. A search result reads

    [1] 课程研发团队工作指南 › 开发环境配置 › VPN — team-guide.md, chunk 12
    在家办公时需要连接公司 VPN……

numbered so the final answer can cite it (`[1] 开发环境配置 › VPN`); the passage shown is the part of the chunk
that holds most of the query's terms. After the turn, `cited_chunks` reads the turn's observations (and the
answer's `[n]` citations) back into chunk ids, from which the bot lists the documents the answer used.
"""

from __future__ import annotations

import re
from typing import Iterable

from tools.docs_chunks import SEPARATOR
from tools.docs_store import DocumentLibrary, Hit
from tools.registry import Tool

SEARCH, READ = "docs_search", "docs_read"
SUBJECTS = ("文档", "指南", "手册", "document", "guide", "handbook", "faq")
SEARCH_FOOTER = ("(Cite what you use as [n] with its heading path, e.g. [1] Guide › Setup; docs_read with a chunk "
                 "id gives that chunk whole, with its neighbours.)")
MIN_EXCERPT = 120  # characters of text per result, at least: fewer results rather than crumbs of each
_HIT_HEADER = re.compile(r"^\[(\d+)\] .* — .*, chunk (\d+)$", re.MULTILINE)
_READ_HEADER = re.compile(r"^\[chunk (\d+)\] ", re.MULTILINE)
_CITATION = re.compile(r"\[(\d+)\]")
_SENTENCE_START = re.compile(r"(?<=[。！？；\n])|(?<=[.!?;] )")


class DocsTools:
    """`docs_search` and `docs_read` over a library, answering within `max_chars` characters."""

    def __init__(self, library: DocumentLibrary, max_chars: int):
        self.library = library
        self.max_chars = max_chars

    async def search(self, query: str, chat_key: str | None = None) -> str:
        """Tool: the passages of this chat's documents that best match `query`, numbered for citing."""
        hits = await self.library.search(query, chat_key)
        if hits:
            return format_hits(hits, self.library.form.terms(query), self.max_chars)
        if not await self.library.any_visible(chat_key):
            return "No documents have been added for this chat."
        return (f"No passage of the documents here matches “{query[:100]}”. Try other words (the documents may "
                "be in Chinese or English), or say that the documents do not cover it.")

    async def read(self, chunk_id: int, chat_key: str | None = None) -> str:
        """Tool: the chunk `chunk_id` whole, with the chunks before and after it."""
        around = await self.library.around(chunk_id, chat_key)
        if not around:
            return (f"There is no chunk {chunk_id} in the documents here (it may have been replaced by a new "
                    "version): search again with docs_search.")
        return format_around(around, chunk_id, self.max_chars)

    async def offered_in(self, chat_key: str) -> bool:
        """Whether the chat can see any document (the tools are left out of its turns otherwise)."""
        return await self.library.any_visible(chat_key)

    def tools(self) -> list[Tool]:
        """The two read-only tools, scoped to the asking chat."""
        return [
            Tool(
                name=SEARCH,
                human_name="团队文档搜索 (team documents)",
                description=("Searches the team's own documents that admins added (guides, onboarding, FAQs, notes; "
                             "Chinese and English). Give a few keywords the document would use. Returns the best "
                             "passages, numbered, each with its document, heading path and chunk id. Cite what you "
                             "use in the final answer as [n] with its heading path."),
                parameters={"type": "object", "properties": {"query": {
                    "type": "string", "minLength": 1, "maxLength": 300,
                    "description": "keywords or a question, e.g. GPU 服务器 申请 or how to rotate the token"}},
                    "required": ["query"], "additionalProperties": False},
                function=self.search,
                progress="📄 搜索团队文档",
                subjects=SUBJECTS,
                chat_scoped=True,
                offered_in=self.offered_in,
            ),
            Tool(
                name=READ,
                human_name="团队文档阅读 (read a passage)",
                description=("Reads one chunk of the team's documents whole, with the chunk before and after it, "
                             "by the chunk id docs_search gave. Use it when a passage was cut short."),
                parameters={"type": "object", "properties": {"chunk_id": {
                    "type": "integer", "minimum": 1, "description": "a chunk id from docs_search's results"}},
                    "required": ["chunk_id"], "additionalProperties": False},
                function=self.read,
                progress="📖 阅读团队文档",
                subjects=SUBJECTS,
                chat_scoped=True,
                offered_in=self.offered_in,
            ),
        ]


def hit_header(label: str, hit: Hit) -> str:
    """The line naming a passage: its label, heading path, document and chunk id."""
    return f"{label} {hit.heading} — {hit.name}, chunk {hit.chunk_id}"


def format_hits(hits: list[Hit], terms: list[str], max_chars: int) -> str:
    """Numbered passages and the footer, within `max_chars`: as many results as leave each a real excerpt."""
    count = len(hits)
    while True:
        headers = [hit_header(f"[{n}]", hit) for n, hit in enumerate(hits[:count], 1)]
        room = max_chars - len(SEARCH_FOOTER) - sum(len(h) + 3 for h in headers) - 2
        if count == 1 or room // count >= MIN_EXCERPT:
            break
        count -= 1
    parts, left = [], room
    for index, (header, hit) in enumerate(zip(headers, hits)):
        share = left // (count - index)
        text = excerpt(hit.text, terms, share)
        left -= len(text)
        parts.append(f"{header}\n{text}")
    return fit("\n\n".join(parts) + "\n\n" + SEARCH_FOOTER, max_chars)


def format_around(around: list[Hit], chunk_id: int, max_chars: int) -> str:
    """The chunk whole (as far as `max_chars` allows), then its neighbours with what room is left."""
    target = next(hit for hit in around if hit.chunk_id == chunk_id)
    header = f"[chunk {chunk_id}] {target.heading} — {target.name}"
    body = excerpt(target.text, [], max(max_chars - len(header) - 1, 0))
    parts = [f"{header}\n{body}"]
    left = max_chars - len(parts[0])
    for hit in around:
        if hit.chunk_id == chunk_id or left < MIN_EXCERPT:
            continue
        where = "Before it" if hit.position < target.position else "After it"
        label = f"{where}, chunk {hit.chunk_id} ({short_path(hit.heading)}):"
        text = excerpt(hit.text, [], left - len(label) - 3)
        parts.append(f"{label}\n{text}")
        left -= len(parts[-1]) + 2
    return fit("\n\n".join(parts), max_chars)


def short_path(heading: str) -> str:
    """The last two steps of a heading path (the title is in the target's header already)."""
    return SEPARATOR.join(heading.split(SEPARATOR)[-2:])


def excerpt(text: str, terms: list[str], size: int) -> str:
    """At most `size` characters of `text`: all of it if it fits, else the stretch starting at a sentence that
    holds the most of `terms` (the start, when there are none), marked with … where it was cut."""
    if len(text) <= size:
        return text
    if size <= 1:
        return ""
    folded = text.casefold()
    starts = sorted({0, *(m.start() for m in _SENTENCE_START.finditer(text) if m.start() < len(text))})[:200]
    best = max(starts, key=lambda s: (sum(folded.count(t, s, s + size) for t in terms), -s)) if terms else 0
    lead = "…" if best > 0 else ""
    room = size - len(lead)
    if best + room >= len(text):
        return lead + text[best:]
    return lead + text[best:best + room - 1].rstrip() + "…"


def fit(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` (a last guard: the formatting above stays within it)."""
    return text if len(text) <= max_chars else text[:max(max_chars - 1, 0)] + "…"


def cited_chunks(observations: Iterable[tuple[str, str]], answer: str) -> list[int]:
    """The chunk ids an answer used, from the turn's (tool name, observation) pairs: those its `[n]` citations
    name (n as numbered by the latest search showing it), or, when it cites none of them, every chunk the turn's
    searches and readings showed. In order of first use, each once."""
    numbered: dict[int, int] = {}
    shown: list[int] = []
    for tool, observation in observations:
        if tool == SEARCH:
            for number, chunk_id in _HIT_HEADER.findall(observation):
                numbered[int(number)] = int(chunk_id)
                shown.append(int(chunk_id))
        elif tool == READ:
            shown += [int(chunk_id) for chunk_id in _READ_HEADER.findall(observation)]
    cited = [numbered[int(n)] for n in _CITATION.findall(answer) if int(n) in numbered]
    return list(dict.fromkeys(cited or shown))
