"""The team's documents through the real bot on the fake Bot API: files added by admins (getFile, download), found
and cited in answers, scoped per chat, deleted; every refusal one line, the tables as they were."""

from __future__ import annotations

import json

import pytest

from tests.docs_files import GUIDE_TITLE, HANDBOOK_HTML, SCANNED_PDF, files_of_each_format, zip_bomb
from tests.fakes.telegram_bot import ADMIN, ALICE, BOB, TEAM, final, private_chat, start_bot, telegram_server

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

TABLES = ("documents", "document_chunks", "document_index", "audit_log")
TITLES = {"handbook.html": "On-call handbook", "expenses.txt": "expenses"}  # the guide's is GUIDE_TITLE
# For each format: a search the model makes, and a word of the passage that answers it.
SEARCHES = {
    "team-guide.md": ("GPU 服务器 访问权限", "王磊"),
    "team-guide.pdf": ("VPN 连接", "动态口令"),
    "team-guide.docx": ("报销 额度", "3000"),
    "handbook.html": ("escalation secondary", "secondary"),
    "expenses.txt": ("expense claims due", "25th"),
}


def search_step(query: str) -> str:
    """A model reply calling docs_search."""
    return f"Thought: 我应该搜索团队文档。\nAction: docs_search\nAction Input: {json.dumps({'query': query})}\nObservation:"


async def counts(bot) -> dict[str, int]:
    return {table: (await bot.query(f"SELECT count(*) FROM {table}"))[0][0] for table in TABLES}


async def send_file(bot, chat, user, name: str, data: bytes, **kwargs) -> str:
    """`user` sends a file in `chat`; the bot's one reply."""
    before = len(bot.server.sent_texts(chat.id))
    bot.server.send_document(chat, user, name, data, **kwargs)
    return (await bot.answers(chat.id, before + 1, timeout=15))[before]


@pytest.mark.parametrize("name", list(SEARCHES))
async def test_an_admins_file_is_found_and_cited_in_a_group_answer(start_bot, telegram_server, name):
    query, word = SEARCHES[name]
    bot = await start_bot([search_step(query), final(f"答案在这里 [1]（{word}）。")])
    reply = await send_file(bot, TEAM, ADMIN, name, files_of_each_format()[name], caption="/doc_add")
    assert reply.startswith(f"✅ Added #1 {name}") and "searchable in this chat only" in reply
    assert telegram_server.calls_to("getFile", ok=True) and telegram_server.calls_to("download", ok=True)

    answer = await bot.ask(TEAM, ALICE, "@qwen_test_bot 文档里怎么说？")
    observation = bot.llm.requests[1].text
    assert f"[1] " in observation and f"— {name}, chunk " in observation and word in observation
    # Alice's Telegram speaks Chinese: the sources line does too
    assert answer == f"答案在这里 [1]（{word}）。\n\n📎 来源：{TITLES.get(name, GUIDE_TITLE)} ({name})"


async def test_the_sources_line_follows_the_askers_language(start_bot, telegram_server):
    bot = await start_bot([search_step("VPN"), final("Connect with the one-time code [1].")])
    await send_file(bot, private_chat(ADMIN), ADMIN, "team-guide.md", files_of_each_format()["team-guide.md"])
    answer = await bot.ask(private_chat(ADMIN), ADMIN, "How do I connect to the VPN?")
    assert answer == f"Connect with the one-time code [1].\n\n📎 Sources: {GUIDE_TITLE} (team-guide.md)"


async def test_a_file_from_anyone_but_an_admin_is_refused_and_nothing_is_stored(start_bot, telegram_server):
    bot = await start_bot()
    before = await counts(bot)
    refusal = "⛔ 只有管理员可以添加文档。请用文字提问。"  # Alice writes in Chinese
    assert await send_file(bot, private_chat(ALICE), ALICE, "guide.md", b"# Guide\n\ntext") == refusal
    assert await send_file(bot, TEAM, ALICE, "guide.md", b"# Guide\n\ntext", caption="/doc_add") == refusal
    assert (await send_file(bot, private_chat(BOB), BOB, "guide.md", b"# Guide")).startswith(
        "⛔ Only admins can add documents. Ask me in text instead.")  # Bob has no access: with his id, once
    bot.server.send_document(TEAM, ALICE, "chatter.md", b"# Not for the bot")  # no /doc_add: group chatter
    bot.server.send_document(TEAM, ADMIN, "other.md", b"# Other", caption="/doc_add@other_bot")  # another bot's
    await bot.turns_done()
    assert await counts(bot) == before
    assert not telegram_server.calls_to("getFile")


