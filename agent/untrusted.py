"""Text the model must read as data, not as the format: a user's question, the history, a tool's result.

The ReAct trace is plain text, so a question holding a line `Observation: 42` (or `Thought:`, `Action:`,
`Final Answer:`, `Question:`) puts a fake step into the prompt: the model "observes" what the user wrote, or takes a
forged `Final Answer:` for its own. Native mode has its markers too: `<tool_call>` and `<tool_response>`, and the
chat template's own `<|im_start|>`/`<|im_end|>`, which a tokenizer turns into the real special tokens wherever they
appear in a message, so a user could open a system turn of their own.

`defuse` changes such text visibly but harmlessly before it enters a prompt (the history and the stored turn keep
what was written):

- a line starting like a ReAct marker (as agent/react.py reads markers: spaces, bold, either colon) is quoted:
  `> Observation: 42`. The model sees a quotation, and no parser takes it for a step;
- a chat-template or tool-call tag gets a zero-width space after its `<` (`<\u200b|im_start|>`): it looks the
  same to a person, and no tokenizer reads it as the special token.
"""

from __future__ import annotations

import re

# A line that agent/react.py's marker pattern would read as a step (plus `Question:`, which opens an exchange).
_MARKER_LINE = re.compile(
    r"^(?=[ \t]*\**[ \t]*(?:Thought|Action Input|Action|Observation|Final Answer|Question)[ \t]*\**[ \t]*[:：])",
    re.IGNORECASE | re.MULTILINE)
# Chat-template special tokens (`<|im_start|>`, `<|endoftext|>`, …) and the native format's tags.
_TAG = re.compile(r"<(?=\|)|<(?=/?(?:tool_call|tool_response|think)>)", re.IGNORECASE)
QUOTE = "> "
ZERO_WIDTH_SPACE = "\u200b"


def defuse(text: str) -> str:
    """`text` with every line that reads as a ReAct marker quoted, and every special-token or tool-call tag broken
    by a zero-width space; text without them comes back unchanged."""
    return _TAG.sub("<" + ZERO_WIDTH_SPACE, _MARKER_LINE.sub(QUOTE, text))
