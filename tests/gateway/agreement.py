"""Whether gateway replicas agree on their workers' indexes: the same digest and block count per worker."""

from __future__ import annotations

from typing import Any, Protocol


class Replica(Protocol):
    def status(self) -> dict[str, dict[str, Any]]: ...


def digests(replicas: list[Replica], urls: list[str]) -> list[dict[str, tuple[str, int]]]:
    out = []
    for gw in replicas:
        status = gw.status()
        out.append({u: (status[u]["index_digest"], status[u]["indexed_blocks"]) for u in urls})
    return out


def agreed(replicas: list[Replica], urls: list[str]) -> dict[str, tuple[str, int]] | None:
    seen = digests(replicas, urls)
    first = seen[0]
    ok = all(d == first for d in seen) and all(digest and blocks > 0 for digest, blocks in first.values())
    return first if ok else None
