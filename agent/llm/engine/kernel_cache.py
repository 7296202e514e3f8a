"""How many compiled CPU kernels oneDNN keeps: bounded, so memory does not grow with every new prompt length.

oneDNN (torch's CPU kernels for bf16 and int8 products) compiles a primitive for each shape it meets and keeps it in
a cache of 1,024 by default. A product's shape includes its rows, and every prompt computed has a length of its own:
at the 0.5B shape each new length kept about 1.3 MiB (a model's five kinds of product), a hundred prompts 130 MiB,
held for good (bench/README.md § "Side by side after the prefix tree"). Decode steps meet a few shapes again and
again (1-8 rows, with their guessed tokens), which a small cache keeps hot; a prompt's length rarely comes back, so
recompiling one costs nothing that keeping it would have saved.

oneDNN reads the capacity from its environment variable when it first builds a primitive, so `limit` must run before
the model loads; in a process that already ran a product it changes nothing (the tests and benchmarks start fresh).
"""

from __future__ import annotations

import os

# oneDNN's own variable; a value the user exported wins over KERNEL_CACHE_ENTRIES (os.environ.setdefault).
ONEDNN_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
# Kernels kept: the decode steps' shapes (five products × up to 8 rows and their guesses) with room to spare.
KERNEL_CACHE_ENTRIES = 64


def limit(entries: int) -> None:
    """Ask oneDNN to keep at most `entries` compiled kernels (0: none, every product compiles its own)."""
    os.environ.setdefault(ONEDNN_VARIABLE, str(entries))
