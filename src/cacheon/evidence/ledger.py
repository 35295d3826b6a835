"""The evidence ledger: one SQLite file, append-only, every write one transaction.

Why SQLite: concurrent writers from several processes (WAL + ``BEGIN IMMEDIATE``), atomic
batches that survive SIGKILL, and a file a user can copy. Append-only is enforced by the
database itself (triggers), so a correction can only ever be a new record that supersedes an
old one and keeps its class, subject and identity.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cacheon.errors import CacheonError, UsageError
from cacheon.evidence.classes import EvidenceClass, Outcome
from cacheon.runtime.identity import Identity, identity_digest, identity_from_facts

LEDGER_ENV = "CACHEON_LEDGER"
APPLICATION_ID = 0x4341434C  # "CACL": marks the file as a Cacheon ledger
BUSY_TIMEOUT_S = 60.0
_SQLITE_MAGIC = b"SQLite format 3\x00"

# _MIGRATIONS[i] takes schema version i to i + 1; statements run one by one inside one transaction.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
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
        """CREATE TRIGGER records_no_update BEFORE UPDATE ON records
            BEGIN SELECT RAISE(ABORT, 'ledger records are append-only'); END""",
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
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)


class LedgerError(CacheonError):
    """The ledger file is unusable (foreign, corrupted, too new) or a write was refused."""


@dataclass(frozen=True)
class Entry:
    """A record to append; the ledger assigns its id and time."""

    evidence_class: EvidenceClass
    subject: str
    identity: Identity
    outcome: Outcome
    details: Mapping[str, Any] = field(default_factory=dict)
    supersedes: int | None = None


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
        }


def default_ledger_path() -> Path:
    """The user's data dir (XDG on Linux, Application Support on macOS)."""
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "cacheon" / "ledger.sqlite3"


def open_ledger(explicit: str | None, *, for_write: bool) -> Ledger:
    """``--ledger`` over ``CACHEON_LEDGER`` over the default; a *named* ledger must exist to be read."""
    named = explicit or os.environ.get(LEDGER_ENV)
    path = Path(named) if named else default_ledger_path()
    return Ledger.open(path, create=for_write or not named)


class Ledger:
    """An open ledger file. Use as a context manager, or call :meth:`close`."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn

    @classmethod
    def open(cls, path: Path, *, create: bool = True) -> Ledger:
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
                ledger._check_and_migrate()
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
        """Append several records atomically: all of them are committed, or none."""
        with self._guard(), self._transaction():
            yield self._insert

    def correct(self, record_id: int, outcome: Outcome, reason: str) -> int:
        """Supersede a record with a new one (same class, subject, identity) and a stated reason."""
        old = self.record(record_id)
        entry = Entry(
            evidence_class=EvidenceClass(old.evidence_class),
            subject=old.subject,
            identity=self.identity(old.identity_digest),
            outcome=outcome,
            details={"correction": reason, "corrected_outcome": old.outcome},
            supersedes=record_id,
        )
        return self.append(entry)

    def _insert(self, entry: Entry) -> int:
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
        try:
            cursor = self._conn.execute(
                "INSERT INTO records(evidence_class, subject, identity_digest, outcome, details, "
                "recorded_at, supersedes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    entry.evidence_class.value,
                    entry.subject,
                    entry.identity.digest,
                    entry.outcome.value,
                    _dumps(dict(entry.details)),
                    now,
                    entry.supersedes,
                ),
            )
        except sqlite3.IntegrityError as exc:
            if "records.supersedes" in str(exc):
                raise LedgerError(f"record {entry.supersedes} is already superseded") from None
            raise
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    # -- reading ---------------------------------------------------------------------------

    def records(
        self,
        *,
        identity: str | None = None,
        evidence_class: EvidenceClass | None = None,
        subject: str | None = None,
    ) -> list[Record]:
        """Records in append order, optionally filtered; superseded ones included (marked)."""
        where, params = [], []
        for column, value in (
            ("r.identity_digest", identity),
            ("r.evidence_class", evidence_class.value if evidence_class else None),
            ("r.subject", subject),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.id"
        with self._guard():
            return [_record(row) for row in self._conn.execute(sql, params)]

    def record(self, record_id: int) -> Record:
        with self._guard():
            row = self._conn.execute(_SELECT + " WHERE r.id = ?", (record_id,)).fetchone()
        if row is None:
            raise UsageError(f"no record {record_id} in {self.path}")
        return _record(row)

    def identity(self, digest: str) -> Identity:
        with self._guard():
            row = self._conn.execute("SELECT facts FROM identities WHERE digest = ?", (digest,)).fetchone()
        if row is None:
            raise UsageError(f"no identity {digest} in {self.path}")
        return _identity(digest, row[0])

    def identities(self) -> list[Identity]:
        with self._guard():
            rows = self._conn.execute(
                "SELECT digest, facts FROM identities ORDER BY first_recorded"
            ).fetchall()
        return [_identity(digest, facts) for digest, facts in rows]

    def resolve_identity(self, text: str) -> str:
        """A full digest as given, or the one recorded identity that starts with ``text``."""
        wanted = text if text.startswith("sha256:") else "sha256:" + text
        if len(wanted) == 71:
            return wanted
        matches = [i.digest for i in self.identities() if i.digest.startswith(wanted)]
        if len(matches) != 1:
            problem = "no recorded identity" if not matches else f"{len(matches)} identities"
            raise UsageError(f"{problem} in {self.path} match {text!r}; give more of the digest")
        return matches[0]

    # -- plumbing --------------------------------------------------------------------------

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

    def _check_and_migrate(self) -> None:
        app_id, version = self._pragmas()
        if app_id == 0 and version == 0:
            if self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
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
            for statements in _MIGRATIONS[version:]:
                for statement in statements:
                    self._conn.execute(statement)
            self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _pragmas(self) -> tuple[int, int]:
        app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        return app_id, version


_SELECT = (
    "SELECT r.id, r.evidence_class, r.subject, r.identity_digest, r.outcome, r.details, r.recorded_at, "
    "r.supersedes, s.id FROM records r LEFT JOIN records s ON s.supersedes = r.id"
)


def _check_header(path: Path) -> None:
    with path.open("rb") as fh:
        head = fh.read(len(_SQLITE_MAGIC))
    if head and head != _SQLITE_MAGIC:
        raise LedgerError(f"{path} is not a Cacheon ledger (not an SQLite database file)")


def _record(row: tuple[Any, ...]) -> Record:
    try:
        details = json.loads(row[5])
    except ValueError:
        raise LedgerError(f"record {row[0]} has unreadable details (ledger damaged)") from None
    return Record(row[0], row[1], row[2], row[3], row[4], details, row[6], row[7], row[8])


def _identity(digest: str, facts_text: str) -> Identity:
    try:
        identity = identity_from_facts(json.loads(facts_text))
    except (ValueError, TypeError):
        raise LedgerError(f"identity {digest} has unreadable facts (ledger damaged)") from None
    if identity.digest != digest:
        raise LedgerError(f"identity {digest} no longer matches its recorded facts (ledger damaged)")
    return identity


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
