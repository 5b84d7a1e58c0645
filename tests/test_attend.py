"""The attend records (axial_rope.attend): each path of Attention is one record with one call, the keyword form
builds the same record, and paths that exclude each other cannot be combined."""

from __future__ import annotations

import pytest
import torch

import axial_rope as ar
from axial_rope.attend import attend_record
from axial_rope.parallel import ContextParallel
from axial_rope.varlen import Segments


def _attention(**kwargs) -> ar.Attention:
    torch.manual_seed(0)
    return ar.Attention(32, 4, ar.AxialRoPE((4, 4)), num_kv_heads=2, qk_norm="rms", **kwargs).double().eval()


def _x(tokens: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, tokens, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("causal", [False, True])
def test_each_record_equals_its_keyword_form_exactly(causal):
    attn, x, pos = _attention(causal=causal), _x(6), ar.grid(2, 3)
    mask = torch.rand(6, 6, generator=torch.Generator().manual_seed(2)) > 0.3
    mask |= torch.eye(6, dtype=torch.bool)  # every query sees a key
    assert torch.equal(attn(x, pos, attend=ar.Sdpa(mask)), attn(x, pos, mask=mask))
    assert torch.equal(attn(x, pos, attend=ar.Sdpa()), attn(x, pos))
    assert torch.equal(attn(x, pos, attend=ar.Sharded(ContextParallel())), attn(x, pos, context_parallel=ContextParallel()))
    seg = Segments([2, 3, 1])
    packed = x[:1]
    assert torch.equal(attn(packed, pos, attend=ar.Varlen(seg)), attn(packed, pos, segments=seg))
    for write in (True, False):
        caches = [ar.KVCache(2, 8, 2, 8, dtype=torch.float64) for _ in range(2)]
        slots = torch.arange(6)
        by_record = attn(x, pos, attend=ar.Cached(caches[0], slots, write))
        by_keywords = attn(x, pos, cache=caches[1], input_pos=slots, cache_write=write)
        assert torch.equal(by_record, by_keywords)
        assert torch.equal(caches[0].k, caches[1].k) and bool(caches[0].filled.any()) == write


def test_records_that_exclude_each_other_cannot_be_combined():
    cache, seg, cp, mask = ar.KVCache(1, 8, 2, 8), Segments([2, 2]), ContextParallel(), torch.ones(4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="attend= is the whole attend step.*'mask'"):
        attend_record(ar.Sdpa(), mask=mask)
    with pytest.raises(ValueError, match="cache_write"):
        attend_record(ar.Sdpa(), cache_write=False)
    with pytest.raises(TypeError, match="attend must be one of Sdpa, Cached, Varlen, Sharded, got Segments"):
        attend_record(seg)
    with pytest.raises(ValueError, match="context_parallel does not take a KV cache"):
        attend_record(cache=cache, input_pos=torch.arange(4), context_parallel=cp)
    with pytest.raises(ValueError, match="segments .* do not take context_parallel"):
        attend_record(segments=seg, context_parallel=cp)
    with pytest.raises(ValueError, match="segments .* do not take a KV cache"):
        attend_record(segments=seg, cache=cache, input_pos=torch.arange(4))
    with pytest.raises(ValueError, match="needs input_pos"):
        attend_record(cache=cache)
    assert attend_record(mask=mask) == ar.Sdpa(mask)
    assert attend_record(segments=seg) == ar.Varlen(seg)
    attn = _attention()
    with pytest.raises(ValueError, match="needs input_pos"):
        attn(_x(4, 1), ar.grid(2, 2), attend=ar.Cached(cache, None))
    with pytest.raises(TypeError, match="Sharded.cp must be"):
        attn(_x(4, 1), ar.grid(2, 2), attend=ar.Sharded(cache))


def test_dit_block_passes_the_record_through():
    """A packed DiTBlock reads its per-item conditioning from the Varlen record; keyword and record forms agree, and a
    keyword the attention does not know is a TypeError, not silently dropped."""
    torch.manual_seed(0)
    block = ar.DiTBlock(32, 4, ar.AxialRoPE((4, 4))).double().eval()
    torch.nn.init.normal_(block.adaLN_modulation[-1].weight, std=0.1)  # not the identity at init
    seg, x, pos = Segments([2, 4]), _x(6, 1), torch.cat([ar.grid(1, 2), ar.grid(2, 2)])
    c = torch.randn(2, 32, dtype=torch.float64)
    by_record = block(x, c, pos, attend=ar.Varlen(seg))
    assert torch.equal(by_record, block(x, c, pos, segments=seg))
    alone = torch.cat([block(x[:, :2], c[:1], pos[:2]), block(x[:, 2:], c[1:], pos[2:])], dim=1)
    torch.testing.assert_close(by_record, alone, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="segment"):
        block(x, c, pos, segment=seg)


def test_a_record_compiles_with_the_attention():
    attn, x, pos = _attention(causal=True), _x(6), ar.grid(2, 3)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1).logical_not()
    compiled = torch.compile(lambda x, mask: attn(x, pos, attend=ar.Sdpa(mask)), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, mask), attn(x, pos, mask=mask), rtol=0, atol=0)
