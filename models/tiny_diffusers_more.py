"""Tiny random diffusers transformers of the later families (Z-Image, Kandinsky 5, 6 and 6 SR, Allegro, OmniGen, ConsisID, ERNIE-Image, NucleusMoE-Image) and their inputs at any size:
:data:`ENTRIES` holds a :class:`~models.tiny_diffusers_common.Tiny` per class name.
"""

from __future__ import annotations

import diffusers
import torch
from diffusers.models.embeddings import get_3d_rotary_pos_embed, get_3d_rotary_pos_embed_allegro

from axial_rope.conventions.easyanimate import easyanimate_crop
from models.tiny_diffusers_common import COGVIDEOX, B, Tiny

__all__ = ["ENTRIES"]


class ZImageTransformer2DModel(diffusers.ZImageTransformer2DModel):
    """Z-Image returning its per-item latents stacked (``[B, C, F, H, W]``; the items share a size here), so
    the generic checks compare one tensor; named as the stock class, whose record the adapter finds."""

    def forward(self, x, t, cap_feats, return_dict=True, patch_size=2, **kwargs):
        out = super().forward(x, t, cap_feats, return_dict=False, patch_size=patch_size, **kwargs)[0]
        return (torch.stack(out),)


def _z_image(depth):
    return ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=16, n_layers=depth, n_refiner_layers=depth,
        n_heads=2, n_kv_heads=2, cap_feat_dim=8, axes_dims=[2, 2, 4], axes_lens=[64, 32, 32],
    )  # fmt: skip


def _z_image_inputs(h, w, frames, g):  # captions of 5 and 3 tokens: padded to 32, the second item masked more
    return dict(
        x=[torch.randn(4, 1, 2 * h, 2 * w, generator=g) for _ in range(B)], t=torch.rand(B, generator=g),
        cap_feats=[torch.randn(5, 8, generator=g), torch.randn(3, 8, generator=g)], return_dict=False,
    )  # fmt: skip


class Kandinsky5Transformer3DModel(diffusers.Kandinsky5Transformer3DModel):
    """Kandinsky 5 returning a tuple (the stock forward returns the bare tensor with ``return_dict=False``), so
    the generic checks' ``model(**inputs)[0]`` is the whole batch; named as the stock class, whose record the
    adapter finds."""

    def forward(self, hidden_states, encoder_hidden_states, timestep, pooled_projections, visual_rope_pos,
                text_rope_pos, scale_factor=(1.0, 1.0, 1.0), sparse_params=None, return_dict=True):  # fmt: skip
        out = super().forward(hidden_states, encoder_hidden_states, timestep, pooled_projections, visual_rope_pos,
                              text_rope_pos, scale_factor, sparse_params, return_dict=False)  # fmt: skip
        return (out,)


def _kandinsky5(depth):
    model = Kandinsky5Transformer3DModel(
        in_visual_dim=4, in_text_dim=8, in_text_dim2=8, time_dim=16, out_visual_dim=4, patch_size=(1, 2, 2),
        model_dim=16, ff_dim=32, num_text_blocks=depth, num_visual_blocks=depth, axes_dims=(2, 2, 4),
    )  # fmt: skip
    for module in model.modules():  # its modulations start at zero (adaLN-Zero): random ones, so attention counts
        if type(module).__name__ == "Kandinsky5Modulation":
            torch.nn.init.normal_(module.out_layer.weight, std=0.5)
            torch.nn.init.normal_(module.out_layer.bias, std=0.5)
    return model


def _kandinsky5_inputs(h, w, frames, g):  # the pipeline's arange positions, scale_factor (1, 1, 1)
    return dict(
        hidden_states=torch.randn(B, frames, 2 * h, 2 * w, 4, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 8, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g),
        pooled_projections=torch.randn(B, 8, generator=g),
        visual_rope_pos=[torch.arange(frames), torch.arange(h), torch.arange(w)], text_rope_pos=torch.arange(5),
        return_dict=False,
    )  # fmt: skip


def _kandinsky6(depth):
    model = diffusers.Kandinsky6Transformer3DModel(
        in_visual_dim=4, out_visual_dim=4, in_text_dim=8, in_text_dim2=8, time_dim=16, patch_size=(1, 2, 2),
        model_dim=16, ff_dim=32, num_text_blocks=depth, num_visual_blocks=depth, axes_dims=(2, 2, 4),
        visual_cond=False, in_audio_dim=4, out_audio_dim=4, ca_rope=True,
    )  # fmt: skip
    return model


