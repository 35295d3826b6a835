import torch


def msa_block_score(q, index_k, seq_lens, block_size: int, out) -> None:
    batch, keys = index_k.shape[0], index_k.shape[1]
    blocks = out.shape[1]
    scores = torch.einsum("bd,bsd->bs", q.float().sum(dim=1), index_k[:, :, 0].float())
    beyond = torch.arange(keys, device=q.device).unsqueeze(0) >= seq_lens.unsqueeze(1)
    best = scores.masked_fill(beyond, float("-inf"))[:, : blocks * block_size]
    best = best.reshape(batch, blocks, block_size).amax(dim=-1)
    seen = best > float("-inf")
    out[seen] = best[seen]  # masked blocks keep whatever the buffer held
