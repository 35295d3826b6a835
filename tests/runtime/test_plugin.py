"""The SGLang plugin entry point: declared where SGLang 0.5.13.post1 looks, and inert when not asked."""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points

from cacheon.runtime import activation, plugin
from tests.runtime.sglang_tier import REPO

GROUP = "sglang.srt.plugins"  # sglang/srt/plugins/__init__.py: GENERAL_PLUGINS_GROUP


def test_pyproject_declares_the_general_plugin():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][GROUP] == {"cacheon": "cacheon.runtime.plugin:load"}


def test_the_installed_distribution_exposes_it():
    (ep,) = [ep for ep in entry_points(group=GROUP) if ep.name == "cacheon"]
    assert ep.load() is plugin.load, "reinstall cacheon (pip install -e .) to register the entry point"


def test_without_the_variable_nothing_is_armed(monkeypatch):
    monkeypatch.delenv(plugin.BUNDLE_ENV, raising=False)
    assert plugin.arm_from_environment() is None
    assert activation.active() is None
