"""A child that attacks the parent through its channel and its output, the scan bypassed.

Each kernel below reaches the channel's socket (its fd is in the child's argv) or its own stdout
directly, as a candidate past the scan could: the parent must end every op within its deadlines,
refuse what it did not ask for before decoding or rebuilding it, keep its memory flat whatever the
child prints, and never let the child's text reach a report or a terminal unbounded or unescaped.
"""

from __future__ import annotations

import argparse
import json
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from cacheon.bundle.manifest import load_manifest
from cacheon.bundle.snapshot import read_snapshot
from cacheon.commands.verify import _print_summary
from cacheon.verify.report import VerifyReport
from cacheon.verify.runner import VerifyOptions, verify_bundle
from tests.conftest import write_bundle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # candidate children; a guard removed must fail, not hang

PRELUDE = '''
import json, os, sys, time
import msgspec
import torch
from cacheon.verify import channel
from cacheon.verify.messages import Raised, Result, WireTensor

FD = json.loads(sys.argv[2])["fds"][0]  # this child's end of the channel, as the launcher numbered it
CALLS = []


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def forge(body):
    write_all(FD, channel.HEADER.pack(len(body)) + body)


def right(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d]) * x[..., d:])


def first_call():
    CALLS.append(1)
    return len(CALLS) == 1
'''
FIRST_CASE = "float32/r0"  # T=1 d=1024: one call, small buffers


def verify(tmp_path: Path, body: str, **options: object) -> VerifyReport:
    root = write_bundle(tmp_path / "bundle", "activation.silu_and_mul", "silu_and_mul",
                        PRELUDE + textwrap.dedent(body))
    return verify_bundle(snapshot := read_snapshot(root), load_manifest(snapshot),
                         VerifyOptions(dtypes=("float32",), stability_calls=0, **options))  # type: ignore[arg-type]


def report_size(report: VerifyReport) -> int:
    return len(json.dumps(report.to_json(debug=True), ensure_ascii=False))


def test_a_child_that_stops_mid_frame_fails_within_its_timeout(tmp_path):
    started = time.monotonic()
    report = verify(tmp_path, """
        def silu_and_mul(x, out):
            write_all(FD, channel.HEADER.pack(1000) + b"\\x81")  # a header and one byte of the body
            time.sleep(3600)
    """, timeout=2.0)
    assert report.verdict == "FAIL"
    assert "candidate timeout" in report.reason and "stopped mid-frame, after 5 bytes" in report.reason, report.reason
    assert time.monotonic() - started < 120


def test_a_child_slow_just_under_each_call_budget_meets_the_op_deadline(tmp_path):
    report = verify(tmp_path, """
        def silu_and_mul(x, out):
            time.sleep(0.5)  # well under --timeout, every call; 19 eager calls take ~10 s
            right(x, out)
    """, timeout=3.0, op_timeout=6.0)
    assert report.verdict == "FAIL"
    assert "no answer within the op's 6s (--op-timeout)" in report.reason, report.reason


def test_the_run_deadline_ends_the_op_in_flight_and_the_ops_after_it(tmp_path):
    root = write_bundle(tmp_path, "activation.silu_and_mul", "silu_and_mul", PRELUDE + textwrap.dedent("""
        def silu_and_mul(x, out):
            time.sleep(0.5)
            right(x, out)
    """))
    (root / "kernels" / "norm.py").write_text("def rmsnorm(x, weight, out, eps):\n    out.zero_()\n")
    with (root / "manifest.toml").open("a") as manifest:
        manifest.write('[[ops]]\nslot = "norm.rmsnorm"\nsource = "kernels/norm.py"\nentry = "rmsnorm"\n'
                       'dtypes = ["float32"]\n')
    options = VerifyOptions(dtypes=("float32",), stability_calls=0, timeout=3.0, run_timeout=6.0)
    report = verify_bundle(snapshot := read_snapshot(root), load_manifest(snapshot), options)
    first, second = report.ops
    # The run's deadline ends the first op whichever way it is waiting when the deadline passes: for the candidate's
    # answer ("no answer within the run's 6s") or, on a loaded box, for it to take a call's inputs ("a message was
    # not taken within the run's 6s": failed 1 clean-checkout CI run in 3, session 15). Never the op's 3 s.
    assert report.verdict == "FAIL" and "within the run's 6s (--run-timeout)" in first.reason, first.reason
    assert second.reason == "not run: the run's 6s (--run-timeout) passed before this op started"


def test_an_import_that_never_ends_meets_the_op_deadline_not_an_infrastructure_error(tmp_path):
    report = verify(tmp_path, """
        time.sleep(3600)

        def silu_and_mul(x, out):
            right(x, out)
    """, op_timeout=8.0)
    assert report.verdict == "FAIL" and "the op's 8s (--op-timeout)" in report.reason, report.reason


def test_an_op_deadline_that_passes_before_the_sandbox_reports_fails_the_op(tmp_path):
    """Not an infrastructure error: the run's time (here the op's) is spent, whoever spent it."""
    report = verify(tmp_path, """
        def silu_and_mul(x, out):
            right(x, out)
    """, op_timeout=0.05)
    assert report.verdict == "FAIL" and "the op's 0.05s (--op-timeout)" in report.reason, report.reason


