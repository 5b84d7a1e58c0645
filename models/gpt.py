"""Decoder-only language model with RoPE, grouped-query attention and a static KV cache.

Pre-norm (RMSNorm) blocks with SwiGLU feed-forward, tied input/output embeddings by
default. Positions: RoPE on one axis (``AxialRoPE(head_dim, pairing="half")``, Llama's
layout) with any scaling method of :mod:`axial_rope.scaling`. The model takes its position
scheme as an argument (``GPT(config, positions=...)``, the calls of :class:`RoPEPositions`);
the length study's schemes (none, sinusoidal, learned, T5, ALiBi, linear attention, a
sliding window, Dual Chunk Attention) live with the study, in ``models/studies/length/positions``.
``generate`` decodes with one :class:`~axial_rope.cache.KVCache` per layer (each key is
rotated once, when written), or the per-layer state a scheme provides.

Length-dependent scaling (DynamicNTK, LongRoPE) picks its frequencies from ``seq_len``.
``generate`` fixes it to the final length (prompt + new tokens) for every step, so all
keys share one spectrum and cached decoding equals recomputing the whole sequence with
that ``seq_len``; a plain ``forward`` without ``seq_len`` uses its own length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import axial_rope as ar
from axial_rope.cache import KVCache, check_rollable, check_window, roll_shift
from axial_rope.init import deferred_init
from axial_rope.layers import Attention

from .token_sampling import check_sampling, decode, prefill_chunks, sample

__all__ = ["GPT", "GPTConfig", "PRESETS", "RoPEPositions", "check_sampling", "sample"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256  # bytes
    depth: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None  # None: num_heads (no GQA)
    hidden_size: int = 192  # model width
    intermediate_size: int | None = None  # SwiGLU width; None: 8/3 hidden_size rounded up to a multiple of 32
    max_seq_len: int = 256  # training context
    theta: float = 10000.0
    scaling: ar.scaling.Scaling | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    qk_norm: str | None = None

    def __post_init__(self):
        if isinstance(self.max_seq_len, bool) or not isinstance(self.max_seq_len, int) or self.max_seq_len < 1:
            raise ValueError(f"GPTConfig: max_seq_len must be an int >= 1, got {self.max_seq_len!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_width(self) -> int:
        """The SwiGLU width: ``intermediate_size``, or 8/3 ``hidden_size`` rounded up to a multiple of 32."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        return -(-8 * self.hidden_size // 3 // 32) * 32


PRESETS: dict[str, GPTConfig] = {
    # the byte-level model of scripts.train --model gpt and the length experiment (1.82 M parameters)
    "tiny": GPTConfig(),
    "tiny-gqa": GPTConfig(num_kv_heads=2),
    "small": GPTConfig(vocab_size=50304, depth=12, num_heads=12, num_kv_heads=4, hidden_size=768, max_seq_len=1024),
}