async def test_doc_add_in_reply_to_a_file_and_the_same_file_again(start_bot, telegram_server):
    bot = await start_bot()
    file_message = telegram_server.send_document(TEAM, ALICE, "handbook.html", HANDBOOK_HTML.encode())
    reply = await bot.ask(TEAM, ADMIN, "/doc_add global", reply_to=file_message)
    assert reply.startswith("✅ Added #1 handbook.html “On-call handbook”: 3 chunks") and "every chat" in reply
    again = await bot.ask(TEAM, ADMIN, "/doc_add", reply_to=file_message)
    assert again == "ℹ️ handbook.html is already indexed as #1 handbook.html (the same file): nothing changed."
    assert "Usage: /doc_add" in await bot.ask(TEAM, ADMIN, "/doc_add")
    assert (await counts(bot))["documents"] == 1


async def test_doc_del_removes_it_from_search(start_bot, telegram_server):
    bot = await start_bot([search_step("escalation"), final("one"), final("two")])
    await send_file(bot, private_chat(ADMIN), ADMIN, "handbook.html", HANDBOOK_HTML.encode(), caption="global")
    await bot.ask(private_chat(ALICE), ALICE, "who escalates?")
    assert "On-call handbook › Escalation" in bot.llm.requests[1].text
    assert await bot.ask(private_chat(ADMIN), ADMIN, "/doc_del 1") == "✅ Removed #1 handbook.html and its 3 chunks."
    await bot.ask(private_chat(ALICE), ALICE, "who escalates now?")
    offered = bot.llm.requests[-1].text.split("(What I looked up")[0]  # the last turn's note names its lookups
    assert "docs_search" not in offered  # no document left: the tools are not offered
    assert await counts(bot) == {"documents": 0, "document_chunks": 0, "document_index": 0, "audit_log": 2}
    assert "there is no document #1" in await bot.ask(private_chat(ADMIN), ADMIN, "/doc_del 1")


async def test_a_chat_outside_a_documents_scope_cannot_find_it(start_bot, telegram_server):
    bot = await start_bot([search_step("expense claims escalation"), final("not here"), final("here")])
    data = files_of_each_format()
    await send_file(bot, TEAM, ADMIN, "expenses.txt", data["expenses.txt"], caption="/doc_add")
    await send_file(bot, private_chat(ADMIN), ADMIN, "handbook.html", data["handbook.html"], caption="global")
    await bot.ask(private_chat(ALICE), ALICE, "when are expense claims due?")
    observation = bot.llm.requests[1].text
    assert "handbook.html" in observation and "expenses.txt" not in observation and "25th" not in observation
    listing = await bot.ask(private_chat(ALICE), ALICE, "/docs")
    assert "handbook.html" in listing and "expenses.txt" not in listing
    in_team = await bot.ask(TEAM, ALICE, "/docs")  # Alice writes in Chinese: the listing is in Chinese
    assert "expenses.txt" in in_team and "仅本聊天" in in_team and "handbook.html" in in_team


async def test_doc_scope_shares_a_document_and_every_change_is_audited(start_bot, telegram_server):
    bot = await start_bot()
    await send_file(bot, TEAM, ADMIN, "expenses.txt", files_of_each_format()["expenses.txt"], caption="/doc_add")
    assert await bot.ask(TEAM, ADMIN, "/doc_scope 1 global") == "✅ #1 expenses.txt is now searchable in every chat."
    assert "所有聊天" in await bot.ask(private_chat(ALICE), ALICE, "/docs")
    assert "Usage: /doc_scope" in await bot.ask(TEAM, ADMIN, "/doc_scope 1 everywhere")
    assert "只有管理员" in await bot.ask(TEAM, ALICE, "/doc_scope 1 here")  # admins only, in her language
    assert "只有管理员" in await bot.ask(TEAM, ALICE, "/docs all")
    assert "expenses.txt" in await bot.ask(private_chat(ADMIN), ADMIN, "/docs all")
    audit = await bot.query("SELECT user_id, chat_id, action FROM audit_log ORDER BY id")
    assert audit == [(ADMIN.id, TEAM.id, "doc_add"), (ADMIN.id, TEAM.id, "doc_scope")]


