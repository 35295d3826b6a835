"""``cacheon kv``: listen to a worker's KV events, predict block hashes, list wire contracts."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from cacheon.commands._args import non_negative_int, positive_float, positive_int
from cacheon.commands._output import add_subcommands, print_json
from cacheon.errors import UsageError
from cacheon.kv import contracts
from cacheon.kv.feed import Delivery
from cacheon.kv.hashing import page_hashes
from cacheon.kv.subscriber import Subscriber
from cacheon.kv.transport import Live, LiveSocket, rank_endpoint
from cacheon.kv.wire import WireBounds, WireDecoder, WireReject, event_json
from cacheon.printable import escape_controls

if TYPE_CHECKING:
    from cacheon.fleet.relay import Relay


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "kv",
        help="SGLang KV events: listen, predict block hashes, list wire contracts",
        description="Work with the KV events SGLang workers publish over ZMQ.",
    )
    kv = add_subcommands(p, "kv_command")

    listen = kv.add_parser(
        "listen",
        help="subscribe to one DP rank and print each batch (decoded or rejected)",
        description="Dial ENDPOINT's port + RANK (SGLang's per-rank ports), decode each batch under the "
        "chosen contract and print it. Without --contract/--sglang-version, classify instead: try every "
        "contract on each batch and print which accept it. Exit 0 when COUNT batches decoded cleanly, "
        "2 when any was rejected, 1 on timeout.",
    )
    listen.add_argument("endpoint", metavar="ENDPOINT", help="the worker's base PUB endpoint, tcp://HOST:PORT")
    which = listen.add_mutually_exclusive_group()
    which.add_argument("--contract", metavar="ID", help="decode under this contract id")
    which.add_argument("--sglang-version", metavar="V", help="decode under the contract covering version V")
    listen.add_argument("--rank", type=non_negative_int, default=0, metavar="N", help="DP rank (port offset)")
    listen.add_argument("--replay", metavar="ENDPOINT", help="the worker's base replay (ROUTER) endpoint")
    listen.add_argument("--topic", default="", help="ZMQ topic prefix to subscribe to (default: all)")
    listen.add_argument(
        "--count", type=non_negative_int, default=1, metavar="N",
        help="stop after N batches (0: until --timeout or Ctrl-C)"
    )
    listen.add_argument("--timeout", type=positive_float, metavar="S", help="give up after S seconds (default: wait)")
    listen.add_argument("--json", action="store_true", help="one JSON object per line")
    listen.set_defaults(handler=run_listen)

    hash_ = kv.add_parser(
        "hash",
        help="predict the block hashes SGLang publishes for a token list",
        description="Print SGLang's unsalted page-hash chain for the tokens' full pages, one signed int64 "
        "per line (bit-exact with get_hash_str/hash_str_to_int64 at the pin).",
    )
    hash_.add_argument("--page-size", type=positive_int, required=True, metavar="P",
                       help="tokens per page, as the worker's --page-size")
    hash_.add_argument("tokens", nargs="*", metavar="TOKEN", help="token ids")
    hash_.add_argument("--tokens-file", type=Path, help="a JSON array or whitespace-separated token ids")
    hash_.add_argument("--json", action="store_true", help="print {page_size, tokens, hashes} as JSON")
    hash_.set_defaults(handler=run_hash)

    listing = kv.add_parser("contracts", help="list the KV-event wire contracts")
    listing.add_argument("--json", action="store_true", help="print the registry as JSON")
    listing.add_argument(
        "--ledger", metavar="PATH", help="evidence ledger whose complete_engine passes promote contracts "
        "to validated (default: $CACHEON_LEDGER, else the user's ledger)"
    )
    listing.set_defaults(handler=run_contracts)

    relay = kv.add_parser(
        "relay",
        help="follow workers' KV publishers and publish their batches to NATS JetStream (the fleet event plane)",
        description="Subscribe to each worker's ZMQ KV publisher as a gateway does (same contracts, strict decode, "
        "replay on gap) and publish every accepted batch to the JetStream stream under a subject per worker and "
        "rank, with periodic index snapshots and a heartbeat per worker. Gateways whose config sets event_plane "
        "read their workers' KV state from there. Run two or more relays on the same config: a lease per "
        "worker (a JetStream KV bucket) shares the workers out, and a dead relay's workers go to another once "
        "its leases expire (lease_s). Runs until SIGTERM or Ctrl-C. Needs the fleet extra (nats-py).",
    )
    relay.add_argument("--config", type=Path, required=True, metavar="FILE",
                       help="relay config (YAML or .toml): event_plane, workers, lease/heartbeat/snapshot timing")
    relay.add_argument("--json", action="store_true", help="on exit, print the relay's status as JSON")
    relay.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="log level (default: info)")
    relay.add_argument("--log-format", choices=("text", "json"), default="text", help="log lines (default: text)")
    relay.set_defaults(handler=run_relay)


def _registry(ledger_path: str | None) -> tuple[tuple[contracts.WireContract, ...], dict[str, Any] | None]:
    """Promotion comes from the ledger: only a real engine's pass makes a contract ``validated``.
    No ledger yet means no evidence yet; a ledger named with --ledger must exist. Also what the
    ledger read was checked against (None when there is no ledger)."""
    from cacheon.evidence.ledger import LEDGER_ENV, default_ledger_path, open_verified_ledger
    from cacheon.evidence.promotion import validated_contracts

    path = Path(ledger_path or os.environ.get(LEDGER_ENV) or default_ledger_path())
    if not path.exists():
        if ledger_path:
            raise UsageError(f"no ledger at {path}")
        return contracts.CONTRACTS, None
    ledger = open_verified_ledger(path)
    validated = validated_contracts(ledger, {c.id: c.versions for c in contracts.CONTRACTS})
    return contracts.promoted(validated), ledger.guarantee()


def freeze_when_connected(started: asyncio.Future[Relay]) -> None:
    """Once the relay is connected: its start-up heap out of the collector's passes, as ``gateway serve`` does.

    A full collection traverses every tracked object, ~50k after a relay's start-up: 25-48 ms with the GIL
    held on a small VM, the ZMQ thread and the publishing loop stopped, each one the p99 of the event plane's
    lag at 100k block events/s (benchmarks/README.md, the lag tail at 100k)."""
    from cacheon.gateway.heap import freeze_startup_objects

    if not started.cancelled() and started.exception() is None:
        freeze_startup_objects(thresholds=None)


def run_relay(args: argparse.Namespace) -> int:
    import signal

    from cacheon.gateway.config import load_relay
    from cacheon.gateway.logs import configure
    from cacheon.gateway.relaying import serve

    cfg = load_relay(args.config)
    configure(args.log_level, args.log_format)

    async def run() -> dict[str, object]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        started: asyncio.Future[Relay] = loop.create_future()
        started.add_done_callback(freeze_when_connected)
        try:
            relay = await serve(cfg, stop, started)
        except (OSError, TimeoutError) as exc:
            why = str(exc) or "no server answered within 5 s"
            raise UsageError(f"event plane {cfg.event_plane.url}: {why}") from None
        return relay.last_status or relay.status()

    status = asyncio.run(run())
    if args.json:
        print_json(status)
    return 0


def run_contracts(args: argparse.Namespace) -> int:
    registry, guarantee = _registry(args.ledger)
    if args.json:
        print_json({"contracts": [c.describe() for c in registry], "guarantee": guarantee})
        return 0
    print(f"{'CONTRACT':<20}{'SGLANG':<24}{'ENCODING':<14}{'REPLAY':<11}{'HASHES':<10}{'REAL ENGINE':<14}PROMOTION")
    for c in registry:
        hashes = "checked" if c.hash_checked else "declared"
        proven = ", ".join(c.engine_proven) or "-"
        print(escape_controls(f"{c.id:<20}{', '.join(c.versions):<24}{c.encoding:<14}{c.replay_framing:<11}"
                              f"{hashes:<10}{proven:<14}{c.promotion}"))
        print(f"{'':<20}{c.summary}")
    checked = f"ledger checked: {guarantee['summary']}" if guarantee else "no ledger yet: nothing promoted"
    print(escape_controls(checked))
    return 0


def run_hash(args: argparse.Namespace) -> int:
    words = list(args.tokens)
    if args.tokens_file is not None:
        try:
            text = args.tokens_file.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read {args.tokens_file}: {exc.strerror}") from None
        try:
            words += json.loads(text) if text.lstrip().startswith("[") else text.split()
        except json.JSONDecodeError as exc:
            raise UsageError(f"{args.tokens_file} is not a JSON array: {exc}") from None
    if not words:
        raise UsageError("give token ids as arguments or with --tokens-file")
    try:
        tokens = [w if isinstance(w, int) else int(w) for w in words]
        hashes = page_hashes(tokens, args.page_size)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print_json({"page_size": args.page_size, "tokens": len(tokens), "hashes": hashes})
        return 0
    for h in hashes:
        print(h)
    return 0


def run_listen(args: argparse.Namespace) -> int:
    if args.contract is not None:
        return _decode(args, contracts.by_id(args.contract))
    if args.sglang_version is not None:
        return _decode(args, contracts.for_version(args.sglang_version))
    if args.replay:
        raise UsageError("--replay needs --contract or --sglang-version (replay framing differs by release)")
    return _classify(args)


def _decode(args: argparse.Namespace, contract: contracts.WireContract) -> int:
    seen = {"batches": 0, "rejects": 0}

    def show(d: Delivery) -> None:
        seen["batches"] += 1
        if d.reject is not None:
            seen["rejects"] += 1
            _emit(args.json, {"seq": d.seq, "reject": d.reject.reason, "detail": d.reject.detail})
        elif d.batch is not None:
            events = [event_json(e) for e in d.batch.events]
            _emit(args.json, {"seq": d.seq, "rank": d.batch.rank, "events": events})

    subscriber = Subscriber(on_delivery=show)
    try:
        subscriber.add_worker("worker", args.endpoint, contract, [args.rank], replay_base=args.replay, topic=args.topic)
        done = _pump(args, lambda: subscriber.poll(0.1), lambda: seen["batches"])
    finally:
        counters = subscriber.counters()
        subscriber.close()
    print(f"counters: {json.dumps(counters, sort_keys=True)}", file=sys.stderr)
    return _verdict(args, done, seen["batches"], seen["rejects"])


def _classify(args: argparse.Namespace) -> int:
    """Each batch under every contract, on the same live socket the gateway reads through."""
    decoders = [WireDecoder(c) for c in contracts.CONTRACTS]
    seen = {"batches": 0, "rejects": 0}
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    live = LiveSocket(ctx, rank_endpoint(args.endpoint, args.rank), args.topic.encode(),
                      max_frame_bytes=WireBounds().max_payload_bytes)

    def receive_one() -> None:
        if not live.wait(0.1):
            return
        for message in live.messages(1):
            seq, payload = (message.seq, message.payload) if isinstance(message, Live) else (-1, message.frames[-1])
            accepted, rejected = [], {}
            for decoder in decoders:
                try:
                    decoder.decode(payload, args.rank)
                    accepted.append(decoder.contract.id)
                except WireReject as reject:
                    rejected[decoder.contract.id] = f"{reject.reason}: {reject.detail}"
            seen["batches"] += 1
            seen["rejects"] += not accepted
            _emit(args.json, {"seq": seq, "rank": args.rank, "accepted_by": accepted, "rejected": rejected})

    try:
        done = _pump(args, receive_one, lambda: seen["batches"])
    finally:
        live.close()
        ctx.term()
    return _verdict(args, done, seen["batches"], seen["rejects"])


def _pump(args: argparse.Namespace, step: Callable[[], object], received: Callable[[], int]) -> bool:
    """Run ``step`` until COUNT batches arrived (True) or the timeout passed (False; with
    ``--count 0`` the timeout is the planned end, so True)."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while args.count == 0 or received() < args.count:
        if deadline is not None and time.monotonic() >= deadline:
            return args.count == 0
        step()
    return True


def _verdict(args: argparse.Namespace, done: bool, batches: int, rejects: int) -> int:
    if not done:
        print(f"cacheon kv listen: timed out with {batches} of {args.count} batches", file=sys.stderr)
        return 1
    return 2 if rejects else 0


def _emit(as_json: bool, record: dict[str, Any]) -> None:
    if as_json:
        print_json(record, line=True)
        return
    if "reject" in record:
        print(f"seq {record['seq']}: REJECTED {record['reject']}: {record['detail']}", flush=True)
    elif "accepted_by" in record:
        verdict = ", ".join(record["accepted_by"]) or "no contract"
        print(f"seq {record['seq']}: accepted by {verdict}", flush=True)
    else:
        kinds = ", ".join(f"{e['type']}[{len(e.get('block_hashes', []))}]" for e in record["events"]) or "-"
        print(f"seq {record['seq']} rank {record['rank']}: {kinds}", flush=True)
