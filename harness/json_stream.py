"""JSON documents too large to decode at once: an array read one item at a time, and the text of a JSON file in the
encoding JSON allows (json.loads' own detection: UTF-8 with or without its BOM, UTF-16, UTF-32)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

_JSON_SPACE = re.compile(r"[ \t\n\r]*")


class NotAJsonArray(ValueError):
    """The document is JSON, or may be, but not an array."""


def read_json_text(path: Path) -> str:
    """The text of a JSON file, decoded as json.loads decodes bytes (UnicodeDecodeError where they are not text)."""
    raw = Path(path).read_bytes()
    return raw.decode(json.detect_encoding(raw), "surrogatepass")


def iter_json_array(text: str, decoder: json.JSONDecoder | None = None) -> Iterator:
    """The items of the JSON array `text` is, decoded one at a time (json.loads would build every item at once: a
    dict per detection of a full-val file); exactly what json.loads accepts (a trailing comma, extra data or an
    unclosed array is a json.JSONDecodeError). A document that is not an array: NotAJsonArray."""
    decoder = decoder or json.JSONDecoder()
    pos = _JSON_SPACE.match(text, 0).end()
    if text[pos:pos + 1] != "[":
        raise NotAJsonArray("not a JSON array")
    pos = _JSON_SPACE.match(text, pos + 1).end()
    if text[pos:pos + 1] != "]":
        while True:
            item, pos = decoder.raw_decode(text, pos)  # after a comma a value must follow, never "]"
            yield item
            pos = _JSON_SPACE.match(text, pos).end()
            if text[pos:pos + 1] == "]":
                break
            if text[pos:pos + 1] != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
            pos = _JSON_SPACE.match(text, pos + 1).end()
    end = _JSON_SPACE.match(text, pos + 1).end()
    if end < len(text):
        raise json.JSONDecodeError("Extra data", text, end)
