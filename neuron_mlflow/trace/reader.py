"""Stream the events of a Chrome/Kineto trace file (``.json`` or ``.json.gz``).

Chunks of text, each one's complete events decoded together by :mod:`msgspec` (docs/cli.md,
``summarize``). Top-level keys other than ``traceEvents`` are kept as metadata. A truncated
or malformed file raises :class:`TraceFormatError` naming the file and the byte offset (in
the uncompressed file); a gzip stream that ends early is read up to where it ends.

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "t.json"
    >>> _ = path.write_text(json.dumps({"distributedInfo": {"rank": 3},
    ...                                 "traceEvents": [{"ph": "X", "name": "a", "ts": 1}]}))
    >>> stream = TraceStream(path)
    >>> [e["name"] for e in stream], stream.metadata["distributedInfo"]["rank"]
    (['a'], 3)
    >>> [(e.name, e.ts, e.dur) for e in TraceStream(path, typed=True)]
    [('a', 1.0, 0.0)]
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import msgspec

from neuron_mlflow.errors import TraceFormatError

CHUNK_CHARS = 1 << 20
_SPACE = re.compile(r"[\s]*")
_NEXT_EVENT = re.compile(r"\s*,\s*\{")
_DECODER = json.JSONDecoder()


_BAD_TRACE = "the file is truncated or not a Chrome/Kineto JSON trace"
"""The end of a format error's message, unless a more precise hint replaces it."""

NO_RAW = msgspec.Raw(b"")
"""An absent raw field (falsy)."""


class EventArgs(msgspec.Struct):
    """The ``args`` fields the trace engine reads (``external id``: PyTorch <= 1.9); inputs
    are kept as raw JSON text, decoded only for the few distinct shapes."""

    correlation: int | None = None
    external_id: int | None = msgspec.field(name="External id", default=None)
    legacy_external_id: int | None = msgspec.field(name="external id", default=None)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=NO_RAW)
    concrete_inputs: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=NO_RAW)
    total_allocated: float | None = msgspec.field(name="Total Allocated", default=None)
    device_type: int | None = msgspec.field(name="Device Type", default=None)


class TraceEvent(msgspec.Struct):
    """The fields of one trace event that the trace engine reads; the rest is skipped.

    Example:
        >>> msgspec.json.decode(b'{"ph": "X", "ts": 5, "pid": "Spans", "x": 1}', type=TraceEvent)
        TraceEvent(ph='X', cat='', name='', pid='Spans', tid=None, ts=5.0, dur=0.0, args=None)
    """

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Any = None
    tid: Any = None
    ts: float = 0.0
    dur: float = 0.0
    args: EventArgs | None = None


_TYPED = msgspec.json.Decoder(list[TraceEvent])
_UNTYPED = msgspec.json.Decoder(list[Any])


def open_trace(path: Path) -> TextIO:
    """Open ``path`` as text, decompressing ``.gz``."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _utf8_length(text: str) -> int:
    """Length of ``text`` in UTF-8 bytes (no copy for ASCII, the usual case)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _to_event(value: Any) -> TraceEvent | None:
    """One event as a :class:`TraceEvent`, with lenient coercion; ``None`` if it has none."""
    if not isinstance(value, dict):
        return None
    args = value.get("args")
    args = args if isinstance(args, dict) else {}
    correlation = args.get("correlation")
    external, legacy = args.get("External id"), args.get("external id")
    raw = {
        key: msgspec.Raw(msgspec.json.encode(args[key])) if key in args else NO_RAW
        for key in ("Input Dims", "Concrete Inputs")
    }
    allocated, device = args.get("Total Allocated"), args.get("Device Type")
    try:
        return TraceEvent(
            ph=str(value.get("ph", "")),
            cat=str(value.get("cat", "")),
            name=str(value.get("name", "")),
            pid=value.get("pid"),
            tid=value.get("tid"),
            ts=float(value.get("ts", 0.0)),
            dur=float(value.get("dur", 0.0)),
            args=EventArgs(
                correlation if isinstance(correlation, int) else None,
                external if isinstance(external, int) else None,
                legacy if isinstance(legacy, int) else None,
                raw["Input Dims"],
                raw["Concrete Inputs"],
                float(allocated) if isinstance(allocated, int | float) else None,
                device if isinstance(device, int) else None,
            ),
        )
    except (TypeError, ValueError):  # a time that is not a number: not an event we can use
        return None


