import torch


def attention_decode(q, k_cache, v_cache, seq_lens, sm_scale: float, out) -> None:
    group = q.shape[1] // k_cache.shape[2]
    k = k_cache.float().repeat_interleave(group, dim=2)
    v = v_cache.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q.float(), k) * sm_scale
    out.copy_(torch.einsum("bhl,blhd->bhd", torch.softmax(scores, dim=-1), v))