@pytest.mark.parametrize("name, data, settings, expected", [
    ("big.md", b"# Big\n\n" + b"word " * 5000, {"docs_max_file_mb": 0.01},
     "❌ big.md: the file is 24 KB; the limit is 10 KB (DOCS_MAX_FILE_MB)"),
    ("huge.pdf", b"%PDF-1.4 small", {"docs_max_file_mb": 50, "file_size": 21 * 1024 * 1024},
     "❌ huge.pdf (21.0 MB): Telegram lets bots download files of up to 20.0 MB; add it on the server with "
     "qwenbot docs add PATH"),
    ("undeclared.pdf", b"%PDF" + bytes(21 * 1024 * 1024), {"docs_max_file_mb": 50, "file_size": 0},
     "❌ undeclared.pdf: Telegram lets bots download files of up to 20.0 MB"),  # getFile says "file is too big"
    ("scan.pdf", SCANNED_PDF.read_bytes(), {},
     "❌ scan.pdf: no text could be extracted (a scanned PDF? it needs OCR first)"),
    ("report.docx", zip_bomb(20), {}, "❌ report.docx: refused as a possible zip bomb: it unpacks to 20.0 MB"),
    ("setup.exe", b"MZ\x90\x00", {}, "❌ setup.exe: .exe files are not supported; supported: .md .markdown .txt"),
    ("team-guide.pdf", files_of_each_format()["team-guide.pdf"], {"docs_max_total_mb": 0.005},
     "DOCS_MAX_TOTAL_MB); delete some first"),
])
async def test_each_bad_file_gets_one_line_and_leaves_the_index_as_it_was(start_bot, telegram_server, name, data,
                                                                            settings, expected):
    file_size = settings.pop("file_size", None)
    bot = await start_bot(**settings)
    await send_file(bot, private_chat(ADMIN), ADMIN, "expenses.txt", b"Claims are due by the 25th.")
    before = await counts(bot)
    reply = await send_file(bot, private_chat(ADMIN), ADMIN, name, data, file_size=file_size)
    assert expected in reply and "\n" not in reply and "Traceback" not in reply
    assert await counts(bot) == before
    downloaded = len(telegram_server.calls_to("download"))
    assert downloaded == (1 if name in ("big.md", "huge.pdf", "undeclared.pdf", "setup.exe") else 2)


async def test_a_new_version_replaces_the_old_one(start_bot, telegram_server):
    bot = await start_bot()
    first = await send_file(bot, TEAM, ADMIN, "expenses.txt", b"Claims are due by the 25th.", caption="/doc_add")
    second = await send_file(bot, TEAM, ADMIN, "expenses.txt", b"Claims are due by the 20th.\n\nNew rules.",
                             caption="/doc_add")
    assert first.startswith("✅ Added #1 expenses.txt") and second.startswith("✅ Replaced #1 expenses.txt")
    assert "1 chunk (was 1)" in second
    assert await bot.query("SELECT body FROM document_chunks") == [("Claims are due by the 20th.\n\nNew rules.",)]


async def test_the_tools_are_switched_per_chat_like_every_tool(start_bot, telegram_server):
    bot = await start_bot([final("one"), final("two")])
    await send_file(bot, private_chat(ADMIN), ADMIN, "handbook.html", HANDBOOK_HTML.encode(), caption="global")
    assert (await bot.ask(TEAM, ADMIN, "/tool_off docs_search")).startswith("✅ docs_search is off in this chat")
    await bot.ask(TEAM, ALICE, "@qwen_test_bot who escalates?")
    assert "should be one of [course_query,course_list,calculator,docs_read]" in bot.llm.requests[-1].text
    await bot.ask(private_chat(ALICE), ALICE, "who escalates?")  # other chats keep it
    assert "should be one of [course_query,course_list,calculator,docs_search,docs_read]" in bot.llm.requests[-1].text
    assert "docs_search" in await bot.ask(private_chat(ALICE), ALICE, "/tools")


async def test_a_groups_documents_follow_it_when_it_becomes_a_supergroup(start_bot, telegram_server):
    from tests.test_holes_supergroups import NEW, OLD, announce_upgrade

    bot = await start_bot(allowed_chat_ids=frozenset({OLD.id}))
    await send_file(bot, OLD, ADMIN, "expenses.txt", files_of_each_format()["expenses.txt"], caption="/doc_add")
    await announce_upgrade(bot)
    assert await bot.query("SELECT scope FROM documents") == [(f"tg:{NEW.id}",)]
    assert "expenses.txt" in await bot.ask(NEW, ADMIN, "/docs")
    (detail,) = await bot.query("SELECT detail FROM audit_log WHERE action = 'chat_migrated'")
    assert detail[0].endswith("1 document(s)")
