"""The bot: a Telegram adapter, and the program around it.

    bot/telegram/   the Telegram adapter: updates in (journal, polling, webhook), handlers, the question path,
                    replies and streaming, admin commands. It speaks python-telegram-bot and nothing else does.
    bot/program/    the program that runs it: the `qwenbot` command line, settings, the wiring of services,
                    the terminal chat, doctor, evaluation, logs and paths. It works without Telegram.

Imports run one way: the adapter takes the settings and services it needs from the program; the program imports
the adapter in one place only, where `qwenbot run` builds the Telegram application (bot/program/cli.py).
"""
