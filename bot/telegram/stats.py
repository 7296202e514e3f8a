"""Usage figures for /stats, from the database: turns, tool calls, errors and median latency per day and per chat.

Errors count turns that failed (the model or the backend failed: status `error`) and tool calls that failed
(an exception, a time-out, bad arguments). Cancelled turns count as turns but not in the latency.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from agent.steps import TOOL_KINDS, StepKind, TurnStatus
from bot.program.texts import add_texts, text
from db import Database

DEFAULT_DAYS = 7
MAX_DAYS = 366
MAX_CHATS_SHOWN = 20
TOTAL = "Total"  # the label of the totals' figures (shown in the reader's language)
TEXTS = {
    "stats_line": {"zh": "{label}：问答 {turns} · 工具调用 {tool_calls} · 错误 {errors} · 中位耗时 {median}",
                   "en": "{label}: turns {turns} · tool calls {tool_calls} · errors {errors} · median {median}"},
    "stats_seconds": {"zh": "{seconds:.1f} 秒", "en": "{seconds:.1f} s"},
    "stats_none": {"zh": "📊 最近 {days} 天没有问答。", "en": "📊 No turns in the last {days} days."},
    "stats_header": {"zh": "📊 最近 {days} 天", "en": "📊 Last {days} days"},
    "stats_total": {"zh": "合计", "en": "Total"},
    "stats_by_day": {"zh": "按天：", "en": "By day:"},
    "stats_by_chat": {"zh": "按聊天：", "en": "By chat:"},
    "stats_more_chats": {"zh": "… 还有 {count} 个聊天", "en": "… and {count} more chats"},
}
add_texts(TEXTS)


@dataclass
class Figures:
    """Totals for one day or one chat."""

    label: str
    turns: int = 0
    tool_calls: int = 0
    errors: int = 0
    durations_ms: list[int] = field(default_factory=list)

    @property
    def median_seconds(self) -> float | None:
        """The median turn latency in seconds, or None without a finished turn."""
        return statistics.median(self.durations_ms) / 1000 if self.durations_ms else None

    def line(self, lang: str = "en") -> str:
        """One line of the report."""
        median = "—" if self.median_seconds is None else text("stats_seconds", lang, seconds=self.median_seconds)
        label = text("stats_total", lang) if self.label == TOTAL else self.label
        return text("stats_line", lang, label=label, turns=self.turns, tool_calls=self.tool_calls,
                    errors=self.errors, median=median)


@dataclass
class Report:
    """Figures per day, per chat and in total over a period."""

    days: int
    by_day: list[Figures]
    by_chat: list[Figures]
    total: Figures

    def text(self, lang: str = "en") -> str:
        """The report as /stats shows it, in `lang`."""
        if not self.total.turns:
            return text("stats_none", lang, days=self.days)
        lines = [text("stats_header", lang, days=self.days), self.total.line(lang), "", text("stats_by_day", lang)]
        lines += [f.line(lang) for f in self.by_day]
        lines += ["", text("stats_by_chat", lang)] + [f.line(lang) for f in self.by_chat[:MAX_CHATS_SHOWN]]
        if len(self.by_chat) > MAX_CHATS_SHOWN:
            lines.append(text("stats_more_chats", lang, count=len(self.by_chat) - MAX_CHATS_SHOWN))
        return "\n".join(lines)


async def usage_report(db: Database, days: int = DEFAULT_DAYS) -> Report:
    """Figures for the last `days` days (UTC)."""
    since = (datetime.now(timezone.utc) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S")
    rows = await db.fetchall(
        "SELECT substr(t.started_at, 1, 10), s.chat_id, COALESCE(s.title, ''), t.session_id, t.status, "
        "t.duration_ms, "
        "(SELECT count(*) FROM steps st WHERE st.turn_id = t.id AND st.kind IN (?, ?)), "
        "(SELECT count(*) FROM steps st WHERE st.turn_id = t.id AND st.kind = ? AND st.error IS NOT NULL) "
        "FROM turns t LEFT JOIN sessions s ON s.id = t.session_id WHERE t.started_at >= ? ORDER BY t.started_at",
        (*TOOL_KINDS, StepKind.TOOL, since))
    by_day: dict[str, Figures] = {}
    by_chat: dict[str, Figures] = {}
    total = Figures(TOTAL)
    for day, chat_id, title, session_id, status, duration_ms, tool_calls, tool_errors in rows:
        chat = f"{title} ({chat_id})" if title else str(chat_id if chat_id is not None else session_id)
        for figures in (by_day.setdefault(day, Figures(day)), by_chat.setdefault(chat, Figures(chat)), total):
            _add(figures, status, duration_ms, tool_calls, tool_errors)
    chats = sorted(by_chat.values(), key=lambda f: -f.turns)
    return Report(days, list(by_day.values()), chats, total)


def _add(figures: Figures, status: str, duration_ms: int, tool_calls: int, tool_errors: int) -> None:
    figures.turns += 1
    figures.tool_calls += tool_calls
    figures.errors += tool_errors + (status == TurnStatus.ERROR)
    if status != TurnStatus.CANCELLED:
        figures.durations_ms.append(duration_ms)
