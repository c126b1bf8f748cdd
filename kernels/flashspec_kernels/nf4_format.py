"""The NF4 weight format of :mod:`flashspec_kernels.nf4`, in plain torch (no Triton needed).

A weight ``W [N, K]`` is stored as NF4 (Dettmers et al. 2023, QLoRA; the same values as
bitsandbytes' ``quantize_4bit(quant_type="nf4", blocksize=64)``): each group of :data:`GROUP`
consecutive weights of a row is scaled by its absolute maximum (a float32 per group) and
each scaled weight is the nearest of the 16 values of :data:`NF4_VALUES`, a 4-bit index; two
indices share a byte (the even ``k`` in the low nibble).
"""

from __future__ import annotations

import torch

# The NF4 code book: quantiles of a standard normal scaled to [-1, 1], with an exact 0
# (bitsandbytes' and QLoRA's table).
NF4_VALUES = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
GROUP = 64  # weights of a row per absmax scale
_TABLES: dict[torch.device, torch.Tensor] = {}


def code_book(device: torch.device) -> torch.Tensor:
    """:data:`NF4_VALUES` as a float32 tensor on ``device`` (made once per device)."""
    table = _TABLES.get(device)
    if table is None:
        table = _TABLES[device] = torch.tensor(NF4_VALUES, dtype=torch.float32, device=device)
    return table


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` as NF4: the packed indices ``[N, ceil(K / GROUP) * GROUP / 2]`` uint8 (even
    ``k`` in the low nibble) and the group scales ``[N, ceil(K / GROUP)]`` float32; a last
    group that ``K`` leaves short is padded with zeros (they dequantize to 0)."""
    if w.dim() != 2:
        raise ValueError(f"NF4 quantizes a 2-D weight [out, in], got shape {tuple(w.shape)}")
    n, k = w.shape
    padded = -(-k // GROUP) * GROUP
    groups = torch.nn.functional.pad(w.detach().float(), (0, padded - k)).reshape(n, padded // GROUP, GROUP)
    scales = groups.abs().amax(-1)  # [N, groups]
    scaled = groups / torch.where(scales > 0, scales, 1.0)[..., None]
    book = code_book(w.device)
    # the nearest code: the book is sorted, so compare with the midpoints between neighbours
    idx = torch.bucketize(scaled.reshape(n, padded), (book[1:] + book[:-1]) / 2).to(torch.uint8)
    packed = idx[:, 0::2] | (idx[:, 1::2] << 4)
    return packed.contiguous(), scales.contiguous()


def dequantize(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, k: int | None = None) -> torch.Tensor:
    """The weight ``[N, K]`` in ``dtype`` (``K``: ``k``, default every packed column): each value
    times its group's scale in float32, rounded once."""
    n = packed.shape[0]
    idx = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(n, -1).long()
    values = code_book(packed.device)[idx].reshape(n, -1, GROUP) * scales[..., None]
    return values.reshape(n, -1)[:, : idx.shape[1] if k is None else k].to(dtype)
