"""The evidence ledger: one SQLite file, append-only, hash-chained, every write one transaction.

Why SQLite: concurrent writers from several processes (WAL + ``BEGIN IMMEDIATE``), atomic
batches that survive SIGKILL, and a file a user can copy. Triggers refuse updates and deletes,
so a correction can only ever be a new record that supersedes an old one and keeps its class,
subject and identity. Triggers stop mistakes, not adversaries (anyone who can write the file can
drop them), so every record also carries the hash of the one before it (:mod:`.chain`): every
read walks the chain first and refuses a broken one, and a ledger is only ever extended from a
verified head.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from cacheon.canonical import canonical_json
from cacheon.errors import CacheonError
from cacheon.evidence import chain
from cacheon.evidence.assurance import Contradicted, assess
from cacheon.evidence.boundary import Malformed, open_regular
from cacheon.evidence.chain import ChainCheck, Head, Header, Record, Row
from cacheon.evidence.classes import EvidenceClass, Outcome
from cacheon.evidence.view import VerifiedLedger
from cacheon.printable import escape_controls
from cacheon.runtime.identity import Identity, identity_digest

__all__ = [
    "APPLICATION_ID",
    "LEDGER_ENV",
    "SCHEMA_VERSION",
    "Entry",
    "Ledger",
    "LedgerError",
    "LedgerTampered",
    "Record",
    "VerifiedLedger",
    "default_ledger_path",
    "open_ledger",
    "open_verified_ledger",
]

LEDGER_ENV = "CACHEON_LEDGER"
APPLICATION_ID = 0x4341434C  # "CACL": marks the file as a Cacheon ledger
BUSY_TIMEOUT_S = 60.0
_SQLITE_MAGIC = b"SQLite format 3\x00"
_CHAINED_SCHEMA = 2  # the first schema with a hash chain

_NO_UPDATE_RECORDS = """CREATE TRIGGER records_no_update BEFORE UPDATE ON records
    BEGIN SELECT RAISE(ABORT, 'ledger records are append-only'); END"""
_V1 = (
    """CREATE TABLE identities (
        digest TEXT PRIMARY KEY,
        facts TEXT NOT NULL,
        first_recorded TEXT NOT NULL
    ) STRICT""",
    """CREATE TABLE records (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        evidence_class TEXT NOT NULL,
        subject TEXT NOT NULL,
        identity_digest TEXT NOT NULL REFERENCES identities(digest),
        outcome TEXT NOT NULL CHECK (outcome IN ('pass', 'fail', 'blocked', 'not_run')),
        details TEXT NOT NULL,
        recorded_at TEXT NOT NULL,
        supersedes INTEGER UNIQUE REFERENCES records(id)
    ) STRICT""",
    "CREATE INDEX records_by_identity ON records(identity_digest, evidence_class, subject)",
    _NO_UPDATE_RECORDS,
    """CREATE TRIGGER records_no_delete BEFORE DELETE ON records
        BEGIN SELECT RAISE(ABORT, 'ledger records are append-only'); END""",
    """CREATE TRIGGER identities_no_update BEFORE UPDATE ON identities
        BEGIN SELECT RAISE(ABORT, 'ledger identities are append-only'); END""",
    """CREATE TRIGGER identities_no_delete BEFORE DELETE ON identities
        BEGIN SELECT RAISE(ABORT, 'ledger identities are append-only'); END""",
    """CREATE TRIGGER records_correction_keeps_claim BEFORE INSERT ON records
        WHEN NEW.supersedes IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM records r WHERE r.id = NEW.supersedes
            AND r.evidence_class = NEW.evidence_class AND r.subject = NEW.subject
            AND r.identity_digest = NEW.identity_digest)
        BEGIN SELECT RAISE(ABORT, 'a correction must keep class, subject and identity'); END""",
)


def _create_v1(conn: sqlite3.Connection) -> None:
    for statement in _V1:
        conn.execute(statement)


def _chain_v1(conn: sqlite3.Connection) -> None:
    """v1 -> v2: a header, and prev/hash columns filled by chaining the records as they are now."""
    rows = conn.execute("SELECT id FROM records ORDER BY id").fetchall()
    for position, (record_id,) in enumerate(rows, start=1):
        if record_id != position:
            raise LedgerError(
                f"record #{position} is missing from this unchained ledger (it was deleted): "
                "migrating would vouch for a damaged history; keep the file as it is and start a new ledger"
            )
    origin = {"kind": "migrated", "from_schema": 1, "records": len(rows)} if rows else {"kind": "new"}
    for statement in (
        """CREATE TABLE ledger_header (
            singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
            ledger_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            origin TEXT NOT NULL
        ) STRICT""",
        """CREATE TRIGGER ledger_header_no_update BEFORE UPDATE ON ledger_header
            BEGIN SELECT RAISE(ABORT, 'the ledger header is immutable'); END""",
        """CREATE TRIGGER ledger_header_no_delete BEFORE DELETE ON ledger_header
            BEGIN SELECT RAISE(ABORT, 'the ledger header is immutable'); END""",
        "ALTER TABLE records ADD COLUMN prev_hash TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE records ADD COLUMN record_hash TEXT NOT NULL DEFAULT ''",
        "DROP TRIGGER records_no_update",  # the one update this ledger ever makes: filling the chain
    ):
        conn.execute(statement)
    header = Header(secrets.token_hex(16), _now(), canonical_json(origin).decode("utf-8"))
    conn.execute(
        "INSERT INTO ledger_header(singleton, ledger_id, created_at, origin) VALUES (1, ?, ?, ?)",
        (header.ledger_id, header.created_at, header.origin),
    )
    prev = header.genesis()
    for row in _rows(conn):
        filled = row.hash_linked_to(prev)
        conn.execute("UPDATE records SET prev_hash = ?, record_hash = ? WHERE id = ?", (prev, filled, row.id))
        prev = filled
    conn.execute(_NO_UPDATE_RECORDS)
    broken = _walk(conn).broken
    if broken is not None:  # e.g. an identity whose facts were edited: chaining would bless it
        raise LedgerError(f"cannot migrate: {broken.reason}; keep the file as it is and start a new ledger")


# _MIGRATIONS[i] takes schema version i to i + 1, all of them inside one transaction.
_MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_create_v1, _chain_v1)
SCHEMA_VERSION = len(_MIGRATIONS)


class LedgerError(CacheonError):
    """The ledger file is unusable (foreign, corrupted, too new, unmigrated) or a write was refused."""


class LedgerTampered(CacheonError):
    """The hash chain is broken: the ledger was altered outside cacheon. Checked and failed: exit 2."""

    exit_code = 2


@dataclass(frozen=True)
class Entry:
    """A record to append; the ledger assigns its id, time and hashes."""

    evidence_class: EvidenceClass
    subject: str
    identity: Identity
    outcome: Outcome
    details: Mapping[str, Any] = field(default_factory=dict)
    supersedes: int | None = None


def default_ledger_path() -> Path:
    """The user's data dir (XDG on Linux, Application Support on macOS)."""
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "cacheon" / "ledger.sqlite3"


