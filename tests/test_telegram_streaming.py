"""The answer streamed into Telegram while the model writes it: drafts in private chats, one edited message in
groups (and wherever drafts are refused), then the whole answer, formatted and split, as real messages."""

from __future__ import annotations

from tests.fakes.telegram_bot import (ADMIN, ALICE, CAROL, QWEN_FINAL, QWEN_LOOKUP, TEAM, final, private_chat,
                                      running_bot, start_bot, telegram_server)
from tests.fakes.telegram_server import FakeTelegramServer
from tests.test_telegram_limits import LONG_ANSWER
from bot.telegram.replies import utf16_len

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ANSWER = "大模型技术实战课程目前一共上线了200节课，每周更新3次，每次更新2小时。"
# These tests are about how an answer travels, not whether its numbers are grounded (tests/test_telegram_trust.py):
# their scripted answers come from memory, so the check is off.
STREAMING = {"token_seconds": 0.03, "stream_interval_seconds": 0.2, "group_stream_interval_seconds": 0.3,
             "grounded_answers": False}


def growing(texts: list[str], whole: str) -> bool:
    """Each text is a beginning of `whole`, each longer than the one before."""
    return all(whole.startswith(t) for t in texts) and all(len(a) < len(b) for a, b in zip(texts, texts[1:]))


async def test_a_private_answer_streams_as_drafts_then_arrives_as_one_message(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL.replace("大模型技术实战课程目前一共上线了200节课。", ANSWER)],
                          **STREAMING)
    question = telegram_server.send_text(private_chat(ALICE), ALICE, "请帮我查一下大模型技术实战课程")
    await bot.answers(ALICE.id, 1)
    await bot.turns_done()

    drafts = telegram_server.draft_texts(ALICE.id)
    assert len(drafts) >= 2 and growing(drafts, ANSWER)  # the answer grew in the draft...
    assert telegram_server.sent_texts(ALICE.id) == [ANSWER]  # ...and arrived whole, once, as a real message
    draft_calls = telegram_server.calls_to("sendMessageDraft", ok=True)
    assert {call.params["draft_id"] for call in draft_calls} == {question}
    assert draft_calls[-1].at < telegram_server.sent(ALICE.id)[0].at
    assert not telegram_server.calls_to("editMessageText")  # no progress message (it comes after 30 s here)
    assert telegram_server.visible_messages(ALICE.id) == [ANSWER]


async def test_thought_and_action_text_never_reach_the_chat(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL], **STREAMING)
    telegram_server.send_text(private_chat(ALICE), ALICE, "多少节？")
    await bot.answers(ALICE.id, 1)
    await bot.turns_done()

    shown = telegram_server.draft_texts(ALICE.id) + telegram_server.sent_texts(ALICE.id)
    assert shown and not any(word in text for text in shown for word in ("Thought", "Action", "我应该", "我现在知道"))


async def test_a_group_answer_is_one_message_edited_no_faster_than_the_throttle(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, final(ANSWER)], **{**STREAMING, "token_seconds": 0.06})  # writing takes ~1 s
    telegram_server.send_text(TEAM, CAROL, "/ask how many lessons?")
    await bot.answers(TEAM.id, 1)
    await bot.turns_done()

    assert not telegram_server.calls_to("sendMessageDraft")  # no drafts in groups
    sent = telegram_server.sent(TEAM.id)
    edits = [call for call in telegram_server.calls_to("editMessageText", ok=True)
             if call.params["chat_id"] == TEAM.id]
    assert len(sent) == 1 and len(edits) >= 2  # one message, growing by edits
    assert {call.params["message_id"] for call in edits} == {sent[0].result["message_id"]}
    assert growing([sent[0].result["text"]] + [call.params["text"] for call in edits], ANSWER)
    updates = [sent[0].at] + [call.at for call in edits]
    assert min(later - earlier for earlier, later in zip(updates, updates[1:])) >= 0.3 * 0.9  # the group's pace
    assert telegram_server.visible_messages(TEAM.id) == [ANSWER]


async def test_a_group_answer_written_within_the_throttle_is_sent_once_whole_never_edited(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, final(ANSWER)], **{**STREAMING, "group_stream_interval_seconds": 30})
    telegram_server.send_text(TEAM, CAROL, "/ask how many lessons?")
    await bot.answers(TEAM.id, 1)
    await bot.turns_done()

    assert telegram_server.sent_texts(TEAM.id) == [ANSWER]
    assert not telegram_server.calls_to("editMessageText")  # no half answer was shown, so nothing waits to be edited


async def test_a_draft_the_server_refuses_falls_back_to_editing_one_message(start_bot, telegram_server):
    telegram_server.fail("sendMessageDraft", status=400, description="Bad Request: TEXTDRAFT_PEER_INVALID", times=-1)
    bot = await start_bot([QWEN_LOOKUP, final(ANSWER)], **STREAMING)
    telegram_server.send_text(private_chat(ALICE), ALICE, "多少节？")
    await bot.answers(ALICE.id, 1)
    await bot.turns_done()

    assert len(telegram_server.calls_to("sendMessageDraft")) == 1  # refused once; this turn asks no more
    assert len(telegram_server.sent(ALICE.id)) == 1
    assert telegram_server.calls_to("editMessageText", ok=True)
    assert telegram_server.visible_messages(ALICE.id) == [ANSWER]


