"""What Ark bills for a media part of a request (docs/gate.md#media).

Images: ``min(ceil(w × h / 784), max)`` tokens, max 1,312 for ``detail: low`` and 5,120 for
``high``, after Ark scales the image down to at most 1,048,576 px (low) or 4,014,080 px (high).
``image_pixel_limit.max_pixels`` moves that bound. The guard reads width and height from a data
URL's header bytes; for an image by URL (which the guard cannot see) it takes the maximum.
Where Ark's default detail is uncertain, the expensive reading (``high``) is taken.

Video, audio and files are billed by content the guard cannot measure: such a part is refused
unless the deployment declares a per-part bound (``model_info.vqg_media_part_tokens``).
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping

PIXELS_PER_TOKEN = 784
MAX_TOKENS = {"low": 1_312, "high": 5_120}
MAX_PIXELS = {"low": 1_048_576, "high": 4_014_080}
HEADER_BYTES = 64 * 1024  # enough of the image to find its size (JPEG may carry EXIF first)


class MediaError(ValueError):
    """A media part the guard cannot bound; the message says why."""


def image_tokens(part: Mapping[str, object]) -> int:
    """Tokens Ark bills for one image part (OpenAI chat ``image_url`` or Responses ``input_image``)."""
    url, detail, (least_pixels, cap) = _image_fields(part)
    level = "low" if detail == "low" else "high"
    cap_pixels = MAX_PIXELS[level] if cap is None else cap
    most = max(MAX_TOKENS[level], math.ceil(max(cap_pixels, least_pixels) / PIXELS_PER_TOKEN))
    size = data_url_size(url) if url.startswith("data:") else None
    if size is None:
        return most  # a remote image (or unreadable data): the most Ark can bill for it
    w, h = size
    pixels = max(min(w * h, cap_pixels), least_pixels)  # scaled down, or up to min_pixels
    return min(math.ceil(pixels / PIXELS_PER_TOKEN), most)


def _image_fields(part: Mapping[str, object]) -> tuple[str, str, tuple[int, int | None]]:
    raw = part.get("image_url", part.get("url"))
    detail = part.get("detail")
    source = part.get("source")  # Anthropic: {"type": "base64", "media_type", "data"} or a url
    if raw is None and isinstance(source, Mapping):
        raw = source.get("url") if source.get("type") == "url" else (
            f"data:{source.get('media_type')};base64,{source.get('data')}")
    if isinstance(raw, Mapping):
        detail = raw.get("detail", detail)
        raw = raw.get("url")
    if not isinstance(raw, str) or not raw:
        raise MediaError("an image part needs a url")
    limit = part.get("image_pixel_limit")
    nested = part.get("image_url")
    if isinstance(nested, Mapping):
        limit = nested.get("image_pixel_limit", limit)
    bounds: tuple[int, int | None] = (0, None)
    if limit is not None:
        if not isinstance(limit, Mapping):
            raise MediaError("image_pixel_limit must be an object")
        found = []
        for name in ("min_pixels", "max_pixels"):
            value = limit.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise MediaError(f"image_pixel_limit.{name} must be a positive integer")
            found.append(value)
        bounds = (found[0] or 0, found[1])
    return raw, str(detail or "high"), bounds


def data_url_size(url: str) -> tuple[int, int] | None:
    """(width, height) of a base64 data URL's PNG, JPEG, GIF or WebP image, else None."""
    head, sep, payload = url.partition(",")
    if not sep or ";base64" not in head:
        return None
    chunk = payload[: HEADER_BYTES * 4 // 3 + 4]
    chunk = chunk[: len(chunk) - len(chunk) % 4]
    try:
        data = base64.b64decode(chunk, validate=False)
        # A GIF frame anywhere may be larger than its screen, a PNG may hold a second IHDR, a
        # JPEG a larger frame header past the first 64 KiB: those are read whole.
        if data[:6] in (b"GIF87a", b"GIF89a") or data[:8] == PNG_SIGNATURE \
                or (data[:2] == b"\xff\xd8" and _jpeg(data) is None):
            data = base64.b64decode(payload[: len(payload) - len(payload) % 4], validate=False)
    except (binascii.Error, ValueError):
        return None
    return _png(data) or _gif(data) or _webp(data) or _jpeg(data)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png(b: bytes) -> tuple[int, int] | None:
    """The size in IHDR, which must be the first chunk and the only one; any other PNG is sized
    as unreadable (the most Ark bills): a lenient decoder looks past a chunk before IHDR and reads
    every IHDR it meets, the last winning, and the bytes where IHDR belongs said 1x1 (red-team,
    stop 37). The chunks are walked to IEND (or the end of the data)."""
    if b[:8] != PNG_SIGNATURE or len(b) < 24 or b[12:16] != b"IHDR":
        return None
    w, h = struct.unpack(">II", b[16:24])
    i = 8
    while i + 8 <= len(b):
        length, kind = struct.unpack(">I4s", b[i:i + 8])
        if kind == b"IHDR" and i != 8:
            return None
        if kind == b"IEND":
            break
        i += 12 + length
    return int(w), int(h)


def _gif(b: bytes) -> tuple[int, int] | None:
    """The logical screen grown to every frame (decoders such as Pillow grow the image to a
    frame that extends past the screen); a byte no block starts with makes it unreadable."""
    if b[:6] not in (b"GIF87a", b"GIF89a") or len(b) < 13:
        return None
    w, h = struct.unpack("<HH", b[6:10])
    i = 13 + _color_table(b[10])
    while i < len(b) and b[i] != 0x3B:  # up to the trailer
        if b[i] == 0x21:  # an extension: its label, then data sub-blocks
            i = _past_sub_blocks(b, i + 2)
        elif b[i] == 0x2C and i + 10 <= len(b):  # an image descriptor
            left, top, fw, fh = struct.unpack("<HHHH", b[i + 1:i + 9])
            w, h = max(w, left + fw), max(h, top + fh)
            i = _past_sub_blocks(b, i + 10 + _color_table(b[i + 9]) + 1)  # + LZW code size
        else:  # a byte no block starts with: a lenient decoder skips it, so frames may follow
            return None
    return int(w), int(h)


def _color_table(flags: int) -> int:
    return 3 << ((flags & 7) + 1) if flags & 0x80 else 0


def _past_sub_blocks(b: bytes, i: int) -> int:
    while i < len(b) and b[i]:
        i += b[i] + 1
    return i + 1


def _webp(b: bytes) -> tuple[int, int] | None:
    if b[:4] != b"RIFF" or b[8:12] != b"WEBP" or len(b) < 30:
        return None
    kind = b[12:16]
    if kind == b"VP8X":
        return 1 + int.from_bytes(b[24:27], "little"), 1 + int.from_bytes(b[27:30], "little")
    if kind == b"VP8L":
        bits = int.from_bytes(b[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if kind == b"VP8 ":
        w, h = struct.unpack("<HH", b[26:30])
        return int(w) & 0x3FFF, int(h) & 0x3FFF
    return None


def _jpeg(b: bytes) -> tuple[int, int] | None:
    """The largest frame of a JPEG's header (every SOF before the scan), None if unreadable or
    if the data ends before the scan (a larger frame header may follow)."""
    if b[:2] != b"\xff\xd8":
        return None
    i, found = 2, None
    while i + 3 < len(b):
        if b[i] != 0xFF:
            return None
        while i + 1 < len(b) and b[i + 1] == 0xFF:  # fill bytes before a marker
            i += 1
        marker = b[i + 1] if i + 1 < len(b) else 0
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker in (0xDA, 0xD9):  # start of scan / end of image: no more headers
            return found
        length = int.from_bytes(b[i + 2:i + 4], "big")
        if length < 2:
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and i + 9 <= len(b):
            h, w = struct.unpack(">HH", b[i + 5:i + 9])
            if found is None or w * h > found[0] * found[1]:
                found = (int(w), int(h))
        i += 2 + length
    return None
