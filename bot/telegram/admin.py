"""Admin commands: tools, courses, access and usage figures. Refused for everyone else; every change audited.

The model never changes data: these commands are the only way in. Each parses its arguments, and wrong or
missing ones get the usage line (never a traceback).
"""

from __future__ import annotations

from telegram import Update

from agent.options import REQUIRE_TOOL_CALL
from bot.program.audit import audit
from bot.program.ids import IdError, parse_id, refuse_service_account
from bot.telegram.chat import may_talk, refuse, reply, session_for
from bot.telegram.context import BotContext
from bot.telegram.stats import DEFAULT_DAYS, MAX_DAYS, usage_report
from tools.courses import FIELDS, FIELD_LABELS
from tools.errors import ConfirmationNeeded, CourseError, UnknownTool
from tools.registry import BUILT_IN, Tool
from tools.settings import GLOBAL

CONFIRM = "destructive"  # the word that enables a tool which may change data

USAGE = {
    "tool_on": ("/tool_on NAME [global] [destructive]: enable a tool in this chat (or everywhere); a tool that may "
                "change data needs the word destructive"),
    "tool_off": "/tool_off NAME [global]: disable a tool in this chat (or everywhere)",
    "course_add": "/course_add NAME LESSONS PER_WEEK HOURS (e.g. /course_add 强化学习实战 120 2 1.5)",
    "course_set": f"/course_set NAME FIELD VALUE, FIELD one of {', '.join(FIELDS)} (e.g. /course_set 大模型技术实战 lessons 210)",
    "course_del": "/course_del NAME",
    "allow": "/allow ID: a user id, or a group id (negative, e.g. -1001234567890)",
    "deny": "/deny ID: a user id, or a group id (negative)",
    "stats": f"/stats [DAYS] (default {DEFAULT_DAYS})",
    "require_tool": ("/require_tool on|off|default [global]: whether a question that names a tool's subject (a "
                     "course) must get a tool call before the answer, in this chat (or everywhere)"),
}
POLICY_VALUES = {"on": True, "off": False, "default": None}
ADMINS_ONLY = "⛔ This command is for admins only."
# Other names admins may use for a course field: the article's Chinese labels and short forms.
FIELD_ALIASES = {**{label: name for name, label in FIELD_LABELS.items()}, "per_week": "updates_per_week",
                 "hours": "hours_per_update", "updates": "updates_per_week"}


async def admin_only(update: Update, context: BotContext) -> bool:
    """Whether the sender is an admin; refuses everyone else.

    Access is checked before the admin list: "admins only" is said only where the bot may talk (to a sender with
    access, or in an allowed group). A chat nobody allowed hears nothing of the admin commands, not even that they
    exist: a stranger gets the refusal any message of theirs gets (once per interval, with their id: see
    bot/telegram/chat.py's `refuse`), and a message with no sender (a channel, a forged update) gets nothing.
    """
    user, message = update.effective_user, update.effective_message
    if user is not None and context.access.is_admin(user.id):
        return True
    if await may_talk(update, context) or await context.access.chat_allowed(message.chat_id, message.chat.type):
        await reply(message, ADMINS_ONLY)
    else:
        await refuse(update, context)
    return False


def arguments(update: Update) -> list[str]:
    """The words after the command."""
    return (update.effective_message.text or "").split()[1:]


async def usage(update: Update, command: str) -> None:
    """Reply with the command's usage line."""
    await reply(update.effective_message, "Usage: " + USAGE[command])


async def record(update: Update, context: BotContext, action: str, detail: str) -> None:
    """Write the change to the audit log."""
    await audit(context.services.db, update.effective_user.id, update.effective_chat.id, action, detail)


# --- tools -----------------------------------------------------------------------------------------------------

async def tool_on(update: Update, context: BotContext) -> None:
    """/tool_on NAME [global]: enable a tool here or everywhere."""
    await switch_tool(update, context, "tool_on", True)


async def tool_off(update: Update, context: BotContext) -> None:
    """/tool_off NAME [global]: disable a tool here or everywhere."""
    await switch_tool(update, context, "tool_off", False)


