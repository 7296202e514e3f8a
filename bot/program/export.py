"""A chat's history as a Markdown document: /export in Telegram, `qwenbot export SESSION` in the terminal.

The document holds every turn of the history since its last /reset (question, answer, when, how long), the running
summary when older turns were folded into one, and, for admins (and the terminal), each turn's steps. It is cut to
`max_bytes` (EXPORT_MAX_BYTES, at most Telegram's 50 MB for a bot's document): the newest turns are kept, and a note
at the top says how many older ones were left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Sequence

from agent.memory import ExportedTurn, Summary
from agent.traces import render_trace
from bot.program.texts import add_texts, text

TEXTS = {
    "export_title": {"zh": "# 聊天记录：{title}", "en": "# Chat history: {title}"},
    "export_about": {"zh": "导出于 {now}（UTC），共 {count} 轮问答。",
                     "en": "Exported {now} (UTC), {count} turn(s)."},
    "export_cut": {"zh": "> 记录太长：最早的 {left_out} 轮没有放进这个文件（上限 {limit} 字节）。",
                   "en": "> The history is too long: its oldest {left_out} turn(s) are left out of this file "
                         "(the limit is {limit} bytes)."},
    "export_summary": {"zh": "## 机器人对前 {count} 轮的摘要", "en": "## The bot's summary of the first {count} turn(s)"},
    "export_turn": {"zh": "## {number} · {when}（UTC，{seconds:.1f} 秒）",
                    "en": "## {number} · {when} (UTC, {seconds:.1f} s)"},
    "export_question": {"zh": "**问：**", "en": "**Question:**"},
    "export_answer": {"zh": "**答：**", "en": "**Answer:**"},
    "export_steps": {"zh": "步骤：", "en": "Steps:"},
    "export_empty": {"zh": "（本聊天还没有记录）", "en": "(nothing in this chat's history yet)"},
}
add_texts(TEXTS)
FENCE = "~~~~"  # steps are fenced with tildes: a model's text may hold ``` of its own


@dataclass(frozen=True)
class ExportDocument:
    """The Markdown text of an export and what it holds."""

    text: str
    turns: int  # turns in the document
    left_out: int  # older turns cut to fit the size limit

    @property
    def data(self) -> bytes:
        """The document as a file's bytes (UTF-8)."""
        return self.text.encode("utf-8")


def render_export(title: str, turns: Sequence[ExportedTurn], summary: Summary | None, *, lang: str,
                  with_steps: bool, max_bytes: int, now: datetime | None = None) -> ExportDocument:
    """The history as Markdown in `lang`, with each turn's steps when `with_steps`, at most `max_bytes` long."""
    moment = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M")
    blocks = [turn_block(number, turn, lang, with_steps) for number, turn in enumerate(turns, 1)]
    tail = [summary_block(summary, lang)] if summary is not None else []

    def head(left_out: int) -> list[str]:
        lines = [text("export_title", lang, title=title),
                 text("export_about", lang, now=moment, count=len(blocks) - left_out)]
        return lines + ([text("export_cut", lang, left_out=left_out, limit=max_bytes)] if left_out else [])

    sizes = [len(block.encode("utf-8")) + 2 for block in blocks]  # each with the blank line before it
    fixed = len("\n\n".join(tail).encode("utf-8")) + 64  # the summary, and room for joins and the empty note
    total, left_out = sum(sizes), 0
    while left_out < len(blocks) and len("\n\n".join(head(left_out)).encode("utf-8")) + fixed + total > max_bytes:
        total -= sizes[left_out]
        left_out += 1
    kept = blocks[left_out:]
    body = "\n\n".join(head(left_out) + tail + (kept or [text("export_empty", lang)])) + "\n"
    if len(body.encode("utf-8")) > max_bytes:  # not even the header and the summary fit: cut on a character
        body = body.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")
    return ExportDocument(body, len(kept), left_out)


def turn_block(number: int, turn: ExportedTurn, lang: str, with_steps: bool) -> str:
    """One turn: its heading, question, answer and (when asked) its steps."""
    when = turn.started_at[:19].replace("T", " ")
    lines = [text("export_turn", lang, number=number, when=when, seconds=turn.duration_ms / 1000), "",
             text("export_question", lang), "", quoted(turn.question), "", text("export_answer", lang), "",
             turn.answer]
    if with_steps and turn.steps:
        lines += ["", text("export_steps", lang), FENCE, render_trace(turn.steps, limit=2000), FENCE]
    return "\n".join(lines)


def summary_block(summary: Summary, lang: str) -> str:
    """The running summary of the turns folded before the ones listed."""
    return "\n".join([text("export_summary", lang, count=summary.folded_turns), "", summary.text])


def quoted(value: str) -> str:
    """A user's text as a Markdown quote, line by line."""
    return "\n".join(f"> {line}" for line in value.splitlines() or [""])
