"""The demo: a multi-turn "chat with a document" workload through the gateway over simulated workers.

For each policy it starts fresh simulated workers (cold caches) and a gateway, replays the same
sessions in turn-synchronised waves, and measures what the workers report: prefix-cache hit rate
(cached prompt tokens / prompt tokens, from each response's usage), load spread, routing reasons.
Every request is kept (:class:`Served`) so a benchmark can replay the exact sequence offline.
"""

from __future__ import annotations

import itertools
import random
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cacheon.sim.launch import RELEASES, GatewayProcess, SimProcess
from cacheon.sim.tokenizer import CORPUS, write_profile

Messages = list[dict[str, str]]

WORDS = sorted({w.strip(".,") for line in CORPUS for w in line.split()})


@dataclass(frozen=True)
class Session:
    """One user's conversation: its app's system prompt, its own document, its questions, its start."""

    system: str
    document: str
    questions: tuple[str, ...]
    start: int  # the wave of its first turn


@dataclass(frozen=True)
class Served:
    """One request as the client sent it and as the worker answered it."""

    wave: int
    session: int
    messages: Messages
    prompt_tokens: int
    cached_tokens: int
    worker: str
    route: str
    order: int  # completion order over the whole run (within a wave, the order the workers served)
    latency_s: float = 0.0  # as the client saw it: sent to whole answer


@dataclass(frozen=True)
class Outcome:
    policy: str
    hit_rate: float
    load: dict[str, int]
    reasons: dict[str, int]
    served: tuple[Served, ...] = field(default=(), repr=False)

    @property
    def spread(self) -> float:
        """max / mean requests per worker (1.0 is perfectly even)."""
        counts = list(self.load.values())
        return max(counts) / (sum(counts) / len(counts)) if counts else 0.0


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) if rng.random() < 0.7 else str(rng.randrange(10_000)) for _ in range(words))


def conversations(sessions: int, turns: int, seed: int = 0, *, apps: int = 4, system_words: int = 40,
                  document_words: int = 500, question_words: int = 12, arrivals: int = 0) -> list[Session]:
    """A "chat with a document" trace, shaped like RAG / support-bot traffic, where routing matters.

    - ``apps`` system prompts (``system_words`` long), each session drawn from one at random: a
      few applications or tenants behind one endpoint. They are shared, so any policy (rr too)
      soon caches them everywhere; they are kept short next to the document, as they are in
      practice next to retrieved context.
    - A per-session document (``document_words``, with numbers, so it tokenizes long: a retrieved
      passage, a pasted file, a ticket's history) in the first user turn. Nobody else shares it:
      it is only a hit if the worker that served the previous turn serves the next one.
    - ``turns`` short follow-up questions; the client appends the worker's real reply to the
      history each turn, as an OpenAI client does, so the history grows by what was generated.
    - Sessions arrive at random over time, ``arrivals`` new ones per wave on average (0: all at
      once), so the steady state mixes new sessions (cold documents) with ongoing ones, and the
      number in flight is not a multiple of the worker count, as in live traffic. (Arrivals in
      lockstep with the pool size would let round robin send a session to the same worker every
      turn by accident.)
    """
    rng = random.Random(seed)
    systems = [f"You are assistant {k} of app {k}. " + _text(rng, system_words) for k in range(apps)]
    window = -(-sessions // arrivals) if arrivals else 1  # waves over which sessions arrive
    return [
        Session(
            system=rng.choice(systems),
            document=f"Document {s}: " + _text(rng, document_words),
            questions=tuple(f"Question {t} on document {s}: " + _text(rng, question_words) for t in range(turns)),
            start=rng.randrange(window),
        )
        for s in range(sessions)
    ]


def _first(session: Session) -> Messages:
    return [{"role": "system", "content": session.system},
            {"role": "user", "content": f"{session.document}\n\n{session.questions[0]}"}]


def replay(url: str | list[str], sessions: list[Session], max_tokens: int = 16, seed: int = 0) -> list[Served]:
    """Turn-synchronised waves: every active session sends its next turn at once, then all wait.

    Several URLs (gateway replicas): the requests of each wave alternate over them, as a
    load balancer in front of the replicas would send them.

    Waves make the run repeatable: a session's next turn never overtakes the previous one, and
    which requests race each other does not depend on thread timing across turns. Within a wave
    the sessions are sent in a shuffled (seeded) order: users do not queue up by session id.
    """
    rng = random.Random(seed)
    urls = [url] if isinstance(url, str) else url
    history: dict[int, Messages] = {}
    served: list[Served] = []
    order = itertools.count()
    waves = max(s.start + len(s.questions) for s in sessions)
    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=len(sessions))) as client, \
            ThreadPoolExecutor(len(sessions)) as pool:

        def send(wave: int, i: int, url: str) -> tuple[Served, str]:
            turn = wave - sessions[i].start
            messages = _first(sessions[i]) if turn == 0 else [
                *history[i], {"role": "user", "content": sessions[i].questions[turn]}]
            sent = time.perf_counter()
            r = client.post(f"{url}/v1/chat/completions",
                            json={"model": "demo", "messages": messages, "max_tokens": max_tokens})
            latency = time.perf_counter() - sent
            r.raise_for_status()
            body = r.json()
            usage = body["usage"]
            return Served(wave, i, messages, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"],
                          r.headers["x-cacheon-worker"], r.headers["x-cacheon-route"], next(order), latency), \
                body["choices"][0]["message"]["content"]

        for wave in range(waves):
            active = [i for i, s in enumerate(sessions) if s.start <= wave < s.start + len(s.questions)]
            rng.shuffle(active)
            targets = [urls[k % len(urls)] for k in range(len(active))]
            for req, reply in pool.map(send, itertools.repeat(wave), active, targets):
                history[req.session] = [*req.messages, {"role": "assistant", "content": reply}]
                served.append(req)
    return sorted(served, key=lambda r: r.order)