async def switch_tool(update: Update, context: BotContext, command: str, enabled: bool) -> None:
    """Enable or disable a tool in this chat, or globally with the word `global`; a tool that may change data is
    enabled only with the word `destructive` too."""
    if not await admin_only(update, context):
        return
    args = arguments(update)
    flags = [word.lower() for word in args[1:]]
    if not args or len(set(flags)) != len(flags) or not set(flags) <= ({GLOBAL, CONFIRM} if enabled else {GLOBAL}):
        return await usage(update, command)
    name, scope = args[0], GLOBAL if GLOBAL in flags else session_for(update.effective_message).chat_key
    try:
        await context.services.tool_settings.set_enabled(name, enabled, scope, confirmed=CONFIRM in flags)
    except UnknownTool:
        known = ", ".join(context.services.registry.names)
        return await reply(update.effective_message, f"❌ No tool named {name!r}. Tools: {known}")
    except ConfirmationNeeded as refusal:
        return await reply(update.effective_message, confirmation_text(refusal.tool, scope == GLOBAL))
    await record(update, context, command, f"{name} scope={scope}" + (f" {CONFIRM}" if CONFIRM in flags else ""))
    where = "everywhere (unless a chat sets its own)" if scope == GLOBAL else "in this chat"
    await reply(update.effective_message, f"✅ {name} is {'on' if enabled else 'off'} {where}.")


def confirmation_text(tool: Tool, everywhere: bool) -> str:
    """Why a tool that may change data stays off, and the command that enables it anyway."""
    hint = "marks it destructive" if tool.destructive else "does not mark it read-only"
    command = f"/tool_on {tool.name}{' global' if everywhere else ''} {CONFIRM}"
    return (f"⚠️ {tool.name} stays off: it may change or delete data ({tool.source}: the server {hint}). The model "
            f"would call it on its own, whenever a question seems to ask for it, and every call is audited. "
            f"To enable it anyway: {command}")


async def tools_all(update: Update, context: BotContext) -> None:
    """/tools all: every registered tool, its state here and where that state comes from."""
    if not await admin_only(update, context):
        return
    chat_key = session_for(update.effective_message).chat_key
    states = await context.services.tool_settings.states(chat_key)
    lines = [f"{'✅' if s.enabled else '⛔'} {s.tool.name} — {s.tool.human_name} ({s.source}){_origin(s.tool)}"
             for s in states]
    await reply(update.effective_message, "\n".join(["Tools in this chat (state source):", *lines]))


def _origin(tool: Tool) -> str:
    """Where a tool comes from and what it may do to data, for tools that are not built in."""
    return "" if tool.source == BUILT_IN else f" · {tool.source}, {tool.access}"


async def require_tool(update: Update, context: BotContext) -> None:
    """/require_tool on|off|default [global]: the first-step policy in this chat, or everywhere."""
    if not await admin_only(update, context):
        return
    args = [arg.lower() for arg in arguments(update)]
    if len(args) not in (1, 2) or args[0] not in POLICY_VALUES or (len(args) == 2 and args[1] != GLOBAL):
        return await usage(update, "require_tool")
    chat_key = session_for(update.effective_message).chat_key
    scope = GLOBAL if len(args) == 2 else chat_key
    await context.services.options.set(REQUIRE_TOOL_CALL, POLICY_VALUES[args[0]], scope)
    await record(update, context, "require_tool", f"{args[0]} scope={scope}")
    required = await context.services.options.require_tool_call(chat_key, context.settings.agent.require_tool_call)
    source = await context.services.options.source(chat_key, REQUIRE_TOOL_CALL)
    state = "must call a tool before answering" if required else "may answer without a tool"
    await reply(update.effective_message, f"✅ Here, questions about a tool's subject {state} ({source} setting).")


# --- courses ---------------------------------------------------------------------------------------------------

async def courses(update: Update, context: BotContext) -> None:
    """/courses: every course with its numbers."""
    if not await admin_only(update, context):
        return
    rows = await context.services.catalog.all()
    lines = [f"• {c.name}: lessons {c.lessons}, updates_per_week {c.updates_per_week}, "
             f"hours_per_update {c.hours_per_update:g}" for c in rows]
    await reply(update.effective_message, "\n".join(lines) if lines else "No courses yet.")


async def course_add(update: Update, context: BotContext) -> None:
    """/course_add NAME LESSONS PER_WEEK HOURS (the name may hold spaces)."""
    if not await admin_only(update, context):
        return
    args = arguments(update)
    if len(args) < 4:
        return await usage(update, "course_add")
    name, numbers = " ".join(args[:-3]), args[-3:]
    try:
        course = await context.services.catalog.add(name, *numbers)
    except CourseError as error:
        return await reply(update.effective_message, f"❌ {error}\nUsage: {USAGE['course_add']}")
    await record(update, context, "course_add", f"{course.name} lessons={course.lessons} "
                 f"updates_per_week={course.updates_per_week} hours_per_update={course.hours_per_update:g}")
    await reply(update.effective_message, f"✅ Added {course.name}.")