class RoPEPositions:
    """The reference GPT's position scheme: RoPE on q and k of softmax attention, SDPA's fused causal kernel.

    A position scheme answers these calls of :class:`GPT` (another scheme, e.g. the length study's
    ``StudyPositions``, answers the same ones):

    - ``check(config)``: raise ``ValueError`` for a config the scheme cannot take;
    - ``uses_rope(config) -> bool``: whether the model builds its ``AxialRoPE`` (handed to attention);
    - ``make_attention(config, rope) -> nn.Module``: one layer's attention, ``(x, pos, mask=, cache=,
      input_pos=, seq_len=)``, with the parameter names of :class:`~axial_rope.layers.Attention`;
    - ``make_embedding(config)``: ``None`` or a module ``(x [B, S, C], pos [S]) -> [B, S, C]`` added at the input;
    - ``make_bias(config)``: ``None`` or a logit bias ``(q_pos [S], k_pos [S_k]) -> [1, H, S, S_k]`` shared by layers;
    - ``mask(bias, q_pos, k_pos)``: the SDPA mask of a forward (``None``: the fused causal path);
    - ``new_caches(config, batch_size, max_seq_len, dtype, device)``: per-layer decoding state, or ``None``
      for one :class:`KVCache` per layer;
    - ``check_decode(model, last)``: raise where position ``last`` is beyond what the scheme can embed;
    - ``streaming_refusal(config)``: ``None``, or why ``generate(window=)`` cannot stream this scheme;
    - ``fixed_modules``: module types whose ``reset_parameters`` draws no random number (buffers recomputed).
    """

    fixed_modules: tuple[type, ...] = ()

    def check(self, config: GPTConfig) -> None:
        return None

    def uses_rope(self, config: GPTConfig) -> bool:
        return True

    def make_attention(self, config: GPTConfig, rope: ar.AxialRoPE | None, **kwargs) -> nn.Module:
        return Attention(config.hidden_size, config.num_heads, rope, **kwargs)

    def make_embedding(self, config: GPTConfig) -> nn.Module | None:
        return None

    def make_bias(self, config: GPTConfig) -> nn.Module | None:
        return None

    def mask(self, bias, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        return None

    def new_caches(self, config: GPTConfig, batch_size: int, max_seq_len: int, dtype, device) -> list | None:
        return None

    def check_decode(self, model: GPT, last: int) -> None:
        return None

    def streaming_refusal(self, config: GPTConfig) -> str | None:
        return None

    def __repr__(self) -> str:
        return "RoPEPositions()"


def _check_idx(idx, name: str, tokens: int) -> None:
    """Token ids ``[B, S]`` with at least ``tokens`` tokens, or a ``ValueError`` naming ``name``."""
    if not isinstance(idx, torch.Tensor) or idx.ndim != 2 or idx.shape[1] < tokens or idx.is_floating_point():
        got = f"{idx.dtype} {tuple(idx.shape)}" if isinstance(idx, torch.Tensor) else repr(idx)
        need = f" with S >= {tokens}" if tokens else ""
        raise ValueError(f"{name} must be int token ids [B, S]{need}, got {got}")


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, rope: ar.AxialRoPE | None, positions: RoPEPositions):
        super().__init__()
        c = config
        self.attention_norm = nn.RMSNorm(c.hidden_size, eps=c.norm_eps)
        # the same parameter names for every scheme's attention: a RoPE model's weights load into its variants
        self.attention = positions.make_attention(
            c, rope, num_kv_heads=c.num_kv_heads, qkv_bias=False, out_bias=False, qk_norm=c.qk_norm, causal=True
        )
        self.ffn_norm = nn.RMSNorm(c.hidden_size, eps=c.norm_eps)
        self.feed_forward = FeedForward(c.hidden_size, c.mlp_width)

    def forward(self, x, pos, cache, input_pos, seq_len, mask=None):
        h = self.attention(self.attention_norm(x), pos, mask=mask, cache=cache, input_pos=input_pos, seq_len=seq_len)
        x = x + h
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(nn.Module):
    """Token ids ``[B, S]`` -> next-token logits ``[B, S, V]``.

    Args:
        config: the sizes and RoPE settings.
        positions: the position scheme (:class:`RoPEPositions`' calls); ``None``: RoPE.
    """

    def __init__(self, config: GPTConfig, positions: RoPEPositions | None = None):
        super().__init__()
        self.config = c = config
        self.positions = p = RoPEPositions() if positions is None else positions
        p.check(c)
        with deferred_init(self):  # built on meta, then reset_parameters: a meta-device build reproduces it
            rope = p.uses_rope(c)
            self.rope = ar.AxialRoPE(c.head_dim, theta=c.theta, scaling=c.scaling, pairing="half") if rope else None
            self.tok_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
            self.layers = nn.ModuleList([Block(c, self.rope, p) for _ in range(c.depth)])
            self.norm = nn.RMSNorm(c.hidden_size, eps=c.norm_eps)
            self.output = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
            # absolute positions (added to the embeddings) or a logit bias (shared by the layers, as in T5)
            self.absolute = p.make_embedding(c)
            self.bias = p.make_bias(c)
        if c.tie_embeddings:  # tied already when built on the meta device: FSDP2 must see one parameter, not two
            self.output.weight = self.tok_embeddings.weight

    def reset_parameters(self) -> None:
        """GPT-2's init: every linear and embedding weight from ``N(0, 0.02)``, norms at 1, fixed buffers (the
        rope's ``F``, a scheme's fixed modules) recomputed; ties the output to the embedding (``to_empty`` unties)."""
        if self.config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        fixed = (nn.RMSNorm, nn.LayerNorm, ar.AxialRoPE, *self.positions.fixed_modules)
        for module in self.modules():  # the modules whose reset draws no random number
            if isinstance(module, fixed):
                module.reset_parameters()
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def new_caches(self, batch_size: int, max_seq_len: int, *, dtype: torch.dtype | None = None) -> list[KVCache]:
        """One empty :class:`KVCache` per layer for ``batch_size`` sequences of up to ``max_seq_len`` tokens
        (or the scheme's own state, e.g. linear attention's running sums instead of keys)."""
        weight = self.tok_embeddings.weight
        c = self.config
        n_kv = c.num_kv_heads or c.num_heads
        own = self.positions.new_caches(c, batch_size, max_seq_len, dtype or weight.dtype, weight.device)
        if own is not None:
            return own
        return [
            KVCache(batch_size, max_seq_len, n_kv, c.head_dim, dtype=dtype or weight.dtype, device=weight.device)
            for _ in range(c.depth)
        ]

    def forward(
        self,
        idx: torch.Tensor,
        input_pos: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
        *,
        seq_len: int | None = None,
    ) -> torch.Tensor:
        """Logits for ``idx [B, S]``.

        Args:
            input_pos: int ``[S]`` positions of the tokens (default ``0 .. S-1``); the cache slots.
            caches: one :class:`KVCache` per layer, or ``None`` for a plain forward.
            seq_len: the length length-dependent scaling sees; default: the cache length with caches,
                else ``S`` (static either way, so no host sync and it compiles).

        Returns:
            ``[B, S, vocab_size]``.
        """
        _check_idx(idx, "idx", tokens=0)
        B, S = idx.shape
        if caches is not None and len(caches) != len(self.layers):
            raise ValueError(f"caches must hold one KVCache per layer ({len(self.layers)}), got {len(caches)}")
        if input_pos is None:
            if caches is not None:
                raise ValueError("decoding with caches needs input_pos, the int [S] positions of idx")
            input_pos = torch.arange(S, device=idx.device)
        if seq_len is None:
            seq_len = caches[0].max_seq_len if caches is not None else S
        x = self.tok_embeddings(idx)  # [B, S, C]
        if self.absolute is not None:
            x = self.absolute(x, input_pos)
        # keys: this call's tokens, or every cache slot (its position); the mask is None on the fused path
        k_pos = input_pos if caches is None else torch.arange(caches[0].max_seq_len, device=idx.device)
        mask = self.positions.mask(self.bias, input_pos, k_pos)
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            x = layer(x, input_pos, cache, input_pos if cache is not None else None, seq_len, mask)
        return self.output(self.norm(x))

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        return_logits: bool = False,
        window: int | None = None,
        sinks: int = 0,
        evict: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Continue ``idx [B, T]`` by ``max_new_tokens`` tokens.

        With ``use_cache`` the prompt is run once (prefill) and each step feeds one token;
        without, the whole sequence is recomputed each step (the reference). Both use
        ``seq_len = T + max_new_tokens`` for length-dependent scaling.

        With ``window`` (RoPE only) the model streams past any length: each token sees the ``sinks`` first
        tokens and the latest ``window - sinks`` (itself included), re-indexed to positions ``0 .. window - 1``
        (StreamingLLM, Xiao et al. 2024). With the cache, a rolling :class:`KVCache` per layer re-rotates its
        kept keys in place as it rolls, and a long prompt is prefilled in chunks of ``window - sinks``; without,
        each step recomputes the model over the kept tokens at their re-indexed positions (StreamingLLM's
        "sliding window with re-computation"). The two agree exactly for one layer; deeper, the cached states
        of layers past the first remember evicted tokens and the recomputation does not. ``evict``: tokens a roll
        drops at least (:class:`KVCache`; default 1, rolling only): a roll every ``evict`` steps re-rotates the cache
        that much less often. The caches' slots are reserved by :meth:`KVCache.advance` on the host before each call,
        so a compiled model (``model.compile()``) decodes exactly as the eager one.

        Returns:
            tokens ``[B, T + max_new_tokens]``; with ``return_logits`` also the logits each new
            token was drawn from, ``[B, max_new_tokens, V]``.
        """
        _check_idx(idx, "idx (the prompt)", tokens=1)
        B, T = idx.shape
        total = T + max_new_tokens
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be an int > 0, got {max_new_tokens!r}")
        check_sampling(temperature, top_k)  # before the prefill, not after it
        sampling = (temperature, top_k, generator)
        if window is not None:
            evict = self._check_streaming(window, sinks, evict)
            stream = self._stream_cached if use_cache else self._stream_recomputed
            return stream(idx, max_new_tokens, window, sinks, evict, sampling, return_logits)
        if sinks:
            raise ValueError(f"sinks go with a rolling window (window=), got sinks={sinks!r}")
        if evict is not None:
            raise ValueError(f"evict goes with a rolling window (window=), got evict={evict!r}")
        self.positions.check_decode(self, total - 1)  # before any work (e.g. a learned table's end)
        if not use_cache:  # the reference: the whole sequence every step
            tokens = idx

            def feed(nxt: torch.Tensor) -> torch.Tensor:
                nonlocal tokens
                tokens = torch.cat([tokens, nxt], 1)
                return self(tokens, seq_len=total)[:, -1]

            return decode(idx, self(idx, seq_len=total)[:, -1], max_new_tokens, feed, sampling, return_logits)
        caches, written = self.new_caches(B, total), 0

        def feed(chunk: torch.Tensor) -> torch.Tensor:
            nonlocal written
            n = chunk.shape[1]
            if isinstance(caches[0], KVCache):  # slots reserved on the host: their length is right under compile
                slots = [cache.advance(n) for cache in caches][0]
            else:  # a scheme's own state (linear attention's running sums) takes the positions as they come
                slots = torch.arange(written, written + n, device=idx.device)
            written += n
            return self(chunk, slots, caches, seq_len=total)[:, -1]

        return decode(idx, feed(idx), max_new_tokens, feed, sampling, return_logits)  # the prompt: one prefill

    def _check_streaming(self, window: int, sinks: int, evict: int | None) -> int:
        """The rolling window's arguments checked (``ValueError`` naming each); returns ``evict`` (default 1)."""
        evict = check_window(window, sinks, evict=evict)
        refusal = self.positions.streaming_refusal(self.config)
        if refusal is not None:
            raise ValueError(
                "generate(window=) streams RoPE softmax attention (it re-indexes positions by rotating cached keys); "
                f"this model has {refusal}"
            )
        check_rollable(self.rope)
        return evict

    def _rolling_feed(self, B: int, window: int, sinks: int, evict: int):
        """``feed(chunk [B, n]) -> logits [B, n, V]`` through fresh rolling caches, one per layer: every call sees
        positions below ``window``."""
        c, weight = self.config, self.tok_embeddings.weight
        caches = [
            KVCache(B, window, c.num_kv_heads or c.num_heads, c.head_dim, window=window, sinks=sinks, evict=evict,
                    dtype=weight.dtype, device=weight.device)
            for _ in self.layers
        ]  # fmt: skip

        def feed(chunk: torch.Tensor) -> torch.Tensor:
            slots = [cache.advance(chunk.shape[1], self.rope) for cache in caches][0]  # the same in every layer
            return self(chunk, slots, caches, seq_len=window)

        return feed

    def stream_logits(
        self, idx: torch.Tensor, window: int, sinks: int = 0, evict: int | None = None, chunk: int = 1
    ) -> torch.Tensor:
        """Teacher-forced logits ``[B, T, V]`` of ``idx [B, T]`` streamed through rolling caches, ``chunk`` tokens a
        call: the loss a streaming model has at every position of a long text (StreamingLLM's evaluation).

        A token sees the ``sinks`` first tokens and the recent ones the cache keeps (``generate(window=)``); with
        ``sinks=0, evict=1, chunk=1`` that is exactly a sliding window of ``window`` tokens."""
        _check_idx(idx, "idx", tokens=1)
        evict = self._check_streaming(window, sinks, evict)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= window - sinks:
            raise ValueError(f"chunk must be an int in [1, window - sinks = {window - sinks}], got {chunk!r}")
        feed = self._rolling_feed(idx.shape[0], window, sinks, evict)
        return torch.cat([feed(idx[:, i : i + chunk]) for i in range(0, idx.shape[1], chunk)], 1)

    def _stream_cached(self, idx, max_new_tokens, window, sinks, evict, sampling, return_logits):
        """Rolling caches: the prompt in chunks (:func:`_prefill_chunks`), then a token a step."""
        full = self._rolling_feed(idx.shape[0], window, sinks, evict)

        def feed(chunk: torch.Tensor) -> torch.Tensor:
            return full(chunk)[:, -1]

        for start, n in prefill_chunks(idx.shape[1], window, sinks):
            logits = feed(idx[:, start : start + n])
        return decode(idx, logits, max_new_tokens, feed, sampling, return_logits)

    def _stream_recomputed(self, idx, max_new_tokens, window, sinks, evict, sampling, return_logits):
        """The reference: the tokens a rolling cache would hold after each call (the same chunks and rolls), run
        through the model at positions ``0 .. len - 1`` every step."""
        kept: list[int] = []  # token indices, in cache order
        tokens = idx

        def feed(chunk: torch.Tensor) -> torch.Tensor:
            nonlocal tokens
            n, start = chunk.shape[1], len(kept) and kept[-1] + 1
            del kept[sinks : sinks + roll_shift(len(kept), n, window, sinks, evict)]
            kept.extend(range(start, start + n))
            if start + n > tokens.shape[1]:
                tokens = torch.cat([tokens, chunk], 1)
            return self(tokens[:, kept], seq_len=window)[:, -1]

        for start, n in prefill_chunks(idx.shape[1], window, sinks):
            logits = feed(idx[:, start : start + n])
        return decode(idx, logits, max_new_tokens, feed, sampling, return_logits)
