"""The candidate's output tail: what the child wrote before it reported is in the report."""

from __future__ import annotations

import os

from cacheon.verify.output import OutputTail


def _writer(tail: OutputTail) -> int:
    return os.open(tail.path, os.O_WRONLY | os.O_NONBLOCK)


def test_bytes_already_in_the_fifo_are_read_even_before_the_drain_runs(tmp_path):
    # the drain thread is never started: only the catch-up in text() can see these bytes, as
    # when a loaded machine has not scheduled the drain between the child's print and its report
    tail = OutputTail(tmp_path / "out")
    fd = _writer(tail)
    try:
        os.write(fd, b"\x1b[2J painted\n")
        assert tail.text() == "\\x1b[2J painted\n" and tail.total == 13
    finally:
        os.close(fd)
        tail.close()


def test_the_catch_up_keeps_only_the_tail_and_counts_the_rest(tmp_path):
    tail = OutputTail(tmp_path / "out", keep=8)
    fd = _writer(tail)
    try:
        os.write(fd, b"a" * 100 + b"the end!")
        assert tail.text() == "[100 earlier bytes not kept]\nthe end!"
    finally:
        os.close(fd)
        tail.close()


def test_reads_from_the_drain_and_the_catch_up_keep_their_order(tmp_path):
    tail = OutputTail(tmp_path / "out", keep=1 << 20)
    fd = _writer(tail)
    tail.start()
    sent = b"".join(b"%06d\n" % i for i in range(20_000))
    try:
        for start in range(0, len(sent), 4096):
            os.write(fd, sent[start:start + 4096])
            tail.text()  # races the drain on purpose
        os.close(fd)
        fd = -1
        tail.settle(5)
        assert tail.text() == sent.decode() and tail.total == len(sent)
    finally:
        if fd >= 0:
            os.close(fd)
        tail.close()


def test_text_after_close_is_the_final_tail(tmp_path):
    tail = OutputTail(tmp_path / "out")
    fd = _writer(tail)
    os.write(fd, b"last words")
    tail.text()
    os.close(fd)
    tail.close()
    assert tail.text() == "last words"
