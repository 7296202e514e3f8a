"""`qwenbot chat` in a real pseudo-terminal (pexpect): steps as they happen, the answer streamed, Ctrl-C stopping
the running question and returning to the prompt, a second Ctrl-C leaving."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import pexpect

REPO = Path(__file__).resolve().parents[1]
QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"
LOOKUP = ('Thought: 查询课程数据库。\nAction: course_query\nAction Input: {"course_name": "大模型技术实战"}\n'
          "Observation:")
ANSWER = "大模型技术实战目前一共上线了200节。"
STORY = "从前有座山，山里有座庙。" * 40  # 480 characters: about 8 s at the pace below
# How prompt_toolkit draws the "> " prompt: the ">" then a cursor move over the space.
PROMPT = r"\x1b\[0m>\x08\x1b\[2C"


def spawn_chat(tmp_path: Path, replies: list[str]) -> pexpect.spawn:
    """`qwenbot chat` on a pseudo-terminal, the scripted model streaming about 20 pieces a second."""
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies, ensure_ascii=False), encoding="utf-8")
    env = {**os.environ, "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(script),
           "SCRIPTED_TOKEN_SECONDS": "0.05", "DATABASE_PATH": str(tmp_path / "bot.sqlite3"), "LOG_LEVEL": "WARNING",
           "TERM": "xterm-256color", "PYTHONPATH": str(REPO),
           "PROMPT_TOOLKIT_NO_CPR": "1"}  # pexpect does not answer cursor position requests as terminals do
    child = pexpect.spawn(sys.executable, ["-m", "bot.program.cli", "chat"], cwd=str(tmp_path), env=env,
                          encoding="utf-8", timeout=60, dimensions=(40, 160))
    child.expect_exact("Ctrl-C stops an answer.")
    child.expect(PROMPT)
    return child


def statuses(tmp_path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(tmp_path / "bot.sqlite3") as db:
        return db.execute("SELECT question, status FROM turns ORDER BY id").fetchall()


def test_chat_shows_steps_then_streams_the_answer_and_ctrl_c_stops_it_back_at_the_prompt(tmp_path):
    child = spawn_chat(tmp_path, [LOOKUP, f" 我知道了\nFinal Answer: {ANSWER}", f"Thought: 好\nFinal Answer: {STORY}"])
    try:
        child.sendline(QUESTION)
        child.expect_exact("course_query")  # the step: the tool...
        child.expect_exact('{"course_name": "大模型技术实战"}')  # ...its input...
        child.expect_exact('"课时": 200')  # ...then the observation
        child.expect_exact(ANSWER)
        child.expect(PROMPT)
        assert "Thought" not in child.before and "我知道了" not in child.before  # only the answer streams

        child.sendline("讲一个很长的故事")
        child.expect_exact("从前有座山，山里有座庙。从前有座山")  # the answer is being written...
        child.sendintr()  # ...Ctrl-C
        child.expect_exact("Stopped.")
        shown = child.before
        child.expect(PROMPT)  # back at the prompt, the program still running
        assert shown.count("山里有座庙") < STORY.count("山里有座庙")  # it stopped mid-answer

        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert statuses(tmp_path) == [(QUESTION, "answered"), ("讲一个很长的故事", "cancelled")]


def test_a_second_ctrl_c_leaves(tmp_path):
    child = spawn_chat(tmp_path, [f"Thought: 好\nFinal Answer: {STORY}"])
    try:
        child.sendline("讲一个很长的故事")
        child.expect_exact("从前有座山")
        child.sendintr()
        time.sleep(0.3)  # a person's second press
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert statuses(tmp_path) == [("讲一个很长的故事", "cancelled")]


def test_ctrl_c_at_the_prompt_leaves(tmp_path):
    child = spawn_chat(tmp_path, [])
    try:
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
