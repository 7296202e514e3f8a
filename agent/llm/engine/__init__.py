"""The local engine: one model thread serving every chat's model calls in shared batches (drawn in README.md).

The local backend (agent/llm/local.py) is its face towards the agent; nothing else outside this package needs
its modules. Importing the package loads nothing heavy: torch and transformers come with the modules that use them.
"""