def _kandinsky6_inputs(h, w, frames, g):  # with audio latents and a padded prompt
    return dict(
        hidden_states=torch.randn(B, frames, 2 * h, 2 * w, 4, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 8, generator=g), pooled_projections=torch.randn(B, 8, generator=g),
        timestep=torch.randint(0, 1000, (B,), generator=g), audio_hidden_states=torch.randn(B, 6, 4, generator=g),
        encoder_attention_mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2]), return_dict=False,
    )  # fmt: skip


def _kandinsky6_sr(depth):
    return diffusers.Kandinsky6SRTransformer3DModel(
        in_visual_dim=4, out_visual_dim=4, time_dim=16, model_dim=16, ff_dim=32, num_visual_blocks=depth,
        axes_dims=(2, 2, 4),
    )  # fmt: skip


def _kandinsky6_sr_inputs(h, w, frames, g):  # the noisy latent, the anchor latent and its mask; patch 1
    return dict(
        hidden_states=torch.randn(B, frames, h, w, 9, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g),
        return_dict=False,
    )  # fmt: skip


def _allegro(depth):
    return diffusers.AllegroTransformer3DModel(
        patch_size=2, patch_size_t=1, num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        num_layers=depth, cross_attention_dim=24, sample_height=8, sample_width=8, sample_frames=4, caption_channels=8,
    )  # fmt: skip


def allegro_tables(h: int, w: int, frames: int, scales=(2.2, 2.0, 2.0)):
    """``AllegroPipeline._prepare_rotary_positional_embeddings`` for an ``h x w`` token grid of ``frames``."""
    freqs_t, freqs_h, freqs_w, grid_t, grid_h, grid_w = get_3d_rotary_pos_embed_allegro(
        embed_dim=12, crops_coords=((0, 0), (h, w)), grid_size=(h, w), temporal_size=frames,
        interpolation_scale=scales,
    )  # fmt: skip
    pos = torch.cartesian_prod(grid_t.long(), grid_h.long(), grid_w.long())
    return (freqs_t, freqs_h, freqs_w), pos.reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1).contiguous()


def _allegro_inputs(h, w, frames, g):  # the pipeline's tables; a padded prompt
    return dict(
        hidden_states=torch.randn(B, 4, frames, 2 * h, 2 * w, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 8, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g),
        encoder_attention_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2]),
        image_rotary_emb=allegro_tables(h, w, frames), return_dict=False,
    )  # fmt: skip


def _omnigen(depth):
    return diffusers.OmniGenTransformer2DModel(
        in_channels=4, patch_size=2, hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=32, num_layers=depth, pad_token_id=0, vocab_size=50, max_position_embeddings=256,
        original_max_position_embeddings=64, pos_embed_max_size=32, time_step_dim=16,
        rope_scaling={"short_factor": [1.0, 1.1, 1.2, 1.5], "long_factor": [2.0, 3.0, 4.0, 8.0]},
    )  # fmt: skip


def _omnigen_inputs(h, w, frames, g):  # 5 prompt tokens, the time token, the image; the second prompt padded
    seq = 5 + 1 + h * w
    mask = torch.ones(B, seq, seq)
    mask[1, :, :2] = 0
    return dict(
        hidden_states=torch.randn(B, 4, 2 * h, 2 * w, generator=g), timestep=torch.rand(B, generator=g),
        input_ids=torch.randint(1, 50, (B, 5), generator=g), input_img_latents=[], input_image_sizes={},
        attention_mask=mask, position_ids=torch.arange(seq).expand(B, seq), return_dict=False,
    )  # fmt: skip


def _consisid(depth):
    return diffusers.ConsisIDTransformer3DModel(**dict(COGVIDEOX, num_layers=depth))


def _consisid_inputs(h, w, frames, g):  # the pipeline's tables over the crop of the 4 x 4 base region
    return dict(
        hidden_states=torch.randn(B, frames, 4, 2 * h, 2 * w, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g),
        image_rotary_emb=get_3d_rotary_pos_embed(16, easyanimate_crop(h, w, 4, 4), (h, w), frames), return_dict=False,
    )  # fmt: skip


