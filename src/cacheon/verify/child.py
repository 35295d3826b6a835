"""The candidate's side of verification: the process that runs inside the sandbox.

It applies its share of the confinement (uid, limits), imports the candidate, owns the buffers,
calls the entry and ships raw results back. It calls the entry in the context the pin's serving
runs it in, so a kernel cannot tell the two apart by asking: gradients off (the pin's scheduler loop
is ``@DynamicGradMode()``, ``torch.set_grad_enabled(False)`` by default, and every model forward is
``@torch.no_grad()``: ``sglang/srt/managers/scheduler.py:1420``, ``srt/utils/common.py:410-452``,
``srt/models/llama.py:529``), a default process group of the pin's backend (``init_process_group``
in ``srt/distributed/parallel_state.py:1805``; world size 1 for a slot that is not a collective), and
a call depth varied per call (``Call.frames`` nested frames). It judges nothing: references, comparisons and
verdicts live in the parent, which the candidate's code never reaches. The only checks made here
need the child's address space (did ``out`` keep its storage and strides?), and the parent treats
even those as claims from an untrusted process that can only make a verdict worse.

Started as ``python -I -S -B -c BOOTSTRAP PATHS BOOT``: isolated mode, no site, no bytecode
writes; ``PATHS`` are where cacheon and the site-packages are mounted, ``BOOT`` the JSON ``Boot``.
For a collective, one launcher process starts one process per rank in the same sandbox.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import torch

from cacheon.verify import channel, poison
from cacheon.verify.confine import apply_limits, drop_to, effective_capabilities
from cacheon.verify.graphs import CandidateRaised, GraphBackend, load_backend
from cacheon.verify.messages import (
    DETAIL_CHARS,
    BackendFailed,
    Boot,
    Booted,
    Call,
    Capture,
    Captured,
    ImportFailed,
    Poison,
    Raised,
    Ready,
    Replay,
    Reply,
    Result,
    Stop,
)
from cacheon.verify.untrusted import bounded, describe

BOOTSTRAP = (
    "import sys; sys.path.extend(sys.argv[1].split(':')); "
    "from cacheon.verify.child import main; main(sys.argv[2])"
)
#: torch intra-op threads in the child: verdicts do not depend on speed, and on a shared CPU the
#: synchronisation of several threads costs more per small call than they gain
CHILD_THREADS = 1
Layout = tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype, int, int]


def _layout(tensor: torch.Tensor) -> Layout:
    storage = tensor.untyped_storage()
    return (tensor.data_ptr(), tuple(tensor.stride()), tuple(tensor.shape), tensor.dtype,
            storage.data_ptr(), storage.nbytes())


@dataclass
class Buffers:
    """One set of harness-owned buffers, reused on refill so a pointer-keyed cache is caught."""

    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    prepared: Any = None
    graph: GraphBackend | None = None


def nested(frames: int, action: Callable[[], object]) -> object:
    """``action()`` called under ``frames`` more stack frames: the depth a kernel sees varies per
    call across the range serving nests it at, so the depth says nothing about being watched."""
    return action() if frames <= 0 else nested(frames - 1, action)


def _returned(value: object) -> str:
    """What an entry returned, in a few words: an entry that returns its result instead of writing
    ``out`` is the most natural first mistake, and only this process sees the return value."""
    if value is None:
        return ""
    try:
        if isinstance(value, torch.Tensor):
            return f"a tensor of shape {list(value.shape)} and dtype {str(value.dtype).removeprefix('torch.')}"
        if isinstance(value, (tuple, list)):
            return f"a {type(value).__name__} of {len(value)} value(s)"
        return f"a {type(value).__name__}"
    except BaseException:  # a candidate's object can raise from anything
        return "a value that could not be described"


def _traceback() -> str:
    try:
        return bounded(traceback.format_exc(limit=8), DETAIL_CHARS)
    except BaseException:  # formatting runs the candidate's __str__
        return "(traceback unavailable)"


class Session:
    """The candidate's entry (and prepare) against the buffer sets the parent asks for."""

    def __init__(self, entry: Callable[..., Any], prepare: Callable[..., Any] | None, group: Any, device: str):
        self.entry = entry
        self.prepare = prepare
        self.group = group
        self.device = torch.device(device)
        self.sets: dict[int, Buffers] = {}
        self.own: torch.Tensor | None = None  # what the candidate wrote last: stale data for poison

    def _poison(self, buffers: Buffers, poison_msg: Poison) -> None:
        inputs = list(buffers.inputs.values())
        for tensor in buffers.outputs.values():
            poison.fill(tensor, poison_msg, inputs, self.own)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _load(self, msg: Call) -> tuple[Buffers, list[str]]:
        """Fresh buffers, or (refill) new values copied into the set's existing ones. A refill must
        change at least one input, or it would prove nothing: a harness problem, reported."""
        fresh = channel.tensors_from_wire(msg.inputs)
        buffers = self.sets.get(msg.buffers)
        if not msg.refill or buffers is None:
            buffers = Buffers({n: t.to(self.device).contiguous() for n, t in fresh.items()})
            buffers.outputs = {
                name: torch.empty(spec.shape, dtype=channel.dtype_of(spec.dtype), device=self.device)
                for name, spec in msg.outputs.items()
            }
            self.sets[msg.buffers] = buffers
            return buffers, []
        return buffers, self._refill(buffers, fresh)

    def _refill(self, buffers: Buffers, fresh: dict[str, torch.Tensor]) -> list[str]:
        changed = False
        for name, value in fresh.items():
            target = buffers.inputs[name]
            changed = changed or not torch.equal(target.cpu(), value)
            target.copy_(value)
        return [] if changed or not fresh else [f"harness: refilled inputs {sorted(fresh)} did not change"]

    def _args(self, buffers: Buffers, msg: Call) -> list[Any]:
        pool: dict[str, Any] = {**buffers.inputs, **buffers.outputs, **msg.scalars,
                                "prepared": buffers.prepared, "group": self.group}
        return [pool[n] for n in msg.args]

    def _prepare(self, buffers: Buffers, names: list[str]) -> None:
        """Run the bundle's ``prepare`` once per set of weights (fresh buffers only)."""
        if names and self.prepare is not None:
            buffers.prepared = self.prepare(*[buffers.inputs[n] for n in names])
            self._sync()

    def call(self, msg: Call) -> Reply:
        buffers, harness = self._load(msg)
        self._poison(buffers, msg.poison)
        self._sync()

        def run() -> object:
            if not msg.refill:
                self._prepare(buffers, msg.prepare)
            args = self._args(buffers, msg)
            return nested(msg.frames, lambda: self.entry(*args))

        return self._run(msg.seq, buffers, run, harness)

    def _run(self, seq: int, buffers: Buffers, action: Callable[[], object], harness: list[str]) -> Reply:
        """Run ``action`` (the candidate), then report the outputs, the layout checks and what it returned."""
        before = {n: _layout(t) for n, t in buffers.outputs.items()}
        try:
            returned = action()
            self._sync()
        except BaseException as exc:  # SystemExit and KeyboardInterrupt are the candidate's failures too
            return Raised(seq, describe(exc), _traceback())
        self.own = poison.kept(list(buffers.outputs.values()))
        violations = []
        for name, tensor in buffers.outputs.items():
            after = _layout(tensor)
            if after[4:] != before[name][4:] or after[0] != before[name][0]:
                violations.append(f"output {name}: storage was replaced (the harness owns it)")
            elif after[1:4] != before[name][1:4]:
                violations.append(f"output {name}: shape/stride/dtype changed from {before[name][1:4]} to {after[1:4]}")
        return Result(seq, channel.tensors_to_wire(buffers.outputs), channel.tensors_to_wire(buffers.inputs),
                      violations, harness, bounded(_returned(returned)))

    def capture(self, msg: Capture) -> Reply:
        """Capture one call over fixed buffers with the graph backend. An exception from the
        candidate's code is its failure; one from the backend itself is an infrastructure error."""
        call = msg.call
        buffers, _ = self._load(call)
        buffers.graph = None
        self._poison(buffers, call.poison)

        def run_entry() -> None:
            try:
                args = self._args(buffers, call)
                nested(call.frames, lambda: self.entry(*args))
            except BaseException as exc:
                raise CandidateRaised(describe(exc)) from exc

        try:
            self._prepare(buffers, call.prepare)
        except BaseException as exc:
            return Raised(call.seq, describe(exc), _traceback())
        try:
            backend = load_backend(msg.backend)
            backend.capture(run_entry, self.device)
        except CandidateRaised as raised:
            return Raised(call.seq, str(raised), _traceback())
        except Exception:
            return BackendFailed(call.seq, _traceback())
        buffers.graph = backend
        return Captured(call.seq)

    def replay(self, msg: Replay) -> Reply:
        """Copy fresh dynamic inputs into the captured buffers, poison outputs, replay."""
        buffers = self.sets[msg.buffers]
        graph = buffers.graph
        if graph is None:
            return BackendFailed(msg.seq, "replay of a buffer set that was never captured")
        harness = self._refill(buffers, channel.tensors_from_wire(msg.inputs))
        self._poison(buffers, msg.poison)
        return self._run(msg.seq, buffers, graph.replay, harness)