def run(policy: str, workers: int, version: str, sessions: list[Session], tmp: Path, profile: tuple[Path, Path],
        page_size: int, capacity_tokens: int, delay_ms: int, releases: Path = RELEASES, seed: int = 0) -> Outcome:
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp, profile, version, page_size=page_size, capacity_tokens=capacity_tokens,
                    delay_ms=delay_ms, releases=releases)
                for _ in range(workers)]
        for s in sims:
            s.ready()
        gw = GatewayProcess(stack, tmp, profile, policy, [{"url": s.url} for s in sims])
        if policy == "exact":
            gw.settled([s.url for s in sims])
        names = {s.url: f"sim{i}" for i, s in enumerate(sims)}
        served = [Served(**{**vars(r), "worker": names[r.worker]}) for r in replay(gw.url, sessions, seed=seed)]
        load = Counter(r.worker for r in served)
        hit_rate = sum(r.cached_tokens for r in served) / max(sum(r.prompt_tokens for r in served), 1)
        return Outcome(policy, hit_rate, {n: load.get(n, 0) for n in names.values()},
                       dict(Counter(r.route for r in served)), tuple(served))


def demo(workers: int, sessions: int, turns: int, version: str, page_size: int, capacity_tokens: int,
         delay_ms: int = 50, policies: tuple[str, ...] = ("rr", "approx", "exact"),
         arrivals: int = 0, releases: Path = RELEASES, seed: int = 0) -> list[Outcome]:
    """Each policy over the same workload: ``seed`` draws it (documents, prompts, arrivals, send order)."""
    workload = conversations(sessions, turns, seed, arrivals=arrivals)
    with tempfile.TemporaryDirectory(prefix="cacheon-demo-") as tmp:
        profile = write_profile(Path(tmp) / "tok")
        return [run(p, workers, version, workload, Path(tmp), profile, page_size, capacity_tokens, delay_ms,
                    releases.resolve(), seed)
                for p in policies]
