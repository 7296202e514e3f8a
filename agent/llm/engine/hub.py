"""Hub models: load from the cache without touching the network, and fail fast when the hub cannot be reached.

Left to itself, `from_pretrained` on a hub id with no network retries each file it wants, logging two warnings per
try, for over a minute, and then raises an error that does not say what to do instead. So before loading a hub
id: a model already in the cache loads with `local_files_only` (no request at all); otherwise the hub must be
reachable (one quick request), or the start fails at once with one line listing the alternatives.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from huggingface_hub import constants, try_to_load_from_cache

from agent.errors import ModelLoadError

HUB_PROBE_SECONDS = 5.0  # how long the reachability check waits: a reachable hub answers well within this
ALTERNATIVES = ("a local folder (MODEL=/path/to/model), a .gguf file (MODEL=/path/to/model.gguf), "
                "or a model server (LLM_BACKEND=openai with OPENAI_BASE_URL)")


def is_cached(repo_id: str, cache_dir: Path | None) -> bool:
    """Whether the hub model's config is in `cache_dir` (None: the Hugging Face default cache)."""
    return isinstance(try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir), str)


def cached_folder(repo_id: str, cache_dir: Path | None) -> Path | None:
    """The cached snapshot's folder of the hub model (its files, as links into the cache), or None."""
    config = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    return Path(config).parent if isinstance(config, str) else None


def hub_unreachable_reason() -> str | None:
    """Why the hub cannot be used now (offline mode, or no answer), or None when it answers."""
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        httpx.head(constants.ENDPOINT, timeout=HUB_PROBE_SECONDS)
    except httpx.HTTPError as error:
        return f"the hub at {constants.ENDPOINT} cannot be reached ({type(error).__name__})"
    return None  # any HTTP answer means the hub is there; from_pretrained reports what it then refuses


def hub_load_options(repo_id: str, cache_dir: Path | None) -> dict[str, object]:
    """`from_pretrained` options for a hub id: the cache folder, and offline loading when the model is cached.

    Raises `ModelLoadError` (one line, with the alternatives) when it is not cached and the hub is unreachable.
    """
    cache = {"cache_dir": str(cache_dir)} if cache_dir is not None else {}
    if is_cached(repo_id, cache_dir):
        return {**cache, "local_files_only": True}
    reason = hub_unreachable_reason()
    if reason is not None:
        where = cache_dir or constants.HF_HUB_CACHE
        raise ModelLoadError(f"MODEL {repo_id}: not in the model cache ({where}) and {reason}; use {ALTERNATIVES}")
    return cache
