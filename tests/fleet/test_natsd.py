"""The fleet tier's own harness: the server starts with JetStream and keeps a stream across restarts."""

from __future__ import annotations

import asyncio

import nats


def test_jetstream_keeps_a_stream_across_a_restart(nats_own):
    async def publish() -> int:
        nc = await nats.connect(nats_own.url)
        js = nc.jetstream()
        await js.add_stream(name="PROBE", subjects=["probe.>"])
        ack = await js.publish("probe.a", b"one", headers={"Nats-Msg-Id": "w/0/1"})
        again = await js.publish("probe.a", b"one", headers={"Nats-Msg-Id": "w/0/1"})
        await nc.close()
        assert again.duplicate and again.seq == ack.seq
        return ack.seq

    async def read() -> tuple[int, bytes]:
        nc = await nats.connect(nats_own.url)
        msg = await nc.jetstream().get_msg("PROBE", 1)
        info = await nc.jetstream().stream_info("PROBE")
        await nc.close()
        return info.state.messages, msg.data

    assert asyncio.run(publish()) == 1
    nats_own.restart()
    assert asyncio.run(read()) == (1, b"one")
