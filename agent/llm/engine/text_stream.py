"""One batch row's new text, decoded token by token as the model thread generates it (see `BatchRow.take`).

Decoding a row's whole output again after every token costs O(n) per token; this keeps two offsets instead, as
text-generation-inference does: each new token is decoded together with the few tokens before it, and only the text they
add is handed on (O(1) per token; see bench/README.md § Engine design measurements). A token that ends inside a
multi-byte character decodes to U+FFFD and waits for the next one, so a Chinese character is never handed on in halves.
"""

from __future__ import annotations

from typing import Any, Callable

REPLACEMENT = "\ufffd"  # what a decoder gives for an incomplete UTF-8 sequence


class TextStream:
    """Incremental detokenizer for one row: `push` every generated token id; new text goes to `emit`."""

    def __init__(self, tokenizer: Any, emit: Callable[[str], None]):
        self.tokenizer = tokenizer
        self.emit = emit
        self.ids: list[int] = []
        self.prefix_offset = 0  # where the context decoded before the new tokens starts
        self.read_offset = 0  # where the tokens whose text was handed on end

    def push(self, token_id: int) -> None:
        """The row generated `token_id`; hand on the text it completes, if any."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self.emit(after[len(before):])
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
