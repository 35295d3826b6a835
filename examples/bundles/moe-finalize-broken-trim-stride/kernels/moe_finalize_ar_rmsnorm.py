import torch
import torch.distributed as dist


def moe_finalize_ar_rmsnorm(gemm_out, row_map, scales, residual, weight, eps: float, out_norm, out_residual,
                            group) -> None:
    tokens = residual.shape[0]
    k = scales.shape[1]
    slot = torch.arange(tokens, device=gemm_out.device).unsqueeze(1) + tokens * torch.arange(k, device=gemm_out.device)
    rows = row_map.long()[slot]
    total = (scales[:tokens].float().unsqueeze(-1) * gemm_out.float()[rows]).sum(dim=1)
    dist.all_reduce(total, group=group)
    total += residual.float()
    out_residual.copy_(total)
    out_norm.copy_(total * torch.rsqrt(total.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float())
