"""What the bot says to users, in Chinese or English, chosen from Telegram's `language_code`.

Apologies for failed turns come from agent/apologies.py, their one home. Admin replies stay in English: they are short, technical, and quote command syntax.
"""

from __future__ import annotations

from agent.apologies import APOLOGIES

TEXTS: dict[str, dict[str, str]] = {
    "start": {
        "zh": ("你好，我是团队助手。我会一步步思考，并用工具查资料后回答，例如课程数据库和计算器。\n\n"
               "直接发消息提问即可；在群里请 @我、回复我的消息，或用 /ask 问题。\n"
               "命令：/help 帮助，/reset 忘记本聊天的历史，/cancel 停止正在进行的回答，"
               "/trace 查看上一次回答的步骤，/tools 查看可用工具。"),
        "en": ("Hi, I am the team's assistant. I think step by step and look things up with tools (such as the "
               "course database and a calculator) before I answer.\n\n"
               "Just write your question; in a group, mention me, reply to one of my messages, or use /ask "
               "question.\nCommands: /help, /reset forgets this chat's history, /cancel stops the running answer, "
               "/trace shows the steps of the last answer, /tools lists the tools enabled here."),
    },
    "help": {
        "zh": ("提问：私聊直接发消息；群里用 @我、回复我，或 /ask 问题。\n"
               "/reset 忘记本聊天的历史\n/cancel 停止正在进行的回答\n/trace 上一次回答的步骤\n"
               "/tools 本聊天可用的工具\n/docs 本聊天可搜索的团队文档（管理员可以发送文件来添加）"),
        "en": ("Ask: write to me in private; in a group mention me, reply to me, or use /ask question.\n"
               "/reset forget this chat's history\n/cancel stop the running answer\n"
               "/trace the steps of the last answer\n/tools the tools enabled here\n"
               "/docs the team documents I can search here (admins add them by sending a file)"),
    },
    "not_allowed": {
        "zh": "抱歉，你还没有使用权限。你的用户 ID 是 {user_id}。请把这个 ID 发给管理员，请他发送 /allow {user_id}。",
        "en": ("Sorry, you do not have access yet. Your user id is {user_id}. Send it to an admin and ask them "
               "to send /allow {user_id}."),
    },
    "text_only": {
        "zh": "我只能读文字消息，请用文字提问。",
        "en": "I can only read text messages: please ask in text.",
    },
    "docs_admins_only": {
        "zh": "⛔ 只有管理员可以添加文档。请用文字提问。",
        "en": "⛔ Only admins can add documents. Ask me in text instead.",
    },
    "ask_usage": {
        "zh": "用法：/ask 你的问题",
        "en": "Usage: /ask your question",
    },
    "queued": {
        "zh": "⏳ 你的上一个问题还在处理中，这个问题会在它之后回答。",
        "en": "⏳ Your previous question is still being answered; this one comes next.",
    },
    "too_many_pending": {
        "zh": "⏳ 你已经有 {limit} 个问题在等待回答。在它们回答完之前，新的问题不会被接收，请稍后再问。",
        "en": ("⏳ You already have {limit} questions waiting for an answer. New questions are not taken until "
               "they are answered: please ask again then."),
    },
    "too_long": {
        "zh": "你的问题太长了（{length} 个字符，上限是 {limit} 个）。请缩短后再问。",
        "en": "Your question is too long ({length} characters; the limit is {limit}). Please shorten it and ask again.",
    },
    "thinking": {
        "zh": "⏳ 正在思考…",
        "en": "⏳ Thinking…",
    },
    "cancelled": {
        "zh": "⏹ 已停止。你可以重新提问。",
        "en": "⏹ Stopped. You can ask again.",
    },
    "answer_stopped": {
        "zh": "⏹ 回答在这里停止了。",
        "en": "⏹ The answer stopped here.",
    },
    "nothing_to_cancel": {
        "zh": "现在没有正在进行的回答。",
        "en": "Nothing is running right now.",
    },
    "reset": {
        "zh": "🧹 已忘记本聊天的历史。",
        "en": "🧹 This chat's history is forgotten.",
    },
    "no_trace": {
        "zh": "本聊天还没有回答记录。",
        "en": "No answer in this chat yet.",
    },
    "trace_header": {
        "zh": "上一次回答（{status}，{seconds:.1f} 秒）的步骤：",
        "en": "Steps of the last answer ({status}, {seconds:.1f} s):",
    },
    "trace_no_steps": {
        "zh": "（没有调用工具，直接回答）",
        "en": "(answered directly, no tool used)",
    },
    "tools_header": {
        "zh": "本聊天可用的工具：",
        "en": "Tools enabled here:",
    },
    "no_tools": {
        "zh": "本聊天没有启用任何工具。",
        "en": "No tool is enabled here.",
    },
    "database_gone": {
        "zh": "⚠️ 机器人需要停下来：它的数据库文件不见了。这个问题没有得到回答，恢复后请再问一次。",
        "en": ("⚠️ The bot has to stop: its database file is gone. This question was not answered; please ask again "
               "once the bot is back."),
    },
    "timeout": APOLOGIES["timeout"],
    "model_error": APOLOGIES["error"],
    "busy": APOLOGIES["busy"],
    "apology": APOLOGIES["bug"],
}


def language(code: str | None) -> str:
    """'zh' for any Chinese language code (zh, zh-hans, zh-TW...), else 'en'."""
    return "zh" if (code or "").lower().startswith("zh") else "en"


def text(key: str, lang: str, **values: object) -> str:
    """The message `key` in `lang` (falling back to English), with `values` filled in."""
    variants = TEXTS[key]
    return variants.get(lang, variants["en"]).format(**values)
