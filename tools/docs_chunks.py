"""A converted document cut into chunks: by its headings first, then by paragraphs, each chunk knowing its path.

    chunk_document(converted, max_chars=800)
    → [Chunk(0, "课程研发团队工作指南 › 开发环境配置 › VPN", "在家办公时需要连接公司 VPN…"), …]

A chunk never spans two sections, so its heading path says exactly where its text stands, and an answer can cite
it (`[1] Guide › Setup › Tokens`). Within a section, whole paragraphs are packed up to `max_chars`; a longer
paragraph is cut between sentences, and a sentence longer still is cut where it reaches the limit. The path starts
with the document's title (its first level-1 heading, else its name), so a chunk of a document without headings
is still labelled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from tools.docs_convert import Converted, Heading, Paragraph

SEPARATOR = " › "
# Where a sentence ends: Chinese full stops wherever they are, Latin ones before a space, and line ends.
_SENTENCE_END = re.compile(r"(?<=[。！？；])|(?<=[.!?;])(?=\s)|(?<=\n)")


@dataclass(frozen=True)
class Chunk:
    """One piece of a document: its place in it, the headings above it, its text."""

    position: int
    heading: str
    text: str


def chunk_document(converted: Converted, max_chars: int) -> list[Chunk]:
    """The document's chunks in order, none longer than `max_chars`, none empty."""
    chunks: list[Chunk] = []
    path: list[Heading] = []
    section: list[str] = []

    def flush() -> None:
        label = heading_path(converted.title, path)
        for text in pack(section, max_chars):
            chunks.append(Chunk(len(chunks), label, text))
        section.clear()

    for block in converted.blocks:
        if isinstance(block, Heading):
            flush()
            while path and path[-1].level >= block.level:
                path.pop()
            path.append(block)
        elif isinstance(block, Paragraph) and block.text.strip():
            section.append(block.text.strip())
    flush()
    return chunks


def heading_path(title: str, path: list[Heading]) -> str:
    """`Title › Section › Subsection`: the headings above a chunk, starting with the document's title."""
    names = [heading.text for heading in path]
    if not names or names[0] != title:
        names.insert(0, title)
    return SEPARATOR.join(names)


def pack(paragraphs: Iterable[str], max_chars: int) -> Iterator[str]:
    """Paragraphs packed into texts of at most `max_chars`, blank-line separated; long ones cut between sentences."""
    current = ""
    for piece in (part for paragraph in paragraphs for part in split_long(paragraph, max_chars)):
        if current and len(current) + 2 + len(piece) > max_chars:
            yield current
            current = ""
        current = f"{current}\n\n{piece}" if current else piece
    if current:
        yield current


def split_long(paragraph: str, max_chars: int) -> Iterator[str]:
    """A paragraph as pieces of at most `max_chars`: whole sentences where they fit, else hard cuts."""
    if len(paragraph) <= max_chars:
        yield paragraph
        return
    current = ""
    for sentence in (s for s in _SENTENCE_END.split(paragraph) if s):
        while len(sentence) > max_chars:  # one sentence longer than a chunk: cut it where the limit falls
            if current:
                yield current.strip()
                current = ""
            yield sentence[:max_chars].strip()
            sentence = sentence[max_chars:]
        if len(current) + len(sentence) > max_chars:
            yield current.strip()
            current = ""
        current += sentence
    if current.strip():
        yield current.strip()
