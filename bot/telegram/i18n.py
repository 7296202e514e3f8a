"""What the bot says to users, in Chinese or English, chosen from Telegram's `language_code`.

The texts join the one catalog of bot/program/texts.py (`text(key, lang)`), where admin replies, /stats and the
MCP reports add theirs. Apologies for failed turns come from agent/apologies.py, their one home.
"""

from __future__ import annotations

from agent.apologies import APOLOGIES
from bot.program.texts import add_texts, language, text

__all__ = ["TEXTS", "language", "text"]

TEXTS: dict[str, dict[str, str]] = {
    "start": {
        "zh": ("你好，我是团队助手。我会一步步思考，并用工具查资料后回答，例如课程数据库和计算器。\n\n"
               "直接发消息提问即可，也可以发语音，或发图片并附上问题；在群里请 @我、回复我的消息，或用 /ask 问题。\n"
               "命令：/help 帮助，/reset 忘记本聊天的历史，/cancel 停止正在进行的回答，"
               "/trace 查看上一次回答的步骤，/tools 查看可用工具。"),
        "en": ("Hi, I am the team's assistant. I think step by step and look things up with tools (such as the "
               "course database and a calculator) before I answer.\n\n"
               "Just write your question, say it in a voice message, or send a picture with your question as its "
               "caption; in a group, mention me, reply to one of my messages, or use /ask question.\nCommands: /help, /reset forgets this chat's history, /cancel stops the running answer, "
               "/trace shows the steps of the last answer, /tools lists the tools enabled here."),
    },
    "help": {
        "zh": ("提问：私聊直接发消息；群里用 @我、回复我，或 /ask 问题。\n"
               "🎤 语音提问：直接发语音（群里请回复我的消息）。🖼 关于图片的问题：发图片并附上问题，或回复图片提问。\n"
               "/reset 忘记本聊天的历史\n/cancel 停止正在进行的回答\n/trace 上一次回答的步骤\n"
               "/tools 本聊天可用的工具\n/docs 本聊天可搜索的团队文档（管理员可以发送文件来添加）\n"
               "/memory 我对较早对话的摘要\n/quota 你今天还剩的额度\n/export 把本聊天的记录导出为文件"),
        "en": ("Ask: write to me in private; in a group mention me, reply to me, or use /ask question.\n"
               "🎤 Ask by voice: send a voice message (in a group, as a reply to me). 🖼 Ask about a picture: send it "
               "with your question as its caption, or reply to it with your question.\n"
               "/reset forget this chat's history\n/cancel stop the running answer\n"
               "/trace the steps of the last answer\n/tools the tools enabled here\n"
               "/docs the team documents I can search here (admins add them by sending a file)\n"
               "/memory what I keep of older turns\n/quota your share left today\n"
               "/export this chat's history as a file"),
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
    "transcript": {
        "zh": "🎤 {text}",
        "en": "🎤 {text}",
    },
    "voice_too_long": {
        "zh": "你的语音太长了（上限是 {limit} 秒）。请说短一些，或者用文字提问。",
        "en": "Your recording is too long (the limit is {limit} seconds). Please keep it shorter, or type your "
              "question.",
    },
    "voice_too_big": {
        "zh": "你的录音文件太大了（{size:.1f} MB，上限是 {limit:g} MB）。请说短一些，或者用文字提问。",
        "en": "Your recording is too large ({size:.1f} MB; the limit is {limit:g} MB). Please keep it shorter, or "
              "type your question.",
    },
    "voice_unheard": {
        "zh": "🎤 我没有听清你的语音里说了什么。请再说一遍，或者用文字提问。",
        "en": "🎤 I could not make out any words in your recording. Please try again, or type your question.",
    },
    "voice_failed": {
        "zh": "抱歉，现在无法识别语音。请用文字提问。",
        "en": "Sorry, I cannot transcribe recordings right now. Please type your question.",
    },
    "voice_timeout": {
        "zh": "抱歉，语音识别超时了。请稍后再试，或者用文字提问。",
        "en": "Sorry, transcribing your recording took too long. Please try again later, or type your question.",
    },
    "not_audio": {
        "zh": "我读不出这段录音。请重新发送，或者用文字提问。",
        "en": "I cannot read that recording. Please send it again, or type your question.",
    },
    "download_failed": {
        "zh": "我没能从 Telegram 取到你发的文件。请重新发送。",
        "en": "I could not fetch your file from Telegram. Please send it again.",
    },
    "text_only_model": {
        "zh": "这个模型只能读文字，看不到图片。请用文字描述图片内容后再问。",
        "en": "This model reads text only: it cannot see pictures. Please describe the picture in words and ask again.",
    },
    "picture_needs_question": {
        "zh": "想问这张图片什么？请回复这张图片提出问题，或者重新发送并在说明里写上问题。",
        "en": "What would you like to know about this picture? Reply to it with your question, or send it again "
              "with the question as its caption.",
    },
    "picture_too_big": {
        "zh": "这张图片太大了（{size:.1f} MB，上限是 {limit:g} MB）。请压缩后再发。",
        "en": "This picture is too large ({size:.1f} MB; the limit is {limit:g} MB). Please send a smaller one.",
    },
    "not_a_picture": {
        "zh": "我读不出这张图片。请以照片形式重新发送。",
        "en": "I cannot read this picture. Please send it again as a photo.",
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
    "memory_none": {
        "zh": "🧠 本聊天还没有摘要：它的历史都还完整地放得下。",
        "en": "🧠 No summary in this chat yet: its whole history still fits as it is.",
    },
    "memory_summary": {
        "zh": "🧠 我对本聊天前 {count} 轮的摘要（{updated} UTC 更新）：\n{summary}\n\n之后的 {recent} 轮完整保留。/reset 会把它和历史一起忘掉。",
        "en": ("🧠 What I keep of this chat's first {count} turn(s) (updated {updated} UTC):\n{summary}\n\n"
               "The {recent} turn(s) after it are kept whole. /reset forgets it with the history."),
    },
    "quota_refused_turns": {
        "zh": "⛔ 你今天的 {limit} 个问题额度已经用完。额度在 UTC {reset} 重置（{wait}后），到时再来问吧。",
        "en": "⛔ You have used today's {limit} questions. The limit resets at {reset} UTC (in {wait}): ask again then.",
    },
    "quota_refused_tokens": {
        "zh": "⛔ 你今天的 {limit} 个 token 额度已经用完。额度在 UTC {reset} 重置（{wait}后），到时再来问吧。",
        "en": ("⛔ You have used today's {limit} tokens of answers. The limit resets at {reset} UTC (in {wait}): ask "
               "again then."),
    },
    "quota_header": {
        "zh": "📊 你今天的额度（按 UTC 日计，UTC {reset} 重置，还有 {wait}）：",
        "en": "📊 Your share today (a UTC day; it resets at {reset} UTC, in {wait}):",
    },
    "quota_turns": {"zh": "问题：已用 {used} / {limit}，还剩 {left}", "en": "Questions: {used} of {limit} used, {left} left"},
    "quota_turns_unlimited": {"zh": "问题：今天已问 {used} 个，不限", "en": "Questions: {used} asked today, no limit"},
    "quota_tokens": {"zh": "Token：已用 {used} / {limit}，还剩 {left}", "en": "Tokens: {used} of {limit} used, {left} left"},
    "quota_tokens_unlimited": {"zh": "Token：今天已用 {used}，不限", "en": "Tokens: {used} used today, no limit"},
    "quota_admin": {"zh": "（你是管理员：额度不限制你。）", "en": "(You are an admin: no limit applies to you.)"},
    "duration": {"zh": "{hours} 小时 {minutes} 分钟", "en": "{hours} h {minutes} min"},
    "export_caption": {
        "zh": "📄 本聊天的记录：{turns} 轮问答。",
        "en": "📄 This chat's history: {turns} turn(s).",
    },
    "export_caption_cut": {
        "zh": "📄 本聊天的记录：最近的 {turns} 轮问答（更早的 {left_out} 轮超出了文件大小上限）。",
        "en": "📄 This chat's history: its newest {turns} turn(s) (the {left_out} before them did not fit the size limit).",
    },
    "export_nothing": {
        "zh": "本聊天还没有可以导出的记录。",
        "en": "Nothing to export: this chat's history is empty.",
    },
    "help_persona": {
        "zh": "本聊天的角色设定：{persona}",
        "en": "This chat's persona: {persona}",
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


add_texts(TEXTS)