def _ernie_image(depth):
    model = diffusers.ErnieImageTransformer2DModel(
        hidden_size=16, num_attention_heads=2, num_layers=depth, ffn_hidden_size=32, in_channels=4, out_channels=4,
        patch_size=1, text_in_dim=8, rope_axes_dim=(2, 2, 4),
    )  # fmt: skip
    for layer in (model.adaLN_modulation[-1], model.final_linear):  # zero-initialised: random, so attention counts
        torch.nn.init.normal_(layer.weight, std=0.5)
        torch.nn.init.normal_(layer.bias, std=0.5)
    return model


def _ernie_image_inputs(h, w, frames, g):  # patch 1; text of 5 and 3 tokens
    return dict(
        hidden_states=torch.randn(B, 4, h, w, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g).float(),
        text_bth=torch.randn(B, 5, 8, generator=g), text_lens=torch.tensor([5, 3]), return_dict=False,
    )  # fmt: skip


def _nucleus(depth):  # dense blocks (the rotary path is the MoE's)
    return diffusers.NucleusMoEImageTransformer2DModel(
        patch_size=2, in_channels=16, num_layers=depth, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, axes_dims_rope=(4, 6, 6), moe_enabled=False,
    )  # fmt: skip


def _nucleus_inputs(h, w, frames, g):  # packed latents [B, h w, 16]; the second prompt padded
    return dict(
        hidden_states=torch.randn(B, h * w, 16, generator=g), img_shapes=[[(1, h, w)]] * B,
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g),
        encoder_hidden_states_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2]), timestep=torch.rand(B, generator=g),
        return_dict=False,
    )  # fmt: skip


ENTRIES: dict[str, Tiny] = {
    "AllegroTransformer3DModel": Tiny(model=_allegro, inputs=_allegro_inputs, grid=(2, 3, 4)),
    "ConsisIDTransformer3DModel": Tiny(
        model=_consisid,
        inputs=_consisid_inputs,
        grid=(3, 4, 4),
    ),
    "ErnieImageTransformer2DModel": Tiny(model=_ernie_image, inputs=_ernie_image_inputs, grid=(1, 3, 4), video=False),
    "Kandinsky5Transformer3DModel": Tiny(
        model=_kandinsky5,
        inputs=_kandinsky5_inputs,
        grid=(2, 3, 4),
        dtype=torch.float32,  # its time embedding casts the timestep to float32 before a linear layer
    ),
    "Kandinsky6Transformer3DModel": Tiny(model=_kandinsky6, inputs=_kandinsky6_inputs, grid=(2, 3, 4)),
    "Kandinsky6SRTransformer3DModel": Tiny(
        model=_kandinsky6_sr,
        inputs=_kandinsky6_sr_inputs,
        grid=(2, 8, 8),
        no_dynamic="its NABLA attention needs token grids divisible by 8 (the checks' 4 x 4 is refused)",
        no_checkpointing="its NABLA flex attention has no backward on CPU",
    ),
    "NucleusMoEImageTransformer2DModel": Tiny(model=_nucleus, inputs=_nucleus_inputs, grid=(1, 3, 4), video=False),
    "OmniGenTransformer2DModel": Tiny(
        model=_omnigen,
        inputs=_omnigen_inputs,
        grid=(1, 3, 4),
        video=False,
        train_size=(5 + 1 + 3 * 4,),
        no_fullgraph="its rotary module picks LongRoPE's short or long factors by max(position_ids) on the host "
        "(a data-dependent branch; so does the adapter's rope keeping the model's LongRoPE)",
    ),
    "ZImageTransformer2DModel": Tiny(
        model=_z_image,
        inputs=_z_image_inputs,
        grid=(1, 3, 4),
        video=False,
        no_fullgraph="RopeEmbedder builds its lookup tables under a `with torch.device` and the forward pads the "
        "items' sequences in Python loops",
        no_dynamic="the forward pads each item's sequence to a multiple of 32 tokens from host lengths",
        no_repeated="its ZImageTransformerBlock serves the image refiner, the caption refiner (without modulation) "
        "and the main layers, each a different call",
    ),
}
