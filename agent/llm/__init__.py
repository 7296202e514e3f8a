"""Model backends behind one async interface (`agent.llm.base.LLM`); bot/program/services.py picks one from the settings."""

from agent.llm.base import LLM, CancelToken, Completion, Message, ModelRequest, ToolCall

__all__ = ["LLM", "CancelToken", "Completion", "Message", "ModelRequest", "ToolCall"]
