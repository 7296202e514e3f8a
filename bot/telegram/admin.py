"""Admin commands: tools, courses, access and usage figures. Refused for everyone else; every change audited.

The model never changes data: these commands are the only way in. Each parses its arguments, and wrong or
missing ones get the usage line (never a traceback). Replies are in the admin's language (admin_texts.py).
"""

from __future__ import annotations

from telegram import Update

from agent.options import REQUIRE_TOOL_CALL
from bot.program.audit import audit
from bot.program.ids import IdError, parse_id, refuse_service_account
from bot.program.texts import text
from bot.telegram.admin_texts import usage_text
from bot.telegram.chat import may_talk, refuse, reply, session_for, user_language
from bot.telegram.context import BotContext
from bot.telegram.stats import DEFAULT_DAYS, MAX_DAYS, usage_report
from tools.courses import FIELDS, FIELD_LABELS
from tools.errors import ConfirmationNeeded, CourseError, UnknownTool
from tools.registry import BUILT_IN, Tool
from tools.settings import GLOBAL

CONFIRM = "destructive"  # the word that enables a tool which may change data

# What each usage line fills in (admin_texts.py holds the lines themselves).
USAGE_VALUES = {"course_set": {"fields": ", ".join(FIELDS)}, "stats": {"days": DEFAULT_DAYS}}
POLICY_VALUES = {"on": True, "off": False, "default": None}
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
        await reply(message, text("admins_only", user_language(update)))
    else:
        await refuse(update, context)
    return False


def arguments(update: Update) -> list[str]:
    """The words after the command."""
    return (update.effective_message.text or "").split()[1:]


async def usage(update: Update, command: str) -> None:
    """Reply with the command's usage line, in the sender's language."""
    await reply(update.effective_message, usage_text(command, user_language(update), **USAGE_VALUES.get(command, {})))


async def error_and_usage(update: Update, command: str, error: object) -> None:
    """Reply with what was wrong, then the command's usage line."""
    lang = user_language(update)
    await reply(update.effective_message, text("error_usage", lang, error=error, usage=text(
        f"usage_{command}", lang, **USAGE_VALUES.get(command, {}))))


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
    args, lang = arguments(update), user_language(update)
    flags = [word.lower() for word in args[1:]]
    if not args or len(set(flags)) != len(flags) or not set(flags) <= ({GLOBAL, CONFIRM} if enabled else {GLOBAL}):
        return await usage(update, command)
    name, scope = args[0], GLOBAL if GLOBAL in flags else session_for(update.effective_message).chat_key
    try:
        await context.services.tool_settings.set_enabled(name, enabled, scope, confirmed=CONFIRM in flags)
    except UnknownTool:
        known = ", ".join(context.services.registry.names)
        return await reply(update.effective_message, text("no_such_tool", lang, name=repr(name), known=known))
    except ConfirmationNeeded as refusal:
        return await reply(update.effective_message, confirmation_text(refusal.tool, scope == GLOBAL, lang))
    await record(update, context, command, f"{name} scope={scope}" + (f" {CONFIRM}" if CONFIRM in flags else ""))
    key = f"tool_{'on' if enabled else 'off'}_{'global' if scope == GLOBAL else 'here'}"
    await reply(update.effective_message, text(key, lang, name=name))


def confirmation_text(tool: Tool, everywhere: bool, lang: str = "en") -> str:
    """Why a tool that may change data stays off, and the command that enables it anyway."""
    hint = text("tool_hint_destructive" if tool.destructive else "tool_hint_not_read_only", lang)
    command = f"/tool_on {tool.name}{' global' if everywhere else ''} {CONFIRM}"
    return text("tool_needs_confirmation", lang, name=tool.name, source=tool.source, hint=hint, command=command)