def resolve_ledger_path(explicit: str | None) -> tuple[Path, bool]:
    """``--ledger`` over ``CACHEON_LEDGER`` over the default; also whether the path was named."""
    named = explicit or os.environ.get(LEDGER_ENV)
    return (Path(named), True) if named else (default_ledger_path(), False)


def open_ledger(explicit: str | None, *, for_write: bool) -> Ledger:
    """The ledger for writing (or for a check that reports rather than refuses); a *named* ledger
    must exist to be read."""
    path, named = resolve_ledger_path(explicit)
    return Ledger.open(path, create=for_write or not named)


def open_verified_ledger(explicit: str | Path | None) -> VerifiedLedger:
    """The one way to read the ledger: open it, walk its hash chain, and return the verified records.

    A broken chain raises :class:`LedgerTampered` (exit 2) naming the first broken record, and
    nothing of the ledger is returned; so does a checkpoint beside the ledger that the ledger
    contradicts (:mod:`.assurance`). The view says which guarantee the read got. A default ledger
    that does not exist yet reads as empty.
    """
    with open_ledger(str(explicit) if explicit is not None else None, for_write=False) as ledger:
        view = ledger.verified()
    try:
        return replace(view, assurance=assess(view))
    except Contradicted as exc:
        raise LedgerTampered(f"ledger {escape_controls(str(view.path))} is not the ledger its checkpoint "
                             f"vouches for: {exc}; nothing was read") from None


