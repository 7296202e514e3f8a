"""What admin commands reply, in Chinese or English (the admin's Telegram language): the texts of admin.py,
admin_mcp.py and admin_chats.py, added to the one catalog (bot/program/texts.py).

Command syntax (names, `global`, `destructive`, field names) stays as typed, in every language. Details that come
from lower layers (a course's or an id's validation error) are quoted as they are.
"""

from __future__ import annotations

from bot.program.texts import add_texts, text

ADMIN_TEXTS = {
    "admins_only": {"zh": "⛔ 这个命令只有管理员可以用。", "en": "⛔ This command is for admins only."},
    "usage": {"zh": "用法：{usage}", "en": "Usage: {usage}"},
    "error_usage": {"zh": "❌ {error}\n用法：{usage}", "en": "❌ {error}\nUsage: {usage}"},
    "error": {"zh": "❌ {error}", "en": "❌ {error}"},
    # --- usage lines -----------------------------------------------------------------------------------------
    "usage_tool_on": {
        "zh": "/tool_on 名称 [global] [destructive]：在本聊天（加 global 则所有聊天）启用一个工具；可能修改数据的工具"
              "还需要加上 destructive",
        "en": "/tool_on NAME [global] [destructive]: enable a tool in this chat (or everywhere); a tool that may "
              "change data needs the word destructive"},
    "usage_tool_off": {"zh": "/tool_off 名称 [global]：在本聊天（加 global 则所有聊天）停用一个工具",
                       "en": "/tool_off NAME [global]: disable a tool in this chat (or everywhere)"},
    "usage_course_add": {"zh": "/course_add 名称 课时 每周更新次数 每次小时数（例如 /course_add 强化学习实战 120 2 1.5）",
                         "en": "/course_add NAME LESSONS PER_WEEK HOURS (e.g. /course_add 强化学习实战 120 2 1.5)"},
    "usage_course_set": {"zh": "/course_set 名称 字段 值，字段为 {fields} 之一（例如 /course_set 大模型技术实战 lessons 210）",
                         "en": "/course_set NAME FIELD VALUE, FIELD one of {fields} (e.g. /course_set 大模型技术实战 "
                               "lessons 210)"},
    "usage_course_del": {"zh": "/course_del 名称", "en": "/course_del NAME"},
    "usage_allow": {"zh": "/allow ID：用户 ID，或群组 ID（负数，例如 -1001234567890）",
                    "en": "/allow ID: a user id, or a group id (negative, e.g. -1001234567890)"},
    "usage_deny": {"zh": "/deny ID：用户 ID，或群组 ID（负数）", "en": "/deny ID: a user id, or a group id (negative)"},
    "usage_stats": {"zh": "/stats [天数]（默认 {days}）", "en": "/stats [DAYS] (default {days})"},
    "usage_require_tool": {
        "zh": "/require_tool on|off|default [global]：在本聊天（加 global 则所有聊天），问到工具所管的内容（例如课程）时，"
              "是否必须先调用工具再回答",
        "en": "/require_tool on|off|default [global]: whether a question that names a tool's subject (a course) "
              "must get a tool call before the answer, in this chat (or everywhere)"},
    "usage_persona": {
        "zh": "/persona 文本：设置本聊天的角色设定（加在系统提示里，不改变回答格式和工具规则）；/persona reset 恢复默认；"
              "只发 /persona 查看当前设定",
        "en": "/persona TEXT: set this chat's persona (added to the system prompt; the answer format and the tool "
              "rules stay); /persona reset goes back to the default; /persona alone shows it"},
    "usage_quota_set": {
        "zh": "/quota_set 用户ID turns|tokens 数量|default：设置一个用户每天的问题数或 token 数（0 = 不限；default "
              "恢复为全局设置）",
        "en": "/quota_set USER turns|tokens N|default: a user's own daily limit of questions or tokens (0 = "
              "unlimited; default goes back to the setting)"},
    "usage_mcp_add": {
        "zh": '/mcp_add 名称 URL [Header=value …]，例如 /mcp_add wiki http://127.0.0.1:8000/mcp '
              '"Authorization=Bearer TOKEN"（含空格的值要加引号；以 /sse 结尾的 URL 是 SSE 服务器）',
        "en": '/mcp_add NAME URL [Header=value …], e.g. /mcp_add wiki http://127.0.0.1:8000/mcp '
              '"Authorization=Bearer TOKEN" (quote a value with spaces; a URL ending in /sse is an SSE server)'},
    "usage_mcp_del": {"zh": "/mcp_del 名称", "en": "/mcp_del NAME"},
    "usage_doc_add": {
        "zh": "/doc_add [global]：作为文件的说明，或回复一条带文件的消息：把它加入本聊天（加 global 则所有聊天）可搜索的文档",
        "en": "/doc_add [global] as the caption of a file, or in reply to a message with a file: add it to the "
              "documents searchable here (or in every chat)"},
    "usage_doc_del": {"zh": "/doc_del ID（/docs 显示的编号）", "en": "/doc_del ID (the number /docs shows)"},
    "usage_doc_scope": {"zh": "/doc_scope ID global|here：这个文档可以在哪里被搜索",
                        "en": "/doc_scope ID global|here: where the document may be searched"},
    "usage_mcp_refresh": {"zh": "/mcp_refresh 名称", "en": "/mcp_refresh NAME"},
    # --- tools -----------------------------------------------------------------------------------------------
    "no_such_tool": {"zh": "❌ 没有叫 {name} 的工具。现有工具：{known}", "en": "❌ No tool named {name}. Tools: {known}"},
    "tool_on_here": {"zh": "✅ 已在本聊天启用 {name}。", "en": "✅ {name} is on in this chat."},
    "tool_off_here": {"zh": "✅ 已在本聊天停用 {name}。", "en": "✅ {name} is off in this chat."},
    "tool_on_global": {"zh": "✅ 已在所有聊天启用 {name}（自己另有设置的聊天除外）。",
                       "en": "✅ {name} is on everywhere (unless a chat sets its own)."},
    "tool_off_global": {"zh": "✅ 已在所有聊天停用 {name}（自己另有设置的聊天除外）。",
                        "en": "✅ {name} is off everywhere (unless a chat sets its own)."},
    "tool_hint_destructive": {"zh": "服务器标明它具有破坏性", "en": "the server marks it destructive"},
    "tool_hint_not_read_only": {"zh": "服务器没有标明它只读", "en": "the server does not mark it read-only"},
    "tool_needs_confirmation": {
        "zh": "⚠️ {name} 保持停用：它可能修改或删除数据（{source}：{hint}）。启用后模型会在问题似乎需要时自行调用它，每次调用"
              "都会记入审计日志。仍要启用，请发送：{command}",
        "en": "⚠️ {name} stays off: it may change or delete data ({source}: {hint}). The model would call it on its "
              "own, whenever a question seems to ask for it, and every call is audited. To enable it anyway: "
              "{command}"},
    "tools_all_header": {"zh": "本聊天的工具（状态、来源）：", "en": "Tools in this chat (state source):"},
    "require_tool_on": {"zh": "✅ 在这里，问到工具所管内容的问题必须先调用工具再回答（{source} 设置）。",
                        "en": "✅ Here, questions about a tool's subject must call a tool before answering "
                              "({source} setting)."},
    "require_tool_off": {"zh": "✅ 在这里，问到工具所管内容的问题可以不调用工具直接回答（{source} 设置）。",
                         "en": "✅ Here, questions about a tool's subject may answer without a tool ({source} "
                               "setting)."},
    # --- courses ---------------------------------------------------------------------------------------------
    "course_line": {"zh": "• {name}：课时 {lessons}，每周更新 {per_week} 次，每次 {hours} 小时",
                    "en": "• {name}: lessons {lessons}, updates_per_week {per_week}, hours_per_update {hours}"},
    "no_courses": {"zh": "还没有课程。", "en": "No courses yet."},
    "course_added": {"zh": "✅ 已添加 {name}。", "en": "✅ Added {name}."},
    "course_changed": {"zh": "✅ {name}：{field} = {value}。", "en": "✅ {name}: {field} = {value}."},
    "course_removed": {"zh": "✅ 已删除 {name}。", "en": "✅ Removed {name}."},
    # --- access ----------------------------------------------------------------------------------------------
    "kind_user": {"zh": "用户", "en": "user"},
    "kind_chat": {"zh": "群组", "en": "chat"},
    "access_allowed": {"zh": "✅ 已允许{kind} {subject}{note}。", "en": "✅ {kind} {subject} is allowed{note}."},
    "access_denied": {"zh": "✅ 已拒绝{kind} {subject}{note}。", "en": "✅ {kind} {subject} is denied{note}."},
    "access_admin_note": {"zh": "（这是管理员：管理员总是可以使用）", "en": " (an admin: admins always have access)"},
    "admins_admins": {"zh": "管理员（ADMIN_USER_IDS）：{ids}", "en": "Admins (ADMIN_USER_IDS): {ids}"},
    "admins_users": {"zh": "用户（ALLOWED_USER_IDS）：{ids}", "en": "Users (ALLOWED_USER_IDS): {ids}"},
    "admins_chats": {"zh": "群组（ALLOWED_CHAT_IDS）：{ids}", "en": "Chats (ALLOWED_CHAT_IDS): {ids}"},
    "admins_changed": {"zh": "运行中的改动：", "en": "Changed at run time:"},
    "admins_entry_allowed": {"zh": "• {kind} {subject}：由 {by} 于 {at} 允许",
                             "en": "• {kind} {subject}: allowed by {by} at {at}"},
    "admins_entry_denied": {"zh": "• {kind} {subject}：由 {by} 于 {at} 拒绝",
                            "en": "• {kind} {subject}: denied by {by} at {at}"},
    "none": {"zh": "无", "en": "none"},
    # --- personas and quotas (admin_chats.py) ----------------------------------------------------------------
    "persona_set": {"zh": "✅ 本聊天的角色设定已更新：\n{persona}", "en": "✅ This chat's persona is now:\n{persona}"},
    "persona_reset": {"zh": "✅ 本聊天的角色设定已恢复默认{default}。", "en": "✅ This chat's persona is back to the default{default}."},
    "persona_default_is": {"zh": "（{persona}）", "en": " ({persona})"},
    "persona_current": {"zh": "本聊天的角色设定（{source}）：\n{persona}", "en": "This chat's persona ({source}):\n{persona}"},
    "persona_none": {"zh": "本聊天没有角色设定。", "en": "This chat has no persona."},
    "persona_too_long": {"zh": "❌ 角色设定太长（{length} 个字符，上限是 {limit}）。",
                         "en": "❌ The persona is too long ({length} characters; the limit is {limit})."},
    "quota_set_done": {"zh": "✅ 用户 {user} 每天的{kind}上限：{limit}。", "en": "✅ User {user}'s daily {kind} limit: {limit}."},
    "quota_set_default": {"zh": "✅ 用户 {user} 每天的{kind}上限恢复为全局设置（{limit}）。",
                          "en": "✅ User {user}'s daily {kind} limit is back to the setting ({limit})."},
    "quota_kind_turns": {"zh": "问题数", "en": "questions"},
    "quota_kind_tokens": {"zh": "token 数", "en": "tokens"},
    "unlimited": {"zh": "不限", "en": "unlimited"},
    # --- MCP (admin_mcp.py) ----------------------------------------------------------------------------------
    "mcp_not_added": {"zh": "❌ 没能添加 {name}：{error}。什么都没有保存。",
                      "en": "❌ Could not add {name}: {error}. Nothing was saved."},
    "mcp_see_list": {"zh": "❌ {error}。见 /mcp_list。", "en": "❌ {error}. See /mcp_list."},
    "mcp_no_server": {"zh": "❌ 没有叫 {name} 的 MCP 服务器。见 /mcp_list。",
                      "en": "❌ No MCP server named {name}. See /mcp_list."},
    "mcp_removed": {"zh": "✅ 已删除 {name}。", "en": "✅ Removed {name}."},
    "mcp_removed_tools": {"zh": "✅ 已删除 {name} 和它的工具（{tools}），这些工具的设置也一并删除。",
                          "en": "✅ Removed {name} and its tools ({tools}); their settings are forgotten."},
    "mcp_refresh_failed": {"zh": "❌ {error}。它已知的 {known} 个工具仍然列出；在它恢复之前，调用这些工具会失败。",
                           "en": "❌ {error}. Its {known} known tool(s) stay listed; calls to them fail until it is "
                                 "back."},
}
add_texts(ADMIN_TEXTS)


def usage_text(command: str, lang: str, **values: object) -> str:
    """'Usage: …' for `command`, in `lang`."""
    return text("usage", lang, usage=text(f"usage_{command}", lang, **values))
