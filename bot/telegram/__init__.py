"""The Telegram adapter: everything that speaks python-telegram-bot, from an update in to an answer out.

Named for what it adapts to. An update goes intake.py (journal, then the dispatcher) → app.py's handlers
(handlers.py, admin.py, admin_mcp.py) → questions.py (addressing, turn order in turns.py, access in access.py,
the agent) → streaming.py and replies.py (drafts, edits, 4096 splitting, progress) → Telegram. The settings and
the services it uses come from bot/program/; nothing here is imported by the program but app.py's `run`.
"""
