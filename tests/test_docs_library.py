"""The document library on a real SQLite file: conversion of each format, chunks and heading paths, the index,
search by scope, replacing, limits and bad input (one line each, the tables as they were), the tools' output."""

from __future__ import annotations

import dataclasses
import re

import pytest

from bot.program.audit import insert_audit
from tests.docs_files import (EXPENSES_TEXT, GPU_HEADING, GUIDE_TITLE, HANDBOOK_HTML, SCANNED_PDF, corpus_file,
                              files_of_each_format, zip_bomb)
from tools.docs import DocsTools, cited_chunks
from tools.docs_chunks import chunk_document
from tools.docs_convert import MB, ArchiveLimits, Converted, Heading, Paragraph, convert, markdown_blocks
from tools.docs_index import DEFAULT_FORM, PORTER_BIGRAM, TRIGRAM, bigram_text
from tools.docs_store import DocsLimits, DocumentLibrary, Upload
from tools.errors import DocumentError
from tools.registry import ToolRegistry

ARCHIVE = DocsLimits().archive
TABLES = ("documents", "document_chunks", "document_index", "document_chunk_vectors", "audit_log")


def library(db, **limits) -> DocumentLibrary:
    return DocumentLibrary(db, DocsLimits(**limits), audit=insert_audit)


async def counts(db) -> dict[str, int]:
    return {table: (await db.fetchone(f"SELECT count(*) FROM {table}"))[0] for table in TABLES}


# --- conversion and chunks -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["team-guide.md", "team-guide.pdf", "team-guide.docx"])
def test_the_guide_reads_the_same_in_each_format_with_its_heading_paths(name):
    converted = convert(name, corpus_file(name), ARCHIVE)
    chunks = chunk_document(converted, 800)
    assert converted.title == GUIDE_TITLE
    assert [c.heading for c in chunks] == [c.heading for c in chunk_document(
        convert("team-guide.md", corpus_file("team-guide.md"), ARCHIVE), 800)]
    gpu = next(c for c in chunks if c.heading == GPU_HEADING)
    assert "王磊" in gpu.text and "48 小时" in gpu.text


def test_html_keeps_headings_and_lists_and_drops_scripts_and_styles():
    converted = convert("handbook.html", HANDBOOK_HTML.encode(), ARCHIVE)
    chunks = chunk_document(converted, 800)
    assert converted.title == "On-call handbook"
    assert [c.heading for c in chunks] == ["On-call handbook", "On-call handbook › Escalation",
                                           "On-call handbook › Handover"]
    text = " ".join(c.text for c in chunks)
    assert "secondary" in text and "Hand over at 10:00" in text and "alert" not in text and "color" not in text


def test_plain_text_is_paragraphs_under_the_file_name():
    chunks = chunk_document(convert("expenses.txt", EXPENSES_TEXT.encode(), ARCHIVE), 800)
    assert [c.heading for c in chunks] == ["expenses"] and "the 25th" in chunks[0].text


def test_text_in_gb18030_is_read_and_binary_data_is_not_text():
    assert "报销" in convert("说明.txt", "报销单每月二十五日前提交。".encode("gb18030"), ARCHIVE).blocks[0].text
    with pytest.raises(DocumentError, match="not a text file"):
        convert("notes.txt", b"\x00\x01\x02binary", ARCHIVE)


def test_markdown_headings_fences_and_links():
    blocks = markdown_blocks("Guide\n=====\n\nSee [the docs](docs/x.md) and [site](https://e.org).\n\n"
                             "## `Setup` **now**\n\n```\n# not a heading\n```\n")
    assert blocks == [Heading(1, "Guide"), Paragraph("See the docs and site (https://e.org)."),
                      Heading(2, "Setup now"), Paragraph("```\n# not a heading\n```")]


def test_long_sections_are_cut_between_sentences_and_never_span_two_sections():
    sentence = "这是一句很长的说明文字，用来测试切分。"
    converted = Converted("T", (Heading(1, "T"), Heading(2, "A"), Paragraph(sentence * 30), Heading(2, "B"),
                                Paragraph("short")))
    chunks = chunk_document(converted, 120)
    assert all(len(c.text) <= 120 for c in chunks)
    assert {c.heading for c in chunks} == {"T › A", "T › B"}
    assert all(c.text.endswith("。") for c in chunks if c.heading == "T › A")
    assert "".join(c.text for c in chunks if c.heading == "T › A") == sentence * 30


