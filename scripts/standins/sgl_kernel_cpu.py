"""The one sgl-kernel CPU op a CPU SGLang server calls without AMX, in plain torch.

No CPU build of sgl-kernel exists on PyPI (its real CPU kernels also need AVX-512/AMX). From 0.5.18
``mem_cache/allocation.py`` imports ``assign_req_to_token_pool_cpu`` when ``is_cpu()`` and calls it
on every extend; it writes each request's new KV slots into its row of the request-to-token table,
like the Triton kernel ``assign_req_to_token_pool`` does on GPU. Copied into the sgl-kernel stand-in
wheel as ``sgl_kernel/_cpu_ops.py``.
"""


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, max_len):
    """``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]`` = request i's slice of
    ``out_cache_loc`` (requests' slices laid out one after another, in batch order)."""
    starts, ends = start_offset.tolist(), end_offset.tolist()
    rows = req_pool_indices.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        if not 0 <= start <= end <= max_len:
            raise ValueError(f"slots [{start}, {end}) do not fit a request row of {max_len}")
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + count].to(req_to_token.dtype)
        taken += count
