"""The command line's contract for every command: one line per error, a traceback only on request,
quiet when the reader of its output goes away."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cacheon import cli
from tests.conftest import REPO


def test_a_closed_pipe_ends_quietly():
    """`cacheon slots --json | head -c0`: the reader is gone before the command writes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cacheon.cli", "slots", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 0, err
    assert err == ""


def test_a_user_error_is_one_line_and_debug_shows_the_traceback(cli):
    plain = cli("scan", "/nonexistent/bundle")
    assert plain.returncode == 1
    assert plain.stderr.strip().splitlines() == ["cacheon scan: error: /nonexistent/bundle does not exist"]
    debug = cli("--debug", "scan", "/nonexistent/bundle")
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.rstrip().endswith("cacheon scan: error: /nonexistent/bundle does not exist")


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (PermissionError(13, "Permission denied", "/var/lib/cacheon"), "error: Permission denied: /var/lib/cacheon"),
        (RuntimeError("boom"), "internal error: RuntimeError: boom; rerun with --debug for the traceback"),
    ],
)
def test_environment_problems_and_bugs_are_one_line(monkeypatch, capsys, raised, expected):
    from cacheon.commands import slots

    def explode(_args: object) -> int:
        raise raised

    monkeypatch.setattr(slots, "run", explode)
    assert cli.main(["slots"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"cacheon slots: {expected}" + (" (please report it)" if "internal" in expected else "")]


# --- help: every argument explained, every default shown ------------------------------------------------------

def _parsers():
    """(words, parser) for every command and subcommand, each built as `cacheon WORDS ...` builds it."""
    import argparse

    def walk(parser, words):
        yield words, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, [*words, name])

    for name in cli.COMMANDS:
        top = cli.build_parser(name)
        chooser = next(a for a in top._actions if a.dest == "command")
        yield from walk(chooser.choices[name], [name])


def _arguments(parser):
    import argparse

    skip = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    return [a for a in parser._actions if not isinstance(a, skip)]


def test_every_argument_of_every_command_has_help():
    missing = [f"cacheon {' '.join(words)} {'/'.join(a.option_strings) or a.dest}"
               for words, parser in _parsers() for a in _arguments(parser) if not (a.help or "").strip()]
    assert not missing, "arguments without help: " + "; ".join(missing)


def test_every_default_is_shown_in_help():
    import argparse

    unshown = []
    for words, parser in _parsers():
        text = " ".join(parser.format_help().split())
        for action in _arguments(parser):
            default = action.default
            if default is None or isinstance(default, bool) or default in ([], ()) or default is argparse.SUPPRESS:
                continue  # nothing to show: a flag, or an option whose absence its help explains
            if not action.option_strings:
                continue
            help_text = " ".join(str(action.help).split())
            if "default" not in help_text.lower() and f"(default: {default})" not in text:
                unshown.append(f"cacheon {' '.join(words)} {action.option_strings[0]} (default {default!r})")
    assert not unshown, "defaults not in --help: " + "; ".join(unshown)


@pytest.mark.parametrize("words", [w for w, _ in _parsers()], ids=" ".join)
def test_help_of_every_command_exits_0(cli_main, words):
    ran = cli_main(*words, "--help")
    assert ran.code == 0 and ran.out.startswith("usage: cacheon " + " ".join(words)) and ran.err == ""


def test_help_says_the_default_of_a_timeout():
    text = cli.build_parser("verify")._subparsers._group_actions[0].choices["verify"].format_help()
    assert "candidate's sandbox is killed (default: 120.0)" in " ".join(text.split())


def test_check_sglang_script_prints_help():
    """Its exit 2 means the pin drifted, so a usage mistake is 1 there too."""
    for argv, code, stream, text in ((["--help"], 0, "stdout", "Weekly SGLang check"),
                                     (["--bogus"], 1, "stderr", "unrecognized arguments: --bogus")):
        done = subprocess.run([sys.executable, "scripts/check_sglang.py", *argv], capture_output=True, text=True,
                              cwd=REPO, timeout=60)
        assert done.returncode == code, done.stderr
        assert "usage: check_sglang.py" in getattr(done, stream) and text in getattr(done, stream)