class TraceStream:
    """Iterate over the events of one trace file; ``metadata`` fills in as it is read.

    Args:
        path: a ``.json`` or ``.json.gz`` trace (an object with ``traceEvents``, or a bare
            array of events).
        typed: yield :class:`TraceEvent` structs (faster, smaller) instead of dicts. Events
            whose times are not numbers are skipped in this mode.
    """

    def __init__(self, path: str | Path, typed: bool = False) -> None:
        self.path = Path(path)
        self.typed = typed
        self.metadata: dict[str, Any] = {}
        self._text = ""
        self._pos = 0
        self._base = 0  # bytes of the uncompressed file before the buffer
        self._chars = 0  # characters before the buffer
        self._eof = False
        self._file: io.BufferedIOBase | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._failure: tuple[str, str] | None = None  # why the data ended early, and a hint

    # -- buffer -------------------------------------------------------------------------

    def _read(self) -> str:
        """The next piece of text (up to about ``CHUNK_CHARS`` bytes); "" at the end.

        ``read1`` keeps what a gzip stream gave before it broke off: :meth:`_fill` raises the
        failure once that text is used up, at the offset the data reached.
        """
        assert self._file is not None
        while True:
            pieces: list[bytes] = []
            size = 0
            if self._failure is None:
                try:
                    while size < CHUNK_CHARS:
                        piece = self._file.read1(CHUNK_CHARS - size)
                        if not piece:
                            break
                        pieces.append(piece)
                        size += len(piece)
                except EOFError:  # the gzip stream ends before its end-of-stream marker
                    self._failure = (
                        "truncated file: its compressed (gzip) stream ends early, cutting the "
                        "data off",
                        "the trace is incomplete (written or copied only in part?)",
                    )
                except (OSError, zlib.error) as exc:  # corrupt gzip data
                    self._failure = (f"unreadable data ({type(exc).__name__}: {exc})", _BAD_TRACE)
            try:
                # final only at a clean end: a character cut off by a failure is no error
                text = self._decoder.decode(b"".join(pieces), final=not (pieces or self._failure))
            except UnicodeDecodeError as exc:
                raise self._error(f"unreadable data ({type(exc).__name__}: {exc})") from None
            if text or not pieces:
                return text

    def _fill(self) -> bool:
        more = self._read()
        self._base += _utf8_length(self._text[: self._pos])
        self._chars += self._pos
        self._text = self._text[self._pos :] + more
        self._pos = 0
        if not more:
            if self._failure is not None:  # at the offset where the data stops
                what, hint = self._failure
                raise self._error(what, len(self._text), hint)
            self._eof = True
        return bool(more)

    def _error(self, what: str, at: int | None = None, hint: str = "") -> TraceFormatError:
        offset = self._base + _utf8_length(self._text[: self._pos if at is None else at])
        return TraceFormatError(
            f"{self.path}: {what} at byte offset {offset} (of the uncompressed file); "
            f"{hint or _BAD_TRACE}"
        )

    def _peek(self, at_end: str = "unexpected end of file") -> str:
        """The next character that is not white space; ``at_end`` names a clean end."""
        while True:
            self._pos = _SPACE.match(self._text, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._text):
                return self._text[self._pos]
            if not self._fill():
                raise self._error(at_end)

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

    def _last_boundary(self) -> int:
        """End of the last ``}`` in the buffer that is followed by ``, {``; -1 if none.

        A cut there is only a guess (a ``}, {`` may sit inside an event); decoding the
        batch checks it: a wrong cut cannot decode as a list of complete values.
        """
        text, end = self._text, len(self._text)
        while True:
            end = text.rfind("}", self._pos, end)
            if end < 0:
                return -1
            if _NEXT_EVENT.match(text, end + 1):
                return end + 1

    def _batches(self) -> Iterator[list[Any]]:
        """Lists of events decoded together; falls back to one at a time where needed."""
        decoder = _TYPED if self.typed else _UNTYPED
        self._expect("[")
        if self._peek() == "]":
            self._pos += 1
            return
        slow_until = -1  # one event at a time until the buffer passes this offset
        while True:  # the buffer position is at the next event's first character
            if self._chars + self._pos >= slow_until:
                more = not (self._eof or self._failure)  # a failure waits for the slow path
                if more and len(self._text) - self._pos < CHUNK_CHARS // 2:
                    self._fill()
                cut = self._last_boundary()
                if cut > 0:
                    try:
                        batch = decoder.decode("[" + self._text[self._pos : cut] + "]")
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        slow_until = self._chars + cut  # a wrong guess, or odd values
                    else:
                        yield batch
                        next_event = _NEXT_EVENT.match(self._text, cut)
                        self._pos = next_event.end() - 1  # type: ignore[union-attr]
                        continue
                elif not self._eof and self._fill():
                    continue
            event = self._value()  # slow path: one event, or the error with its offset
            yield [_to_event(event) if self.typed else event]
            char = self._peek()
            self._pos += 1
            if char == "]":
                return
            if char != ",":
                raise self._error(
                    f"expected ',' or ']' between events, found {char!r}", self._pos - 1
                )

    def __iter__(self) -> Iterator[Any]:
        for batch in self.batches():
            for event in batch:
                if event is not None and (self.typed or isinstance(event, dict)):
                    yield event

    def batches(self) -> Iterator[list[Any]]:
        """The events in lists as decoded (the fastest way through a file).

        In typed mode an entry is ``None`` where an event's times are not numbers.
        """
        gzipped = self.path.suffix == ".gz"
        with gzip.open(self.path, "rb") if gzipped else self.path.open("rb") as handle:
            self._file = handle
            first = self._peek("empty file")  # a broken file keeps its own reason
            if first == "[":
                yield from self._batches()
                return
            self._expect("{")
            if self._peek() == "}":
                return
            while True:
                key = self._value()
                self._expect(":")
                if key == "traceEvents":
                    yield from self._batches()
                else:
                    self.metadata[str(key)] = self._value()
                char = self._peek()
                self._pos += 1
                if char == "}":
                    return
                if char != ",":
                    raise self._error(f"expected ',' or '}}', found {char!r}", self._pos - 1)
