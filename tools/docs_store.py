"""The document library: documents added by admins, their chunks and full-text index in SQLite, and search.

    library = DocumentLibrary(db, DocsLimits(), audit=insert_audit)
    added = await library.add(Upload("guide.pdf", data, scope="tg:-100123", added_by=1001))
    hits = await library.search("怎么申请 GPU 服务器", chat_key="tg:-100123")

Adding is all or nothing: the file is checked (type, DOCS_MAX_FILE_MB) and converted first, outside any transaction;
then one transaction checks the total budget (DOCS_MAX_TOTAL_MB of text), writes the document, its chunks, their
index rows and the audit row. A refusal is a `DocumentError` and leaves the database as it was. The same file (same
SHA-256) added again where it is searchable already (its scope, or global) changes nothing; a different file of the
same name in the same scope replaces the old version under the same id.

A chat sees the documents whose scope is 'global' or its own chat key; searching, reading a chunk and listing all go
through that rule. Every change (add, replace, delete, scope) writes an audit row in its own transaction, through
the writer the program passes in (bot/program/audit.py's `insert_audit`: tools/ does not import bot/).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from db import Database
from tools.docs_chunks import Chunk, chunk_document
from tools.docs_convert import MB, ArchiveLimits, check_type, convert, megabytes, suffix_of
from tools.docs_index import BODY_WEIGHT, DEFAULT_FORM, HEADING_WEIGHT, INDEX_TABLE, IndexForm
from tools.errors import DocumentError
from tools.settings import GLOBAL

# insert_audit(conn, user_id, chat_id, action, detail), on the transaction's connection.
AuditWriter = Callable[[Any, int | None, int | None, str, str], Awaitable[None]]
DUPLICATE_ROOM = 3  # results fetched per result wanted, so that copies left out still leave enough
_COLUMNS = ("id, name, title, kind, size_bytes, text_bytes, sha256, chunk_count, scope, added_by, added_by_name, "
            "added_in, added_at")


@dataclass(frozen=True)
class DocsLimits:
    """The library's limits. These defaults are the only ones: `Settings` takes its defaults from here."""

    max_file_bytes: int = 20 * MB
    max_total_bytes: int = 200 * MB  # the text of all documents together
    chunk_chars: int = 800
    search_results: int = 5
    max_unpacked_bytes: int = 100 * MB  # what a .docx archive may unpack to
    max_zip_ratio: float = 100.0  # …and how many times its packed size

    @property
    def archive(self) -> ArchiveLimits:
        """What a .docx may unpack to."""
        return ArchiveLimits(self.max_unpacked_bytes, self.max_zip_ratio)


@dataclass(frozen=True)
class Upload:
    """A file to add: its name and bytes, where it may be searched, and who sent it from which chat."""

    name: str
    data: bytes
    scope: str = GLOBAL
    added_by: int | None = None
    added_by_name: str = ""
    added_in: int | None = None


@dataclass(frozen=True)
class DocumentInfo:
    """One document as listed."""

    id: int
    name: str
    title: str
    kind: str
    size_bytes: int
    text_bytes: int
    sha256: str
    chunk_count: int
    scope: str
    added_by: int | None
    added_by_name: str
    added_in: int | None
    added_at: str

    def label(self) -> str:
        """`#3 team-guide.pdf`: how replies name it."""
        return f"#{self.id} {self.name}"


@dataclass(frozen=True)
class Added:
    """What adding a file did: `added`, `replaced` (a new version of the same name) or `unchanged` (same file)."""

    document: DocumentInfo
    outcome: str
    previous_chunks: int = 0


@dataclass(frozen=True)
class Hit:
    """A chunk as search and reading return it, with its document."""

    chunk_id: int
    document_id: int
    position: int
    name: str
    title: str
    heading: str
    text: str


