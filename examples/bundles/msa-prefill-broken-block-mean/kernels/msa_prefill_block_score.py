import torch
import torch.nn.functional as F


def msa_prefill_block_score(q, index_k, prefix_len: int, scale: float, block_size: int, out) -> None:
    rows, keys = q.shape[0], index_k.shape[0]
    blocks = out.shape[1]
    scores = (q.float() @ index_k.float().T) * scale
    key = torch.arange(keys, device=q.device).unsqueeze(0)
    row = torch.arange(rows, device=q.device).unsqueeze(1)
    visible = (key <= prefix_len + row).float()
    pad = blocks * block_size - keys
    total = F.pad(scores * visible, (0, pad)).reshape(rows, blocks, block_size).sum(dim=-1)
    count = F.pad(visible, (0, pad)).reshape(rows, blocks, block_size).sum(dim=-1)
    out.copy_((total / count).masked_fill(count == 0, float("-inf")))
