"""The token counts the pinned SGLang actually runs a kernel at, so verify always asks for some.

A kernel can be right everywhere except at the sizes serving uses (a power of two, a chunk of a
chunked prefill, a CUDA-graph batch size); drawn sizes almost never land on them. The numbers
below are read from the pin's ``sglang/srt/server_args.py`` (0.5.13.post1):

- ``chunked_prefill_size`` defaults by GPU memory to 2048, 4096, 8192 or 16384 (its
  ``_handle_gpu_memory_settings``, lines 1473-1529);
- the CUDA-graph capture batch sizes without speculative decoding are 1, 2, 4, 8, 12, then every
  8 to 256, every 16 below 512, every 32 from 512 up to ``cuda_graph_max_bs`` (at most 512 by
  default) (``_generate_cuda_graph_batch_sizes``, lines 1665-1670).
"""

from __future__ import annotations

import random

#: the pin's default chunked-prefill sizes (server_args.py:1473-1529)
CHUNKED_PREFILL_SIZES = (2048, 4096, 8192, 16384)
#: the pin's largest default cuda_graph_max_bs (server_args.py:1506-1525)
CUDA_GRAPH_MAX_BS = 512
#: serving counts run per dtype besides the two extremes, drawn from the run seed
DRAWN_COUNTS = 3


def cuda_graph_batch_sizes(max_bs: int = CUDA_GRAPH_MAX_BS) -> tuple[int, ...]:
    """The pin's capture batch sizes (no speculative decoding), up to ``max_bs``."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return tuple(s for s in sizes if s <= max_bs)


def serving_counts(largest: int) -> tuple[int, ...]:
    """Every token count serving is known to use, up to ``largest`` (a slot's serving range):
    powers of two, the chunked-prefill sizes and the CUDA-graph batch sizes."""
    powers = (1 << k for k in range(largest.bit_length()))
    counts = {*powers, *CHUNKED_PREFILL_SIZES, *cuda_graph_batch_sizes()}
    return tuple(sorted(c for c in counts if 1 <= c <= largest))


def chosen_counts(largest: int, rng: random.Random) -> tuple[int, ...]:
    """The serving counts one run asks for: always the smallest and the largest (the biggest chunk
    or power of two a slot reaches), and ``DRAWN_COUNTS`` others drawn from ``rng``."""
    counts = serving_counts(largest)
    inner = list(counts[1:-1])
    drawn = rng.sample(inner, min(DRAWN_COUNTS, len(inner)))
    return tuple(sorted({counts[0], counts[-1], *drawn}))
