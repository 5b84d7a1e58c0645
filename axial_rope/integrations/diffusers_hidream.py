"""HiDream-I1 (diffusers ``HiDreamImageTransformer2DModel``) through axial_rope: its attention processor.

HiDream's attention (diffusers 0.42.1 ``models/transformers/transformer_hidream_image.py`` ``HiDreamAttnProcessor``)
normalises the image tokens' q and k by RMSNorms across heads (``q_rms_norm``, ``k_rms_norm`` over ``H * D``), masks
the padded image keys, appends the text tokens (double-stream blocks: their own projections and norms), rotates every
token by the per-item tables (rotation matrices ``[B, S, 1, D/2, 2, 2]``; a head wider than the tables rotates its
first half) and attends with ``F.scaled_dot_product_attention``. :class:`HiDreamRopeProcessor` does the same step for
step, each stream's norm and rotation as one :func:`axial_rope.ops.norm_apply_rope` call where its norms are modules
it can read; the key mask then follows the rotation (a per-token factor, which the rotation, linear in each token,
leaves where it was).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .diffusers_processors import RopeProcessor, Tables, read_norm

__all__ = ["HiDreamRopeProcessor", "matrix_tables"]


def matrix_tables(matrices: torch.Tensor, backend: str | None) -> Tables:
    """The rotation by HiDream's matrices ``[B, S, 1, D/2, 2, 2]`` (``[[cos, -sin], [sin, cos]]`` per interleaved
    plane): interleaved ``cos``, ``sin`` ``[B, S, D]`` (each plane's value twice)."""
    cos, sin = matrices[:, :, 0, :, 0, 0], matrices[:, :, 0, :, 1, 0]  # [B, S, D/2]
    interleave = lambda t: t[..., None].expand(*t.shape, 2).flatten(-2)  # noqa: E731
    return Tables(interleave(cos), interleave(sin), backend)


class HiDreamRopeProcessor(RopeProcessor):
    """HiDream's single- and double-stream attention: image tokens, then text tokens; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        hidden_states_masks: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ):
        dtype, batch = hidden_states.dtype, hidden_states.shape[0]
        q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)  # [B, S, H * D]
        head_dim = k.shape[-1] // attn.heads
        streams = [("q_rms_norm", "k_rms_norm", q, k, v, hidden_states_masks)]
        if not attn.single:  # the text's own projections and norms, after the image
            streams.append(("q_rms_norm_t", "k_rms_norm_t", attn.to_q_t(encoder_hidden_states),
                            attn.to_k_t(encoder_hidden_states), attn.to_v_t(encoder_hidden_states), None))  # fmt: skip
        rotation = None if image_rotary_emb is None else matrix_tables(image_rotary_emb, self.backend)
        heads = lambda t: t.view(batch, -1, attn.heads, head_dim)  # noqa: E731  # [B, S, H, D]
        norms = [read_norm(getattr(attn, nq), getattr(attn, nk), attn.heads, head_dim, dtype) for nq, nk, *_ in streams]
        qs, ks, vs, start = [], [], [], 0
        for (nq, nk, q, k, v, mask), norm in zip(streams, norms):
            rows = slice(start, start + q.shape[1])
            start = rows.stop
            if rotation is not None and None not in norms:  # fused: norm and rotation by this stream's rows
                q, k = rotation.norm_rotate(heads(q), heads(k), norm, "bshd", rows)
            else:  # the norms called, the rotation after the streams are joined
                q, k = heads(getattr(attn, nq)(q).to(dtype)), heads(getattr(attn, nk)(k).to(dtype))
            if mask is not None:  # the padded image keys
                k = k * mask.view(batch, -1, 1, 1)
            qs.append(q)
            ks.append(k)
            vs.append(heads(v))
        q, k, v = (torch.cat(t, dim=1) if len(t) > 1 else t[0] for t in (qs, ks, vs))
        if rotation is not None and None in norms:
            q, k = rotation(q, k, "bshd")

        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=0.0,
                                             is_causal=False)  # fmt: skip
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(q.dtype)
        if attn.single:
            return attn.to_out(out)
        img, txt = torch.split(out, [qs[0].shape[1], qs[1].shape[1]], dim=1)
        return attn.to_out(img), attn.to_out_t(txt)
