"""The isolated side of verification: runs inside a spawned child process.

This module imports the candidate, owns the device buffers, calls the entry and ships raw results
back. It judges nothing: references, comparisons and verdicts live in the parent, which the
candidate's code never reaches. The only checks made here are the ones that need the child's
address space (did ``out`` keep its storage and strides?), and the parent treats even those as
claims from an untrusted process that can only make a verdict worse, never better.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from cacheon.verify import channel
from cacheon.verify.graphs import CandidateRaised, load_backend

POISON_INT = -0x5A5A5A5A


def _poison(tensor: torch.Tensor) -> None:
    """Fill an output with values no correct kernel leaves behind (NaN, or a sentinel for ints)."""
    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    elif tensor.dtype == torch.bool:
        tensor.fill_(True)
    else:
        tensor.fill_(POISON_INT)


def _layout(tensor: Any) -> tuple[Any, ...]:
    storage = tensor.untyped_storage()
    return (
        tensor.data_ptr(),
        tuple(tensor.stride()),
        tuple(tensor.shape),
        tensor.dtype,
        storage.data_ptr(),
        storage.nbytes(),
    )


class _Session:
    """State of one candidate across calls: buffers reused on refill, so a pointer-keyed cache is caught."""

    def __init__(self, entry: Any, prepare: Any, group: Any, device: str) -> None:
        self.entry = entry
        self.prepare = prepare
        self.group = group
        self.prepared: Any = None
        self.device = torch.device(device)
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}
        self.graph: Any = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _load_inputs(self, tensors: dict[str, Any], refill: bool) -> list[str]:
        """Fresh buffers, or (refill) new values copied into the existing ones. A refill must change
        at least one input, or a replay would prove nothing; that is reported as a harness problem."""
        changed = False
        for name, value in tensors.items():
            if refill and name in self.inputs:
                previous = self.inputs[name].clone()
                self.inputs[name].copy_(value)
                changed = changed or not torch.equal(previous, self.inputs[name])
            else:
                self.inputs[name] = value.to(self.device).contiguous()
                changed = True
        if refill and tensors and not changed:
            return [f"harness: refilled inputs {sorted(tensors)} did not change"]
        return []

    def _alloc_outputs(self, layout: dict[str, list[Any]], refill: bool) -> None:
        for name, (shape, dtype) in layout.items():
            if not (refill and name in self.outputs):
                self.outputs[name] = torch.empty(shape, dtype=channel.dtype_of(dtype), device=self.device)
            _poison(self.outputs[name])

    def _prepare(self, names: list[str] | None) -> None:
        """Run the bundle's ``prepare`` once per set of weights (not per call)."""
        if names:
            self.prepared = self.prepare(*[self.inputs[n] for n in names])
            self._sync()

    def _args(self, names: list[str], scalars: dict[str, Any]) -> list[Any]:
        pool = {**self.inputs, **self.outputs, **scalars, "prepared": self.prepared, "group": self.group}
        return [pool[n] for n in names]

    def _collect(self, before: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
        violations = []
        for name, tensor in self.outputs.items():
            after = _layout(tensor)
            if after[4:] != before[name][4:] or after[0] != before[name][0]:
                violations.append(f"output {name}: storage was replaced (the harness owns it)")
            elif after[1:4] != before[name][1:4]:
                violations.append(f"output {name}: shape/stride/dtype changed from {before[name][1:4]} to {after[1:4]}")
        return {
            "outputs": dict(self.outputs),
            "inputs_after": dict(self.inputs),
            "violations": violations,
        }

    def call(self, msg: dict[str, Any]) -> tuple[str, Any]:
        refill = msg["refill"]
        harness = self._load_inputs(msg["inputs"], refill)
        if not refill:
            self.outputs = {}
        self._alloc_outputs(msg["outputs"], refill)
        self._sync()

        def call_entry() -> None:
            self._prepare(msg.get("prepare"))
            self.entry(*self._args(msg["args"], msg["scalars"]))

        return self._run(call_entry, harness)

    def _run(self, action: Any, harness: list[str]) -> tuple[str, Any]:
        """Run ``action`` (the candidate), then report the outputs and the layout checks."""
        before = {n: _layout(t) for n, t in self.outputs.items()}
        try:
            action()
            self._sync()
        except Exception:
            return "raised", traceback.format_exc(limit=8)
        result = self._collect(before)
        result["harness"] = harness
        return "result", result

    def capture(self, msg: dict[str, Any]) -> tuple[str, Any]:
        """Capture one call over fixed buffers with the graph backend. An exception from the
        candidate's code is its failure; one from the backend itself is an infrastructure error."""
        self._load_inputs(msg["inputs"], refill=False)
        self.outputs = {}
        self._alloc_outputs(msg["outputs"], refill=False)

        def call_entry() -> None:
            try:
                self.entry(*self._args(msg["args"], msg["scalars"]))
            except Exception as exc:
                raise CandidateRaised(traceback.format_exc(limit=8)) from exc

        self.graph = None
        try:
            self._prepare(msg.get("prepare"))
        except Exception:
            return "raised", traceback.format_exc(limit=8)
        try:
            backend = load_backend(msg["backend"])
            backend.capture(call_entry, self.device)
        except CandidateRaised as raised:
            return "raised", str(raised)
        except Exception:
            return "infra_error", traceback.format_exc(limit=8)
        self.graph = backend
        return "captured", None

    def replay(self, msg: dict[str, Any]) -> tuple[str, Any]:
        """Copy fresh dynamic inputs into the captured buffers, poison outputs, replay."""
        harness = self._load_inputs(msg["inputs"], refill=True)
        for tensor in self.outputs.values():
            _poison(tensor)
        return self._run(self.graph.replay, harness)


def _init_group(rank: int, world: int, init_method: str, device: str) -> Any:
    """The harness owns the process group; the candidate only receives it."""
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    return dist.new_group(list(range(world)))


def serve(conn: Connection, bundle_dir: str, op: Any, device: str, setup: dict[str, Any]) -> None:
    """Child main loop. ``op`` is a manifest ``OpEntry``; ``setup`` carries the log path, the
    limits and, for collectives, ``rank``/``world``/``init_method``."""
    from cacheon.verify.sandbox import confine

    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # Triton kernels run on CPU through the interpreter
    private = tempfile.mkdtemp(prefix="cacheon-child-")
    isolation = confine(private, setup["log"], setup["limits"])
    # Bytecode comes only from the scanned sources: a shipped __pycache__/*.pyc (which the scan and
    # the digest ignore) is never looked at, because the cache lives in a private prefix.
    sys.pycache_prefix = os.path.join(private, "pycache")
    try:
        group = None
        if "rank" in setup:
            group = _init_group(setup["rank"], setup["world"], setup["init_method"], device)
        from cacheon.bundle.loader import load_entry

        entry = load_entry(Path(bundle_dir), op)
        prepare = load_entry(Path(bundle_dir), op, op.prepare) if op.prepare else None
    except BaseException:
        conn.send_bytes(channel.encode(["import_error", traceback.format_exc(limit=8)]))
        return
    session = _Session(entry, prepare, group, device)
    handlers = {"call": session.call, "capture": session.capture, "replay": session.replay}
    conn.send_bytes(channel.encode(["ready", isolation]))
    while True:
        kind, msg = channel.decode(conn.recv_bytes())
        if kind == "stop":
            return
        conn.send_bytes(channel.encode(list(handlers[kind](msg))))
