"""Injected graph backends for testing the graph-stage orchestration on CPU (no CUDA here)."""


class EmulatedGraphs:
    """'capture' makes one call (as a warm-up would) and keeps it; 'replay' makes it again. It
    exercises buffers, poisoning and judging; it proves nothing about CUDA graphs."""

    def capture(self, call, device) -> None:
        call()
        self._call = call

    def replay(self) -> None:
        self._call()


class BrokenGraphs:
    """The graph machinery itself fails: an infrastructure error, never the candidate's."""

    def capture(self, call, device) -> None:
        raise RuntimeError("graph machinery unavailable on this host")

    def replay(self) -> None:
        raise AssertionError("never captured")
