"""What the bot says to people, in Chinese or English: one catalog of texts, extended by every module that speaks.

    TEXTS = {"quota_left": {"zh": "今天还剩 {left} 个问题。", "en": "{left} questions left today."}}
    add_texts(TEXTS)                                  # once, at import, in the module that says them
    text("quota_left", "zh", left=3)                  # → "今天还剩 3 个问题。"

Each module keeps its own texts beside its code (the user replies in bot/telegram/i18n.py, the admin replies in
bot/telegram/admin_texts.py, /stats in bot/telegram/stats.py, the MCP reports in bot/program/mcp_reports.py) and
adds them here; a new module (document reports, say) does the same with keys of its own. A key defined twice, a
text without its English variant, or variants whose `{placeholders}` differ is a mistake, refused at import.
The language is the sender's Telegram language (`language`); the terminal speaks English.
"""

from __future__ import annotations

import string
from typing import Mapping

LANGUAGES = ("zh", "en")
_CATALOG: dict[str, dict[str, str]] = {}


def add_texts(texts: Mapping[str, Mapping[str, str]]) -> None:
    """Add `texts` (key → language → text) to the catalog; refuses a key already there with other texts."""
    for key, variants in texts.items():
        if "en" not in variants or not set(variants) <= set(LANGUAGES):
            raise ValueError(f"text {key!r} needs an English variant and only the languages {LANGUAGES}")
        if len({frozenset(placeholders(variant)) for variant in variants.values()}) > 1:
            raise ValueError(f"the variants of text {key!r} do not have the same placeholders")
        if key in _CATALOG and _CATALOG[key] != dict(variants):
            raise ValueError(f"text {key!r} is defined twice")
        _CATALOG[key] = dict(variants)


def text(key: str, lang: str, **values: object) -> str:
    """The text `key` in `lang` (falling back to English), with `values` filled in."""
    variants = _CATALOG[key]
    return variants.get(lang, variants["en"]).format(**values)


def language(code: str | None) -> str:
    """'zh' for any Chinese language code (zh, zh-hans, zh-TW...), else 'en'."""
    return "zh" if (code or "").lower().startswith("zh") else "en"


def placeholders(template: str) -> set[str]:
    """The names of a text's `{placeholders}`."""
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}


def catalog() -> dict[str, dict[str, str]]:
    """Every text added so far (a copy), for checks."""
    return {key: dict(variants) for key, variants in _CATALOG.items()}