def distinct(hits: list[Hit]) -> list[Hit]:
    """`hits` without those repeating an earlier one: same heading path, same letters and digits in their first 300
    (a copy of the document in another format differs only in spacing and markup)."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for hit in hits:
        key = (hit.heading, re.sub(r"[\W_]+", "", hit.text).casefold()[:300])
        if key not in seen:
            seen.add(key)
            kept.append(hit)
    return kept


class DocumentLibrary:
    """Documents, their chunks and their index, in the bot's database."""

    def __init__(self, db: Database, limits: DocsLimits = DocsLimits(), *, audit: AuditWriter,
                 form: IndexForm = DEFAULT_FORM):
        self.db = db
        self.limits = limits
        self.audit = audit
        self.form = form

    # --- changes -------------------------------------------------------------------------------------------

    async def add(self, upload: Upload) -> Added:
        """Add (or replace, or find unchanged) the uploaded file; `DocumentError` when it cannot be used."""
        check_type(upload.name)
        self.check_size(upload.name, len(upload.data))
        digest = hashlib.sha256(upload.data).hexdigest()
        if (same := await self._same_file(digest, upload.scope)) is not None:
            return Added(same, "unchanged")
        converted = await asyncio.to_thread(convert, upload.name, upload.data, self.limits.archive)
        chunks = chunk_document(converted, self.limits.chunk_chars)
        text_bytes = sum(len(chunk.text.encode()) + len(chunk.heading.encode()) for chunk in chunks)
        async with self.db.transaction() as conn:
            if (same := await self._same_file(digest, upload.scope, conn)) is not None:
                return Added(same, "unchanged")  # the same file, added meanwhile by another upload
            old = await self._named(conn, upload.name, upload.scope)
            await self._check_budget(conn, upload.name, text_bytes, old)
            fields = (converted.title, suffix_of(upload.name).lstrip("."), len(upload.data), text_bytes, digest,
                      len(chunks))
            doc_id = await self._write_document(conn, upload, fields, old)
            await self._write_chunks(conn, doc_id, chunks)
            outcome = "added" if old is None else "replaced"
            await self.audit(conn, upload.added_by, upload.added_in, f"doc_{'add' if old is None else 'replace'}",
                             f"#{doc_id} {upload.name} sha256={digest[:12]} chunks={len(chunks)} scope={upload.scope}")
        return Added(await self.get(doc_id), outcome, old.chunk_count if old else 0)

    def check_size(self, name: str, size: int) -> None:
        """Refuse a file over DOCS_MAX_FILE_MB (before it is downloaded, where the size is known first)."""
        if size > self.limits.max_file_bytes:
            raise DocumentError(f"{name}: the file is {megabytes(size)}; the limit is "
                                f"{megabytes(self.limits.max_file_bytes)} (DOCS_MAX_FILE_MB)")

    async def remove(self, doc_id: int, *, by: int | None = None, chat_id: int | None = None) -> DocumentInfo:
        """Delete a document, its chunks and their index rows; `DocumentError` for an unknown id."""
        document = await self.get(doc_id)
        async with self.db.transaction() as conn:
            await self._delete_chunks(conn, doc_id)
            await conn.execute("DELETE FROM documents WHERE id = ?", (doc_id,))
            await self.audit(conn, by, chat_id, "doc_del", f"#{doc_id} {document.name} scope={document.scope}")
        return document

    async def set_scope(self, doc_id: int, scope: str, *, by: int | None = None,
                        chat_id: int | None = None) -> DocumentInfo:
        """Make a document searchable in `scope` ('global' or a chat key) only; `DocumentError` for an unknown id,
        or when that scope holds another document of the same name."""
        document = await self.get(doc_id)
        async with self.db.transaction() as conn:
            other = await self._named(conn, document.name, scope)
            if other is not None and other.id != doc_id:
                raise DocumentError(f"{other.label()} has the same name there already: delete one of them first")
            await conn.execute("UPDATE documents SET scope = ? WHERE id = ?", (scope, doc_id))
            await self.audit(conn, by, chat_id, "doc_scope", f"#{doc_id} {document.name} {document.scope} -> {scope}")
        return await self.get(doc_id)

    async def rebuild_index(self, form: IndexForm) -> None:
        """Index every chunk again in `form` (a scratch database measuring a tokenizer: `qwenbot eval`)."""
        async with self.db.transaction() as conn:
            await conn.execute(f"DROP TABLE {INDEX_TABLE}")
            await conn.execute(form.create_sql())
            async with conn.execute("SELECT id, heading, body FROM document_chunks") as cursor:
                rows = list(await cursor.fetchall())
            await conn.executemany(f"INSERT INTO {INDEX_TABLE} (rowid, heading, body) VALUES (?, ?, ?)",
                                   [(row[0], form.index_text(row[1]), form.index_text(row[2])) for row in rows])
        self.form = form

    # --- reading -------------------------------------------------------------------------------------------

    async def get(self, doc_id: int) -> DocumentInfo:
        """The document `doc_id`; `DocumentError` when there is none."""
        row = await self.db.fetchone(f"SELECT {_COLUMNS} FROM documents WHERE id = ?", (doc_id,))
        if row is None:
            raise DocumentError(f"there is no document #{doc_id} (/docs and qwenbot docs list show them)")
        return DocumentInfo(*row)

    async def documents(self, chat_key: str | None = None) -> list[DocumentInfo]:
        """The documents visible in `chat_key` (every one when None), oldest first."""
        if chat_key is None:
            rows = await self.db.fetchall(f"SELECT {_COLUMNS} FROM documents ORDER BY id")
        else:
            rows = await self.db.fetchall(f"SELECT {_COLUMNS} FROM documents WHERE scope IN (?, ?) ORDER BY id",
                                          (GLOBAL, chat_key))
        return [DocumentInfo(*row) for row in rows]

    async def any_visible(self, chat_key: str | None) -> bool:
        """Whether the chat `chat_key` can see at least one document (None: a global one)."""
        row = await self.db.fetchone("SELECT 1 FROM documents WHERE scope IN (?, ?) LIMIT 1",
                                     (GLOBAL, chat_key or GLOBAL))
        return row is not None

    async def search(self, question: str, chat_key: str | None, limit: int | None = None) -> list[Hit]:
        """The chunks visible in `chat_key` that best match `question`, best first (BM25), at most `limit`.

        A chunk saying what a better-ranked one says (the same guide added as .pdf and as .docx) is left out, so
        the results are different passages: same heading path, same letters and digits in its first 300.
        """
        query = self.form.query(question)
        if query is None:
            return []
        wanted = limit or self.limits.search_results
        rows = await self.db.fetchall(
            f"SELECT c.id, c.document_id, c.position, d.name, d.title, c.heading, c.body "
            f"FROM {INDEX_TABLE} JOIN document_chunks AS c ON c.id = {INDEX_TABLE}.rowid "
            f"JOIN documents AS d ON d.id = c.document_id "
            f"WHERE {INDEX_TABLE} MATCH ? AND d.scope IN (?, ?) "
            f"ORDER BY bm25({INDEX_TABLE}, {HEADING_WEIGHT}, {BODY_WEIGHT}) LIMIT ?",
            (query, GLOBAL, chat_key or GLOBAL, wanted * DUPLICATE_ROOM))
        return distinct([Hit(*row) for row in rows])[:wanted]

    async def around(self, chunk_id: int, chat_key: str | None) -> list[Hit]:
        """The chunk `chunk_id` with the one before and the one after it in its document, in order; empty when
        there is no such chunk, or the chat may not see its document."""
        rows = await self.db.fetchall(
            "SELECT c.id, c.document_id, c.position, d.name, d.title, c.heading, c.body "
            "FROM document_chunks AS target JOIN document_chunks AS c ON c.document_id = target.document_id "
            "AND c.position BETWEEN target.position - 1 AND target.position + 1 "
            "JOIN documents AS d ON d.id = c.document_id "
            "WHERE target.id = ? AND d.scope IN (?, ?) ORDER BY c.position",
            (chunk_id, GLOBAL, chat_key or GLOBAL))
        return [Hit(*row) for row in rows]

    async def documents_of(self, chunk_ids: Iterable[int]) -> list[DocumentInfo]:
        """The documents the chunks belong to, in the order the chunks come (each once); gone chunks skipped."""
        found: dict[int, DocumentInfo] = {}
        for chunk_id in chunk_ids:
            row = await self.db.fetchone(
                f"SELECT {', '.join('d.' + c.strip() for c in _COLUMNS.split(','))} FROM documents AS d "
                "JOIN document_chunks AS c ON c.document_id = d.id WHERE c.id = ?", (chunk_id,))
            if row is not None and row[0] not in found:
                found[row[0]] = DocumentInfo(*row)
        return list(found.values())

    # --- inside the transactions ---------------------------------------------------------------------------

    async def _same_file(self, digest: str, scope: str, conn: Any = None) -> DocumentInfo | None:
        """The document holding this very file where `scope` sees it already (in that scope, or global)."""
        sql = f"SELECT {_COLUMNS} FROM documents WHERE sha256 = ? AND scope IN (?, ?) ORDER BY id LIMIT 1"
        if conn is None:
            row = await self.db.fetchone(sql, (digest, scope, GLOBAL))
        else:
            async with conn.execute(sql, (digest, scope, GLOBAL)) as cursor:
                row = await cursor.fetchone()
        return DocumentInfo(*row) if row is not None else None

    async def _named(self, conn: Any, name: str, scope: str) -> DocumentInfo | None:
        async with conn.execute(f"SELECT {_COLUMNS} FROM documents WHERE name = ? AND scope = ?",
                                (name, scope)) as cursor:
            row = await cursor.fetchone()
        return DocumentInfo(*row) if row is not None else None

    async def _check_budget(self, conn: Any, name: str, text_bytes: int, replacing: DocumentInfo | None) -> None:
        async with conn.execute("SELECT COALESCE(SUM(text_bytes), 0) FROM documents") as cursor:
            (held,) = await cursor.fetchone()
        held -= replacing.text_bytes if replacing else 0
        if held + text_bytes > self.limits.max_total_bytes:
            raise DocumentError(f"{name}: its text ({megabytes(text_bytes)}) does not fit: the documents hold "
                                f"{megabytes(held)} of {megabytes(self.limits.max_total_bytes)} "
                                f"(DOCS_MAX_TOTAL_MB); delete some first")

    async def _write_document(self, conn: Any, upload: Upload, fields: tuple, old: DocumentInfo | None) -> int:
        who = (upload.added_by, upload.added_by_name, upload.added_in)
        if old is None:
            cursor = await conn.execute(
                "INSERT INTO documents (title, kind, size_bytes, text_bytes, sha256, chunk_count, added_by, "
                "added_by_name, added_in, name, scope) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*fields, *who, upload.name, upload.scope))
            return cursor.lastrowid
        await self._delete_chunks(conn, old.id)
        await conn.execute(
            "UPDATE documents SET title = ?, kind = ?, size_bytes = ?, text_bytes = ?, sha256 = ?, chunk_count = ?, "
            "added_by = ?, added_by_name = ?, added_in = ?, added_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
            "WHERE id = ?", (*fields, *who, old.id))
        return old.id

    async def _write_chunks(self, conn: Any, doc_id: int, chunks: list[Chunk]) -> None:
        for chunk in chunks:
            cursor = await conn.execute(
                "INSERT INTO document_chunks (document_id, position, heading, body) VALUES (?, ?, ?, ?)",
                (doc_id, chunk.position, chunk.heading, chunk.text))
            indexed = (cursor.lastrowid, self.form.index_text(chunk.heading), self.form.index_text(chunk.text))
            await conn.execute(f"INSERT INTO {INDEX_TABLE} (rowid, heading, body) VALUES (?, ?, ?)", indexed)

    async def _delete_chunks(self, conn: Any, doc_id: int) -> None:
        await conn.execute(f"DELETE FROM {INDEX_TABLE} WHERE rowid IN "
                           "(SELECT id FROM document_chunks WHERE document_id = ?)", (doc_id,))
        await conn.execute("DELETE FROM document_chunks WHERE document_id = ?", (doc_id,))
