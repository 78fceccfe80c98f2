"""int4 weights: the AWQ "GEMM" checkpoint format, round-to-nearest quantization, and the layout
the W4A16 skinny linear reads (`kernels.gemv` with an `Int4Weight`).

The format (AutoAWQ's `WQLinear_GEMM`, what `quantization_config` {"quant_method": "awq",
"version": "gemm"} checkpoints hold) for a linear layer with weight W (N out, K in):

    qweight  (K, N / 8)  int32   8 four-bit values per int32, output columns 8j..8j+7
    qzeros   (K / g, N / 8) int32  the same packing, one zero point per group of g input rows
    scales   (K / g, N)  float16
    W[n, k] = (q[k, n] - z[k // g, n]) * s[k // g, n]

Within an int32 the nibble at bits 4i..4i+3 holds column 8j + AWQ_ORDER[i] (the interleave of
AutoAWQ's packer). Quantization (`quantize_rtn`) is round-to-nearest, asymmetric, per group of g
input rows: s = (max - min) / 15, z = round(-min / s) clamped to [0, 15], q = clamp(round(w / s) + z,
0, 15) -- AWQ's own formula, so a model quantized here and one saved by AutoAWQ without its
activation-aware scaling hold the same numbers.

The kernel layout (`Int4Weight`) is the same numbers arranged for a stream over K per output row:
qweight (N, K / 8) int32 with k = 8j + i at bits 4i..4i+3 (low nibble first), scales and zeros
(N, K / g) float16 (the checkpoint's scales exactly; zeros are integers, exact too). Bytes per
weight: 0.5, plus 2 x 2 bytes per group of g.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a packed AWQ int32 holds column 8j + AWQ_ORDER[i]
_AWQ_NIBBLE = tuple(AWQ_ORDER.index(c) for c in range(8))  # column 8j + c sits in nibble _AWQ_NIBBLE[c]
GROUP_SIZE = 128  # the quantizer's default group: AWQ's usual one
INT4_MAX = 15


@dataclass(frozen=True)
class AwqTensors:
    """One linear layer in the AWQ GEMM checkpoint format (module docstring): qweight (K, N / 8)
    int32, qzeros (K / g, N / 8) int32, scales (K / g, N) float16."""

    qweight: torch.Tensor
    qzeros: torch.Tensor
    scales: torch.Tensor

    @property
    def group_size(self) -> int:
        return self.qweight.shape[0] // self.scales.shape[0]


@dataclass(frozen=True)
class Int4Weight:
    """A W4 weight of N output rows and K inputs in the kernel layout: qweight (N, K / 8) int32 (k =
    8j + i at bits 4i..4i+3), scales and zeros (N, K / group_size) float16, zeros holding the integer
    zero points. Dequantized: W[n, k] = (q[n, k] - zeros[n, k // g]) * scales[n, k // g]."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) of the weight it stands for."""
        return self.qweight.shape[0], self.qweight.shape[1] * 8

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def nbytes(self) -> int:
        """Bytes the kernel streams: packed weights plus scales and zeros."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros))


def check_group(k: int, group_size: int, what: str = "weight") -> None:
    """ValueError unless `group_size` is a power of two >= 8 that divides K."""
    if group_size < 8 or group_size & (group_size - 1) or k % group_size:
        raise ValueError(f"{what}: int4 group size must be a power of two >= 8 dividing K={k}, got {group_size}")


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q (..., 8m) integers in 0..15 -> (..., m) int32, element 8j + i at bits 4i..4i+3."""
    q = q.to(torch.int64).reshape(*q.shape[:-1], -1, 8)
    shifts = torch.arange(0, 32, 4, device=q.device)
    packed = (q << shifts).sum(dim=-1)  # < 2^32: fits int64, then wraps into int32's range
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    """(..., m) int32 -> (..., 8m) uint8 in 0..15, the inverse of `pack_nibbles`."""
    shifts = torch.arange(0, 32, 4, device=p.device, dtype=torch.int32)
    q = (p[..., None] >> shifts) & 0xF  # arithmetic shift; the mask drops the sign bits
    return q.reshape(*p.shape[:-1], -1).to(torch.uint8)


def _awq_pack(q: torch.Tensor) -> torch.Tensor:
    """q (R, N) in 0..15 -> (R, N / 8) int32 in AWQ's column interleave."""
    r, n = q.shape
    return pack_nibbles(q.reshape(r, n // 8, 8)[..., list(AWQ_ORDER)].reshape(r, n))


def _awq_unpack(p: torch.Tensor) -> torch.Tensor:
    """(R, N / 8) AWQ-packed int32 -> (R, N) uint8, the inverse of `_awq_pack`."""
    r, m = p.shape
    return unpack_nibbles(p).reshape(r, m, 8)[..., list(_AWQ_NIBBLE)].reshape(r, m * 8)


def quantize_rtn(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> AwqTensors:
    """weight (N, K) -> its round-to-nearest asymmetric int4 quantization in the AWQ GEMM format
    (module docstring), groups of `group_size` consecutive inputs per output row. Computed in
    float32; the scales are stored in float16 and the integers are rounded against the stored scale,
    so dequantizing the result is the model the kernel runs. Needs N % 8 == 0."""
    n, k = weight.shape
    check_group(k, group_size)
    if n % 8:
        raise ValueError(f"int4 packing needs a multiple of 8 output rows, got {n}")
    w = weight.float().reshape(n, k // group_size, group_size)
    lo, hi = w.amin(dim=2), w.amax(dim=2)
    scales = ((hi - lo).clamp(min=1e-5) / INT4_MAX).half()  # (N, K / g)
    s = scales.float()
    zeros = torch.round(-lo / s).clamp(0, INT4_MAX)
    q = (torch.round(w / s[..., None]) + zeros[..., None]).clamp(0, INT4_MAX).reshape(n, k)
    return AwqTensors(qweight=_awq_pack(q.t().contiguous()), qzeros=_awq_pack(zeros.t().contiguous()),
                      scales=scales.t().contiguous())


def awq_dequantize(t: AwqTensors) -> torch.Tensor:
    """The AWQ tensors' weight (N, K) in float32, from the format's definition."""
    g = t.group_size
    q = _awq_unpack(t.qweight).float()  # (K, N)
    z = _awq_unpack(t.qzeros).float().repeat_interleave(g, dim=0)
    s = t.scales.float().repeat_interleave(g, dim=0)
    return ((q - z) * s).t().contiguous()


def from_awq(t: AwqTensors) -> Int4Weight:
    """The kernel layout of AWQ tensors: the same weight, the same numbers."""
    return from_parts(*awq_unpacked(t))


def to_awq(w: Int4Weight) -> AwqTensors:
    """The AWQ tensors of a kernel-layout weight: `from_awq`'s inverse."""
    q = unpack_nibbles(w.qweight).t().contiguous()  # (K, N)
    return AwqTensors(qweight=_awq_pack(q), qzeros=_awq_pack(w.zeros.t().round().to(torch.int64)),
                      scales=w.scales.t().half().contiguous())


def dequantize(w: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight (N, K) an `Int4Weight` stands for: (q - z) * s in float32 (exact: a 5-bit integer
    times a float16), then rounded to `dtype`. The W4A16 kernel's reference."""
    g = w.group_size
    q = unpack_nibbles(w.qweight).float()
    z = w.zeros.float().repeat_interleave(g, dim=1)
    s = w.scales.float().repeat_interleave(g, dim=1)
    return ((q - z) * s).to(dtype)


def awq_unpacked(t: AwqTensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q (N, K) uint8, zeros (N, K / g) float16, scales (N, K / g) float16) of AWQ tensors."""
    return (_awq_unpack(t.qweight).t().contiguous(), _awq_unpack(t.qzeros).t().half().contiguous(),
            t.scales.t().half().contiguous())


def from_parts(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> Int4Weight:
    """An `Int4Weight` from q (N, K) integers in 0..15 and zeros, scales (N, K / g): the group size
    is K over their column count."""
    n, k = q.shape
    if zeros.shape != scales.shape or zeros.shape[0] != n or k % zeros.shape[1]:
        raise ValueError(f"int4 parts: q {tuple(q.shape)}, zeros {tuple(zeros.shape)}, scales {tuple(scales.shape)}")
    return Int4Weight(qweight=pack_nibbles(q), scales=scales.half().contiguous(), zeros=zeros.half().contiguous(),
                      group_size=k // zeros.shape[1])


def quantize_int4(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> Int4Weight:
    """weight (N, K) -> `Int4Weight` by `quantize_rtn`."""
    return from_awq(quantize_rtn(weight, group_size))
