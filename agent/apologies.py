"""The honest short answers for turns that could not finish: one home for every apology a user may read.

The agent uses them in the question's language; the Telegram bot (bot/telegram/i18n.py) in the sender's.
"""

from __future__ import annotations

import re

APOLOGIES: dict[str, dict[str, str]] = {
    "steps": {
        "zh": "抱歉，我在允许的步骤内没能得出答案。请换个说法或把问题拆小一点再问。",
        "en": "Sorry, I could not reach an answer within my step limit. Try rephrasing or splitting the question.",
    },
    "format": {  # the model's raw text is never the answer: /trace shows it, and why it was not used
        "zh": "抱歉，我这次没能整理出答案（发送 /trace 可查看原因）。请换个说法再问一次。",
        "en": "Sorry, I could not put an answer together this time (send /trace to see why). "
              "Please ask again, perhaps in other words.",
    },
    "error": {
        "zh": "抱歉，模型暂时无法回答，请稍后再试。",
        "en": "Sorry, the model cannot answer right now. Please try again in a moment.",
    },
    "timeout": {
        "zh": "抱歉，这次回答用时太长，已经停止。请换个问法再试一次。",
        "en": "Sorry, this answer took too long and was stopped. Please try again, perhaps phrased differently.",
    },
    "busy": {
        "zh": "抱歉，数据库正忙，这次的回答没能保存。请稍后再问一次。",
        "en": "Sorry, the database is busy and this answer could not be saved. Please ask again in a moment.",
    },
    "bug": {
        "zh": "抱歉，出了点问题，请稍后再试。",
        "en": "Sorry, something went wrong. Please try again in a moment.",
    },
    # The honest answer when the model's answer could not be confirmed (agent/review.py): numbers nothing it
    # looked up holds, or text that was no answer. Unlike the others it is an answer: "I don't know" is true.
    "unconfirmed": {
        "zh": "抱歉，我没有找到能证实这个答案的依据，所以无法确认。",
        "en": "Sorry, I could not confirm that: nothing I looked up supports an answer.",
    },
}
# Apologies that are a truthful answer rather than a turn that did not finish.
HONEST_UNKNOWN = ("unconfirmed",)

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_LATIN = re.compile(r"[A-Za-z]")
CJK_WEIGHT = 3  # Latin letters one CJK character weighs, when a text mixes both


def language_of(text: str) -> str:
    """'zh' when the text is written in Chinese (or another CJK script), else 'en': apologies follow it. An English
    sentence naming a Chinese course ("How many lessons does 大模型技术实战 have?") is English: a CJK character
    carries about as much as three Latin letters, so the script with more weight wins."""
    cjk = len(_CJK.findall(text))
    latin = len(_LATIN.findall(text))
    return "zh" if cjk and cjk * CJK_WEIGHT >= latin else "en"


def apology(reason: str, lang: str) -> str:
    """The apology for `reason` (a key of APOLOGIES: steps, format, error, timeout, busy, bug, unconfirmed) in
    `lang`."""
    variants = APOLOGIES[reason]
    return variants.get(lang, variants["en"])


def is_apology(text: str) -> bool:
    """Whether `text` is one of these apologies, in any language: a turn that did not answer (the honest
    "could not confirm" answer is not one)."""
    return any(text == variant for reason, variants in APOLOGIES.items() if reason not in HONEST_UNKNOWN
               for variant in variants.values())


def is_honest_unknown(text: str) -> bool:
    """Whether `text` is the honest "could not confirm" answer, in any language."""
    return any(text == variant for reason in HONEST_UNKNOWN for variant in APOLOGIES[reason].values())
