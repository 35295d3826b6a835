"""Routing traces for benchmarks/routing_peers.py: chat sessions as plain data, deterministic from a seed.

A trace is a set of sessions replayed in turn-synchronised waves: every session active in a wave
sends its next turn at once, and the worker's reply joins that session's history before its next
turn (as an OpenAI client does). So every router sees the same prompts in the same waves, which the
benchmark checks, and what differs is only where each request went.

- ``chat``: the demo's "chat with a document" (``cacheon.sim.demo.conversations``): a few shared
  short system prompts, a private long document per session, short follow-ups.
- ``system``: many users behind a few applications with long system prompts, short questions: the
  shared prefix is most of every prompt, so piling an app's users onto its prompt's holder is the trap.
- ``forks``: a tree of forks: a few long conversations, each forked many times at different depths
  (regenerate, edit-and-resend, agents exploring branches); a fork's best worker holds its root.
- ``burst``: a burst of new sessions, all at once, each with a private document, then a follow-up:
  nothing is cached at first, so the first wave is pure load balancing and the second pure affinity.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from cacheon.sim.demo import WORDS, conversations

Message = dict[str, str]


@dataclass(frozen=True)
class Session:
    opening: tuple[Message, ...]  # the first turn's messages
    follow_ups: tuple[str, ...]  # the user messages of its later turns
    start: int  # the wave of its first turn

    @property
    def turns(self) -> int:
        return 1 + len(self.follow_ups)


@dataclass(frozen=True)
class Trace:
    name: str
    sessions: tuple[Session, ...]

    @property
    def waves(self) -> int:
        return max(s.start + s.turns for s in self.sessions)

    @property
    def requests(self) -> int:
        return sum(s.turns for s in self.sessions)

    def active(self, wave: int) -> list[int]:
        """Indices of the sessions that send a turn in ``wave``."""
        return [i for i, s in enumerate(self.sessions) if s.start <= wave < s.start + s.turns]


def text(rng: random.Random, words: int) -> str:
    """Words and numbers (numbers tokenize long, like identifiers and figures in real documents)."""
    return " ".join(rng.choice(WORDS) if rng.random() < 0.7 else str(rng.randrange(10_000)) for _ in range(words))


def chat(seed: int, sessions: int = 48, turns: int = 4, arrivals: int = 8) -> Trace:
    out = tuple(Session(({"role": "system", "content": c.system},
                         {"role": "user", "content": f"{c.document}\n\n{c.questions[0]}"}), c.questions[1:], c.start)
                for c in conversations(sessions, turns, seed, arrivals=arrivals))
    return Trace("chat", out)


def system(seed: int, users: int = 64, apps: int = 4, system_words: int = 900, turns: int = 3,
           arrivals: int = 16) -> Trace:
    rng = random.Random(seed)
    prompts = [f"You are the assistant of application {k}. Policies and reference: " + text(rng, system_words)
               for k in range(apps)]
    window = -(-users // arrivals)
    out = tuple(Session(({"role": "system", "content": rng.choice(prompts)},
                         {"role": "user", "content": f"User {u} asks: " + text(rng, 12)}),
                        tuple(f"User {u} follows up {t}: " + text(rng, 10) for t in range(1, turns)),
                        rng.randrange(window))
                for u in range(users))
    return Trace("system", out)


def forks(seed: int, roots: int = 6, per_root: int = 8, depth: int = 6, document_words: int = 300,
          turns: int = 2) -> Trace:
    """Each root: a document and ``depth`` fixed exchanges; each fork resends the root's history up to
    a random depth with a question of its own, then follows up ``turns - 1`` times."""
    rng = random.Random(seed)
    out = []
    for r in range(roots):
        history: list[Message] = [{"role": "system", "content": f"Root {r}. You are a careful reviewer."},
                                  {"role": "user", "content": f"Document {r}: " + text(rng, document_words)}]
        for k in range(depth):
            history += [{"role": "assistant", "content": f"Review {r}.{k}: " + text(rng, 40)},
                        {"role": "user", "content": f"Point {r}.{k}: " + text(rng, 20)}]
        for f in range(per_root):
            cut = 3 + 2 * rng.randrange(depth)  # the system prompt, the document, then up to an answer
            opening = (*history[:cut], {"role": "user", "content": f"Fork {r}.{f}: " + text(rng, 15)})
            out.append(Session(opening, tuple(f"Fork {r}.{f} goes on {t}: " + text(rng, 10) for t in range(1, turns)),
                               rng.randrange(3)))
    rng.shuffle(out)
    return Trace("forks", tuple(out))


def burst(seed: int, sessions: int = 64, document_words: int = 400, turns: int = 2) -> Trace:
    rng = random.Random(seed)
    out = tuple(Session(({"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": f"Ticket {s}: " + text(rng, document_words)}),
                        tuple(f"Ticket {s}, follow-up {t}: " + text(rng, 10) for t in range(1, turns)), 0)
                for s in range(sessions))
    return Trace("burst", out)


TRACES: dict[str, Callable[[int], Trace]] = {"chat": chat, "system": system, "forks": forks, "burst": burst}