def _init_group(boot: Boot) -> Any:
    """The harness owns the process group; a collective's candidate receives it. Every candidate
    runs with a default group initialised as the pin initialises it (its device's backend, nccl or
    gloo, from an init method; world size 1 for a slot that is not a collective), so
    ``torch.distributed`` answers as in serving. Only loopback or the workdir is reachable: fine."""
    import torch.distributed as dist

    backend = "nccl" if boot.device == "cuda" else "gloo"
    if boot.device == "cuda":
        torch.cuda.set_device(boot.rank)
    dist.init_process_group(backend, init_method=boot.rendezvous, rank=boot.rank, world_size=boot.world)
    return dist.new_group(list(range(boot.world))) if boot.world > 1 else None


def _confine(boot: Boot) -> dict[str, str]:
    applied = {"confinement": boot.confinement}
    if boot.drop_uid is not None and os.getuid() == 0:  # a rank's launcher may have dropped already
        drop_to(boot.drop_uid, boot.drop_uid)
    applied["uid"] = str(os.getuid())
    applied["capabilities"] = effective_capabilities()
    os.chdir(boot.workdir)
    applied.update(apply_limits(boot.limits))
    sys.dont_write_bytecode = True
    torch.set_num_threads(CHILD_THREADS)
    return applied


def _launch_ranks(boot: Boot) -> int:
    """Inside one sandbox: one process per rank, each with only its own channel."""
    paths = sys.argv[1]
    ranks = []
    for rank, fd in enumerate(boot.fds):
        argv = [sys.executable, "-I", "-S", "-B", "-c", BOOTSTRAP, paths,
                msgspec.json.encode(msgspec.structs.replace(boot, rank=rank)).decode()]
        ranks.append(subprocess.Popen(argv, pass_fds=(fd,), close_fds=True))
        os.close(fd)
    codes = [p.wait() for p in ranks]
    return next((c for c in codes if c), 0)


