"""Pictures for models that can see: any image Pillow reads, turned upright, shrunk to the model's limit and sent
as a JPEG image part of the question's message (OpenAI's `image_url` content part, which vLLM, SGLang, llama.cpp
and Ollama take too).

Shrinking happens here, before sending: a phone photo is 12 megapixels, and a vision model cuts a picture into
patches of 14 or 28 pixels, each one a token of the prompt. A picture lives only for its turn: the history keeps
a note that there was one (agent/memory.py), not the picture.
"""

from __future__ import annotations

import base64
import io
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from PIL import Image, ImageOps, UnidentifiedImageError

from agent.errors import NotAnImage

# Far beyond any photo (a 12-megapixel phone picture is 12 million): a larger header is a decompression bomb.
MAX_SOURCE_PIXELS = 64_000_000
JPEG_QUALITY = 90


@dataclass(frozen=True)
class Picture:
    """A picture ready to send: JPEG bytes and its size in pixels."""

    jpeg: bytes
    width: int
    height: int

    def as_part(self) -> dict[str, Any]:
        """The picture as a chat-completions content part (a data URL: nothing to fetch for the server)."""
        url = "data:image/jpeg;base64," + base64.b64encode(self.jpeg).decode("ascii")
        return {"type": "image_url", "image_url": {"url": url}}


def fit_picture(data: bytes, max_side: int) -> Picture:
    """The image in `data`, upright (EXIF orientation applied), flattened onto white if transparent, and shrunk so
    its longer side is at most `max_side` pixels (never enlarged). Raises `NotAnImage` when Pillow cannot read it,
    or when its header claims more than MAX_SOURCE_PIXELS."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is checked just below
            image = Image.open(io.BytesIO(data))
        with image:
            if image.width * image.height > MAX_SOURCE_PIXELS:
                raise NotAnImage(f"the picture is {image.width}×{image.height} pixels, far too large to read")
            image.draft("RGB", (max_side, max_side))  # JPEG: decode at a reduced scale when that suffices
            fitted = _flattened(ImageOps.exif_transpose(image))
    except UnidentifiedImageError:
        raise NotAnImage("not a picture in a format that can be read") from None
    except (OSError, ValueError, Image.DecompressionBombError) as error:  # a truncated or damaged file
        raise NotAnImage(f"the picture cannot be read ({error})") from None
    fitted.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    fitted.save(out, "JPEG", quality=JPEG_QUALITY)
    return Picture(out.getvalue(), fitted.width, fitted.height)


def _flattened(image: Image.Image) -> Image.Image:
    """RGB, with any transparency laid on white (JPEG has no alpha; black would hide dark drawings)."""
    if image.mode in ("RGBA", "LA", "P"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, "white")
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def with_pictures(content: str, pictures: Sequence[Picture]) -> str | list[dict[str, Any]]:
    """A user message's content with `pictures` before its text, as vision chat templates expect; the text alone
    when there is no picture."""
    if not pictures:
        return content
    return [*(picture.as_part() for picture in pictures), {"type": "text", "text": content}]


def text_of(content: Any) -> str:
    """The text of a message's content, whether a string or a list of parts (pictures left out)."""
    if isinstance(content, list):
        return "\n".join(str(part.get("text") or "") for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
    return "" if content is None else str(content)