FORGED = {
    # a shape whose element count is 0 but that torch cannot even allocate: the verifier raised on it
    "shape": ('forge(channel.encode(Result(1, {"out": WireTensor("float32", [2**64 - 1, 0], b"")}, '
              'channel.tensors_to_wire({"x": x}), [], [])))', "[18446744073709551615, 0] where float32 [1, 1024]"),
    "dtype": ('forge(channel.encode(Result(1, {"out": WireTensor("float16", [1, 1024], bytes(2048))}, '
              'channel.tensors_to_wire({"x": x}), [], [])))', "float16 [1, 1024] where float32 [1, 1024]"),
    "name": ('right(x, out); forge(channel.encode(Result(1, channel.tensors_to_wire({"out": out, "evil": out}), '
             'channel.tensors_to_wire({"x": x}), [], [])))', "names ['evil'] that were not allocated"),
    "oversized": ("write_all(FD, channel.HEADER.pack(1 << 31))", "a frame of 2147483648 bytes, more than the"),
    "unknown-field": ('forge(msgspec.msgpack.encode({"type": "raised", "seq": 1, "reason": "r", "detail": "", '
                      '"verdict": "PASS"}))', "unknown field `verdict`"),
}


@pytest.mark.parametrize("kind", sorted(FORGED))
def test_a_forged_reply_is_refused_and_the_verifier_does_not_raise(tmp_path, kind):
    forgery, reason = FORGED[kind]
    report = verify(tmp_path, f"""
        def silu_and_mul(x, out):
            if first_call():
                {forgery}
            right(x, out)
    """, case=FIRST_CASE, timeout=30.0)
    assert report.verdict == "FAIL" and reason in report.reason, report.reason
    assert report_size(report) < 64 << 10


def test_a_gigabyte_on_stdout_leaves_the_parent_memory_flat(tmp_path):
    me = psutil.Process()
    baseline, peak, done = me.memory_info().rss, [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], me.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        report = verify(tmp_path, """
            def silu_and_mul(x, out):
                if first_call():
                    junk = b"junk \\x1b[2J " * (1 << 16)
                    for _ in range((1 << 30) // len(junk) + 1):
                        write_all(1, junk)
                right(x, out)
        """, case=FIRST_CASE, timeout=300.0)
    finally:
        done.set()
        sampler.join()
    op = report.ops[0]
    assert report.verdict == "PASS", report.reason
    assert op.candidate_output_bytes >= 1 << 30 and len(op.candidate_output) < 16 << 10
    assert op.candidate_output.startswith("[") and "earlier bytes not kept" in op.candidate_output
    assert "\x1b" not in op.candidate_output
    assert peak[0] - baseline < 200 << 20, f"the parent grew by {(peak[0] - baseline) >> 20} MiB"


EIGHT_MB = 8 << 20


def test_an_eight_megabyte_exception_is_bounded_in_the_child_and_the_report(tmp_path):
    report = verify(tmp_path, f"""
        def silu_and_mul(x, out):
            raise ValueError("x" * {EIGHT_MB})
    """, case=FIRST_CASE)
    assert report.verdict == "FAIL" and "entry raised: ValueError: xxx" in report.reason, report.reason
    assert report_size(report) < 256 << 10


def test_an_eight_megabyte_forged_reason_is_refused(tmp_path):
    report = verify(tmp_path, f"""
        def silu_and_mul(x, out):
            forge(channel.encode(Raised(1, "x" * {EIGHT_MB}, "")))
            right(x, out)
    """, case=FIRST_CASE)
    assert report.verdict == "FAIL" and "candidate protocol" in report.reason and "more than the" in report.reason
    assert report_size(report) < 64 << 10


def test_a_forged_text_past_its_bound_is_refused_even_inside_the_frame_budget(tmp_path):
    report = verify(tmp_path, """
        def silu_and_mul(x, out):
            forge(channel.encode(Raised(1, "ValueError: no", "x" * 100_000)))
            right(x, out)
    """, case=FIRST_CASE)
    assert report.verdict == "FAIL" and "Expected `str` of length <= 32768" in report.reason, report.reason
    assert report_size(report) < 64 << 10


def test_an_eight_megabyte_type_name_returned_is_bounded_in_the_child(tmp_path):
    report = verify(tmp_path, f"""
        def silu_and_mul(x, out):
            right(x, out)
            return type("x" * {EIGHT_MB}, (), {{}})()
    """, case=FIRST_CASE)
    assert report.verdict == "PASS", report.reason
    assert report_size(report) < 64 << 10


def test_escape_bytes_are_escaped_in_the_report_and_the_debug_output(tmp_path, capsys):
    report = verify(tmp_path, """
        def silu_and_mul(x, out):
            print("\\x1b[2J\\x1b]0;owned\\x07 painted", flush=True)
            raise ValueError("\\x1b[31mred\\x1b[0m \\u202eevil")
    """, case=FIRST_CASE)
    op = report.ops[0]
    assert report.verdict == "FAIL" and "\\x1b[31mred" in report.reason, report.reason
    assert "\\x1b[31mred" in op.detail and "\\x1b[2J" in op.candidate_output
    text = json.dumps(report.to_json(debug=True), ensure_ascii=False)
    assert not any(ch in text for ch in "\x1b\x07\u202e")
    args = argparse.Namespace(debug=True, bundle=tmp_path, device="cpu", model=None, world_size=None,
                              confinement="bubblewrap")
    capsys.readouterr()
    _print_summary(args, report)
    shown = capsys.readouterr().out
    assert "traceback from the candidate's process" in shown and "\\x1b[31mred" in shown
    assert not any(ch in shown for ch in "\x1b\x07\u202e"), shown
