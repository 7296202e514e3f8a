"""`qwenbot docs add|list|del|search` and `qwenbot eval --retrieval`, as real processes on a real database."""

from __future__ import annotations

import json
import sqlite3

from tests.docs_files import CORPUS, GPU_HEADING, GUIDE_TITLE, SCANNED_PDF
from tests.test_cli_foundation import ROOT, qwenbot


def rows(path, sql: str) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


def test_add_a_folder_and_files_list_search_and_delete(tmp_path):
    database = tmp_path / "bot.sqlite3"
    env = {"DATABASE_PATH": str(database), "DATA_DIR": str(tmp_path)}
    folder = tmp_path / "handbook"
    folder.mkdir()
    (folder / "guide.md").write_bytes((CORPUS / "team-guide.md").read_bytes())
    (folder / "notes.txt").write_text("Standup is at 9:30.\n\nRetro every other Friday.", encoding="utf-8")
    (folder / "logo.png").write_bytes(b"\x89PNG")  # another type inside a folder: skipped

    added = qwenbot("docs", "add", str(folder), str(SCANNED_PDF), str(tmp_path / "missing.md"), **env)
    assert added.returncode == 2
    assert added.stdout.splitlines() == [
        f"{folder / 'guide.md'}: ✅ Added #1 guide.md “{GUIDE_TITLE}”: 22 chunks, 6 KB, searchable in every chat.",
        f"{folder / 'notes.txt'}: ✅ Added #2 notes.txt “notes”: 1 chunk, 46 bytes, searchable in every chat."]
    assert added.stderr.splitlines() == [
        "qwenbot: scanned.pdf: no text could be extracted (a scanned PDF? it needs OCR first)",
        f"qwenbot: {tmp_path / 'missing.md'}: [Errno 2] No such file or directory: '{tmp_path / 'missing.md'}'"]

    team = tmp_path / "team.txt"
    team.write_text("The retro board is in the team wiki.", encoding="utf-8")
    scoped = qwenbot("docs", "add", str(team), "--scope", "tg:-100", **env)
    assert scoped.returncode == 0 and "Added #3 team.txt" in scoped.stdout and "tg:-100 only" in scoped.stdout
    same = qwenbot("docs", "add", str(folder / "notes.txt"), "--scope", "tg:-100", **env)  # global already covers it
    assert "already indexed as #2 notes.txt (the same file): nothing changed." in same.stdout

    listing = qwenbot("docs", "list", **env).stdout.splitlines()
    assert [line.split(" · ")[0] for line in listing] == [f"#1 guide.md “{GUIDE_TITLE}”", "#2 notes.txt “notes”",
                                                         "#3 team.txt “team”"]
    assert all("added by qwenbot docs add" in line for line in listing)
    assert len(qwenbot("docs", "list", "--chat", "tg:-200", **env).stdout.splitlines()) == 2

    found = qwenbot("docs", "search", "GPU 服务器 申请", **env)
    assert found.stdout.startswith(f"[1] {GPU_HEADING} — guide.md, chunk ")
    assert qwenbot("docs", "del", "1", **env).stdout == "Removed #1 guide.md and its 22 chunks.\n"
    gone = qwenbot("docs", "search", "GPU 服务器 申请", **env)
    assert gone.stdout.startswith("No passage of the documents here matches")
    missing = qwenbot("docs", "del", "1", **env)
    assert (missing.returncode, missing.stderr) == (
        2, "qwenbot: there is no document #1 (/docs and qwenbot docs list show them)\n")
    assert [row[0] for row in rows(database, "SELECT action FROM audit_log ORDER BY id")] == [
        "doc_add", "doc_add", "doc_add", "doc_del"]


def test_eval_retrieval_reports_recall_per_question_and_overall(tmp_path):
    questions = tmp_path / "docs.jsonl"
    questions.write_text("\n".join(json.dumps(line, ensure_ascii=False) for line in [
        {"q": "怎么申请 GPU 服务器的访问权限？", "doc": "team-guide", "heading": "开发环境配置 › 获取 GPU 服务器访问权限"},
        {"q": "年假一共有几天？", "doc": "team-guide", "heading": "请假与报销 › 请假"},
        {"q": "Who may read a group's /trace?", "doc": "team-guide", "heading": "请假与报销 › 请假"},  # not there
    ]), encoding="utf-8")
    report = tmp_path / "report.json"
    corpus = ["--corpus", str(CORPUS / "team-guide.pdf"), "--corpus", str(CORPUS / "SECURITY.md")]
    result = qwenbot("eval", "--retrieval", str(questions), *corpus, "--report", str(report),
                     DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["✓ 1 怎么申请 GPU 服务器的访问权限？", "✓ 1 年假一共有几天？"]
    assert lines[2].startswith("✗ Who may read a group's /trace? (wanted 请假与报销 › 请假 in team-guide; first: "
                               "Security › Known limits")
    assert "recall@5: 2/3 (67%); recall@1 67%, MRR 0.67" in lines
    assert json.loads(report.read_text(encoding="utf-8"))["by_group"] == {"zh": 1.0, "team-guide": 0.6667, "en": 0.0}
    trigram = qwenbot("eval", "--retrieval", str(questions), *corpus, "--tokenizer", "trigram", DATA_DIR=str(tmp_path))
    assert "✗ 年假一共有几天？" in trigram.stdout  # two-character words: nothing for a trigram index to match


def test_the_shipped_question_set_finds_every_answer_in_the_top_five(tmp_path):
    result = qwenbot("eval", "--retrieval", str(ROOT / "evals" / "docs.jsonl"), DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "recall@5: 57/57 (100%)" in result.stdout


def test_a_bad_question_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "where?", "heading": "Setup"}\n', encoding="utf-8")
    result = qwenbot("eval", "--retrieval", str(bad), "--corpus", str(CORPUS), DATA_DIR=str(tmp_path))
    assert (result.returncode, result.stderr) == (
        2, f'qwenbot: {bad}, line 1: expected {{"q": "question", "doc": "name", "heading": "Section › Part"}}\n')


def test_ask_lists_the_documents_the_answer_used(tmp_path):
    env = {"DATABASE_PATH": str(tmp_path / "bot.sqlite3")}
    assert qwenbot("docs", "add", str(CORPUS / "team-guide.md"), **env).returncode == 0
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([
        'Thought: search\nAction: docs_search\nAction Input: {"query": "VPN"}\nObservation:',
        "Thought: I now know the final answer\nFinal Answer: Use the one-time code from Feishu [1].",
    ]), encoding="utf-8")
    asked = qwenbot("ask", "How do I connect to the VPN?", LLM_BACKEND="scripted", SCRIPTED_REPLIES_PATH=str(script),
                    LOG_LEVEL="WARNING", **env)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout == (f"Use the one-time code from Feishu [1].\n\n📎 Sources: {GUIDE_TITLE} (team-guide.md)\n")
