"""Tiny random diffusers transformers of the last families served (Bria-Fibo 2, Ideogram 4, ACE-Step 1.5, Mochi,
LTX-2, SANA-WM's LTX-2 refiner, AnyFlow-FAR) and their
inputs at any size: :data:`ENTRIES` holds a :class:`~models.tiny_diffusers_common.Tiny` per class name.
"""

from __future__ import annotations

import diffusers
import torch
from diffusers.pipelines.ideogram4.pipeline_ideogram4 import Ideogram4Pipeline

from models.tiny_diffusers_common import B, Tiny

__all__ = ["ENTRIES"]


def _bria_fibo2(depth):
    return diffusers.BriaFibo2Transformer2DModel(
        in_channels=4, patch_size=2, dim=16, n_layers=depth, n_refiner_layers=depth, n_heads=2, cap_feat_dim=8,
        injection_layer_ids=(0,), perceiver_num_layers=1, min_num_gist_tokens=4, max_num_gist_tokens=8, gist_step=4,
        gist_min_text_len=2, gist_max_text_len=8, axes_dims=(2, 2, 4), axes_lens=(16, 64, 64),
    )  # fmt: skip


def _bria_fibo2_inputs(h, w, frames, g):  # prompts of 5 and 3 tokens: 8 and 4 gist tokens, the gist padded (masked)
    return dict(
        hidden_states=torch.randn(B, 4, 2 * h, 2 * w, generator=g), timestep=torch.rand(B, generator=g),
        encoder_hidden_states=torch.randn(B, 2, 5, 8, generator=g),
        encoder_attention_mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2]), return_dict=False,
    )  # fmt: skip


def _ideogram4(depth):
    return diffusers.Ideogram4Transformer2DModel(
        in_channels=4, num_layers=depth, attention_head_dim=16, num_attention_heads=2, intermediate_size=32,
        adaln_dim=16, llm_features_dim=8, mrope_section=(4, 2, 2),
    )  # fmt: skip


def _ideogram4_inputs(h, w, frames, g):  # the pipeline's packing: [left padding][text][image], texts of 5 and 3
    position_ids, segment_ids, indicator = Ideogram4Pipeline._prepare_ids([5, 3], h, w, 5, torch.device("cpu"))
    length = position_ids.shape[1]
    return dict(
        hidden_states=torch.randn(B, length, 4, generator=g), timestep=torch.rand(B, generator=g),
        encoder_hidden_states=torch.randn(B, length, 8, generator=g), position_ids=position_ids,
        segment_ids=segment_ids, indicator=indicator, return_dict=False,
    )  # fmt: skip


def _ace_step(depth):  # a sliding-window block and a full one per depth
    return diffusers.AceStepTransformer1DModel(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2 * depth, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, in_channels=8, audio_acoustic_hidden_dim=4, patch_size=2, sliding_window=4,
    )  # fmt: skip


def _ace_step_inputs(h, w, frames, g):  # 2 h w latent frames: h w tokens after the patches of 2
    timestep = torch.rand(B, generator=g)
    return dict(
        hidden_states=torch.randn(B, 2 * h * w, 4, generator=g), timestep=timestep, timestep_r=timestep.clone(),
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g),
        context_latents=torch.randn(B, 2 * h * w, 4, generator=g), return_dict=False,
    )  # fmt: skip


def _mochi(depth):
    model = diffusers.MochiTransformer3DModel(
        patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=depth, pooled_projection_dim=16,
        in_channels=4, text_embed_dim=16, time_embed_dim=4, max_sequence_length=16,
    )  # fmt: skip
    torch.nn.init.normal_(model.pos_frequencies, std=0.5)  # learned, zero at init: random ones, so RoPE turns
    return model


def _mochi_inputs(h, w, frames, g):  # texts of 5 and 3 tokens
    return dict(
        hidden_states=torch.randn(B, 4, frames, 2 * h, 2 * w, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g),
        encoder_attention_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2]), return_dict=False,
    )  # fmt: skip


def _ltx2(depth):
    return diffusers.LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
        audio_cross_attention_dim=8, num_layers=depth, caption_channels=16,
    )  # fmt: skip


def _ltx2_inputs(h, w, frames, g):  # patchified video tokens [B, F h w, 4] and 4 audio latent frames per video frame
    return dict(
        hidden_states=torch.randn(B, frames * h * w, 4, generator=g),
        audio_hidden_states=torch.randn(B, 4 * frames, 4, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g),
        audio_encoder_hidden_states=torch.randn(B, 5, 16, generator=g), timestep=torch.rand(B, generator=g) * 1000,
        num_frames=frames, height=h, width=w, audio_num_frames=4 * frames, return_dict=False,
    )  # fmt: skip