class Ledger:
    """An open ledger file. Use as a context manager, or call :meth:`close`."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn

    @classmethod
    def open(cls, path: Path, *, create: bool = True, migrate: bool = False) -> Ledger:
        """Open (creating if allowed); ``migrate`` chains an unchained v1 ledger's records as they are."""
        path = Path(path)
        if path.is_dir():
            raise LedgerError(f"{path} is a directory, not a ledger file")
        if path.exists():
            _check_header(path)
        elif not create:
            raise LedgerError(f"no ledger at {path}")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        ledger = cls(path, conn)
        try:
            with ledger._guard():
                conn.execute("PRAGMA foreign_keys = ON")
                ledger._check_and_migrate(migrate)
        except BaseException:
            conn.close()
            raise
        return ledger

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------

    def append(self, entry: Entry) -> int:
        """Append one record in its own transaction; returns its id."""
        with self.batch() as add:
            return add(entry)

    @contextmanager
    def batch(self) -> Iterator[Callable[[Entry], int]]:
        """Append several records atomically: all of them are committed, or none.

        The chain is walked under the write lock first: a record is only ever linked to a
        verified head, so a writer never extends (and so seems to vouch for) a tampered ledger.
        """
        with self._guard(), self._transaction():
            head = [self._verify_in_transaction().head]

            def add(entry: Entry) -> int:
                head[0] = self._insert(entry, head[0])
                return head[0].seq

            yield add

    def correct(self, record_id: int, outcome: Outcome, reason: str) -> int:
        """Supersede a record with a new one (same class, subject, identity) and a stated reason."""
        with self._guard(), self._transaction():
            view = self._verify_in_transaction()
            old = view.record(record_id)
            entry = Entry(
                evidence_class=EvidenceClass(old.evidence_class),
                subject=old.subject,
                identity=view.identity(old.identity_digest),
                outcome=outcome,
                details={"correction": reason, "corrected_outcome": old.outcome},
                supersedes=record_id,
            )
            return self._insert(entry, view.head).seq

    def _insert(self, entry: Entry, head: Head) -> Head:
        if not isinstance(entry.evidence_class, EvidenceClass) or not isinstance(entry.outcome, Outcome):
            raise TypeError("Entry.evidence_class and Entry.outcome must be EvidenceClass and Outcome")
        if ":" not in entry.subject:
            raise ValueError(f"subject {entry.subject!r} must be '<kind>:<name>'")
        if identity_digest(entry.identity.facts) != entry.identity.digest:
            raise LedgerError(f"identity {entry.identity.digest} does not match its facts")
        now = _now()
        self._conn.execute(
            "INSERT OR IGNORE INTO identities(digest, facts, first_recorded) VALUES (?, ?, ?)",
            (entry.identity.digest, _dumps(entry.identity.facts), now),
        )
        row = Row(
            id=head.seq + 1,
            evidence_class=entry.evidence_class.value,
            subject=entry.subject,
            identity_digest=entry.identity.digest,
            outcome=entry.outcome.value,
            details=_dumps(dict(entry.details)),
            recorded_at=now,
            supersedes=entry.supersedes,
            prev_hash=head.hash,
            record_hash="",
        )
        row = msgspec.structs.replace(row, record_hash=row.computed_hash())
        try:
            self._conn.execute(
                f"INSERT INTO records({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                msgspec.structs.astuple(row),
            )
        except sqlite3.IntegrityError as exc:
            if "records.supersedes" in str(exc):
                raise LedgerError(f"record {entry.supersedes} is already superseded") from None
            raise
        return Head(row.id, row.record_hash)

    # -- checking --------------------------------------------------------------------------

    def check(self) -> ChainCheck:
        """Walk the chain in one read snapshot and report (never raises for a broken chain)."""
        with self._guard(), self._snapshot():
            return self._walk()

    def verified(self) -> VerifiedLedger:
        """The verified records, or :class:`LedgerTampered` naming the first broken link."""
        with self._guard(), self._snapshot():
            return self._verify_in_transaction()

    def _verify_in_transaction(self) -> VerifiedLedger:
        check = self._walk()
        if check.broken is not None:
            raise LedgerTampered(
                f"ledger {self.path} is tampered: {check.broken.reason}; nothing was read "
                "(`cacheon evidence verify` shows the check)"
            )
        return VerifiedLedger.from_check(self.path, check)

    def _walk(self) -> ChainCheck:
        return _walk(self._conn)

    # -- plumbing --------------------------------------------------------------------------

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """One read transaction: every SELECT inside sees the same committed state."""
        self._conn.execute("BEGIN")
        try:
            yield
        finally:
            self._conn.execute("COMMIT")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._conn.execute("BEGIN IMMEDIATE")  # take the write lock now: no upgrade deadlocks
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn SQLite's errors into one-line ledger errors that name the file."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            text = str(exc)
            if "malformed" in text or "not a database" in text:
                raise LedgerError(f"ledger {self.path} is corrupted ({text})") from None
            raise LedgerError(f"ledger {self.path}: {text}") from None

    def _check_and_migrate(self, migrate: bool) -> None:
        with self._snapshot():  # one read: a writer creating the schema meanwhile is seen whole or not at all
            app_id, version = self._pragmas()
            tables = self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if (app_id, version) == (0, 0):
            if tables:
                raise LedgerError(f"{self.path} is an SQLite database but not a Cacheon ledger")
        elif app_id != APPLICATION_ID:
            raise LedgerError(
                f"{self.path} is an SQLite database but not a Cacheon ledger (application_id {app_id:#x})"
            )
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"ledger {self.path} has schema v{version}, newer than this cacheon "
                f"supports (v{SCHEMA_VERSION}); upgrade cacheon"
            )
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = FULL")
        if version == SCHEMA_VERSION:
            return
        with self._transaction():
            _, version = self._pragmas()  # another process may have migrated meanwhile
            if 0 < version < _CHAINED_SCHEMA and not migrate:
                count = self._conn.execute("SELECT count(*) FROM records").fetchone()[0]
                if count:
                    raise LedgerError(
                        f"ledger {self.path} has schema v{version}, without a hash chain: run "
                        f"`cacheon evidence migrate --ledger {self.path}` to chain its {count} records "
                        "(it vouches for them as they are now)"
                    )
            for step in _MIGRATIONS[version:]:
                step(self._conn)
            self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _pragmas(self) -> tuple[int, int]:
        app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        return int(app_id), int(version)


