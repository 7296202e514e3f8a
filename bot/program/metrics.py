"""The bot's Prometheus metrics: what a turn, a tool call and an answer on screen took, and, read at scrape time,
the model engine's counters, Telegram's calls, the update journal's backlog and the MCP servers' state.

    qwenbot_turns_total{status}                         turns ended, by how (answered, step_limit, gave_up,
                                                        cancelled, error, timeout, database_busy, failed)
    qwenbot_turn_duration_seconds                       a turn, from its start to its answer delivered
    qwenbot_first_visible_seconds                       from a turn's start to the first character of its answer
                                                        on the user's screen (a draft, a message or an edit)
    qwenbot_tool_calls_total{tool, outcome}             ok, repeated, or the error (unknown_tool, timeout, …)
    qwenbot_model_queue_jobs                            model calls waiting for the model (local engine)
    qwenbot_model_batch_rows                            rows in the batch the engine is running now
    qwenbot_model_batches_total, …_batched_rows_total   batches started, and the rows they held in all
    qwenbot_model_generated_tokens_total                tokens the model wrote (every backend)
    qwenbot_model_prompt_tokens_total{cache}            prompt tokens computed, or reused from a cached prefix
    qwenbot_model_speculative_tokens_total{outcome}     speculative tokens proposed, and accepted
    qwenbot_telegram_requests_total{method, result}     Bot API calls: ok, 429, 4xx, 5xx, timeout, network_error
    qwenbot_update_journal_backlog                      updates received and not yet handled
    qwenbot_mcp_server_state{server, state}             1 for each server's state (connected, connecting, down,
                                                        idle), 0 for the others
    qwenbot_mcp_server_tools{server}                    tools a server offers (as last listed)

The registry is the application's own, not the process-wide default, so two bots in one process (tests) never mix
their counts. The engine and the backends know nothing of Prometheus: they keep plain counters
(`agent/llm/base.py`'s `ModelCounters`), and the collector here reads them when Prometheus asks.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.steps import StepKind, TurnResult

if TYPE_CHECKING:
    from bot.program.services import Services


class CallTally(Protocol):
    """Bot API calls by (method, result): what the Telegram adapter counts (bot/telegram/requests.py)."""

    counts: Mapping[tuple[str, str], int]

log = logging.getLogger(__name__)

# A turn takes seconds (one model call, a cached prompt) to minutes (several tool calls on a CPU).
TURN_BUCKETS = (0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300)
FIRST_VISIBLE_BUCKETS = (0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120)
MCP_STATES = ("connected", "connecting", "down", "idle")


class BotMetrics:
    """The metrics of one running bot, in a registry of its own (`registry`), served at /metrics."""

    def __init__(self, telegram_calls: CallTally | None = None) -> None:
        self.registry = CollectorRegistry()
        self.turns = Counter("qwenbot_turns", "Turns ended, by how they ended.", ["status"], registry=self.registry)
        self.turn_seconds = Histogram("qwenbot_turn_duration_seconds", "A turn, from its start to its answer "
                                      "delivered.", buckets=TURN_BUCKETS, registry=self.registry)
        self.first_visible_seconds = Histogram(
            "qwenbot_first_visible_seconds", "From a turn's start to the first character of its answer on screen.",
            buckets=FIRST_VISIBLE_BUCKETS, registry=self.registry)
        self.tool_calls = Counter("qwenbot_tool_calls", "Tool calls the model asked for, by tool and outcome.",
                                  ["tool", "outcome"], registry=self.registry)
        self.state = StateCollector(telegram_calls)
        self.registry.register(self.state)

    def attach(self, services: "Services") -> None:
        """Read the model's counters, the journal and the MCP servers of `services` from now on."""
        self.state.services = services

    def turn_ended(self, status: str, seconds: float, first_visible: float | None) -> None:
        """A turn ended with `status` after `seconds`; its answer first showed after `first_visible` (None: it
        never showed)."""
        self.turns.labels(status).inc()
        self.turn_seconds.observe(seconds)
        if first_visible is not None:
            self.first_visible_seconds.observe(first_visible)

    def timer(self) -> "TurnTimer":
        """A clock for a turn starting now."""
        return TurnTimer(self)

    def tools_used(self, result: TurnResult) -> None:
        """Count the tool calls of a finished turn, by tool and outcome."""
        for step in result.steps:
            if step.kind not in (StepKind.TOOL, StepKind.REPEATED):
                continue
            # A name the model made up is no tool: one label for all of them keeps the series few.
            tool = "unknown" if step.error == "unknown_tool" else step.action
            outcome = step.error or ("repeated" if step.kind is StepKind.REPEATED else "ok")
            self.tool_calls.labels(tool, outcome).inc()


