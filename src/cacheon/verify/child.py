"""The isolated side of verification: runs inside a spawned child process.

This module imports the candidate, owns the device buffers, calls the entry and ships raw results
back. It judges nothing: references, comparisons and verdicts live in the parent, which the
candidate's code never reaches. The only checks made here are the ones that need the child's
address space (did ``out`` keep its storage and strides?), and the parent treats even those as
claims from an untrusted process that can only make a verdict worse, never better.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from cacheon.verify import channel

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

    def __init__(self, entry: Any, device: str) -> None:
        self.entry = entry
        self.device = torch.device(device)
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}
        self.graph: Any = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _load_inputs(self, tensors: dict[str, Any], refill: bool) -> list[str]:
        problems = []
        for name, value in tensors.items():
            if refill and name in self.inputs:
                previous = self.inputs[name].clone()
                self.inputs[name].copy_(value)
                if torch.equal(previous, self.inputs[name]):
                    problems.append(f"refilled input {name} did not change (harness)")
            else:
                self.inputs[name] = value.to(self.device).contiguous()
        return problems

    def _alloc_outputs(self, layout: dict[str, list[Any]], refill: bool) -> None:
        for name, (shape, dtype) in layout.items():
            if not (refill and name in self.outputs):
                self.outputs[name] = torch.empty(shape, dtype=channel.dtype_of(dtype), device=self.device)
            _poison(self.outputs[name])

    def _args(self, names: list[str], scalars: dict[str, Any]) -> list[Any]:
        pool = {**self.inputs, **self.outputs, **scalars}
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
        before = {n: _layout(t) for n, t in self.outputs.items()}
        self._sync()
        try:
            self.entry(*self._args(msg["args"], msg["scalars"]))
            self._sync()
        except Exception:
            return "raised", traceback.format_exc(limit=8)
        result = self._collect(before)
        result["harness"] = harness
        return "result", result

    def capture(self, msg: dict[str, Any]) -> tuple[str, Any]:
        """Warm up on a side stream, then capture one call into a CUDA graph over fixed buffers."""
        self._load_inputs(msg["inputs"], refill=False)
        self.outputs = {}
        self._alloc_outputs(msg["outputs"], refill=False)
        args = self._args(msg["args"], msg["scalars"])
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.entry(*args)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._sync()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.entry(*args)
            self._sync()
        except Exception:
            self.graph = None
            return "raised", traceback.format_exc(limit=8)
        return "captured", None

    def replay(self, msg: dict[str, Any]) -> tuple[str, Any]:
        """Copy fresh dynamic inputs into the captured buffers, poison outputs, replay."""
        harness = self._load_inputs(msg["inputs"], refill=True)
        for tensor in self.outputs.values():
            _poison(tensor)
        before = {n: _layout(t) for n, t in self.outputs.items()}
        try:
            self.graph.replay()
            self._sync()
        except Exception:
            return "raised", traceback.format_exc(limit=8)
        result = self._collect(before)
        result["harness"] = harness
        return "result", result


def serve(conn: Connection, bundle_dir: str, op: Any, device: str) -> None:
    """Child main loop. ``op`` is a manifest ``OpEntry``."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # Triton kernels run on CPU through the interpreter
    os.chdir(tempfile.mkdtemp(prefix="cacheon-child-"))
    try:
        from cacheon.bundle.loader import load_entry

        entry = load_entry(Path(bundle_dir), op)
    except BaseException:
        conn.send_bytes(channel.encode(["import_error", traceback.format_exc(limit=8)]))
        return
    session = _Session(entry, device)
    handlers = {"call": session.call, "capture": session.capture, "replay": session.replay}
    conn.send_bytes(channel.encode(["ready", None]))
    while True:
        kind, msg = channel.decode(conn.recv_bytes())
        if kind == "stop":
            return
        conn.send_bytes(channel.encode(list(handlers[kind](msg))))
