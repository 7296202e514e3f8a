"""`qwenbot ask` and `qwenbot chat` end to end, as subprocesses, with the scripted backend and a real database."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"
REPLIES = [
    'Thought: 查询课程数据库。\nAction: course_query\nAction Input: {"course_name": "大模型技术实战课程"}\nObservation:',
    " 我知道了\nFinal Answer: 大模型技术实战目前一共上线了200节。",
]


def qwenbot(tmp_path: Path, *args: str, replies=REPLIES, stdin: str = "") -> subprocess.CompletedProcess:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies, ensure_ascii=False), encoding="utf-8")
    env = {**os.environ, "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(script),
           "DATABASE_PATH": str(tmp_path / "bot.sqlite3"), "LOG_LEVEL": "WARNING"}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", *args], input=stdin, capture_output=True, text=True,
                          env=env, cwd=Path(__file__).parent.parent, timeout=120)


def test_ask_prints_the_answer_and_stores_the_turn(tmp_path):
    done = qwenbot(tmp_path, "ask", QUESTION)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "大模型技术实战目前一共上线了200节。"
    with sqlite3.connect(tmp_path / "bot.sqlite3") as conn:
        assert conn.execute("SELECT question, status FROM turns").fetchall() == [(QUESTION, "answered")]
        assert conn.execute("SELECT action FROM steps WHERE kind = 'tool'").fetchall() == [("course_query",)]


def test_ask_with_trace_prints_the_answer_then_each_step(tmp_path):
    done = qwenbot(tmp_path, "ask", "--trace", QUESTION)
    assert done.stdout.startswith("大模型技术实战目前一共上线了200节。\n")
    assert "Action: course_query" in done.stdout
    assert '"课时": 200' in done.stdout


def test_without_a_terminal_steps_go_to_stderr_as_plain_lines_and_quiet_drops_them(tmp_path):
    done = qwenbot(tmp_path, "ask", QUESTION)
    assert done.stdout == "大模型技术实战目前一共上线了200节。\n"  # exactly the answer: scripts read this
    steps = done.stderr.splitlines()
    assert steps[0] == '→ course_query {"course_name": "大模型技术实战课程"}'  # the tool and its input...
    assert steps[1].startswith('  {"课程名称": "大模型技术实战"')  # ...then its observation
    assert "\x1b[" not in done.stdout + done.stderr  # no escape codes without a terminal

    quiet = qwenbot(tmp_path, "ask", "--quiet", QUESTION)
    assert quiet.returncode == 0 and quiet.stdout == "大模型技术实战目前一共上线了200节。\n" and quiet.stderr == ""


def test_chat_session_with_trace_reset_and_quit(tmp_path):
    replies = [*REPLIES, "Thought: 好\nFinal Answer: 你好！"]
    done = qwenbot(tmp_path, "chat", replies=replies, stdin=f"{QUESTION}\n/trace\n/reset\n你好\n/quit\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "200节" in out and "Action: course_query" in out and "History cleared (2 messages)" in out
    assert "你好！" in out
    with sqlite3.connect(tmp_path / "bot.sqlite3") as conn:
        assert conn.execute("SELECT content FROM messages ORDER BY id").fetchall() == [("你好",), ("你好！",)]


def test_model_failure_is_one_line_not_a_traceback(tmp_path):
    done = qwenbot(tmp_path, "ask", QUESTION, replies=[])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "qwenbot: scripted model has no more replies"
    assert "Traceback" not in done.stderr


def test_each_ask_is_a_fresh_session_unless_one_is_named(tmp_path):
    first = qwenbot(tmp_path, "ask", QUESTION)
    again = qwenbot(tmp_path, "ask", QUESTION)
    assert first.returncode == again.returncode == 0
    with sqlite3.connect(tmp_path / "bot.sqlite3") as conn:
        sessions = [row[0] for row in conn.execute("SELECT session_id FROM turns ORDER BY id")]
    assert len(set(sessions)) == 2 and all(s.startswith("cli:ask:") for s in sessions)  # nothing shared

    for _ in range(2):
        assert qwenbot(tmp_path, "ask", "--session", "cli:notes", QUESTION).returncode == 0
    with sqlite3.connect(tmp_path / "bot.sqlite3") as conn:
        kept = conn.execute("SELECT count(*) FROM messages WHERE session_id = 'cli:notes'").fetchone()[0]
    assert kept == 4  # the second run saw, and added to, the first one's history
    assert "fresh session" in subprocess.run([sys.executable, "-m", "bot.program.cli", "ask", "--help"],
                                             capture_output=True, text=True, cwd=Path(__file__).parent.parent).stdout


def test_export_prints_a_sessions_history_as_markdown(tmp_path):
    assert qwenbot(tmp_path, "ask", "--session", "cli:notes", QUESTION).returncode == 0
    done = qwenbot(tmp_path, "export", "cli:notes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Chat history: cli:notes\n")
    assert f"> {QUESTION}" in done.stdout and "大模型技术实战目前一共上线了200节。" in done.stdout
    assert "Action: course_query" in done.stdout  # the terminal is at the server: steps included
    assert "Action:" not in qwenbot(tmp_path, "export", "--no-steps", "cli:notes").stdout
    missing = qwenbot(tmp_path, "export", "cli:nothing")
    assert missing.returncode == 1 and missing.stderr.strip() == "qwenbot: no history in session 'cli:nothing'"
