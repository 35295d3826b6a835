"""The ledger's hash chain: what a record's hash covers, and the walk that finds the first broken link.

Record ``n`` stores ``prev`` (record ``n-1``'s hash; for record 1 the ledger's genesis hash) and
``hash = sha256("cacheon.ledger-record.v2" || 0x00 || canonical JSON of every column, prev
included)``. ``details`` is hashed as the exact text stored, so what is checked is what is read.
The genesis hash covers the ledger's header (a random ledger id, its creation time, its origin),
so records cannot be spliced in from another ledger and the header cannot be swapped.

What the chain detects on its own: any edited, deleted, inserted or reordered record before the
last one, an edited header, and an identity whose facts no longer hash to its digest. What it
cannot detect on its own: a tail cut off (the shorter chain is still a valid chain), the last
record edited and re-hashed, or a whole file rewritten with every hash recomputed. Those need a
head the verifier already knows: a signed checkpoint (:mod:`cacheon.evidence.checkpoint`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from cacheon.canonical import digest
from cacheon.evidence.boundary import Malformed, check_depth, convert
from cacheon.evidence.classes import EvidenceClass, Outcome
from cacheon.evidence.facts import Facts
from cacheon.printable import escape_controls
from cacheon.runtime.identity import Identity, identity_from_facts

RECORD_DOMAIN = "cacheon.ledger-record.v2"
GENESIS_DOMAIN = "cacheon.ledger-genesis.v1"


class Header(msgspec.Struct, frozen=True, array_like=True):
    """The ledger's one header row, fixed at creation (or at migration from an unchained ledger); decoded
    from the row by type, so a column of another type (a table rebuilt without STRICT) is a break."""

    ledger_id: str
    created_at: str
    origin: str  # canonical JSON: {"kind": "new"} or {"kind": "migrated", "from_schema": 1, "records": N}

    def genesis(self) -> str:
        return digest(GENESIS_DOMAIN, {"ledger": self.ledger_id, "created_at": self.created_at, "origin": self.origin})

    def origin_json(self) -> Any:
        return json.loads(self.origin)


class Row(msgspec.Struct, frozen=True, array_like=True):
    """One record row exactly as stored, decoded by type (``SELECT`` order is field order)."""

    id: int
    evidence_class: str
    subject: str
    identity_digest: str
    outcome: str
    details: str
    recorded_at: str
    supersedes: int | None
    prev_hash: str
    record_hash: str

    def computed_hash(self) -> str:
        return self.hash_linked_to(self.prev_hash)

    def hash_linked_to(self, prev_hash: str) -> str:
        """This record's hash when it follows a record (or genesis) hashing to ``prev_hash``."""
        return digest(
            RECORD_DOMAIN,
            {
                "id": self.id,
                "prev": prev_hash,
                "class": self.evidence_class,
                "subject": self.subject,
                "identity": self.identity_digest,
                "outcome": self.outcome,
                "details": self.details,
                "recorded_at": self.recorded_at,
                "supersedes": self.supersedes,
            },
        )


@dataclass(frozen=True)
class Record:
    id: int
    evidence_class: str
    subject: str
    identity_digest: str
    outcome: str
    details: dict[str, Any]
    recorded_at: str
    supersedes: int | None
    superseded_by: int | None
    hash: str = ""
    prev_hash: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "class": self.evidence_class,
            "subject": self.subject,
            "identity": self.identity_digest,
            "outcome": self.outcome,
            "details": self.details,
            "recorded_at": self.recorded_at,
            "supersedes": self.supersedes,
            "superseded_by": self.superseded_by,
            "hash": self.hash,
            "prev": self.prev_hash,
        }


@dataclass(frozen=True)
class Head:
    """The last record of a chain (``seq`` 0 and the genesis hash for an empty ledger)."""

    seq: int
    hash: str

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash}


@dataclass(frozen=True)
class Break:
    """The first broken link: the record where the walk stopped, and why."""

    record: int
    reason: str


@dataclass(frozen=True)
class ChainCheck:
    header: Header | None
    rows: int
    head: Head | None  # the last record before the first break (the head itself when intact)
    broken: Break | None
    records: tuple[Record, ...] = ()  # only when intact
    identities: Mapping[str, Identity] | None = None  # those the records use, only when intact

    @property
    def ok(self) -> bool:
        return self.broken is None

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "ledger_id": escape_controls(self.header.ledger_id) if self.header else None,
            "origin": self.header.origin_json() if self.header else None,
            "records": self.rows,
            "head": self.head.to_json() if self.head else None,
            "broken": {"record": self.broken.record, "reason": self.broken.reason} if self.broken else None,
        }


class Unreadable(Exception):
    """A stored row that does not decode into its typed struct; ``str(exc)`` is one line."""


def decode_row(raw: Sequence[Any]) -> Row:
    try:
        return msgspec.convert(list(raw), Row, strict=True)
    except msgspec.ValidationError as exc:
        where = str(raw[0]) if raw and isinstance(raw[0], int) else "?"
        raise Unreadable(f"record #{where} has a column of the wrong type ({_first(exc)})") from None


def decode_header(raw: Sequence[Any]) -> Header:
    try:
        header = msgspec.convert(list(raw), Header, strict=True)
        json.loads(header.origin)
    except (msgspec.ValidationError, ValueError, RecursionError) as exc:
        raise Unreadable(f"the ledger header does not read back ({_first(exc)})") from None
    return header


