"""Request bodies as every API route reads them (issue 21 items 8-10): JSON bounded as the
webhook and agent routes bound it, and serializers that refuse fields they do not have.

Its own module: DRF's settings import the parser while `rest_framework.views` is still
loading, so nothing here may import the views (as `api_common` does).
"""

from __future__ import annotations

import json

from rest_framework import exceptions
from rest_framework.parsers import JSONParser

# As deep as any body of ours nests, with room: the webhook and agent routes allow 32 too.
MAX_JSON_NESTING = 32


def _depth(text: str) -> int:
    """How deeply arrays and objects nest, by one scan: no RecursionError for any input."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> float:
    raise exceptions.ParseError(f"the body is not valid JSON: {name} is not a number")


def lone_surrogate_at(value: object, path: str = "$") -> str | None:
    """The path of the first text holding a lone surrogate (`"\\ud800"` in JSON), which no
    database, template or UTF-8 encoder will take: written, it made every page that shows
    it answer 500."""
    if isinstance(value, str):
        if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = lone_surrogate_at(key, f"{path} (a key)") or lone_surrogate_at(
                item, f"{path}.{key}" if isinstance(key, str) else path
            )
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if found := lone_surrogate_at(item, f"{path}[{index}]"):
                return found
    return None


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, bounded as the webhook and agent routes are: a body nested deeper
    than MAX_JSON_NESTING, NaN or an infinity, or text with a lone surrogate is a 400 with
    a sentence, never a RecursionError or a row no page can render (issue 21 items 8, 9)."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise exceptions.ParseError("the body is not UTF-8") from None
        if not text.strip():
            raise exceptions.ParseError("the body is empty; send a JSON object")
        nested = text.count("[") + text.count("{") > MAX_JSON_NESTING
        if nested and _depth(text) > MAX_JSON_NESTING:
            raise exceptions.ParseError(f"the body nests deeper than {MAX_JSON_NESTING} levels")
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except exceptions.ParseError:
            raise
        except (ValueError, RecursionError) as exc:
            raise exceptions.ParseError(f"the body is not valid JSON ({exc})") from None
        if where := lone_surrogate_at(data):
            raise exceptions.ParseError(
                f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape), "
                "which is not text"
            )
        return data


class RejectUnknownFields:
    """A serializer mixin: a body naming a field the resource does not have is a 400 that
    names it, not a 200 that silently changed nothing (issue 21 item 10). Read-only fields
    of the GET shape may be sent back and are ignored, as DRF does."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in data if key not in self.fields)
            if unknown:
                raise exceptions.ValidationError(
                    {key: ["this field does not exist here"] for key in unknown}
                )
        return super().to_internal_value(data)