async def test_a_server_without_drafts_is_not_asked_for_them_again(tmp_path):
    with FakeTelegramServer(drafts=False) as server:
        bot = await running_bot(server, tmp_path, [final(ANSWER), final("第二个回答，也是流式的。")], **STREAMING)
        try:
            server.send_text(private_chat(ALICE), ALICE, "第一个问题")
            await server.wait_for(lambda: server.sent_texts(ALICE.id))
            await bot.turns_done()
            server.send_text(private_chat(ALICE), ALICE, "第二个问题")
            await server.wait_for(lambda: len(server.sent_texts(ALICE.id)) > 1)
            await bot.turns_done()
        finally:
            await bot.stop()

        assert server.statuses("sendMessageDraft") == [404]  # "Not Found" once, then never asked again
        assert server.visible_messages(ALICE.id) == [ANSWER, "第二个回答，也是流式的。"]


async def test_a_10000_character_answer_streamed_in_a_group_ends_as_correctly_split_messages(start_bot,
                                                                                              telegram_server):
    bot = await start_bot([final(LONG_ANSWER)], token_seconds=0.0005,
                          group_stream_interval_seconds=0.2)
    telegram_server.send_text(TEAM, CAROL, "/ask tell me everything")
    await bot.answers(TEAM.id, 1, timeout=30)
    await bot.turns_done(timeout=60)

    visible = telegram_server.visible_messages(TEAM.id)
    assert len(visible) >= 3 and all(utf16_len(text) <= 4096 for text in visible)
    assert "\n\n".join(visible) == LONG_ANSWER  # cut at paragraph boundaries, nothing lost, nothing doubled
    assert telegram_server.calls_to("sendMessage", ok=False) == []
    assert telegram_server.calls_to("editMessageText", ok=False) == []


async def test_a_10000_character_answer_streamed_in_private_ends_as_correctly_split_messages(start_bot,
                                                                                             telegram_server):
    bot = await start_bot([final(LONG_ANSWER)], token_seconds=0.0005, stream_interval_seconds=0.2)
    telegram_server.send_text(private_chat(ALICE), ALICE, "tell me everything")
    await telegram_server.wait_for(lambda: telegram_server.draft_texts(ALICE.id), 30)
    await bot.turns_done(timeout=60)

    visible = telegram_server.visible_messages(ALICE.id)
    assert "\n\n".join(visible) == LONG_ANSWER and all(utf16_len(text) <= 4096 for text in visible)
    assert telegram_server.draft_texts(ALICE.id)  # it streamed
    assert all(utf16_len(text) <= 4096 for text in telegram_server.draft_texts(ALICE.id))


async def test_cancel_mid_stream_in_a_group_leaves_the_streamed_part_marked_as_stopped(start_bot, telegram_server):
    long_answer = "The course has many parts. " * 60
    bot = await start_bot([final(long_answer)], token_seconds=0.05, group_stream_interval_seconds=0.2)
    telegram_server.send_text(TEAM, CAROL, "/ask describe the course")
    await telegram_server.wait_for(lambda: telegram_server.sent(TEAM.id), message="the answer to start streaming")

    assert await bot.ask(TEAM, ADMIN, "/cancel") == "⏹ Stopped. You can ask again."
    await bot.turns_done()

    streamed, confirmation = telegram_server.visible_messages(TEAM.id)
    assert streamed.endswith("…\n\n⏹ The answer stopped here.")
    assert long_answer.startswith(streamed.split("…\n\n")[0]) and len(streamed) < len(long_answer)
    assert confirmation == "⏹ Stopped. You can ask again."
    assert await bot.query("SELECT status FROM turns") == [("cancelled",)]


async def test_cancel_mid_stream_in_private_leaves_only_the_clear_stopped_message(start_bot, telegram_server):
    bot = await start_bot([final("第一部分。" * 100)], token_seconds=0.05, stream_interval_seconds=0.2)
    telegram_server.send_text(private_chat(ALICE), ALICE, "介绍一下课程")
    await telegram_server.wait_for(lambda: telegram_server.draft_texts(ALICE.id), message="the first draft")

    assert await bot.ask(private_chat(ALICE), ALICE, "/cancel") == "⏹ 已停止。你可以重新提问。"
    await bot.turns_done()

    assert telegram_server.visible_messages(ALICE.id) == ["⏹ 已停止。你可以重新提问。"]  # the draft was never a message
    assert await bot.query("SELECT status FROM turns") == [("cancelled",)]


async def test_formatting_telegram_refuses_falls_back_to_plain_text_while_streaming_and_at_the_end(start_bot,
                                                                                                   telegram_server):
    refuse_html = {"status": 400, "description": "Bad Request: can't parse entities: nope", "times": -1,
                   "when": lambda params: params.get("parse_mode") == "HTML"}
    for method in ("sendMessage", "editMessageText"):
        telegram_server.fail(method, **refuse_html)
    answer = "The answer is **200** lessons, and `course_query` found them in the catalogue of courses."
    bot = await start_bot([final(answer)], **STREAMING)
    telegram_server.send_text(TEAM, CAROL, "/ask how many?")
    await bot.answers(TEAM.id, 1)
    await bot.turns_done()

    assert telegram_server.visible_messages(TEAM.id) == [answer]  # plain, asterisks and all, nothing lost


async def test_formatted_answers_stream_formatted(start_bot, telegram_server):
    answer = "The answer is **200** lessons, found by `course_query` in the catalogue."
    bot = await start_bot([final(answer)], **STREAMING)
    telegram_server.send_text(TEAM, CAROL, "/ask how many?")
    await bot.answers(TEAM.id, 1)
    await bot.turns_done()

    assert telegram_server.visible_messages(TEAM.id) == ["The answer is 200 lessons, found by course_query in the "
                                                         "catalogue."]
    last_edit = telegram_server.calls_to("editMessageText", ok=True)[-1]
    assert last_edit.params["parse_mode"] == "HTML" and "<b>200</b>" in last_edit.params["text"]
