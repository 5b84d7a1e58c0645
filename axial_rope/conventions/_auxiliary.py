"""diffusers models beside a pipeline's denoising transformer (ControlNets, VAEs and decoders, condition encoders) that
use RoPE and are not served, each with its reason: ``tests/test_diffusers_coverage.py`` counts them apart from the
RoPE transformers, and :func:`~axial_rope.conventions.diffusers_family` gives the reason to a caller."""

from __future__ import annotations

__all__ = ["DIFFUSERS_AUXILIARY"]

_CONTROLNET = (
    "a ControlNet beside {transformer}: it computes its own tables ({how}) from the same inputs and adds residuals to "
    "the transformer's blocks; not served yet (a record of its own would replace its tables as the transformer's "
    "are), so a scaled transformer takes residuals computed on stock tables"
)
_WRAPPER = "a wrapper with no attention of its own that runs each of its `nets` ({each}) and sums their residuals"
# diffusers 0.42.1 class name -> why it is not served
DIFFUSERS_AUXILIARY: dict[str, str] = {
    "FluxControlNetModel": _CONTROLNET.format(transformer="FluxTransformer2DModel", how="`pos_embed(ids)`"),
    "FluxMultiControlNetModel": _WRAPPER.format(each="FluxControlNetModel"),
    "QwenImageControlNetModel": _CONTROLNET.format(
        transformer="QwenImageTransformer2DModel", how="`pos_embed(img_shapes, ...)`"
    ),
    "QwenImageMultiControlNetModel": _WRAPPER.format(each="QwenImageControlNetModel"),
    "ZImageControlNetModel": _CONTROLNET.format(
        transformer="ZImageTransformer2DModel",
        how="the transformer's `rope_embedder` object, which `from_transformer` hands it: the adapter's stand-in on "
        "the transformer does not reach the ControlNet's reference",
    ),
    "CosmosControlNetModel": _CONTROLNET.format(
        transformer="CosmosTransformer3DModel", how="`rope(control_hidden_states, fps)`"
    ),
    "AutoencoderKLMiniMaxH3": "a VAE, not the denoising transformer the adapter scales: its ViT decoder rotates by "
    "its latent patches' coordinates (`MiniMaxH3VideoRotaryPosEmbed`)",
    "AutoencoderSAME": "a VAE, not the denoising transformer the adapter scales: partial RoPE in its encoder's and "
    "decoder's transformer blocks over the patches it codes",
    "LTX2VideoDiffusionDecoderModel": "a VAE decoder: RoPE inside neighbourhood attention windows "
    "(`LTX2VideoVaeRotaryPosEmbed3D`): a query meets keys at most a `kernel_size` window away, the same offsets at "
    "every video size",
    "AnimaTextConditioner": "a text conditioner: 1-D RoPE over the prompt's tokens, as a language model's; the "
    "image size does not change it",
    "AceStepConditionEncoder": "a condition encoder: 1-D RoPE over the lyrics' tokens and the reference audio's "
    "frames, as a language model's",
    "AceStepAudioTokenizer": "an audio tokenizer: RoPE within each pooling window (`patch_size + 1` tokens), the same "
    "length at every duration",
    "AceStepAudioTokenDetokenizer": "an audio detokenizer: RoPE within each pooling window (`pool_window_size` "
    "tokens), the same length at every duration",
}