def _load_candidate(boot: Boot) -> tuple[Callable[..., Any], Callable[..., Any] | None]:
    from cacheon.bundle.loader import load_entry
    from cacheon.bundle.manifest import OpEntry

    op = OpEntry(boot.slot, boot.source, boot.entry, (), boot.prepare)
    entry = load_entry(Path(boot.bundle), op)
    prepare = load_entry(Path(boot.bundle), op, boot.prepare) if boot.prepare else None
    return entry, prepare


def serve(boot: Boot, conn: channel.Endpoint, applied: dict[str, str]) -> None:
    conn.send(channel.encode(Booted(boot.rank, applied)))
    try:
        group = _init_group(boot)
        entry, prepare = _load_candidate(boot)
    except BaseException as exc:  # an import that raises or exits is the candidate's failure
        conn.send(channel.encode(ImportFailed(describe(exc), _traceback())))
        return
    session = Session(entry, prepare, group, boot.device)
    conn.send(channel.encode(Ready(boot.rank)))
    torch.set_grad_enabled(False)  # what the pin's DynamicGradMode does around every forward
    while True:
        msg = channel.decode_to_child(conn.receive())
        if isinstance(msg, Stop):
            return
        if isinstance(msg, Call):
            reply = session.call(msg)
        elif isinstance(msg, Capture):
            reply = session.capture(msg)
        else:
            reply = session.replay(msg)
        conn.send(channel.encode(reply))


def main(boot_json: str) -> None:
    boot = msgspec.json.decode(boot_json, type=Boot)
    if boot.rank < 0:  # the launcher of a collective: confined like the ranks it starts
        _confine(boot)
        raise SystemExit(_launch_ranks(boot))
    applied = _confine(boot)
    serve(boot, channel.Endpoint.from_fd(boot.fds[boot.rank]), applied)