@pytest.mark.parametrize("name, data, message", [
    ("scanned.pdf", SCANNED_PDF.read_bytes(), "no text could be extracted (a scanned PDF? it needs OCR first)"),
    ("bomb.docx", zip_bomb(20), "refused as a possible zip bomb"),
    ("report.docx", b"PK\x03\x04 not really a zip", "not a Word document"),
    ("fake.pdf", b"hello", "not a PDF"),
    ("setup.exe", b"MZ", ".exe files are not supported"),
    ("old.doc", b"\xd0\xcf\x11\xe0", "save it as .docx"),
    ("README", b"text", "without a type suffix"),
    ("empty.md", b"  \n\n ", "no text could be extracted"),
])
def test_each_bad_file_is_one_line_naming_it(name, data, message):
    with pytest.raises(DocumentError) as caught:
        convert(name, data, ARCHIVE)
    assert message in str(caught.value) and str(caught.value).startswith(name)
    assert "\n" not in str(caught.value)


def test_a_docx_declaring_more_than_the_unpacked_limit_is_refused_before_unpacking():
    limits = ArchiveLimits(max_unpacked_bytes=5 * MB, max_ratio=10_000)
    with pytest.raises(DocumentError, match="unpacks to 8.0 MB"):
        convert("bomb.docx", zip_bomb(8), limits)


# --- the index -------------------------------------------------------------------------------------------------

async def test_the_migration_builds_the_index_in_the_default_form(db):
    (sql,) = await db.fetchone("SELECT sql FROM sqlite_master WHERE name = 'document_index'")
    assert sql == DEFAULT_FORM.create_sql()


def test_chinese_runs_are_indexed_as_overlapping_pairs():
    assert bigram_text("令牌与密钥 for GPU服务器") == "令牌 牌与 与密 密钥 for gpu 服务 务器"
    assert PORTER_BIGRAM.query("年假有几天?") == '"年假" OR "假有" OR "有几" OR "几天"'
    assert TRIGRAM.query("年假") is None  # two characters: nothing the trigram tokenizer can match
    assert PORTER_BIGRAM.query('the "quoted" OR') == '"quoted"'  # no FTS5 syntax gets through


async def test_every_format_is_added_and_found_by_its_own_words(db):
    docs = library(db)
    for name, data in files_of_each_format().items():
        added = await docs.add(Upload(name, data))
        assert added.outcome == "added" and added.document.chunk_count > 0
    hits = await docs.search("GPU 服务器 访问权限", None)
    assert hits[0].heading == GPU_HEADING
    # the guide in three formats is three documents, but one passage in the results
    assert [h.heading for h in hits].count(GPU_HEADING) == 1
    assert (await docs.search("secondary pager escalation", None))[0].heading == "On-call handbook › Escalation"
    assert (await docs.search("when are expense claims due", None))[0].name == "expenses.txt"


async def test_a_chat_finds_global_documents_and_its_own_but_not_another_chats(db):
    docs = library(db)
    await docs.add(Upload("handbook.html", HANDBOOK_HTML.encode(), scope="global"))
    await docs.add(Upload("expenses.txt", EXPENSES_TEXT.encode(), scope="tg:-100"))
    assert [h.name for h in await docs.search("expense claims pager", "tg:-100")] == ["expenses.txt",
                                                                                      "handbook.html"]
    assert [h.name for h in await docs.search("expense claims pager", "tg:-200")] == ["handbook.html"]
    assert [h.name for h in await docs.search("expense claims pager", None)] == ["handbook.html"]
    chunk = (await docs.search("expense claims", "tg:-100"))[0].chunk_id
    assert await docs.around(chunk, "tg:-200") == []
    assert [d.name for d in await docs.documents("tg:-300")] == ["handbook.html"]
    assert [d.name for d in await docs.documents()] == ["handbook.html", "expenses.txt"]


