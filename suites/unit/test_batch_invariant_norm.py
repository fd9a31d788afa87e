"""`Options(batch_invariant=True)`'s residual norm (harness.runtime.batch_invariant_norm), on CPU torch: it does the
fused kernel's job (add into the residual, normalise into the input, hand both back) through a norm without a
residual, so a row's result no longer depends on how many rows share the call. The GPU proof is the batch-invariance
benchmark (docs/performance.md)."""

from __future__ import annotations

import os

import pytest

from harness.runtime.batch_invariant_norm import invariant_residual_norm

torch = pytest.importorskip("torch")


def rows_norm(x, weight, eps=1e-6):
    """A per-row RMSNorm whose result depends on nothing but the row (as vLLM's Triton batch-invariant norm)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def batch_dependent_fused(x, weight, eps=1e-6, residual=None):
    """Like the fused kernel it replaces: the residual add and the norm in place, the reduction's order set by the
    number of rows (a chunked sum: chunks of 64 under 256 rows, of 16 from there on)."""
    residual.add_(x)
    chunk = 64 if residual.shape[0] < 256 else 16
    sq = residual.float().pow(2)
    total = torch.zeros(residual.shape[0], 1)
    for part in sq.split(chunk, dim=-1):
        total = total + part.sum(-1, keepdim=True)
    x.copy_((residual.float() * torch.rsqrt(total / residual.shape[-1] + eps)).to(x.dtype) * weight)
    return x, residual


def _alone_and_among(fn, rows=128, among=512, hidden=1024, dtype=torch.float32):
    gen = torch.Generator().manual_seed(3)
    x, r = (torch.randn(among, hidden, generator=gen).to(dtype) * 8 for _ in range(2))
    weight = torch.ones(hidden, dtype=dtype)
    alone = fn(x[:rows].clone(), weight, 1e-6, residual=r[:rows].clone())
    both = fn(x.clone(), weight, 1e-6, residual=r.clone())
    return alone, [t[:rows] for t in both]


def test_the_replacement_writes_where_the_fused_kernel_writes_and_hands_back_the_same_tensors():
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.rand(8)
    expect_r = x + r
    expect_x = rows_norm(expect_r, w)
    xi, ri = x.clone(), r.clone()
    out = invariant_residual_norm(rows_norm)(xi, w, 1e-6, residual=ri)
    assert out[0] is xi and out[1] is ri
    assert torch.equal(ri, expect_r) and torch.equal(xi, expect_x)
    assert torch.equal(invariant_residual_norm(rows_norm)(x, w, 1e-6), rows_norm(x, w))  # no residual: unchanged


def test_a_rows_result_depends_on_its_batch_with_the_fused_kind_and_not_with_the_replacement():
    alone, among = _alone_and_among(batch_dependent_fused)
    assert not torch.equal(alone[0], among[0])  # the reduction order followed the row count
    alone, among = _alone_and_among(invariant_residual_norm(rows_norm))
    assert torch.equal(alone[0], among[0]) and torch.equal(alone[1], among[1])


def test_the_switch_is_set_for_the_start_only_and_the_environment_restored(monkeypatch):
    from harness.runtime.batch_invariant_norm import MODE_ENV, mode_env

    monkeypatch.delenv(MODE_ENV, raising=False)
    with mode_env(True):
        assert os.environ[MODE_ENV] == "1"
    assert MODE_ENV not in os.environ
    monkeypatch.setenv(MODE_ENV, "0")
    with pytest.raises(RuntimeError), mode_env(True):  # a start that fails restores it too
        raise RuntimeError("start failed")
    assert os.environ[MODE_ENV] == "0"
    with mode_env(False):
        assert os.environ[MODE_ENV] == "0"
