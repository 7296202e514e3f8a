"""The program around the Telegram adapter: what a person runs, and what it is made of.

Named "program" because it is the process, not the chat: the `qwenbot` command line (cli.py) and its terminal
chat (terminal.py), the settings (config.py), the wiring that builds the database, model, tools and agent from
them (services.py), doctor, evaluation, logs, paths and the audit log. Only `qwenbot run` loads the adapter in
bot/telegram/ (cli.py imports its `run` there); the other commands work without it (doctor alone asks the Bot
API, with python-telegram-bot's `Bot`, whether the token works).
"""
