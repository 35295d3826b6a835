"""Every command as a hostile newcomer drives it: missing and wrong paths, directories for files, garbage and
wrong types in files, out-of-range numbers. Each ends in one line on stderr, exit 1, never a traceback and
never a verdict (a negative timeout is not a FAIL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO

SILU = str(EXAMPLES / "silu-torch")
HEX_KEY = "00" * 32


@pytest.fixture(scope="module")
def junk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of things that are not what a command expects."""
    root = tmp_path_factory.mktemp("junk")
    (root / "file.txt").write_text("just text\n")
    (root / "dir").mkdir()
    (root / "garbage.yaml").write_text("policy: [exact\n")
    (root / "wrong-types.yaml").write_text("policy: 3\nworkers: nope\n")
    (root / "garbage.bin").write_bytes(bytes(range(256)) * 8)
    (root / "tokens.json").write_text("[1, 2, ")
    for name, manifest in (("binary-manifest", bytes(range(256))), ("int-id", b"bundle_id = 3\n"),
                           ("no-ops", b'bundle_id = "x"\nabi_version = "cacheon-op-abi-v1"\n')):
        (root / name).mkdir()
        (root / name / "manifest.toml").write_bytes(manifest)
    return root


# (argv with {junk} for the junk directory, what stderr's error line must say)
MISTAKES = [
    # bundles
    (("scan", "{junk}/missing"), "does not exist"),
    (("scan", "{junk}/file.txt"), "neither a bundle directory nor a .tar.gz/.tgz archive"),
    (("scan", "{junk}/dir"), "missing manifest.toml"),
    (("scan", "{junk}/binary-manifest"), "not valid TOML"),
    (("scan", "{junk}/int-id"), "bundle_id: must be a string, got int"),
    (("scan", "{junk}/no-ops"), "ops: must be a non-empty array"),
    (("verify", "{junk}/garbage.bin"), "neither a bundle directory"),
    (("verify", "{junk}/garbage.tar.gz"), "does not exist"),
    # numbers that would otherwise become a verdict, or silently something else
    (("verify", SILU, "--timeout", "-1"), "argument --timeout: must be a finite number above 0, got '-1'"),
    (("verify", SILU, "--timeout", "0"), "argument --timeout: must be a finite number above 0"),
    (("verify", SILU, "--timeout", "nan"), "argument --timeout: must be a finite number above 0"),
    (("verify", SILU, "--timeout", "inf"), "argument --timeout: must be a finite number above 0"),
    (("verify", SILU, "--timeout", "soon"), "argument --timeout: expected a number, got 'soon'"),
    (("verify", SILU, "--stability-calls", "-5"), "argument --stability-calls: must be 0 or more, got -5"),
    (("verify", SILU, "--graph-replays", "-1"), "argument --graph-replays: must be 0 or more"),
    (("verify", SILU, "--world-size", "0"), "argument --world-size: must be at least 1, got 0"),
    (("verify", SILU, "--seed", "-1"), "argument --seed: must be 0 or more"),
    (("verify", SILU, "--seed", "1.5"), "argument --seed: expected a whole number, got '1.5'"),
    # --case
    (("verify", SILU, "--case", "float32/r0", "--record"), "never recorded as evidence"),
    (("verify", SILU, "--case", "float32/d0"), "drawn from the run seed; add the --seed"),
    (("verify", SILU, "--case", "the-failing-one"), "a case id is [SLOT:]DTYPE/KI"),
    (("verify", SILU, "--case", "float32/r9", "--seed", "1"), "no such case; activation.silu_and_mul: DTYPE/KI"),
    (("verify", SILU, "--case", "norm.rmsnorm:float32/r0"), "no op has slot norm.rmsnorm"),
    (("verify", SILU, "--case", "bfloat16/r0", "--dtype", "float32"), "DTYPE in float32,"),
    # package
    (("package", SILU, "--out", "{junk}/dir"), "--out {junk}/dir is a directory"),
    (("package", SILU, "--out", "{junk}/missing/silu.tgz"), "directory {junk}/missing does not exist"),
    (("package", SILU, "--out", "{junk}/file.txt"), "exists; add --force to replace it"),
    (("package", "{junk}/file.txt", "--out", "{junk}/x.tgz"), "is not a bundle directory"),
    # new
    (("new", "no.such_slot", "{junk}/n"), "unknown slot 'no.such_slot' (registered slots:"),
    (("new", "norm.rmsnorm", "{junk}/missing/n"), "directory {junk}/missing does not exist"),
    (("new", "norm.rmsnorm", "{junk}/file.txt"), "exists and is not a directory"),
    (("new", "norm.rmsnorm", "{junk}/binary-manifest"), "exists and is not empty; add --force"),
    (("new", "norm.rmsnorm", "{junk}/Not A Name"), "(it is DIR's name: pass --bundle-id)"),
    # gateway config
    (("gateway", "check-config", "{junk}/garbage.yaml"), "not valid YAML"),
    (("gateway", "check-config", "{junk}/wrong-types.yaml"), "policy"),
    (("gateway", "check-config", "{junk}/dir"), "cannot read config {junk}/dir: Is a directory"),
    (("gateway", "check-config", "{junk}/missing.yaml"), "No such file or directory"),
    (("gateway", "serve", "--config", "{junk}/garbage.yaml"), "not valid YAML"),
    # release
    (("release", "sign", "{junk}/dir", "--key", "{junk}/dir"), "cannot read private key"),
    (("release", "build", "--spec", "{junk}/dir", "--out", "{junk}/rel"), "cannot read release spec"),
    (("release", "build", "--spec", "{junk}/file.txt", "--out", "{junk}/missing/rel"), "does not exist"),
    (("release", "verify", "{junk}/dir", "--key", "abc"), "neither 64 hex characters nor a .pub file"),
    (("release", "verify", "{junk}/dir", "--key", HEX_KEY, "--threshold", "0"), "--threshold: must be at least 1"),
    (("release", "sbom", "--out", "{junk}/missing/sbom.json"), "directory {junk}/missing does not exist"),
    # the ledger
    (("evidence", "list", "--ledger", "{junk}/dir"), "is a directory, not a ledger file"),
    (("evidence", "list", "--ledger", "{junk}/garbage.bin"), "not an SQLite database"),
    (("evidence", "show", "0", "--ledger", "{junk}/l.db"), "argument ID: must be at least 1, got 0"),
    (("evidence", "show", "first", "--ledger", "{junk}/l.db"), "argument ID: expected a whole number"),
    (("pin", "status", "--ledger", "{junk}/dir"), "is a directory, not a ledger file"),
    # KV events
    (("kv", "hash", "--page-size", "0", "1", "2"), "argument --page-size: must be at least 1, got 0"),
    (("kv", "hash", "--page-size", "2", "--tokens-file", "{junk}/dir"), "Is a directory"),
    (("kv", "hash", "--page-size", "2", "--tokens-file", "{junk}/tokens.json"), "is not a JSON array"),
    (("kv", "hash", "--page-size", "2", "one", "two"), "invalid literal"),
    (("kv", "listen", "tcp://127.0.0.1:1", "--timeout", "-1"), "argument --timeout: must be a finite number above 0"),
    (("kv", "listen", "tcp://127.0.0.1:1", "--count", "-1"), "argument --count: must be 0 or more"),
    (("kv", "listen", "somewhere"), "is not tcp://HOST:PORT"),
    # simulated workers and the demo
    (("demo", "--workers", "0"), "argument --workers: must be at least 1, got 0"),
    (("demo", "--delay-ms", "-1"), "argument --delay-ms: must be 0 or more"),
    (("demo", "--capacity-tokens", "2", "--page-size", "4"), "holds no page of 4 tokens"),
    (("sim", "worker", "--port", "0", "--kv-port", "2", "--sglang-version", "0.5.22"), "--port: must be a TCP port"),
    (("sim", "worker", "--port", "1", "--kv-port", "70000", "--sglang-version", "0.5.22"), "from 1 to 65535"),
    (("sim", "worker", "--port", "1", "--kv-port", "65535", "--dp-size", "2", "--sglang-version", "0.5.22"),
     "the last rank's KV port would be 65536"),
    (("preflight", "--compat-timeout", "0"), "argument --compat-timeout: must be at least 1"),
    # the command line itself
    (("identity", "--colour"), "cacheon identity: error: unrecognized arguments: --colour"),
    (("evidence", "list", "--everything"), "cacheon evidence list: error: unrecognized arguments"),
    (("kv",), "the following arguments are required: SUBCOMMAND"),
    (("frobnicate",), "invalid choice: 'frobnicate'"),
]


