"""`swiftspec.kernels.topk.logsoftmax_topk` (tree growth: log-softmax + top-k over the vocabulary)
against `logsoftmax_topk_ref` on random logits (never zeros), CPU under TRITON_INTERPRET=1 and GPU
when present."""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not HAS_CUDA and not INTERPRET:
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cuda" if HAS_CUDA else "cpu"

from swiftspec.kernels.reference import logsoftmax_topk_ref  # noqa: E402
from swiftspec.kernels.topk import logsoftmax_topk  # noqa: E402


def _logits(t: int, v: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn((t, v), generator=gen) + 1).to(dtype).to(DEVICE)


@pytest.mark.parametrize("t,v,k,chunk", [(1, 100, 8, 4096), (3, 1000, 8, 256), (8, 5000, 4, 1024),
                                         (2, 4097, 16, 4096), (5, 64, 1, 16), (1, 128256, 8, 4096)])
def test_float32_matches_reference(t, v, k, chunk):
    """Distinct random float32 logits: the same indices in the same order, values to 1e-5. Chunk
    sizes give one chunk, many, and a ragged tail shorter than k (4097 = 4096 + 1)."""
    logits = _logits(t, v, torch.float32, seed=t * v + k)
    got_v, got_i = logsoftmax_topk(logits, k, chunk=chunk)
    ref_v, ref_i = logsoftmax_topk_ref(logits, k)
    assert got_v.shape == (t, k) and got_v.dtype == torch.float32 and got_i.dtype == torch.int64
    assert torch.equal(got_i, ref_i)
    torch.testing.assert_close(got_v, ref_v, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_with_ties(dtype):
    """bf16/fp16 logits repeat values, so which tied index comes out is open (torch's order is
    unspecified): the values equal the reference's, every index is distinct and carries exactly
    the log-probability reported for it, and ties come out lowest index first."""
    logits = _logits(4, 3000, dtype, seed=11)
    k = 12
    got_v, got_i = logsoftmax_topk(logits, k, chunk=512)
    ref_v, _ = logsoftmax_topk_ref(logits, k)
    torch.testing.assert_close(got_v, ref_v, rtol=0, atol=1e-5)
    full = torch.log_softmax(logits.float(), dim=-1)
    torch.testing.assert_close(full.gather(1, got_i), got_v, rtol=0, atol=1e-5)
    for row_v, row_i in zip(got_v.tolist(), got_i.tolist()):
        assert len(set(row_i)) == k
        for (va, ia), (vb, ib) in zip(zip(row_v, row_i), zip(row_v[1:], row_i[1:])):
            assert va > vb or (va == vb and ia < ib)


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")  # the all -inf row, interpreted
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_masked_vocab_and_short_rows():
    """-inf logits (a masked vocabulary): a row with 3 finite entries and k = 5 gives those 3, then
    -inf values at distinct other indices; a row with no finite entry gives NaN, as torch does."""
    logits = _logits(3, 700, torch.float32, seed=3)
    logits[1, :] = float("-inf")
    logits[1, [5, 600, 42]] = torch.tensor([1.0, 3.0, 2.0], device=DEVICE)
    logits[2, :] = float("-inf")
    got_v, got_i = logsoftmax_topk(logits, 5, chunk=128)
    ref_v, ref_i = logsoftmax_topk_ref(logits, 5)
    assert torch.equal(got_i[0], ref_i[0])
    assert got_i[1, :3].tolist() == [600, 42, 5]
    torch.testing.assert_close(got_v[1, :3], ref_v[1, :3], rtol=0, atol=1e-6)
    assert torch.isinf(got_v[1, 3:]).all() and len(set(got_i[1].tolist())) == 5 and int(got_i[1].max()) < 700
    assert torch.isnan(got_v[2]).all() and torch.isnan(ref_v[2]).all()


def test_bad_input():
    x = _logits(2, 50, torch.float32, seed=0)
    with pytest.raises(ValueError, match="k must be"):
        logsoftmax_topk(x, 0)
    with pytest.raises(ValueError, match="k must be"):
        logsoftmax_topk(x, 51)
    with pytest.raises(ValueError, match="chunk"):
        logsoftmax_topk(x, 4, chunk=100)
    with pytest.raises(ValueError, match="contiguous"):
        logsoftmax_topk(x.t(), 4)
    v, i = logsoftmax_topk(x[:0], 4)
    assert v.shape == (0, 4) and i.shape == (0, 4)


def test_tree_growth_switch():
    """`top_logprobs` (what DraftTree.grow calls): by default the kernel on CUDA and torch on CPU
    (`KernelConfig.tree_growth`); the kernel path (a vocab-limited, strided slice, as ModelRunner
    passes it) gives torch's answer, and k above the kernel's MAX_K falls back to torch."""
    from swiftspec.kernels.topk import MAX_K
    from swiftspec.runtime.kernel_config import KernelConfig
    from swiftspec.runtime.tree import top_logprobs
    from swiftspec.spec import UserError

    def growth(device, **kw):
        return KernelConfig.resolve(device, **kw).tree_growth

    assert growth("cuda") == "triton" and growth("cpu") == "torch"
    assert growth("cpu", tree_growth="triton") == "triton"
    with pytest.raises(UserError, match="tree_growth must be one of"):
        growth("cpu", tree_growth="cub")
    with pytest.raises(ValueError, match="tree growth must be one of"):
        top_logprobs(_logits(1, 10, torch.float32, seed=1), 2, "cub")
    full = _logits(4, 3000, torch.float32, seed=11)
    logits = full[:, :2500]  # stride(0) 3000: the kernel must honour it
    for k in (3, MAX_K + 1):
        got_v, got_i = top_logprobs(logits, k, impl="triton")
        ref_v, ref_i = top_logprobs(logits, k, impl="torch")
        assert torch.equal(got_i, ref_i)
        torch.testing.assert_close(got_v, ref_v, rtol=0, atol=1e-5)


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_top_logprobs_host_one_copy(impl):
    """What DraftTree.grow takes: host lists from one packed buffer (kernel) or two tensors (torch),
    equal to the device answer; the packed buffer's two views read back on the device and, after
    the copy, in numpy."""
    from swiftspec.kernels.topk import logsoftmax_topk_packed, unpack_topk
    from swiftspec.runtime.tree import top_logprobs, top_logprobs_host

    logits = _logits(6, 3000, torch.float32, seed=13)[:, :2900]  # distinct: no ties to order
    ref_v, ref_i = top_logprobs(logits, 7, impl="torch")
    got_v, got_i = top_logprobs_host(logits, 7, impl=impl)
    assert got_i == ref_i.tolist()
    torch.testing.assert_close(torch.tensor(got_v), ref_v.cpu(), rtol=0, atol=1e-5)
    packed = logsoftmax_topk_packed(logits, 7)
    assert packed.shape == (3 * 6 * 7,) and packed.dtype == torch.int32
    dv, di = unpack_topk(packed, 6, 7)
    hv, hi = unpack_topk(packed.cpu().numpy(), 6, 7)
    assert torch.equal(di.cpu(), ref_i.cpu()) and (hi == ref_i.cpu().numpy()).all()
    assert torch.equal(dv.cpu(), torch.from_numpy(hv.copy()))
