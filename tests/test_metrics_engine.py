"""/metrics and /healthz with the local engine on the real offline model (SmolLM2-135M): the engine's own counts
(batches, rows, tokens generated, prompt tokens computed and reused) reach /metrics, and /healthz turns unhealthy
while the model thread is blocked, and healthy again once it goes on.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.llm.base import CancelToken, ModelRequest
from tests.fakes.telegram_bot import ALICE, private_chat, running_bot, telegram_server
from agent.llm.local import LocalLLM
from tests.real_model import GGUF
from tests.test_metrics import free_port, healthz, scrape, value

__all__ = ["telegram_server"]  # the fixture, used by name

pytestmark = pytest.mark.real_model


class StuckCancelToken(CancelToken):
    """A cancel token whose check blocks the model thread until released: a model thread that is alive but stuck,
    as one caught in a hung library call would be. Read anywhere else it answers at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.reached = threading.Event()

    @property
    def cancelled(self) -> bool:
        if threading.current_thread().name == "model":
            self.reached.set()
            self.release.wait(60)
        return False


async def test_the_engine_counts_reach_metrics_and_a_blocked_model_thread_is_unhealthy(telegram_server, tmp_path):
    port = free_port()
    llm = LocalLLM(str(GGUF), device_map="cpu", dtype="float32", prefix_cache_mb=64)  # started by the bot
    bot = await running_bot(telegram_server, tmp_path, llm=llm, start_timeout=300, metrics_port=port, max_steps=1,
                            max_new_tokens=12, health_model_stall_seconds=1, turn_timeout_seconds=120)
    stuck = StuckCancelToken()
    try:
        for question in ("What is 6*7?", "And 7*8?"):  # the second turn's prompt starts as the first's did
            telegram_server.send_text(private_chat(ALICE), ALICE, question)
            await telegram_server.wait_for(lambda: not telegram_server.pending_updates, 30, "the update taken")
            await bot.all_handled(180)  # the journal marks an update handled once its turn has ended
            await bot.turns_done(30)
        families = await asyncio.to_thread(scrape, port)
        status, body = await asyncio.to_thread(healthz, port)
        assert status == 200 and body["checks"]["model"]["detail"].startswith("the model thread is alive ("), body

        call = asyncio.create_task(llm.complete(ModelRequest([{"role": "user", "content": "hi"}],
                                                             max_new_tokens=2, cancel=stuck)))
        assert await asyncio.to_thread(stuck.reached.wait, 60)
        await asyncio.sleep(1.5)  # past HEALTH_MODEL_STALL_SECONDS=1
        blocked_status, blocked = await asyncio.to_thread(healthz, port)
        stuck.release.set()
        await asyncio.wait_for(call, 60)
        after_status, after = await asyncio.to_thread(healthz, port)
    finally:
        stuck.release.set()
        await bot.stop()

    assert sum(v for (name, _), v in families["qwenbot_turns"].items() if name == "qwenbot_turns_total") == 2
    assert value(families, "qwenbot_model_batches", "qwenbot_model_batches_total") >= 2
    assert value(families, "qwenbot_model_batched_rows", "qwenbot_model_batched_rows_total") >= 2
    assert value(families, "qwenbot_model_generated_tokens", "qwenbot_model_generated_tokens_total") > 0
    assert value(families, "qwenbot_model_prompt_tokens", "qwenbot_model_prompt_tokens_total", cache="computed") > 0
    assert value(families, "qwenbot_model_prompt_tokens", "qwenbot_model_prompt_tokens_total", cache="reused") > 0
    proposed = value(families, "qwenbot_model_speculative_tokens", "qwenbot_model_speculative_tokens_total",
                     outcome="proposed")
    accepted = value(families, "qwenbot_model_speculative_tokens", "qwenbot_model_speculative_tokens_total",
                     outcome="accepted")
    assert 0 <= accepted <= proposed
    assert value(families, "qwenbot_model_queue_jobs") == 0  # (the last batch may still be storing its KV)

    assert blocked_status == 503
    model = blocked["checks"]["model"]
    assert not model["ok"] and model["detail"].startswith("the model thread has work but made no step for ")
    assert model["detail"].endswith("s (HEALTH_MODEL_STALL_SECONDS=1)")
    assert all(check["ok"] for name, check in blocked["checks"].items() if name != "model")
    assert after_status == 200, after
