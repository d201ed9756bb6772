"""Stream the events of a Chrome/Kineto trace file (``.json`` or ``.json.gz``).

Events are decoded one at a time from a sliding text buffer and handed to the caller; the
whole file is never held as Python objects. Top-level keys other than ``traceEvents``
(``distributedInfo``, ``deviceProperties``, ...) are kept as metadata, in whatever order
they appear. A truncated or malformed file raises :class:`TraceFormatError` naming the file
and the offset (in the uncompressed text).

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "t.json"
    >>> _ = path.write_text(json.dumps({"distributedInfo": {"rank": 3},
    ...                                 "traceEvents": [{"ph": "X", "name": "a"}]}))
    >>> stream = TraceStream(path)
    >>> [e["name"] for e in stream], stream.metadata["distributedInfo"]["rank"]
    (['a'], 3)
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from neuron_mlflow.errors import NeuronMlflowError

CHUNK_CHARS = 1 << 20
_SPACE = re.compile(r"[\s]*")
_SEPARATOR = re.compile(r"\s*([,\]])\s*")
_DECODER = json.JSONDecoder()


class TraceFormatError(NeuronMlflowError, ValueError):
    """A trace file is truncated or is not a Chrome/Kineto JSON trace.

    Example:
        >>> str(TraceFormatError("t.json: truncated at offset 12"))
        't.json: truncated at offset 12'
    """


def open_trace(path: Path) -> TextIO:
    """Open ``path`` as text, decompressing ``.gz``."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


class TraceStream:
    """Iterate over the events of one trace file; ``metadata`` fills in as it is read.

    Args:
        path: a ``.json`` or ``.json.gz`` trace (an object with ``traceEvents``, or a bare
            array of events).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.metadata: dict[str, Any] = {}
        self._text = ""
        self._pos = 0
        self._base = 0
        self._eof = False
        self._file: TextIO | None = None

    # -- buffer -------------------------------------------------------------------------

    def _fill(self) -> bool:
        assert self._file is not None
        more = self._file.read(CHUNK_CHARS)
        self._base += self._pos
        self._text = self._text[self._pos :] + more
        self._pos = 0
        if not more:
            self._eof = True
        return bool(more)

    def _error(self, what: str, at: int | None = None) -> TraceFormatError:
        offset = self._base + (self._pos if at is None else at)
        return TraceFormatError(
            f"{self.path}: {what} at offset {offset} (of the uncompressed text); "
            "the file is truncated or not a Chrome/Kineto JSON trace"
        )

    def _peek(self) -> str:
        while True:
            self._pos = _SPACE.match(self._text, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._text):
                return self._text[self._pos]
            if not self._fill():
                raise self._error("unexpected end of file")

    def _expect(self, char: str) -> None:
        if self._peek() != char:
            raise self._error(f"expected {char!r}, found {self._text[self._pos]!r}")
        self._pos += 1

    def _value(self) -> Any:
        self._peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._text, self._pos)
            except json.JSONDecodeError as exc:
                if self._eof or not self._fill():
                    raise self._error(f"invalid JSON ({exc.msg})", exc.pos) from None
                continue
            if end == len(self._text) and not self._eof and not isinstance(value, dict | list):
                self._fill()  # a number or literal may continue in the next chunk
                continue
            self._pos = end
            return value

    # -- structure ----------------------------------------------------------------------

    def _events(self) -> Iterator[dict]:
        self._expect("[")
        if self._peek() == "]":
            self._pos += 1
            return
        decode, separator = _DECODER.raw_decode, _SEPARATOR.match
        while True:  # the buffer position is at the next event's first character
            try:  # fast path: decode straight from the buffer
                event, end = decode(self._text, self._pos)
            except json.JSONDecodeError:
                event = self._value()  # slow path: refills the buffer, or reports the error
                end = self._pos
            if isinstance(event, dict):
                yield event
            found = separator(self._text, end)
            if found is not None and found.end() < len(self._text):
                self._pos = found.end()
                if found.group(1) == "]":
                    return
                continue
            self._pos = end
            char = self._peek()
            self._pos += 1
            if char == "]":
                return
            if char != ",":
                raise self._error(
                    f"expected ',' or ']' between events, found {char!r}", self._pos - 1
                )

    def __iter__(self) -> Iterator[dict]:
        with open_trace(self.path) as handle:
            self._file = handle
            try:
                first = self._peek()
            except TraceFormatError:
                raise self._error("empty file") from None
            if first == "[":
                yield from self._events()
                return
            self._expect("{")
            if self._peek() == "}":
                return
            while True:
                key = self._value()
                self._expect(":")
                if key == "traceEvents":
                    yield from self._events()
                else:
                    self.metadata[str(key)] = self._value()
                char = self._peek()
                self._pos += 1
                if char == "}":
                    return
                if char != ",":
                    raise self._error(f"expected ',' or '}}', found {char!r}", self._pos - 1)