def walk(
    header: Sequence[Any] | None, rows: Iterable[Sequence[Any]], identity_facts: Iterable[Sequence[Any]]
) -> ChainCheck:
    """Check every link from the genesis to the last record; stop at the first broken one.

    Everything is decoded here, from the stored rows, into typed structs (header, rows, each
    record's details and each identity's facts, depth-bounded): a value of the wrong type or shape is
    a break of the chain at that record, so no reader ever meets one.
    """
    raw_rows = list(rows)
    if header is None:
        first = raw_rows[0][0] if raw_rows and isinstance(raw_rows[0][0], int) else 1
        return ChainCheck(None, len(raw_rows), None, Break(first, "the ledger header is missing (it was deleted)"))
    try:
        decoded = decode_header(header)
    except Unreadable as exc:
        return ChainCheck(None, len(raw_rows), None, Break(1, str(exc)))
    head = Head(0, decoded.genesis())
    facts = {str(d): f for d, f in (tuple(pair) for pair in identity_facts)}
    records: list[Record] = []
    identities: dict[str, Identity] = {}
    for raw in raw_rows:
        try:
            row = decode_row(raw)
        except Unreadable as exc:
            return ChainCheck(decoded, len(raw_rows), head, Break(head.seq + 1, str(exc)))
        problem = _link_problem(row, head) or _content_problem(row, facts, identities)
        if isinstance(problem, tuple):
            return ChainCheck(decoded, len(raw_rows), head, Break(problem[0], problem[1]))
        records.append(_record(row, problem))
        head = Head(row.id, row.record_hash)
    return ChainCheck(decoded, len(raw_rows), head, None, _with_supersession(records), identities)


def _first(exc: BaseException) -> str:
    return escape_controls(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)


def _link_problem(row: Row, head: Head) -> tuple[int, str] | None:
    expected = head.seq + 1
    if row.id != expected:
        return expected, f"record #{expected} is missing: the chain jumps from #{head.seq} to #{row.id} (deleted)"
    if row.computed_hash() != row.record_hash:
        return row.id, f"record #{row.id} does not match its hash: its content was edited"
    if row.prev_hash != head.hash:
        before = "the ledger's genesis" if head.seq == 0 else f"record #{head.seq}"
        return row.id, (
            f"record #{row.id} does not link to {before} (it names {_short(row.prev_hash)}, "
            f"{before} hashes to {_short(head.hash)}): "
            + (
                "the header was edited or the records come from another ledger"
                if head.seq == 0
                else f"#{head.seq} was rewritten, or records were reordered or inserted"
            )
        )
    return None


def _content_problem(
    row: Row, identity_facts: Mapping[str, Any], identities: dict[str, Identity]
) -> tuple[int, str] | dict[str, Any]:
    """The parts a record points to must read back as what they claim: its class and outcome known, its
    details a depth-bounded object, its identity's facts a captured identity that hashes to the digest.
    Returns the problem, or the decoded details."""
    if row.evidence_class not in _CLASSES or row.outcome not in _OUTCOMES:
        return row.id, f"record #{row.id} has an unknown evidence class or outcome (written outside cacheon)"
    try:
        details: dict[str, Any] = _decoded(row.details, dict[str, Any], f"record #{row.id} details")
    except Malformed as exc:
        return row.id, f"{exc}: unreadable details"
    if row.identity_digest in identities:
        return details
    facts_text = identity_facts.get(row.identity_digest)
    if facts_text is None:
        missing = _short(row.identity_digest)
        return row.id, f"record #{row.id} names identity {missing}, which the ledger lacks (deleted)"
    try:
        facts = _decoded(facts_text, dict[str, Any], "facts")
        convert(facts, Facts, "facts")
        identity: Identity | None = identity_from_facts(facts)
    except (Malformed, TypeError):
        identity = None
    if identity is None or identity.digest != row.identity_digest:
        return row.id, (
            f"record #{row.id}: the facts of identity {_short(row.identity_digest)} no longer hash to it, "
            "or are not a captured identity (edited)"
        )
    identities[row.identity_digest] = identity
    return details


_CLASSES = frozenset(c.value for c in EvidenceClass)
_OUTCOMES = frozenset(o.value for o in Outcome)


def _decoded(text: Any, kind: Any, what: str) -> Any:
    """Stored JSON text into ``kind``, depth-bounded; :class:`Malformed` for anything else."""
    if not isinstance(text, str):
        raise Malformed(f"{what} are not text")
    try:
        value = msgspec.json.decode(text, type=kind, strict=True)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise Malformed(f"{what} do not decode ({_first(exc)})") from None
    check_depth(value, what)
    return value


def _record(row: Row, details: dict[str, Any]) -> Record:
    return Record(
        row.id,
        row.evidence_class,
        row.subject,
        row.identity_digest,
        row.outcome,
        details,
        row.recorded_at,
        row.supersedes,
        None,
        row.record_hash,
        row.prev_hash,
    )


def _with_supersession(records: list[Record]) -> tuple[Record, ...]:
    successor = {r.supersedes: r.id for r in records if r.supersedes is not None}
    return tuple(replace(r, superseded_by=successor[r.id]) if r.id in successor else r for r in records)


def _short(value: str) -> str:
    """A stored value (a hash, a digest) quoted in a reason: cut, and escaped (a forger chose it)."""
    return escape_controls(value[:19] + "…" if len(value) > 20 else value)
