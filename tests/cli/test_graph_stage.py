"""The CUDA-graph stage's orchestration, run on CPU through an injected backend (library calls)."""

import pytest

from cacheon.bundle.manifest import load_manifest
from cacheon.bundle.snapshot import read_snapshot
from cacheon.contract.catalog import SILU_AND_MUL
from cacheon.verify.graphs import EMULATED_BACKEND
from cacheon.verify.report import GraphStatus, Stage
from cacheon.verify.runner import InfrastructureError, VerifyOptions, verify_bundle
from tests.conftest import EXAMPLES, write_bundle

pytestmark = pytest.mark.slow  # candidate children

# Correct for the first two calls on each output shape (the eager trials), then a different path:
# the third call is the capture, so everything after it is what a graph would replay.
COUNTING = '''
import torch

_calls: dict = {}


def silu_and_mul(x, out):
    key = tuple(out.shape)
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] > 2:
        AFTER_EAGER
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d]) * x[..., d:])
'''


def verify(root, **options):
    # A fixed seed: the counting cheat keys on output shapes, and this seed draws none of the
    # registered ones again in the eager stage. The graph stage runs before the stability stage.
    options = {"dtypes": ("float32",), "graph_backend": EMULATED_BACKEND, "seed": 1, "stability_calls": 0, **options}
    return verify_bundle(snapshot := read_snapshot(root), load_manifest(snapshot), VerifyOptions(**options))


def test_faithful_bundle_replays_cleanly_but_emulation_is_no_proof():
    report = verify(EXAMPLES / "silu-torch", graph_replays=2)
    op = report.ops[0]
    graph = [c for c in op.cases if c.stage is Stage.GRAPH]
    assert len(graph) == 2 * len(SILU_AND_MUL.shapes) and all(c.ok for c in graph)
    assert report.verdict == "NUMERICAL_PASS"
    assert op.graph.status is GraphStatus.EMULATED and "no CUDA-graph proof" in op.graph.detail


def test_a_replay_that_does_nothing_leaves_poison_and_fails(tmp_path):
    root = write_bundle(tmp_path, "activation.silu_and_mul", "silu_and_mul", COUNTING.replace("AFTER_EAGER", "return"))
    report = verify(root)
    failed = [c for c in report.ops[0].cases if not c.ok]
    assert report.verdict == "FAIL" and report.ops[0].graph.status is GraphStatus.FAILED
    # the poison left behind is drawn per replay: non-finite, or plausible values that are wrong
    assert failed[0].stage is Stage.GRAPH
    assert "non-finite" in failed[0].failures[0] or "outside tolerance" in failed[0].failures[0]
    assert all(c.ok for c in report.ops[0].cases if c.stage is Stage.EAGER)


def test_capture_that_raises_is_the_candidates_failure(tmp_path):
    source = COUNTING.replace("AFTER_EAGER", "raise RuntimeError('not capturable')")
    report = verify(write_bundle(tmp_path, "activation.silu_and_mul", "silu_and_mul", source))
    assert report.verdict == "FAIL"
    assert "capture raised: RuntimeError: not capturable" in report.reason


def test_replays_see_fresh_inputs(tmp_path):
    """A 'graph' that replays the captured values: the fresh inputs copied in must expose it."""
    stale = COUNTING.replace(
        "AFTER_EAGER", "out.copy_(_frozen.setdefault(key, torch.nn.functional.silu(x[..., :x.shape[-1] // 2]) "
        "* x[..., x.shape[-1] // 2:]))\n        return",
    ).replace("_calls: dict = {}", "_calls: dict = {}\n_frozen: dict = {}")
    report = verify(write_bundle(tmp_path, "activation.silu_and_mul", "silu_and_mul", stale))
    failed = [c for c in report.ops[0].cases if not c.ok]
    assert failed and failed[0].stage is Stage.GRAPH and failed[0].trial == 1
    assert "elements outside tolerance" in failed[0].failures[0]


def test_a_broken_backend_is_an_infrastructure_error():
    with pytest.raises(InfrastructureError, match="cannot be loaded"):
        verify(EXAMPLES / "silu-torch", graph_backend="cacheon.verify.graphs:NoSuchBackend")