@pytest.mark.parametrize(("argv", "text"), MISTAKES, ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_a_mistake_is_one_line_and_exit_1(cli_main, junk, argv, text):
    ran = cli_main(*(word.replace("{junk}", str(junk)) for word in argv))
    lines = ran.err.rstrip("\n").splitlines()
    assert ran.code == 1, ran.out + ran.err
    assert "Traceback" not in ran.err and ran.out == "", ran.out + ran.err
    # one line; a parser's own error follows its usage line(s), which say how to call the command
    usage = [line for line in lines[:-1] if not (line.startswith("usage: ") or line.startswith(" "))]
    assert usage == [], ran.err
    assert text.replace("{junk}", str(junk)) in lines[-1], lines[-1]
    assert "error" in lines[-1]


def test_no_command_prints_the_help_and_exits_1(cli_main):
    ran = cli_main()
    assert ran.code == 1 and "COMMAND" in ran.err and ran.out == ""


def test_package_refuses_a_bundle_that_fails_scan_and_writes_nothing(cli_main, tmp_path):
    out = tmp_path / "bad.tgz"
    ran = cli_main("package", str(EXAMPLES / "silu-scan-violation"), "--out", str(out))
    assert ran.code == 2 and ran.out == ""
    assert "[not-allowed-import] os is not importable" in ran.err
    assert ran.err.rstrip().splitlines()[-1].endswith("scan found 3 violation(s); nothing written")
    assert list(tmp_path.iterdir()) == []


def test_package_replaces_only_with_force_and_whole(cli_main, tmp_path):
    out = tmp_path / "silu.tgz"
    first = cli_main("package", SILU, "--out", str(out), "--json")
    assert first.code == 0, first.err
    archive = out.read_bytes()
    out.write_bytes(b"yesterday's archive")
    refused = cli_main("package", SILU, "--out", str(out))
    assert refused.code == 1 and out.read_bytes() == b"yesterday's archive"
    assert cli_main("package", SILU, "--out", str(out), "--force").code == 0
    assert out.read_bytes() == archive  # deterministic, and no temporary file left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["silu.tgz"]


@pytest.mark.slow  # a CLI process
def test_ctrl_c_is_one_line_and_exit_130():
    """A wait that would last forever (no publisher there), interrupted as a user at a terminal would."""
    proc = subprocess.Popen([sys.executable, "-m", "cacheon.cli", "kv", "listen", "tcp://127.0.0.1:9", "--count", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3)  # past the imports, into the wait
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["interrupted"] and out == ""


@pytest.mark.slow  # CLI processes
@pytest.mark.parametrize("argv", [("slots",), ("slots", "--json"), ("kv", "contracts"), ("new", "--help")])
def test_output_into_a_reader_that_stops_early_ends_quietly(argv):
    """`cacheon slots | head -1`: the reader leaves after one line."""
    done = subprocess.run(["bash", "-o", "pipefail", "-c", f"{sys.executable} -m cacheon.cli {' '.join(argv)} | head -1"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "CACHEON_LEDGER": "/nonexistent/ledger.sqlite3"})
    assert done.returncode == 0 and done.stderr == "" and len(done.stdout.splitlines()) == 1