_COLUMNS = Row.__struct_fields__  # the stored columns, in Row's order
_SELECT_ROWS = f"SELECT {', '.join(_COLUMNS)} FROM records ORDER BY id"


def _walk(conn: sqlite3.Connection) -> ChainCheck:
    """The chain as stored: the walk decodes every row itself (what is checked is what is read)."""
    header = conn.execute("SELECT ledger_id, created_at, origin FROM ledger_header").fetchone()
    facts = conn.execute("SELECT digest, facts FROM identities").fetchall()
    return chain.walk(header, conn.execute(_SELECT_ROWS).fetchall(), facts)


def _rows(conn: sqlite3.Connection) -> list[Row]:
    """The rows decoded by type (for migration); a row that does not decode is refused."""
    try:
        return [chain.decode_row(raw) for raw in conn.execute(_SELECT_ROWS)]
    except chain.Unreadable as exc:
        raise LedgerError(f"cannot migrate: {exc}; keep the file as it is and start a new ledger") from None


def _check_header(path: Path) -> None:
    """The file is a regular file that starts as SQLite does (opened non-blocking: a FIFO is refused). A
    ledger may be a link to its file, as SQLite follows one: the file it names is what is checked."""
    try:
        with os.fdopen(open_regular(path.resolve()), "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except Malformed as exc:
        raise LedgerError(f"ledger {escape_controls(str(path))}: {exc}") from None
    if head and head != _SQLITE_MAGIC:
        raise LedgerError(f"{path} is not a Cacheon ledger (not an SQLite database file)")


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
