"""`--json` where a machine reads the result: one JSON document on stdout, nothing else there, the fields named
in the option's help."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cacheon.bundle.digest import bundle_digest
from cacheon.runtime.identity import Identity, runtime_identity
from tests.conftest import EXAMPLES

SILU = EXAMPLES / "silu-torch"


@pytest.fixture(scope="module")
def here() -> Identity:
    return runtime_identity()


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("CACHEON_LEDGER", str(path))
    return path


def test_package_json(cli_main, tmp_path):
    out = tmp_path / "silu.tgz"
    ran = cli_main("package", SILU, "--out", out, "--json")
    assert ran.code == 0, ran.err
    assert json.loads(ran.out) == {"archive": str(out), "bundle_id": "silu-torch",
                                   "bundle_digest": bundle_digest(SILU), "bytes": out.stat().st_size}


def test_check_config_json_redacts_the_admin_token(cli_main, tmp_path, profile):
    config = tmp_path / "gw.yaml"
    config.write_text(f"policy: exact\nworkers: [{{url: 'http://127.0.0.1:1'}}]\n"
                      f"models: {{demo: {{tokenizer: {profile[0]}}}}}\nadmin: {{token: s3cret-token-of-32-chars-or-so}}\n")
    ran = cli_main("gateway", "check-config", config, "--json")
    assert ran.code == 0, ran.err
    document = json.loads(ran.out)
    assert document["ok"] is True and document["config"]["policy"] == "exact"
    assert document["config"]["admin"]["token"] == "<redacted>" and "s3cret" not in ran.out
    plain = cli_main("gateway", "check-config", config)  # the control: without --json, the one-line summary
    assert plain.code == 0 and plain.out.startswith("ok: policy exact, 1 worker(s)")


def test_kv_hash_json(cli_main):
    lines = cli_main("kv", "hash", "--page-size", "2", "1", "2", "3", "4", "5")
    ran = cli_main("kv", "hash", "--page-size", "2", "1", "2", "3", "4", "5", "--json")
    assert ran.code == 0, ran.err
    assert json.loads(ran.out) == {"page_size": 2, "tokens": 5, "hashes": [int(h) for h in lines.out.split()]}


def test_pin_freeze_and_step_json(cli_main, ledger, here):
    version = here.sglang_version or "0.0.0"
    for argv in (("freeze",), ("step", "migration")):
        ran = cli_main("pin", *argv, "--to", version, "--note", "n", "--json")
        if not here.sglang_version:  # no SGLang here: the refusal is a usage error either way
            assert ran.code == 1 and ran.out == ""
            continue
        assert ran.code == 0, ran.err
        assert json.loads(ran.out) == {"record": json.loads(ran.out)["record"], "step": argv[-1], "target": version,
                                       "identity": here.digest, "ledger": str(ledger)}
    if here.sglang_version:
        plan = cli_main("pin", "plan", "--to", version, "--json")
        assert plan.code == 0 and len(json.loads(plan.out)["gates"]) == 8
