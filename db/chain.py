"""The hash chain's format: the canonical encoding of an event, the link hash, and the export file.

Pure Python and no database, so that `review-queue audit verify --file` runs anywhere and so that
docs/audit.md can specify the same bytes for someone writing their own verifier:

    hash(0)   = 32 zero bytes
    hash(seq) = sha256(hash(seq - 1) || canonical(event sealed at seq))

canonical(event) is the ASCII JSON object with exactly the keys actor, at, details, event, id,
item_id, lease_epoch, trace_id; keys sorted, no whitespace, every non-ASCII character escaped;
`at` as UTC to the microsecond ("2026-12-03T09:30:00.123456Z"); UUIDs lowercase with hyphens;
numbers inside details exactly as PostgreSQL's jsonb prints them (no exponent, trailing zeros kept).
"""

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

GENESIS = bytes(32)
_DUMPS: dict[str, Any] = {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": True}


def _encode(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + _encode(value[k]) for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    if isinstance(value, Decimal):
        # jsonb keeps a number's digits ("1.10" stays "1.10"); a float would not, and Decimal's
        # str() would write 1E-7 where jsonb writes 0.0000001.
        return format(value, "f")
    return json.dumps(value, ensure_ascii=True)


def canonical_json(value: Any) -> str:
    """Canonical JSON of a value parsed with parse_float=Decimal."""
    return _encode(value)


class _Fraction(Exception):
    pass


def _refuse_fraction(_: str) -> Decimal:
    raise _Fraction


# Module-level and C-accelerated: the verifier encodes a million details in seconds.
_FAST_DECODE = json.JSONDecoder(parse_float=_refuse_fraction).decode
_FAST_ENCODE = json.JSONEncoder(**_DUMPS).encode
_DECIMAL_DECODE = json.JSONDecoder(parse_float=Decimal).decode
_string = json.encoder.encode_basestring_ascii


def canonical_details(jsonb_text: str) -> str:
    """Canonical JSON of details, from jsonb's own text output (`details::text`)."""
    try:
        # The service's own details hold only strings and integers: the fast path.
        return str(_FAST_ENCODE(_FAST_DECODE(jsonb_text)))
    except _Fraction:
        return _encode(_DECIMAL_DECODE(jsonb_text))


@dataclass(frozen=True, slots=True)
class EventFields:
    """An event as the chain sees it; `at` already formatted, details already canonical."""

    id: int
    item_id: str
    event: str
    actor: str
    at: str
    lease_epoch: int
    trace_id: str
    details: str

    def canonical(self) -> bytes:
        return (
            f'{{"actor":{_string(self.actor)},"at":"{self.at}","details":{self.details},'
            f'"event":{_string(self.event)},"id":{self.id},"item_id":"{self.item_id}",'
            f'"lease_epoch":{self.lease_epoch},"trace_id":"{self.trace_id}"}}'
        ).encode("ascii")


def link(previous: bytes, event: EventFields) -> bytes:
    return hashlib.sha256(previous + event.canonical()).digest()


def parse_head(text: str) -> tuple[int, bytes]:
    """`SEQ:HASH` as `review-queue audit head` prints it."""
    seq, _, digest = text.strip().partition(":")
    try:
        value = bytes.fromhex(digest)
        number = int(seq)
    except ValueError:
        raise ValueError(f"not SEQ:HASH: {text!r}") from None
    if len(value) != 32 or number < 0:
        raise ValueError(f"not SEQ:HASH (sha256, 64 hex digits): {text!r}")
    return number, value


def format_head(seq: int, digest: bytes) -> str:
    return f"{seq}:{digest.hex()}"


# ---------------------------------------------------------------------------------------------
# Export lines: one canonical JSON object per event, in chain order.
# ---------------------------------------------------------------------------------------------


def export_line(seq: int, previous: bytes, digest: bytes, event: EventFields) -> bytes:
    """{"event":{...canonical...},"hash":hex,"prev_hash":hex,"seq":n} and a newline: each line
    carries the link into it, so any range verifies on its own."""
    return (
        b'{"event":'
        + event.canonical()
        + f',"hash":"{digest.hex()}","prev_hash":"{previous.hex()}","seq":{seq}}}\n'.encode("ascii")
    )


@dataclass(frozen=True, slots=True)
class Break:
    seq: int
    kind: str  # modified, missing, inserted, out of order, rewritten, malformed, archived
    detail: str

    def __str__(self) -> str:
        return f"seq {self.seq}: {self.kind}: {self.detail}"


@dataclass(frozen=True, slots=True)
class FileResult:
    first_seq: int | None
    last_seq: int | None
    last_hash: bytes | None
    events: int
    broken: Break | None
    first_prev: bytes | None = None  # what the first line links to (32 zeros at seq 1)


def _event_of(obj: Any) -> EventFields:
    ev = obj["event"]
    if not isinstance(ev, dict) or set(ev) != {
        "actor", "at", "details", "event", "id", "item_id", "lease_epoch", "trace_id"
    }:  # fmt: skip
        raise ValueError("event fields")
    return EventFields(
        id=ev["id"],
        item_id=ev["item_id"],
        event=ev["event"],
        actor=ev["actor"],
        at=ev["at"],
        lease_epoch=ev["lease_epoch"],
        trace_id=ev["trace_id"],
        details=canonical_json(ev["details"]),
    )


def verify_lines(lines: Iterable[bytes], *, against: tuple[int, bytes] | None = None) -> FileResult:
    """Verify an export on its own: every line's hash from its prev_hash and event, every
    prev_hash the hash of the line before, seqs consecutive; from seq 1, prev_hash is 32 zeros."""
    first = last = None
    previous: bytes | None = None
    first_prev: bytes | None = None
    count = 0

    def result(broken: Break | None) -> FileResult:
        return FileResult(first, last, previous, count, broken, first_prev)

    for number, raw in enumerate(lines, start=1):
        seq_guess = last + 1 if last is not None else 0
        try:
            obj = json.loads(raw, parse_float=Decimal)
            seq, prev_hash, digest = obj["seq"], bytes.fromhex(obj["prev_hash"]), bytes.fromhex(obj["hash"])
            event = _event_of(obj)
            if not isinstance(seq, int) or isinstance(seq, bool) or len(digest) != 32 or len(prev_hash) != 32:
                raise ValueError("seq or hash")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
            # RecursionError: a line nested deeper than the parser or the encoder goes.
            why = "nested too deep" if isinstance(error, RecursionError) else error
            return result(Break(seq_guess, "malformed", f"line {number} is not an export line ({why})"))
        if last is None:
            first, first_prev = seq, prev_hash
            if seq == 1 and prev_hash != GENESIS:
                return result(Break(seq, "modified", "seq 1 must link to 32 zero bytes"))
        elif seq != last + 1:
            kind = "missing" if seq > last + 1 else "out of order"
            return result(Break(last + 1, kind, f"line {number} has seq {seq} after seq {last}"))
        elif prev_hash != previous:
            return result(Break(seq, "modified", "prev_hash is not the previous line's hash"))
        if link(prev_hash, event) != digest:
            return result(Break(seq, "modified", f"event {event.id} does not hash to the line's hash"))
        if export_line(seq, prev_hash, digest, event) != raw:
            # Same values, other bytes (an escape or a hex digit in another case): an export is
            # canonical byte for byte, so any change to it is visible.
            return result(Break(seq, "modified", f"line {number} is not in canonical form"))
        last, previous, count = seq, digest, count + 1
        if against is not None and seq == against[0] and digest != against[1]:
            return result(Break(seq, "rewritten", f"hash {digest.hex()} is not the stored head's"))
    if against is not None and (last is None or last < against[0] or (first or 0) > against[0]):
        return result(Break(against[0], "missing", "the stored head's seq is not in the file"))
    return result(None)


def iter_file(path: str) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        yield from handle
