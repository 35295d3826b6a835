"""How the child captures and replays a call as a graph. The real backend is CUDA graphs; the
backend is injectable (``module:Class``) so the orchestration around it — fresh inputs copied into
captured buffers, poisoned outputs, judged replays, candidate vs. infrastructure failures — can be
tested on CPU. Only the real CUDA backend on a CUDA device counts as a graph *proof*."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol

import torch

CUDA_BACKEND = "cacheon.verify.graphs:CudaGraphs"


class GraphBackend(Protocol):
    def capture(self, call: Callable[[], None], device: torch.device) -> None: ...

    def replay(self) -> None: ...


class CandidateRaised(Exception):
    """The candidate's own code raised while being warmed up or captured (its failure, not ours)."""


class CudaGraphs:
    """Warm up on a side stream (lazy init, autotuning), then capture one call with CUDAGraph."""

    def __init__(self) -> None:
        self._graph: torch.cuda.CUDAGraph | None = None

    def capture(self, call: Callable[[], None], device: torch.device) -> None:
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # torch.cuda.Stream is unannotated
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                call()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            call()
        torch.cuda.synchronize(device)

    def replay(self) -> None:
        if self._graph is None:
            raise RuntimeError("replay before a successful capture")
        self._graph.replay()


class EmulatedGraphs:
    """An emulation for CPU hosts and tests: "capture" makes one call (as a warm-up would) and
    keeps it, "replay" makes it again. It exercises the buffers, poisoning and judging around a
    graph; it proves nothing about CUDA graphs, and a report says so."""

    def __init__(self) -> None:
        self._call: Callable[[], None] | None = None

    def capture(self, call: Callable[[], None], device: torch.device) -> None:
        call()
        self._call = call

    def replay(self) -> None:
        if self._call is None:
            raise RuntimeError("replay before a successful capture")
        self._call()


EMULATED_BACKEND = "cacheon.verify.graphs:EmulatedGraphs"


def load_backend(spec: str) -> GraphBackend:
    """Instantiate ``module:Class``; a bad spec is the harness's problem, raised as ValueError."""
    module_name, _, class_name = spec.partition(":")
    try:
        backend = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"graph backend {spec!r} cannot be loaded: {exc}") from None
    instance: GraphBackend = backend()
    return instance