async def test_the_same_file_again_changes_nothing(db):
    docs = library(db)
    first = await docs.add(Upload("team-guide.md", corpus_file("team-guide.md")))
    before = await counts(db)
    again = await docs.add(Upload("copy of guide.md", corpus_file("team-guide.md")))
    assert again.outcome == "unchanged" and again.document.id == first.document.id
    assert await counts(db) == before


async def test_a_new_version_replaces_the_old_one_under_the_same_id(db):
    docs = library(db)
    first = await docs.add(Upload("expenses.txt", EXPENSES_TEXT.encode()))
    old_chunks = [row[0] for row in await db.fetchall("SELECT id FROM document_chunks")]
    newer = await docs.add(Upload("expenses.txt", b"Claims are now due by the 20th.\n\nNo more receipts."))
    assert newer.outcome == "replaced" and newer.document.id == first.document.id and newer.previous_chunks == 1
    assert await docs.search("25th", None) == [] and (await docs.search("20th", None))[0].name == "expenses.txt"
    assert not set(old_chunks) & {row[0] for row in await db.fetchall("SELECT rowid FROM document_index")}
    assert (await counts(db))["documents"] == 1
    actions = [row[0] for row in await db.fetchall("SELECT action FROM audit_log ORDER BY id")]
    assert actions == ["doc_add", "doc_replace"]


@pytest.mark.parametrize("upload, limits, message", [
    (Upload("big.md", b"# Big\n\n" + b"x " * 6000), {"max_file_bytes": 10_000}, "the limit is 10 KB (DOCS_MAX_FILE_MB)"),
    (Upload("bomb.docx", zip_bomb(20)), {}, "zip bomb"),
    (Upload("scan.pdf", SCANNED_PDF.read_bytes()), {}, "no text could be extracted"),
    (Upload("tool.exe", b"MZ"), {}, "not supported"),
    (Upload("team-guide.pdf", corpus_file("team-guide.pdf")), {"max_total_bytes": 5000}, "DOCS_MAX_TOTAL_MB"),
])
async def test_a_refused_file_leaves_every_table_as_it_was(db, upload, limits, message):
    docs = library(db, **limits)
    await docs.add(Upload("expenses.txt", EXPENSES_TEXT.encode()))
    before = await counts(db)
    with pytest.raises(DocumentError, match=re.escape(message)):
        await docs.add(upload)
    assert await counts(db) == before


async def test_a_failure_half_way_through_the_transaction_leaves_nothing_behind(db):
    async def failing_audit(*args):
        raise RuntimeError("disk full")
    docs = DocumentLibrary(db, DocsLimits(), audit=failing_audit)
    before = await counts(db)
    with pytest.raises(RuntimeError):
        await docs.add(Upload("team-guide.md", corpus_file("team-guide.md")))
    assert await counts(db) == before


async def test_delete_and_scope_are_audited_and_delete_takes_chunks_index_and_vectors(db):
    docs = library(db)
    added = await docs.add(Upload("expenses.txt", EXPENSES_TEXT.encode(), scope="tg:-100", added_by=42))
    (chunk_id,) = (await db.fetchone("SELECT id FROM document_chunks"))
    async with db.transaction() as conn:  # the embedding extension point: a vector goes with its chunk
        await conn.execute("INSERT INTO document_chunk_vectors VALUES (?, 'm', 2, ?)", (chunk_id, b"\0" * 8))
    assert (await docs.set_scope(added.document.id, "global", by=42, chat_id=-100)).scope == "global"
    await docs.remove(added.document.id, by=42, chat_id=-100)
    assert {k: v for k, v in (await counts(db)).items() if k != "audit_log"} == dict.fromkeys(TABLES[:-1], 0)
    audit = await db.fetchall("SELECT user_id, action, detail FROM audit_log ORDER BY id")
    assert [tuple(row) for row in audit] == [
        (42, "doc_add", f"#{added.document.id} expenses.txt sha256={added.document.sha256[:12]} chunks=1 scope=tg:-100"),
        (42, "doc_scope", f"#{added.document.id} expenses.txt tg:-100 -> global"),
        (42, "doc_del", f"#{added.document.id} expenses.txt scope=global")]
    with pytest.raises(DocumentError, match="there is no document"):
        await docs.remove(added.document.id)


# --- the tools -------------------------------------------------------------------------------------------------