async def tools_all(update: Update, context: BotContext) -> None:
    """/tools all: every registered tool, its state here and where that state comes from."""
    if not await admin_only(update, context):
        return
    chat_key = session_for(update.effective_message).chat_key
    states = await context.services.tool_settings.states(chat_key)
    lines = [f"{'✅' if s.enabled else '⛔'} {s.tool.name} — {s.tool.human_name} ({s.source}){_origin(s.tool)}"
             for s in states]
    await reply(update.effective_message, "\n".join([text("tools_all_header", user_language(update)), *lines]))


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
    await reply(update.effective_message,
                text("require_tool_on" if required else "require_tool_off", user_language(update), source=source))


# --- courses ---------------------------------------------------------------------------------------------------

async def courses(update: Update, context: BotContext) -> None:
    """/courses: every course with its numbers."""
    if not await admin_only(update, context):
        return
    rows, lang = await context.services.catalog.all(), user_language(update)
    lines = [text("course_line", lang, name=c.name, lessons=c.lessons, per_week=c.updates_per_week,
                  hours=f"{c.hours_per_update:g}") for c in rows]
    await reply(update.effective_message, "\n".join(lines) if lines else text("no_courses", lang))


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
        return await error_and_usage(update, "course_add", error)
    await record(update, context, "course_add", f"{course.name} lessons={course.lessons} "
                 f"updates_per_week={course.updates_per_week} hours_per_update={course.hours_per_update:g}")
    await reply(update.effective_message, text("course_added", user_language(update), name=course.name))


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
        return await error_and_usage(update, "course_set", error)
    await record(update, context, "course_set", f"{course.name} {field}={value}")
    await reply(update.effective_message, text("course_changed", user_language(update), name=course.name,
                                               field=field, value=f"{getattr(course, field):g}"))


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
        return await reply(update.effective_message, text("error", user_language(update), error=error))
    await record(update, context, "course_del", name)
    await reply(update.effective_message, text("course_removed", user_language(update), name=name))


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
        return await error_and_usage(update, command, error)
    kind = await context.access.set_allowed(subject_id, allowed, by=update.effective_user.id,
                                            chat_id=update.effective_chat.id)
    lang = user_language(update)
    note = text("access_admin_note", lang) if context.access.is_admin(subject_id) else ""
    await reply(update.effective_message, text("access_allowed" if allowed else "access_denied", lang,
                                               kind=text(f"kind_{kind}", lang), subject=subject_id, note=note))


def _is_number(word: str) -> bool:
    """ASCII digits only: `str.isdigit` also accepts ² and ١, which `int` refuses or reads unexpectedly."""
    return word.isascii() and word.isdigit()


async def admins(update: Update, context: BotContext) -> None:
    """/admins: the admins, and who else has access (from the environment and from /allow, /deny)."""
    if not await admin_only(update, context):
        return
    settings, lang = context.settings, user_language(update)
    lines = [text("admins_admins", lang, ids=_ids(settings.access.admin_user_ids, lang)),
             text("admins_users", lang, ids=_ids(settings.access.allowed_user_ids, lang)),
             text("admins_chats", lang, ids=_ids(settings.access.allowed_chat_ids, lang))]
    entries = await context.access.entries()
    if entries:
        lines.append(text("admins_changed", lang))
        lines += [text("admins_entry_allowed" if e.allowed else "admins_entry_denied", lang,
                       kind=text(f"kind_{e.kind}", lang), subject=e.subject_id, by=e.changed_by,
                       at=e.changed_at[:16]) for e in entries]
    await reply(update.effective_message, "\n".join(lines))


def _ids(ids: frozenset[int], lang: str) -> str:
    return ", ".join(str(i) for i in sorted(ids)) or text("none", lang)


# --- figures ---------------------------------------------------------------------------------------------------

async def stats(update: Update, context: BotContext) -> None:
    """/stats [DAYS]: turns, tool calls, errors and median latency per day and per chat."""
    if not await admin_only(update, context):
        return
    args = arguments(update)
    if len(args) > 1 or (args and not (_is_number(args[0]) and 0 < int(args[0]) <= MAX_DAYS)):
        return await usage(update, "stats")
    report = await usage_report(context.services.db, int(args[0]) if args else DEFAULT_DAYS)
    await reply(update.effective_message, report.text(user_language(update)))

