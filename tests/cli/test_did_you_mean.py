"""A typo gets the closest name in its one-line error: commands, subcommands, options, choices,
slots, manifest keys and gateway config keys. A word close to nothing gets no suggestion."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.conftest import Ran
from tests.conftest import REPO


@pytest.mark.parametrize(("argv", "suggested"), [
    (["verfy", "x"], "verify"),
    (["chain-compt"], "chain-compat"),
    (["evidence", "lst"], "list"),
    (["scan", "--jsn", "x"], "--json"),
    (["verify", "x", "--dtype", "float23"], "float32"),
    (["new", "activation.silu_and_mull", "{tmp}/n"], "activation.silu_and_mul"),
    (["gateway", "check-config", "{tmp}/gw.yaml"], "policy"),
    (["scan", "{tmp}/bundle"], "entry"),
])
def test_a_typo_gets_the_closest_name(cli_main: Callable[..., Ran], tmp_path: Path, argv: list[str],
                                      suggested: str) -> None:
    (tmp_path / "gw.yaml").write_text("polcy: rr\n")
    bundle = tmp_path / "bundle"
    (bundle / "kernels").mkdir(parents=True)
    source = REPO / "examples" / "bundles" / "silu-torch"
    (bundle / "kernels" / "silu_and_mul.py").write_bytes((source / "kernels" / "silu_and_mul.py").read_bytes())
    (bundle / "manifest.toml").write_text((source / "manifest.toml").read_text().replace("entry =", "entyr ="))
    ran = cli_main(*(word.format(tmp=tmp_path) for word in argv))
    assert ran.code == 1
    last = ran.err.strip().splitlines()[-1]
    assert last.endswith(f"; did you mean {suggested!r}?"), ran.err


def test_a_word_close_to_nothing_gets_no_suggestion(cli_main: Callable[..., Ran]) -> None:
    ran = cli_main("zzzzqqq")
    assert ran.code == 1 and "invalid choice: 'zzzzqqq'" in ran.err and "did you mean" not in ran.err
