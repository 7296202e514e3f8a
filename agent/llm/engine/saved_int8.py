"""int8 weights saved once quantized and laid out, so that a later start of the same model skips both.

A start in int8 stacked each layer's projections in float (linear_fused.py), rounded every weight to its int8
levels (linear_int8.py's `per_channel_int8`) and had oneDNN lay each product out for its kernel: at the 1.5B shape
on 2 cores 1.2-2.6 s of rounding and 4.3 s of laying out, the same work with the same result at every start. So
every int8 product is saved as oneDNN laid it out (its bytes in `<name>.onednn`, their layout and the scales in
`<name>.safetensors`; the output layer, whose product reads plain levels, as levels and scales), in a folder of
MODEL_CONVERTED_DIR named by a key of what they were computed from; a later start maps the bytes and builds its
products straight over them (internals.int8_packed_from_bytes), with no float stack, no rounding and no laying out.
What it reads is what it would have computed, bit for bit, so the model and its tokens are the same. The bytes stay
a mapping of the file: their pages are the weights' memory (shared with the page cache, one copy for every process
of the model), where reading them into the process's own memory would copy 1.3 GB at 1.5B.

The key (`levels_key`) covers this module's `FORMAT` (how levels are computed and named), torch's version, the
layout oneDNN gives int8 weights on this CPU (internals.int8_layout: bytes laid out for another CPU's instructions
compute garbage there, silently), and every linear layer's name, shape, dtype and a sample of its weight: 256 values
spread over the whole tensor and its first and last 64. A fine-tuned, merged or replaced model differs there;
hashing every weight would cost what the quantizing saves. Not the model's config: the levels depend on the weights
only, and the config names where the model was loaded from (a GGUF's first start and its converted copy's later
ones share their levels). Where this torch cannot build a product over saved bytes (`int8_layout` is None), the
levels are saved instead, and laid out at every start. A folder is written whole or not at all (renamed from its
`.partial` once every product is in), and only the MODEL_INT8_KEPT most recently used folders are kept (each holds
about a byte per weight: 1.5 GB for Qwen2.5-1.5B). A folder that cannot be written or read only means quantizing
at that start, never an error.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from agent.llm.engine.linear_int8 import Levels, PackedBytes

log = logging.getLogger(__name__)

# torch is imported where it is used: the settings read KEPT, and a command that runs no model imports no torch.
KEPT = 2  # MODEL_INT8_KEPT's default: models whose int8 weights stay saved
FORMAT = "2"  # change when per_channel_int8, the stacking or the names change what a saved product holds
FOLDER = "int8"  # inside MODEL_CONVERTED_DIR
RAW_SUFFIX = ".onednn"  # beside a product's safetensors file: its bytes as oneDNN laid them out
COMPLETE_MARK = "int8.ok"  # written last, in the folder before it is renamed into place
SPREAD = 256  # values sampled across each weight for the key, beside its first and last EDGE
EDGE = 64
STALE_SECONDS = 3600  # a `.partial` folder untouched this long is what an interrupted save left


class SavedLevels:
    """The int8 products of one model, under `root`/`key`: read when a complete folder is there, else written as
    they are computed (`put`, then `finish`). `packed`: the products are saved as oneDNN laid them out (else as
    levels)."""

    def __init__(self, root: Path, key: str, kept: int, packed: bool = True):
        self.root, self.kept, self.packed = root, kept, packed
        self.folder = root / key
        self.complete = (self.folder / COMPLETE_MARK).is_file()
        if self.complete:
            _touch(self.folder / COMPLETE_MARK)  # the newest kept are the most recently used (`_keep_newest`)
        self._partial: Path | None = None if self.complete else root / f"{key}.{os.getpid()}.partial"
        self._written = 0
        self._damaged = False  # a product of the complete folder could not be read

    def get(self, name: str, out_features: int, in_features: int) -> Levels | PackedBytes | None:
        """Product `name` as saved: its laid-out bytes (their pages mapped, not read), or its levels [out, in] int8
        and scales [out] float32; None where there is neither of that shape (then it is computed, as without a
        saved folder)."""
        path = self.folder / _file_name(name)
        if not self.complete or not path.is_file():
            return None
        import torch
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            saved = load_file(path)
            scales = saved["scales"].clone()  # its own: a view would keep this file's mapping for 4 bytes a row
            if "levels" in saved:
                levels = saved["levels"]
                fits = levels.dtype == torch.int8 and levels.shape == (out_features, in_features)
                found: Levels | PackedBytes = (levels, scales)
            else:
                found = self._packed_bytes(path, saved, scales)
                fits = found.raw.numel() >= out_features * in_features
        except (OSError, KeyError, SafetensorError, RuntimeError) as error:
            log.warning("int8 levels of %s unreadable in %s (%s): quantizing it", name, self.folder, error)
            self._damaged = True
            return None
        if not fits or scales.dtype != torch.float32 or scales.shape != (out_features,):
            return None
        return found

    def _packed_bytes(self, path: Path, saved: dict[str, torch.Tensor], scales: torch.Tensor) -> PackedBytes:
        """The laid-out bytes beside `path`, mapped, with the layout `saved` holds for them."""
        import torch

        from agent.llm.engine.linear_int8 import PackedBytes

        raw_path = path.with_suffix(RAW_SUFFIX)
        size, expected = raw_path.stat().st_size, int(saved["bytes"])
        if not self.packed or size != expected or saved["layout"].dtype != torch.uint8:
            # a short file would end the process when the kernel reads past it (a bus error), not raise
            raise RuntimeError(f"{raw_path.name} holds {size} bytes, not the {expected} laid out")
        # shared=False: a private mapping of the file, read-only in use; its pages load as the kernel reads them
        raw = torch.from_file(str(raw_path), shared=False, size=size, dtype=torch.uint8)
        return PackedBytes(raw, saved["layout"].clone(), scales)

    def put(self, name: str, levels: Levels, packed: PackedBytes | None = None) -> None:
        """Save product `name` (while no complete folder exists): as laid out where `packed` is given and this
        folder holds laid-out products, else its levels; a failure stops saving."""
        if self._partial is None:
            return
        import torch
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        path = self._partial / _file_name(name)
        try:
            if not self._written:  # made once: a folder gone since (cleared as stale) fails the save, not refills
                self._partial.mkdir(parents=True, exist_ok=True)
            if packed is not None and self.packed:
                packed.raw.numpy().tofile(path.with_suffix(RAW_SUFFIX))
                tensors = {"layout": packed.layout.contiguous(), "scales": packed.scales.contiguous(),
                           "bytes": torch.tensor([packed.raw.numel()])}
            else:
                tensors = {"levels": levels[0].contiguous(), "scales": levels[1].contiguous()}
            save_file(tensors, path)
            self._written += 1
        except (OSError, SafetensorError) as error:  # safetensors reports a full disk as its own error
            log.warning("could not save int8 levels in %s (%s): the next start quantizes again", self.root, error)
            self._give_up()

    def finish(self) -> None:
        """Put the written folder in place (every product is in it) and keep only the newest `kept` folders; remove a
        complete folder a product of which could not be read, so that the next start saves it anew (the products
        this start mapped from it keep their bytes until they are let go)."""
        if self._damaged:
            shutil.rmtree(self.folder, ignore_errors=True)
            log.warning("removed the damaged int8 weights in %s: the next start saves them anew", self.folder)
        if self._partial is None or not self._written:
            self._give_up()
            return
        try:
            if len(list(self._partial.glob("*.safetensors"))) != self._written:
                raise OSError("some of its files are gone")
            (self._partial / COMPLETE_MARK).write_text(f"{FORMAT}\n")
            shutil.rmtree(self.folder, ignore_errors=True)
            self._partial.rename(self.folder)
            log.info("saved the int8 weights (%d products) to %s: the next start reads them", self._written,
                     self.folder)
        except OSError as error:
            log.warning("could not save int8 levels in %s (%s): the next start quantizes again", self.root, error)
            self._give_up()
            return
        self._partial = None
        try:
            self._keep_newest()
        except OSError as error:  # a folder removed meanwhile by another process: pruned at a later save
            log.debug("could not prune %s: %s", self.root, error)

    def _give_up(self) -> None:
        if self._partial is not None:
            shutil.rmtree(self._partial, ignore_errors=True)
        self._partial = None

    def _keep_newest(self) -> None:
        """Remove all but the `kept` most recently used folders, and what interrupted saves left."""
        folders = sorted((path for path in self.root.iterdir() if (path / COMPLETE_MARK).is_file()),
                         key=lambda path: (path / COMPLETE_MARK).stat().st_mtime_ns)
        for old in folders[:-self.kept] + [path for path in self.root.glob("*.partial") if _stale(path)]:
            shutil.rmtree(old, ignore_errors=True)


def saved_levels(converted_dir: Path | None, kept: int, model: Any) -> SavedLevels | None:
    """The saved int8 products of `model` (loaded, before the engine's layers go in) in `converted_dir`, or None
    where none are kept (no folder, or MODEL_INT8_KEPT=0)."""
    if converted_dir is None or kept <= 0:
        return None
    from agent.llm.engine.internals import int8_layout

    layout = int8_layout()
    return SavedLevels(Path(converted_dir) / FOLDER, levels_key(model, layout), kept, packed=layout is not None)


def levels_key(model: Any, layout: str | None) -> str:
    """What a model's int8 products are computed from, and the layout they are saved in, hashed (see the module's
    docstring)."""
    import torch

    digest = hashlib.sha256()
    for part in (FORMAT, torch.__version__, layout or "levels"):
        digest.update(part.encode() + b"\0")
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            weight = module.weight.detach()
            digest.update(f"{name}:{tuple(weight.shape)}:{weight.dtype}".encode())
            if weight.device.type == "cpu":  # the layers quantized (an offloaded one stays as loaded)
                digest.update(_weight_sample(weight).numpy().tobytes())
    return digest.hexdigest()[:32]


def _weight_sample(weight: torch.Tensor) -> torch.Tensor:
    import torch

    flat = weight.reshape(-1)
    step = max(1, flat.numel() // SPREAD)
    return torch.cat([flat[:EDGE], flat[::step], flat[-EDGE:]]).float()


def _stale(partial: Path) -> bool:
    """An interrupted save's folder: untouched for STALE_SECONDS (another process's save under way writes a file
    every second or so; its folder is left alone)."""
    try:
        return time.time() - partial.stat().st_mtime > STALE_SECONDS
    except OSError:
        return False


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:  # a read-only folder: it is still read, only its age is not renewed
        pass


def _file_name(name: str) -> str:
    return f"{name}.safetensors"