async def test_docs_search_numbers_passages_with_path_document_and_chunk_within_the_limit(db):
    docs = library(db)
    for name in ("team-guide.md", "README.md", "SECURITY.md", "bench-README.md"):
        await docs.add(Upload(name, corpus_file(name)))
    for limit in (2000, 700, 300):
        text = await DocsTools(docs, limit).search("GPU 服务器 怎么申请", None)
        assert len(text) <= limit
        assert text.startswith(f"[1] {GPU_HEADING} — team-guide.md, chunk ")
        assert "Cite what you use as [n]" in text or limit == 300
    wide = await DocsTools(docs, 4000).search("security threat model admins", None)
    assert re.findall(r"^\[(\d)\] ", wide, re.MULTILINE) == ["1", "2", "3", "4", "5"]


async def test_docs_read_gives_the_chunk_whole_with_its_neighbours(db):
    docs = library(db)
    await docs.add(Upload("team-guide.md", corpus_file("team-guide.md")))
    (chunk_id,) = await db.fetchone("SELECT id FROM document_chunks WHERE heading = ?", (GPU_HEADING,))
    text = await DocsTools(docs, 2000).read(chunk_id, None)
    assert text.startswith(f"[chunk {chunk_id}] {GPU_HEADING} — team-guide.md\n深度学习实战")
    assert f"Before it, chunk {chunk_id - 1} (开发环境配置 › Python 环境):" in text
    assert f"After it, chunk {chunk_id + 1} (开发环境配置 › VPN):" in text
    assert "no chunk 999" in await DocsTools(docs, 2000).read(999, None)
    assert (await DocsTools(docs, 2000).search("GPU", "tg:1")).startswith("[1] ")  # a global document: any chat


async def test_the_tools_say_when_a_chat_has_no_documents_or_nothing_matches(db):
    docs = library(db)
    tools = DocsTools(docs, 2000)
    assert await tools.search("anything", "tg:1") == "No documents have been added for this chat."
    await docs.add(Upload("expenses.txt", EXPENSES_TEXT.encode()))
    assert "No passage of the documents here matches" in await tools.search("quantum chromodynamics", "tg:1")


def test_cited_chunks_follow_the_answers_citations_else_everything_shown():
    search = ("[1] Guide › Setup — guide.md, chunk 7\ntext\n\n[2] Guide › Tokens (v2) — guide (1).md, chunk 9\n"
              "text\n\n(Cite what you use…)")
    read = "[chunk 12] Other › Part — other.pdf\ntext\n\nAfter it, chunk 13 (Part):\nmore"
    steps = [("docs_search", search), ("calculator", "[1] chunk 99"), ("docs_read", read)]
    assert cited_chunks(steps, "See [2] Guide › Tokens.") == [9]
    assert cited_chunks(steps, "No citation here.") == [7, 9, 12]
    assert cited_chunks(steps, "A made-up [5] citation.") == [7, 9, 12]
    assert cited_chunks([], "[1]") == []


def test_limits_default_once():
    assert dataclasses.asdict(DocsLimits()) == {"max_file_bytes": 20 * MB, "max_total_bytes": 200 * MB,
                                                "chunk_chars": 800, "search_results": 5,
                                                "max_unpacked_bytes": 100 * MB, "max_zip_ratio": 100.0}


async def test_the_registry_gives_the_tools_the_turns_chat_and_the_model_cannot_name_another(db):
    docs = library(db)
    await docs.add(Upload("expenses.txt", EXPENSES_TEXT.encode(), scope="tg:-100"))
    registry = ToolRegistry.of(DocsTools(docs, 2000).tools())
    mine = await registry.call("docs_search", {"query": "expense claims"}, chat_key="tg:-100")
    assert mine.ok and "expenses.txt" in mine.output
    other = await registry.call("docs_search", {"query": "expense claims"}, chat_key="tg:-200")
    assert other.output == "No documents have been added for this chat."
    forged = await registry.call("docs_search", {"query": "expense claims", "chat_key": "tg:-100"}, chat_key="tg:-200")
    assert forged.error == "invalid_arguments" and "expenses.txt" not in forged.output
    tool = registry.get("docs_search")
    assert await tool.offered("tg:-100") and not await tool.offered("tg:-200")
