"""The static check behind both canaries, on real modules written to disk (no SGLang needed)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from cacheon.runtime.canary import run_canary
from cacheon.runtime.surface import Surface, check_surface

UPSTREAM = """
__version__ = "1.2.3"

class Layer:
    def forward_native(self, x, residual=None):
        return x

def entry(prompt, sampling_params=None):
    return prompt
"""


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    """A fake upstream package ``fakeup`` (real files, real import machinery)."""
    (tmp_path / "fakeup").mkdir()
    (tmp_path / "fakeup" / "__init__.py").write_text(textwrap.dedent(UPSTREAM))
    (tmp_path / "fakeup" / "broken.py").write_text("raise ImportError('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fakeup"
    for name in [m for m in sys.modules if m == "fakeup" or m.startswith("fakeup.")]:
        del sys.modules[name]


def test_present_symbol_with_its_parameters_is_ok(upstream):
    row = check_surface(Surface("layer", upstream, "Layer.forward_native", ("x", "residual")))
    assert (row.status, row.detail) == ("ok", "fakeup:Layer.forward_native(x, residual)")


def test_a_function_and_a_class_constructor_are_checked_too(upstream):
    assert check_surface(Surface("entry", upstream, "entry", ("prompt", "sampling_params"))).status == "ok"
    assert check_surface(Surface("cls", upstream, "Layer")).status == "ok"


def test_removed_symbol_fails_with_the_reason(upstream):
    row = check_surface(Surface("layer", upstream, "Layer.forward_cuda", ("x",)))
    assert (row.status, row.detail) == ("FAIL", "fakeup:Layer.forward_cuda is gone (no such symbol)")


def test_renamed_parameter_fails_naming_what_is_there(upstream):
    row = check_surface(Surface("entry", upstream, "entry", ("prompt", "input_ids")))
    assert row.status == "FAIL"
    assert row.detail == "fakeup:entry lacks parameter(s) input_ids; has prompt, sampling_params"


def test_module_that_cannot_import_fails(upstream):
    row = check_surface(Surface("gpu", "fakeup.broken", "thing"))
    assert row.status == "FAIL" and row.detail == "cannot import fakeup.broken: ImportError: needs a GPU"


def test_absent_optional_package_is_skip_not_pass(upstream):
    row = check_surface(Surface("fi", upstream, "Layer", requires="cacheon_no_such_package"))
    assert (row.status, row.detail) == ("SKIP", "requires cacheon_no_such_package (not installed)")


def test_canary_at_the_pin_passes_and_lists_every_row(upstream):
    surfaces = [
        Surface("layer", upstream, "Layer.forward_native", ("x",)),
        Surface("fi", upstream, "X", requires="nope_pkg"),
    ]
    report = run_canary(upstream, "1.2.3", surfaces)
    assert report.exit_code == 0
    assert report.counts() == {"ok": 1, "FAIL": 0, "SKIP": 1}
    assert report.lines()[0] == "fakeup 1.2.3 (pin 1.2.3)"
    assert report.lines()[-1] == "ok: fakeup 1.2.3 is the pin (1 ok, 0 FAIL, 1 SKIP)"


def test_canary_other_version_differs_with_every_surface_present(upstream):
    report = run_canary(upstream, "1.2.4", [Surface("layer", upstream, "Layer")])
    assert report.exit_code == 2 and report.counts()["FAIL"] == 0
    assert report.version_row.detail == "1.2.3 DIFFERS from pin 1.2.4"
    assert report.verdict().startswith("FAIL: fakeup 1.2.3 DIFFERS from pin 1.2.4")


def test_canary_a_failed_surface_fails_the_run(upstream):
    report = run_canary(upstream, "1.2.3", [Surface("gone", upstream, "Gone")])
    assert report.exit_code == 2 and report.failed[0].name == "gone"


def test_canary_not_importable_claims_nothing(upstream):
    report = run_canary("fakeup.broken", "1.2.3", [Surface("layer", upstream, "Layer")])
    assert report.exit_code == 2
    assert report.import_error == "ImportError: needs a GPU"
    assert [r.status for r in report.rows] == ["SKIP"]
    assert report.verdict() == "FAIL: fakeup.broken cannot be imported; no surface was checked"
    assert report.to_json()["version"] is None
