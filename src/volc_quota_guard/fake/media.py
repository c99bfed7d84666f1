"""What Ark bills for media in a request, taking the more expensive reading (docs/gate.md).

- An image costs ``min(ceil(pixels / 784), cap)`` tokens, where ``pixels`` is ``width × height``
  scaled down (aspect kept) to at most 1,048,576 px for ``detail: low`` (the default) or
  4,014,080 px for ``high``; the cap is 1,312 (low) or 5,120 (high). ``detail: auto`` counts as
  high. ``image_pixel_limit: {max_pixels, min_pixels}`` replaces the bound (the cap grows to
  ``ceil(max_pixels / 784)`` when that is larger) and scales small images *up* to
  ``min_pixels``. Scaling is not rounded down to whole pixels (rounding could only save).
- The size of a ``data:`` URL image is read from its header bytes (PNG, JPEG, GIF, WebP);
  an undecodable image is a ValueError (Ark answers 400). An image by ``http(s)`` URL is
  billed at the cap: the fake cannot fetch it.
- Video, audio and file parts are billed a flat per-part amount (the server's
  ``media_tokens`` default or the directive's ``media=``): their content is unseen.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from typing import Any

TOKEN_PIXELS = 784
LOW_MAX_PIXELS, LOW_CAP = 1_048_576, 1_312
HIGH_MAX_PIXELS, HIGH_CAP = 4_014_080, 5_120
IMAGE_PARTS = frozenset({"image_url", "input_image"})
MEDIA_PARTS = frozenset({"video_url", "input_video", "input_audio", "audio_url", "file",
                         "input_file"})
TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal"})


def part_text(part: dict[str, Any]) -> str:
    """A text part's text, and every other field but its type as text too (a refusal part
    carries its text under ``refusal``; whether Ark reads other keys of a part is unknown, so
    the fake takes the dearer reading): strings as they are, other values as JSON."""
    return "\n".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
                     for k, v in part.items() if k != "type" and v is not None)

_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG, JPEG, GIF or WebP header; ValueError otherwise."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        w, h = _png_size(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        w, h = _gif_size(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        w, h = _webp_size(data)
    elif data[:2] == b"\xff\xd8":
        w, h = _jpeg_size(data)
    else:
        raise ValueError("the image is not PNG, JPEG, GIF or WebP")
    if w <= 0 or h <= 0:
        raise ValueError("the image has no pixels")
    return int(w), int(h)


def _png_size(data: bytes) -> tuple[int, int]:
    """The largest IHDR chunk's size, walking every chunk as a lenient decoder (Pillow) does: it
    skips a chunk before IHDR and reads each IHDR it meets (the last wins) — the dearer reading."""
    i, found = 8, None
    while i + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[i:i + 8])
        if kind == b"IHDR" and i + 16 <= len(data):
            w, h = struct.unpack(">II", data[i + 8:i + 16])
            if found is None or w * h > found[0] * found[1]:
                found = (int(w), int(h))
        i += 12 + length  # length, type, data, CRC
    if found is None:
        raise ValueError("the PNG has no IHDR chunk")
    return found


def _gif_size(data: bytes) -> tuple[int, int]:
    """The larger of the logical screen and the extent of every frame (Pillow decodes a frame
    past the screen at its full size; the dearer reading)."""
    w, h = struct.unpack("<HH", data[6:10])
    pos = 13 + (3 * 2 ** ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
    while pos < len(data):
        block = data[pos]
        if block == 0x2C and pos + 10 <= len(data):
            left, top, fw, fh, flags = struct.unpack("<HHHHB", data[pos + 1:pos + 10])
            w, h = max(w, left + fw), max(h, top + fh)
            pos += 11 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
        elif block == 0x21:
            pos += 2
        elif block == 0x3B:  # the trailer
            break
        else:  # Pillow skips a byte it does not know and reads on
            pos += 1
            continue
        while pos < len(data) and data[pos] != 0:  # data sub-blocks up to the terminator
            pos += data[pos] + 1
        pos += 1
    return w, h


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return (int.from_bytes(data[24:27], "little") + 1,
                int.from_bytes(data[27:30], "little") + 1)
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    raise ValueError("unreadable WebP header")


def _jpeg_size(data: bytes) -> tuple[int, int]:
    i, found = 2, None
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise ValueError("unreadable JPEG header")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if marker in _JPEG_SOF:
            if i + 9 > len(data):
                break
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            if found is None or w * h > found[0] * found[1]:
                found = (int(w), int(h))  # every frame header before the scan: the largest
        if marker in (0xDA, 0xD9):
            break
        i += 2 + length
    if found is None:
        raise ValueError("no JPEG frame header")
    return found


def decode_data_url(url: str) -> bytes:
    """The bytes of a base64 ``data:`` URL; ValueError if it is not one."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise ValueError("an image data URL must be data:<mime>;base64,<data>")
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError):
        raise ValueError("the image data URL is not valid base64") from None


def image_tokens(url: str, detail: str | None = None,
                 pixel_limit: dict[str, Any] | None = None) -> int:
    """Ark's tokens for one image (see the module docstring)."""
    if detail not in (None, "low", "high", "auto"):
        raise ValueError(f"image detail must be low, high or auto, not {detail!r}")
    high = detail in ("high", "auto")
    bound, cap = (HIGH_MAX_PIXELS, HIGH_CAP) if high else (LOW_MAX_PIXELS, LOW_CAP)
    least = 0
    if pixel_limit is not None:
        if not isinstance(pixel_limit, dict):
            raise ValueError("image_pixel_limit must be an object")
        most, least = pixel_limit.get("max_pixels"), pixel_limit.get("min_pixels") or 0
        for value in (most, least):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise ValueError("image_pixel_limit values must be non-negative integers")
        if most:
            bound = most
            cap = max(cap, math.ceil(most / TOKEN_PIXELS))
    if url.startswith("data:"):
        w, h = image_size(decode_data_url(url))
        pixels = max(min(w * h, bound), least)
    elif url.startswith(("http://", "https://")):
        pixels = bound  # unseen: the biggest it could be
    else:
        raise ValueError("an image URL must be http(s) or a base64 data URL")
    return min(math.ceil(pixels / TOKEN_PIXELS), cap)


def part_image(part: dict[str, Any]) -> tuple[str, str | None, dict[str, Any] | None]:
    """(url, detail, image_pixel_limit) of a chat ``image_url`` or Responses ``input_image`` part."""
    value = part.get("image_url")
    if isinstance(value, dict):
        url, detail = value.get("url"), value.get("detail", part.get("detail"))
        limit = value.get("image_pixel_limit", part.get("image_pixel_limit"))
    else:
        url, detail, limit = value, part.get("detail"), part.get("image_pixel_limit")
    if not isinstance(url, str) or not url:
        raise ValueError("an image part needs an image URL")
    return url, detail, limit
