"""The one real op in the sgl-kernel stand-in does what the release's own kernel does.

``assign_req_to_token_pool_cpu`` (scripts/standins/sgl_kernel_cpu.py) stands in for the CPU op of
sgl-kernel, which has no CPU build on PyPI. Its GPU twin in the release, the Triton kernel
``mem_cache/allocation.py:assign_req_to_token_pool``, runs here under Triton's interpreter: both fill
the same request-to-token table from the same batch, and the tables must be equal.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.engines.conftest import require_release
from tests.engines.server import release_table, venv_python

RELEASES_WITH_STANDIN = [r for r, facts in release_table().items() if "sgl-kernel" in facts["standins"]]

COMPARE = """
import torch
from sgl_kernel import assign_req_to_token_pool_cpu
from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

g = torch.Generator().manual_seed(0)
rows, width = 6, 64
req_pool_indices = torch.tensor([4, 0, 2], dtype=torch.int64)
start = torch.tensor([0, 5, 17], dtype=torch.int64)
end = torch.tensor([9, 5, 50], dtype=torch.int64)  # one request adds nothing
out_cache_loc = torch.randint(0, 4096, (int((end - start).sum()),), generator=g, dtype=torch.int64)
tables = []
for fill in ("kernel", "standin"):
    table = torch.full((rows, width), -1, dtype=torch.int32)
    if fill == "kernel":
        assign_req_to_token_pool[(3,)](req_pool_indices, table, start, end, out_cache_loc, width, 4)
    else:
        assign_req_to_token_pool_cpu(req_pool_indices, table, start, end, out_cache_loc, width)
    tables.append(table)
assert (tables[0] >= 0).sum() == len(out_cache_loc), "the kernel wrote nothing: the comparison would be empty"
print("equal" if torch.equal(*tables) else f"differ:\\n{tables[0]}\\n{tables[1]}")
"""


@pytest.mark.parametrize("release", RELEASES_WITH_STANDIN)
def test_the_standin_op_equals_the_release_triton_kernel(release: str) -> None:
    require_release(release)
    env = {**os.environ, "TRITON_INTERPRET": "1", "SGLANG_USE_CPU_ENGINE": "1"}
    done = subprocess.run(
        [str(venv_python(release)), "-W", "ignore", "-c", COMPARE], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "equal", done.stdout
