"""The agent: a Qwen model reasoning in the ReAct format (or native tool calls) over the tool registry."""
