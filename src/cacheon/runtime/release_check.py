"""The weekly release check: is there an SGLang release newer than the pin, and does the installed one
still pass the canary?

A newer release is a warning, never an action: a bump is a reviewed rebaseline (docs/maintaining/runtime-pin.md).
The installed SGLang differing from the pin, or a seam FAIL, is an error. When SGLang cannot be imported
the release half still runs and seam coverage is reported as skipped, never claimed; an unreachable
index is a warning, not a crash.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from packaging.version import InvalidVersion, Version

from cacheon.runtime.canary import EXIT_FAILED, EXIT_OK, CanaryReport

INDEX_URL_ENV = "CACHEON_SGLANG_INDEX_URL"
DEFAULT_INDEX_URL = "https://pypi.org/pypi/sglang/json"

Level = Literal["notice", "warning", "error"]


@dataclass(frozen=True)
class Finding:
    level: Level
    title: str
    message: str


def index_url() -> str:
    return os.environ.get(INDEX_URL_ENV) or DEFAULT_INDEX_URL


def latest_release(url: str, timeout_s: float = 20.0) -> str:
    """``info.version`` from a PyPI-style JSON API document (the newest non-pre-release)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        document = json.load(response)
    version = document.get("info", {}).get("version") if isinstance(document, dict) else None
    if not isinstance(version, str) or not version:
        raise ValueError("the index answered without info.version")
    return version


def release_finding(pin: str, fetch: Callable[[], str]) -> Finding:
    """Compare the index's latest release with the pin."""
    try:
        latest = fetch()
    except (OSError, ValueError, urllib.error.URLError) as exc:  # JSON errors are ValueErrors
        return Finding("warning", "SGLang release check", f"index unreachable or unreadable: {exc}")
    try:
        newer = Version(latest) > Version(pin)
    except InvalidVersion:
        return Finding("warning", "SGLang release check", f"index reports an unparseable version {latest!r}")
    if newer:
        return Finding(
            "warning",
            "SGLang release",
            f"sglang {latest} is out; the pin is {pin}. A bump is a reviewed rebaseline, not an update: "
            "follow the pin-bump steps in docs/maintaining/runtime-pin.md.",
        )
    return Finding("notice", "SGLang release", f"the pin {pin} is the latest release ({latest})")


def canary_findings(report: CanaryReport) -> list[Finding]:
    """Errors for DIFFERS and FAIL rows; not importable means coverage skipped, said as a warning."""
    if report.import_error is not None:
        return [
            Finding(
                "warning",
                "SGLang seams",
                f"sglang is not importable ({report.import_error}); seam coverage SKIPPED, nothing claimed",
            )
        ]
    findings = [Finding("error", "SGLang seam", f"{r.name}: {r.detail}") for r in report.failed]
    if not findings:
        findings.append(Finding("notice", "SGLang seams", report.verdict()))
    return findings


def exit_code(findings: list[Finding]) -> int:
    return EXIT_FAILED if any(f.level == "error" for f in findings) else EXIT_OK


def annotation(finding: Finding) -> str:
    """A GitHub Actions workflow command (``::warning title=...::message``), escaped as Actions requires."""

    def data(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    title = data(finding.title).replace(":", "%3A").replace(",", "%2C")
    return f"::{finding.level} title={title}::{data(finding.message)}"
