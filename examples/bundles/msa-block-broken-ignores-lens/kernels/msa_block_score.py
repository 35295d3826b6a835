import torch


def msa_block_score(q, index_k, seq_lens, block_size: int, out) -> None:
    batch = index_k.shape[0]
    blocks = out.shape[1]
    scores = torch.einsum("bd,bsd->bs", q.float().sum(dim=1), index_k[:, :, 0].float())
    out.copy_(scores[:, : blocks * block_size].reshape(batch, blocks, block_size).amax(dim=-1))
