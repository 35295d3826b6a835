"""What a forger with write access to the ledger file does: drop the triggers, edit rows with plain
SQL, and (the careful one, who has read chain.py) recompute every hash after the edit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cacheon.evidence import chain
from cacheon.evidence.ledger import _rows as rows

TRIGGERS = (
    "records_no_update",
    "records_no_delete",
    "identities_no_update",
    "identities_no_delete",
    "ledger_header_no_update",
    "ledger_header_no_delete",
)


def open_raw(path: Path) -> sqlite3.Connection:
    """A plain connection with the append-only triggers dropped (anyone who can write the file can)."""
    conn = sqlite3.connect(path, isolation_level=None)
    for name in TRIGGERS:
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
    return conn


def rehash(conn: sqlite3.Connection, *, start: int = 1, links: bool = True) -> None:
    """Recompute record hashes from ``start`` on; with ``links``, the prev links too (a consistent forgery)."""
    header = chain.Header(*conn.execute("SELECT ledger_id, created_at, origin FROM ledger_header").fetchone())
    prev = header.genesis()
    for row in rows(conn):
        if row.id >= start:
            link = prev if links else row.prev_hash
            new = row.hash_linked_to(link)
            conn.execute("UPDATE records SET prev_hash = ?, record_hash = ? WHERE id = ?", (link, new, row.id))
            prev = new
        else:
            prev = row.record_hash
