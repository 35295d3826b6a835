"""The first process inside a confined server's sandbox: drop privileges, set limits, relay, serve.

``python -m cacheon.serving.confined_init PLAN_JSON``, started by :mod:`cacheon.serving.confined`
inside bubblewrap. As root of the sandbox's user namespace (when the host side runs as root) it
drops to the unprivileged uid first, which clears every capability; then it sets the resource
limits (inherited by the server and everything it starts, the armed kernel included), starts one
relay per published port (from the listening Unix socket the host handed in, to loopback) and
runs the server as its child until it exits or this process is told to stop.
"""

from __future__ import annotations

import resource
import signal
import socket
import subprocess
import sys
from types import FrameType

import msgspec

from cacheon.serving import relay
from cacheon.verify.confine import drop_to, effective_capabilities


class InitLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    address_space_bytes: int | None  # per process (None on CUDA: the driver reserves huge ranges)
    processes: int  # processes and threads of the sandbox's uid
    file_bytes: int
    open_files: int


class InitPlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    command: list[str]
    ports: list[int]
    listen_fds: list[int]  # per port, a listening Unix socket the host made (its path is not in here)
    limits: InitLimits
    drop_uid: int | None = None


def _limit(kind: int, value: int) -> None:
    _soft, hard = resource.getrlimit(kind)
    capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (capped, capped))


def apply(limits: InitLimits) -> None:
    if limits.address_space_bytes is not None:
        _limit(resource.RLIMIT_AS, limits.address_space_bytes)
    _limit(resource.RLIMIT_NPROC, limits.processes)
    _limit(resource.RLIMIT_FSIZE, limits.file_bytes)
    _limit(resource.RLIMIT_NOFILE, limits.open_files)


def main(argv: list[str]) -> int:
    plan = msgspec.json.decode(argv[1].encode(), type=InitPlan)
    if plan.drop_uid is not None:
        drop_to(plan.drop_uid, plan.drop_uid)
    apply(plan.limits)
    print(f"cacheon confined_init: capabilities {effective_capabilities()}", flush=True)
    listening = [socket.socket(fileno=fd) for fd in plan.listen_fds]
    relays = relay.RelayThread(lambda: [relay.unix_to_tcp(s, p) for s, p in zip(listening, plan.ports, strict=True)])
    server = subprocess.Popen(plan.command, start_new_session=True)  # close_fds: the server never holds them

    def stop(signum: int, frame: FrameType | None) -> None:
        server.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = server.wait()
    relays.close()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
