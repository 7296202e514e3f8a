"""The engine's load-time checks remembered, so that a start skips the two that run the model (internals.py's
`cache_mismatch` and `pass_mismatch`: half a second of the test model's start) once they have passed.

Their verdict depends only on what they run: transformers' and torch's code, the engine's own, the model's
architecture and dtype, the quantization and the CPU's kernels. So a pass is recorded under a fingerprint of all of
those, in a small JSON file beside the converted models (MODEL_CONVERTED_DIR); an upgrade of either library, an
edit of the engine, another model or dtype, or the data directory restored on another machine misses the record
and checks again. Failures are never recorded: a model that fell back is checked, and says why, at every start.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECORD_FILE = "engine-checks.json"
KEPT = 64  # fingerprints kept, newest last: models and versions tried on this machine


class CheckRecord:
    """The fingerprints of models that passed the checks, in `folder` (None: nothing is remembered)."""

    def __init__(self, folder: Path | None):
        self.path = Path(folder) / RECORD_FILE if folder is not None else None

    def passed(self, fingerprint: str) -> bool:
        """Whether a model with this fingerprint passed the checks before."""
        return fingerprint in self._read()

    def remember(self, fingerprint: str) -> None:
        """Record a pass; a folder that cannot be written only costs the next start its checks."""
        if self.path is None:
            return
        kept = [known for known in self._read() if known != fingerprint][-(KEPT - 1):] + [fingerprint]
        partial = self.path.with_name(f"{RECORD_FILE}.{os.getpid()}.partial")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"passed": kept}, indent=1) + "\n")
            partial.replace(self.path)  # whole or not at all, if two processes write at once
        except OSError as error:
            log.debug("could not record the engine's checks in %s: %s", self.path, error)
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)

    def _read(self) -> list[str]:
        if self.path is None:
            return []
        try:
            passed = json.loads(self.path.read_text()).get("passed", [])
        except (OSError, ValueError, AttributeError):  # none yet, or unreadable: check again
            return []
        return [entry for entry in passed if isinstance(entry, str)] if isinstance(passed, list) else []


def fingerprint(model: Any, quantize: str | None) -> str:
    """What the checks' verdict on `model` (loaded, before the engine's layers go in) depends on, hashed."""
    import torch
    import transformers

    parts = [torch.__version__, transformers.__version__, _engine_source_digest(), _cpu_flags(),
             type(model).__qualname__, model.config.to_json_string(use_diff=False), str(model.dtype),
             str(model.device), quantize or ""]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@functools.cache
def _engine_source_digest() -> str:
    """The engine's own code (this package's modules): an edit changes what the checks would find."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model and instruction sets (which kernels torch picks); empty where /proc is not there."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    wanted = ("model name", "flags", "Features")  # Features: ARM's flags line
    return "\n".join(sorted({line.strip() for line in lines if line.split(":")[0].strip() in wanted}))
