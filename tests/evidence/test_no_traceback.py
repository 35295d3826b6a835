"""The design-level guard of issue 23: for any input, the evidence package answers or refuses with its
one-line error, never an exception of another kind. Hypothesis writes the hostile inputs: stored rows
of any SQLite type with any details and facts (what a forger who rebuilt the tables can store),
release predicates with any field replaced by any JSON, and any bytes as an envelope or checkpoint."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cacheon.canonical import digest
from cacheon.evidence import chain, checkpoint, dsse
from cacheon.evidence.boundary import Malformed, decode_json
from cacheon.evidence.descriptor import RELEASE_DOMAIN, problems, release_digest
from cacheon.evidence.gates import evaluate
from cacheon.evidence.promotion import validated_contracts
from cacheon.evidence.sbom import MEDIA_TYPE as SBOM_MEDIA_TYPE
from cacheon.evidence.standing import standing
from cacheon.evidence.state import state_of_record
from cacheon.evidence.view import VerifiedLedger
from cacheon.runtime.identity import identity_digest, summary

from ._releases import IMAGE_DIGEST, REVISION
from .conftest import make_identity

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
SQL_VALUE = st.none() | st.integers(-2, 2**63 - 1) | st.floats() | st.text(max_size=8) | st.binary(max_size=8)
HEADER = ("0" * 32, "2026-01-01T00:00:00.000000Z", '{"kind":"new"}')
GOOD = make_identity("0.5.13.post1", gpus=1)


def _details_text() -> st.SearchStrategy[Any]:
    return JSON.map(lambda v: json.dumps(v)) | st.text(max_size=12) | SQL_VALUE


def _rows(draw: st.DrawFn) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Rows chained correctly (so the walk reaches the content checks), with hostile columns mixed in."""
    facts_value = draw(st.sampled_from(["good", "mutated", "json", "raw"]))
    if facts_value in ("good", "mutated"):
        value = copy.deepcopy(GOOD.facts)
        if facts_value == "mutated":  # one fact of a captured identity replaced by any JSON: a forger's facts
            _replace(value, draw(st.sampled_from(FACT_PATHS)), draw(JSON))
    else:
        value = draw(JSON)
    facts = json.dumps(value)
    try:
        digest_ = identity_digest(value)  # the forger hashes them right
    except TypeError:
        digest_ = "sha256:" + "0" * 64
    if facts_value == "raw":
        facts, digest_ = draw(SQL_VALUE), draw(SQL_VALUE)
    prev = chain.Header(*HEADER).genesis()
    rows = []
    for index in range(1, draw(st.integers(1, 3)) + 1):
        hostile = draw(st.booleans())  # else only the facts are hostile, so the readers run on them
        values = [index, draw(SQL_VALUE) if hostile else "component", "bundle:x", digest_,
                  draw(st.sampled_from(["pass", "x"]) | SQL_VALUE) if hostile else "pass",
                  draw(_details_text()) if hostile else '{"exit_code":0}', "2026-01-01T00:00:00Z", None]
        try:
            record_hash = chain.Row(*values, prev, "").hash_linked_to(prev)  # type: ignore[arg-type]
        except TypeError:
            record_hash = "sha256:" + "0" * 64
        rows.append((*values, prev, record_hash))
        prev = record_hash
    return rows, [(digest_, facts)]


@st.composite
def ledgers(draw: st.DrawFn) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return _rows(draw)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledgers())
def test_any_stored_rows_are_walked_and_read_without_an_exception(stored: tuple[list[Any], list[Any]]) -> None:
    rows, facts = stored
    check = chain.walk(HEADER, rows, facts)
    json.dumps(check.to_json())
    if not check.ok:
        return
    view = VerifiedLedger.from_check(Path("ledger"), check)
    for identity in view.identities():  # every reader, on whatever the walk let through
        summary(identity.facts)
        standing(view, identity.digest)
        evaluate(view, identity)
    state_of_record(view).to_markdown()
    validated_contracts(view, {"c1": {"0.5.13.post1"}})
    for record in view.records():
        json.dumps(record.to_json())


def _seed() -> dict[str, Any]:
    """A valid release predicate, as `release build` writes it."""
    facts = copy.deepcopy(GOOD.facts)
    facts.update(image_digest=IMAGE_DIGEST, sglang_revision=REVISION, standins=[])
    return {
        "schema": RELEASE_DOMAIN,
        "name": "demo-engine",
        "sglang": {"version": "0.5.13.post1", "upstream_revision": REVISION},
        "base_image": f"registry.example/sglang@{IMAGE_DIGEST}",
        "runtime_identity": {"digest": identity_digest(facts), "facts": facts},
        "model": {"id": "Qwen/Qwen2.5-0.5B-Instruct", "revision": REVISION},
        "serve": {"tensor_parallel_size": 1, "engine_args": [], "env_allowlist": ["HF_TOKEN"]},
        "artifacts": [
            {"name": "notes.txt", "media_type": "text/plain", "sha256": "sha256:" + "a" * 64, "size": 3},
            {"name": "sbom.cdx.json", "media_type": SBOM_MEDIA_TYPE, "sha256": "sha256:" + "b" * 64, "size": 9},
        ],
        "sbom": "sbom.cdx.json",
    }


SEED = _seed()


def _descriptor() -> dict[str, Any]:
    return copy.deepcopy(SEED)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*path, index))
    return found


PATHS = _paths(_descriptor())
FACT_PATHS = _paths(GOOD.facts)[1:]


def _replace(root: Any, path: tuple[Any, ...], value: Any) -> None:
    node = root
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PATHS[1:]), JSON)
@example(("runtime_identity", "facts", "standins"), 5)  # found by this test before the facts were typed
def test_any_predicate_field_replaced_is_a_problem_not_a_crash(path: tuple[Any, ...], value: Any) -> None:
    descriptor = _descriptor()
    _replace(descriptor, path, value)
    found = problems(descriptor)
    if not found:
        release_digest(descriptor)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_as_an_envelope_or_checkpoint(raw: bytes) -> None:
    for kind, what in ((dsse.Envelope, "envelope"), (checkpoint.Checkpoint, "checkpoint")):
        try:
            decoded = decode_json(raw, kind, what, canonical=True)
        except Malformed:
            continue
        if isinstance(decoded, dsse.Envelope):
            try:
                dsse.check_signatures(decoded, [])
                decoded.body()
            except Malformed:
                pass


def test_the_seed_descriptor_is_valid() -> None:
    assert problems(_descriptor()) == []
    assert digest("x", _descriptor())