class TurnTimer:
    """One turn's clock, started when the turn starts. Whoever runs the turn sets `status` (None: not a turn of
    its own, such as an answer sent again) and calls `end` once the answer is out."""

    def __init__(self, metrics: BotMetrics) -> None:
        self.metrics = metrics
        self.started = time.monotonic()
        self.status: str | None = "failed"  # until told otherwise: our own code failed (the error handler's case)

    def end(self, first_shown: float | None) -> None:
        """Record the turn; `first_shown` is the time.monotonic() its answer first reached the screen."""
        if self.status is not None:
            shown = None if first_shown is None else max(0.0, first_shown - self.started)
            self.metrics.turn_ended(self.status, time.monotonic() - self.started, shown)


class StateCollector(Collector):
    """What is read when Prometheus scrapes: the model's counters, Telegram's calls, the journal, MCP servers."""

    def __init__(self, telegram_calls: CallTally | None) -> None:
        self.telegram_calls = telegram_calls
        self.services: "Services | None" = None

    def collect(self) -> Iterable[Metric]:
        yield from self._telegram()
        services = self.services
        if services is None:  # still starting: the model, the database and MCP are not there yet
            return
        yield from model_metrics(services)
        yield from journal_metrics(services.db.path)
        yield from mcp_metrics(services)

    def _telegram(self) -> Iterable[Metric]:
        requests = CounterMetricFamily("qwenbot_telegram_requests", "Bot API calls, by method and result.",
                                       labels=["method", "result"])
        for (method, result), count in sorted((self.telegram_calls.counts if self.telegram_calls else {}).items()):
            requests.add_metric([method, result], count)
        yield requests


def model_metrics(services: "Services") -> Iterable[Metric]:
    """The model backend's plain counters as metric families (zero where a backend has no such thing)."""
    counters = services.llm.counters.snapshot()
    yield gauge("qwenbot_model_queue_jobs", "Model calls waiting for the model.", counters.queued_jobs)
    yield gauge("qwenbot_model_batch_rows", "Rows in the batch the model is running now.", counters.batch_rows)
    yield counter("qwenbot_model_batches", "Batches the model started.", counters.batches)
    yield counter("qwenbot_model_batched_rows", "Rows of all the batches started.", counters.batch_rows_total)
    yield counter("qwenbot_model_generated_tokens", "Tokens the model generated.", counters.generated_tokens)
    prompt = CounterMetricFamily("qwenbot_model_prompt_tokens", "Prompt tokens, computed or reused from a cached "
                                 "prefix.", labels=["cache"])
    prompt.add_metric(["computed"], counters.prompt_tokens_computed)
    prompt.add_metric(["reused"], counters.prompt_tokens_reused)
    yield prompt
    speculative = CounterMetricFamily("qwenbot_model_speculative_tokens", "Speculative tokens proposed, and "
                                      "accepted by the model.", labels=["outcome"])
    speculative.add_metric(["proposed"], counters.speculative_proposed)
    speculative.add_metric(["accepted"], counters.speculative_accepted)
    yield speculative


def journal_metrics(database: Path) -> Iterable[Metric]:
    """The update journal's backlog, read on a connection of its own (WAL: it waits for no writer)."""
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=1.0)) as conn:
            (backlog,) = conn.execute("SELECT count(*) FROM telegram_updates WHERE handled_at IS NULL").fetchone()
    except sqlite3.Error as error:  # a scrape must not fail with the database; /healthz reports it
        log.debug("cannot read the journal's backlog: %s", error)
        return
    yield gauge("qwenbot_update_journal_backlog", "Updates received and not handled yet.", backlog)


def mcp_metrics(services: "Services") -> Iterable[Metric]:
    """Each MCP server's state (one series per state, 1 for the current one) and its number of tools."""
    state = GaugeMetricFamily("qwenbot_mcp_server_state", "MCP servers: 1 for the state each is in.",
                              labels=["server", "state"])
    tools = GaugeMetricFamily("qwenbot_mcp_server_tools", "Tools each MCP server offers, as last listed.",
                              labels=["server"])
    for connection in services.mcp.servers():
        name = connection.spec.name
        for each in MCP_STATES:
            state.add_metric([name, each], 1.0 if connection.state == each else 0.0)
        tools.add_metric([name], len(services.mcp.listings.get(name, [])))
    yield state
    yield tools


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)