async def course_set(update: Update, context: BotContext) -> None:
    """/course_set NAME FIELD VALUE: change one number of a course."""
    if not await admin_only(update, context):
        return
    args = arguments(update)
    if len(args) < 3:
        return await usage(update, "course_set")
    name, field, value = " ".join(args[:-2]), FIELD_ALIASES.get(args[-2], args[-2]).lower(), args[-1]
    try:
        course = await context.services.catalog.set_field(name, field, value)
    except CourseError as error:
        return await reply(update.effective_message, f"❌ {error}\nUsage: {USAGE['course_set']}")
    await record(update, context, "course_set", f"{course.name} {field}={value}")
    await reply(update.effective_message, f"✅ {course.name}: {field} = {getattr(course, field):g}.")


async def course_del(update: Update, context: BotContext) -> None:
    """/course_del NAME: remove a course."""
    if not await admin_only(update, context):
        return
    name = " ".join(arguments(update))
    if not name:
        return await usage(update, "course_del")
    try:
        await context.services.catalog.remove(name)
    except CourseError as error:
        return await reply(update.effective_message, f"❌ {error}")
    await record(update, context, "course_del", name)
    await reply(update.effective_message, f"✅ Removed {name}.")


# --- access ----------------------------------------------------------------------------------------------------

async def allow(update: Update, context: BotContext) -> None:
    """/allow ID: let a user, or everyone in a group, talk to the bot."""
    await set_access(update, context, "allow", True)


async def deny(update: Update, context: BotContext) -> None:
    """/deny ID: take access away from a user or a group."""
    await set_access(update, context, "deny", False)


async def set_access(update: Update, context: BotContext, command: str, allowed: bool) -> None:
    """Parse the id, record the decision (audited), and confirm."""
    if not await admin_only(update, context):
        return
    args = arguments(update)
    if len(args) != 1:
        return await usage(update, command)
    try:
        subject_id = parse_id(args[0])
        if allowed:
            refuse_service_account(subject_id)  # /deny may still take an old entry back
    except IdError as error:
        return await reply(update.effective_message, f"❌ {error}\nUsage: {USAGE[command]}")
    kind = await context.access.set_allowed(subject_id, allowed, by=update.effective_user.id,
                                            chat_id=update.effective_chat.id)
    note = " (an admin: admins always have access)" if context.access.is_admin(subject_id) else ""
    await reply(update.effective_message, f"✅ {kind} {subject_id} is {'allowed' if allowed else 'denied'}{note}.")


def _is_number(word: str) -> bool:
    """ASCII digits only: `str.isdigit` also accepts ² and ١, which `int` refuses or reads unexpectedly."""
    return word.isascii() and word.isdigit()


async def admins(update: Update, context: BotContext) -> None:
    """/admins: the admins, and who else has access (from the environment and from /allow, /deny)."""
    if not await admin_only(update, context):
        return
    settings = context.settings
    lines = ["Admins (ADMIN_USER_IDS): " + _ids(settings.access.admin_user_ids),
             "Users (ALLOWED_USER_IDS): " + _ids(settings.access.allowed_user_ids),
             "Chats (ALLOWED_CHAT_IDS): " + _ids(settings.access.allowed_chat_ids)]
    entries = await context.access.entries()
    if entries:
        lines.append("Changed at run time:")
        lines += [f"• {e.kind} {e.subject_id}: {'allowed' if e.allowed else 'denied'} by {e.changed_by} "
                  f"at {e.changed_at[:16]}" for e in entries]
    await reply(update.effective_message, "\n".join(lines))


def _ids(ids: frozenset[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids)) or "none"


# --- figures ---------------------------------------------------------------------------------------------------

async def stats(update: Update, context: BotContext) -> None:
    """/stats [DAYS]: turns, tool calls, errors and median latency per day and per chat."""
    if not await admin_only(update, context):
        return
    args = arguments(update)
    if len(args) > 1 or (args and not (_is_number(args[0]) and 0 < int(args[0]) <= MAX_DAYS)):
        return await usage(update, "stats")
    report = await usage_report(context.services.db, int(args[0]) if args else DEFAULT_DAYS)
    await reply(update.effective_message, report.text())