class SanaWMLTX2RefinerTransformer3DModel(diffusers.SanaWMLTX2RefinerTransformer3DModel):
    """The refiner as its pipeline drives one AR window: the window's tables from the model's own
    ``build_rotary_emb_for_absolute_positions(frame_positions, height, width)`` (which calls ``self.rope``), then the
    forward; named as the stock class, whose record the adapter finds."""

    def forward(self, hidden_states, encoder_hidden_states, timestep, frame_positions, height, width,
                encoder_attention_mask=None, return_dict=True):  # fmt: skip
        tables = self.build_rotary_emb_for_absolute_positions(
            hidden_states.shape[0], frame_positions, height, width, hidden_states.device, 24.0
        )
        return super().forward(hidden_states, encoder_hidden_states, timestep, tables,
                               encoder_attention_mask=encoder_attention_mask, return_dict=return_dict)  # fmt: skip


def _refiner(depth):
    return SanaWMLTX2RefinerTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
        audio_cross_attention_dim=8, num_layers=depth, caption_channels=16,
    )  # fmt: skip


def _refiner_inputs(h, w, frames, g):  # a window of `frames` latent frames from frame 2 of the source video
    return dict(
        hidden_states=torch.randn(B, frames * h * w, 4, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), timestep=torch.rand(B, generator=g) * 1000,
        frame_positions=list(range(2, 2 + frames)), height=h, width=w, return_dict=False,
    )  # fmt: skip


def _anyflow_far(depth):  # context windows of 2 x 2 full-grid tokens (compressed patches (1, 4, 4) over (1, 2, 2))
    return diffusers.AnyFlowFARTransformer3DModel(
        num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16, freq_dim=32,
        ffn_dim=32, num_layers=depth, rope_max_seq_len=32, full_chunk_limit=2,
    )  # fmt: skip


def _anyflow_far_inputs(h, w, frames, g):  # chunks of 1, 2, 2, ... frames: the first compressed (full_chunk_limit 2)
    chunks = [1] + [2] * ((frames - 1) // 2) + [1] * ((frames - 1) % 2)
    return dict(
        hidden_states=torch.randn(B, frames, 4, 2 * h, 2 * w, generator=g),
        timestep=torch.rand(B, frames, generator=g) * 1000, r_timestep=torch.rand(B, frames, generator=g) * 500,
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), chunk_partition=chunks, return_dict=False,
    )  # fmt: skip


ENTRIES = {
    "BriaFibo2Transformer2DModel": Tiny(
        model=_bria_fibo2,
        inputs=_bria_fibo2_inputs,
        grid=(1, 3, 4),
        video=False,
        no_fullgraph="the forward reads the prompts' lengths on the host (`encoder_attention_mask.sum().tolist()`) "
        "to count the gist tokens, and RopeEmbedder builds its lookup tables under a `with torch.device`",
        no_repeated="its BriaFibo2TransformerBlock serves the noise refiner (image tokens) and the main layers (gist "
        "and image tokens, the first with cross-attention): other shapes and modules per call",
    ),  # fmt: skip
    "Ideogram4Transformer2DModel": Tiny(model=_ideogram4, inputs=_ideogram4_inputs, grid=(1, 3, 4), video=False),
    "LTX2VideoTransformer3DModel": Tiny(
        model=_ltx2,
        inputs=_ltx2_inputs,
        grid=(3, 3, 4),
        # the adapter's, not stock's: LTX-2 takes position modes only (no per-axis spectrum), and sizing its
        # physical coordinates reads the token grid on the host
        no_fullgraph="sized (its only scaling), the adapter reads the forward's token grid (num_frames, height, "
        "width) on the host to scale LTX-2's coordinates in seconds and pixels: one graph break per forward",
    ),  # fmt: skip
    "SanaWMLTX2RefinerTransformer3DModel": Tiny(
        model=_refiner,
        inputs=_refiner_inputs,
        grid=(3, 3, 4),
        no_fullgraph="its pipeline builds each window's tables outside the forward from a host list of frame "
        "positions (build_rotary_emb_for_absolute_positions), which this tiny forward calls as the pipeline would; "
        "sized, the adapter reads the window's grid from them on the host",
    ),  # fmt: skip
    "AnyFlowFARTransformer3DModel": Tiny(
        model=_anyflow_far,
        inputs=_anyflow_far_inputs,
        grid=(5, 4, 4),
        no_checkpointing="its causal attention runs on flex attention, which has no backward on CPU",
        no_dynamic="its forward builds the flex-attention block mask from the sizes, which specialises on the "
        "mask's block count",
    ),  # fmt: skip
    "MochiTransformer3DModel": Tiny(model=_mochi, inputs=_mochi_inputs, grid=(3, 3, 4)),
    "AceStepTransformer1DModel": Tiny(model=_ace_step, inputs=_ace_step_inputs, grid=(1, 3, 4), video=False),
}
