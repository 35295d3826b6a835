"""One rank of the all-or-nothing proofs, run as ``python collective_worker.py MODE RANK WORLD PORT OUT SPEC``.

MODE ``sglang``: every scenario goes the way a real server goes. ``$CACHEON_BUNDLE`` names this rank's
bundle, the plugin arms it (the first scenario through SGLang's own ``load_plugins``), then SGLang's own
``GroupCoordinator`` is constructed on a gloo world, which is where every rank must agree.
MODE ``plain``: no SGLang; the protocol (:func:`cacheon.runtime.collective.enforce`) runs on plain gloo
groups with claims built by hand.

SPEC is JSON: a list of scenarios ``{"name", "bundles": [one path (or "") per rank], "digests": [...]}``.
The rank writes ``{scenario: {"ok", "error", ...}}`` as JSON to ``OUT``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist


def run_sglang(rank: int, world: int, scenarios: list[dict[str, Any]]) -> dict[str, Any]:
    import sglang.srt.plugins
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    from cacheon.runtime import activation, plugin

    stock = (GroupCoordinator.__init__, GroupCoordinator.all_reduce)
    results: dict[str, Any] = {}
    for index, scenario in enumerate(scenarios):
        os.environ[plugin.BUNDLE_ENV] = scenario["bundles"][rank]
        if index == 0:
            sglang.srt.plugins.load_plugins()  # discovers cacheon through the sglang.srt.plugins entry point
        else:
            plugin.arm_from_environment()
        armed = activation.active()
        result: dict[str, Any] = {"armed": armed is not None and armed.digest is not None}
        try:
            group = GroupCoordinator(
                [list(range(world))],
                rank,
                "gloo",
                False,
                False,
                False,
                False,
                False,
                False,
                False,
                group_name=f"cacheon_{scenario['name']}",
            )
            x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + rank
            result["sum"] = group.all_reduce(x).tolist()
            result["ok"] = True
        except Exception as exc:
            result["ok"] = False
            result["error"] = f"{type(exc).__name__}: {exc}"
        still = activation.active()
        result["fired"] = still.receipts["distributed.GroupCoordinator.all_reduce"].fired if still else 0
        # An abort must disarm by itself: stock methods back on the class.
        result["left_armed"] = (GroupCoordinator.__init__, GroupCoordinator.all_reduce) != stock
        if still is not None:
            still.disarm()
        results[scenario["name"]] = result
    return results


def run_plain(rank: int, world: int, scenarios: list[dict[str, Any]]) -> dict[str, Any]:
    from pathlib import Path

    from cacheon.bundle.loader import load_entry
    from cacheon.bundle.manifest import load_manifest
    from cacheon.runtime.collective import Claim, GroupView, all_reduce_probe, enforce

    results: dict[str, Any] = {}
    for scenario in scenarios:
        bundle = scenario["bundles"][rank]
        view = GroupView(dist.new_group(backend="gloo"), dist.new_group(backend="gloo"), torch.device("cpu"), world)
        try:
            if bundle:
                manifest = load_manifest(Path(bundle))
                claim = Claim(
                    scenario["digests"][rank], probe=all_reduce_probe(load_entry(Path(bundle), manifest.ops[0]))
                )
            else:
                claim = Claim(None, error="no bundle on this rank")
            enforce(claim, view)
            results[scenario["name"]] = {"ok": True}
        except Exception as exc:
            results[scenario["name"]] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return results


def write_rank1_failing_bundle(root: Any) -> Any:
    """A scan-clean all_reduce bundle that completes the collective on every rank, then fails on rank 1:
    one rank that cannot complete the call, without leaving its peers blocked inside the collective."""
    from pathlib import Path

    root = Path(root)
    (root / "kernels").mkdir(parents=True)
    (root / "manifest.toml").write_text(
        'bundle_id = "allreduce-rank1-fails"\nabi_version = "cacheon-op-abi-v1"\n\n'
        '[[ops]]\nslot = "collective.all_reduce"\nsource = "kernels/all_reduce.py"\nentry = "all_reduce"\n'
    )
    (root / "kernels" / "all_reduce.py").write_text(
        "import torch.distributed as dist\n\n\n"
        "def all_reduce(x, out, group):\n"
        "    out.copy_(x)\n"
        "    dist.all_reduce(out, group=group)\n"
        "    if dist.get_rank(group) == 1:\n"
        "        raise RuntimeError('rank 1 cannot complete all_reduce')\n"
    )
    return root


def launch(mode: str, scenarios: list[dict[str, Any]], out_dir: Any, world: int = 2, timeout: float = 300) -> list[Any]:
    """Run every rank as its own process (as SGLang runs TP ranks) and return each rank's results."""
    import socket
    import subprocess
    from pathlib import Path

    from tests.runtime.sglang_tier import finish, python_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outs = [Path(out_dir) / f"rank{rank}.json" for rank in range(world)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-W",
                "ignore",
                __file__,
                mode,
                str(rank),
                str(world),
                str(port),
                str(out),
                json.dumps(scenarios),
            ],
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, out in enumerate(outs)
    ]
    done = [finish(proc, timeout) for proc in procs]
    for proc, out in zip(done, outs, strict=True):
        assert out.exists(), f"a rank wrote no result (exit {proc.returncode}): {proc.stderr[-3000:]}"
    results = [json.loads(out.read_text()) for out in outs]
    assert all("crash" not in r for r in results), results
    return results


def main() -> None:
    mode, rank, world, port, out, spec = sys.argv[1:7]
    rank_i, world_i = int(rank), int(world)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank_i, world_size=world_i)
    scenarios = json.loads(spec)
    try:
        results = (run_sglang if mode == "sglang" else run_plain)(rank_i, world_i, scenarios)
    except Exception:
        results = {"crash": traceback.format_exc()}
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(results, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
