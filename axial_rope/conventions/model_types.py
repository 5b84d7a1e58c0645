"""transformers model types -> the rotation their modeling code applies, as a test checked it.

``tests/test_conventions_model_types.py`` runs, for every model type of transformers 5.24.0 whose modeling
module has a rotary, the model's own rotary module and ``apply_rotary_pos_emb`` on a tiny config against
:func:`axial_rope.rope_from_config` (``tests/model_types_support.py``); the model types here are the ones
it matched. The pairing is what the code does, not what the name suggests: GLM, GLM-4, ERNIE 4.5, Helium,
Moonshine, BLT and Cohere pair channels ``(2j, 2j+1)``; NanoChat's ``rotate_half`` is ``cat(x2, -x1)``, a
rotation by minus the angle. :func:`model_convention` refuses a model type that is not here, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelConvention", "MODEL_TYPES", "REFUSED", "INTERLEAVED_MODEL_TYPES", "model_convention"]


@dataclass(frozen=True)
class ModelConvention:
    """How a model type's code rotates q and k.

    Attributes:
        pairing: ``"half"`` (``rotate_half``: planes ``(j, j + D/2)``) or ``"interleaved"`` (``(2j, 2j+1)``).
        sign: ``1``, or ``-1`` for a rotation by minus the angle (the rope gets negated frequencies).
        mrope: the layout of ``mrope_section`` in the code: ``"split"`` (contiguous sections, Qwen2-VL),
            ``"cycled"`` (interleaved, Qwen3-VL), or ``None`` (no M-RoPE: an ``mrope_section`` is refused).
    """

    pairing: str
    sign: int = 1
    mrope: str | None = None


# (2j, 2j+1): a complex view, repeat_interleave or an interleaving rotate_half
INTERLEAVED_MODEL_TYPES = frozenset({
    "blt", "blt_global_transformer", "blt_local_decoder", "blt_local_encoder", "blt_patcher", "cohere",
    "cohere2", "cohere2_moe", "deepseek_v2", "ergo", "ernie4_5", "ernie4_5_moe", "glm", "glm4", "glm_ocr",
    "glm_ocr_text", "helium", "llama4", "llama4_text", "moonshine", "openai_privacy_filter", "pe_video_encoder"
})  # fmt: skip
# rotate_half over (j, j + D/2): the Llama convention
HALF_MODEL_TYPES = frozenset({
    "EvollaModel", "afmoe", "apertus", "apertus1p5_text", "arcee", "aria", "aria_text", "bamba", "bitnet",
    "chameleon", "cosmos3_edge", "cosmos3_edge_text", "csm", "csm_depth_decoder_model", "cwm", "dbrx",
    "deepseek_ocr2", "deepseek_ocr2_encoder", "deepseek_ocr2_text", "dia_decoder", "dia_encoder", "diffllama",
    "doge", "dory", "dots1", "emu3", "emu3_text_model", "esm", "esmc", "eurobert", "evolla", "exaone4",
    "exaone_moe", "falcon", "falcon_h1", "flex_olmo", "flint", "gemma", "gemma2", "gemma3", "gemma3_text",
    "glm4_moe", "glmasr", "glmasr_encoder", "gpt_neox", "gpt_neox_japanese", "gpt_oss", "granite",
    "granite_docling_text", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoehybrid",
    "granitemoeshared", "gte", "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3",
    "hyperclovax", "idefics", "jais2", "jetmoe", "jina_embeddings_v3", "kolibri1", "kyutai_speech_to_text",
    "laguna", "lara_mini", "lasr_encoder", "lfm2", "lfm2_moe", "llama", "mellum", "mimi", "mimi_decoder",
    "mimi_encoder", "mimo_v2_flash", "minicpm3", "minicpm5_moe", "minimax", "minimax_m2", "minimax_m3_vl", "minimax_m3_vl_text",
    "ministral", "ministral3", "mistral", "mixtral", "mllama", "mllama_text_model", "modernbert",
    "modernbert-decoder", "molmo2", "molmo2_text", "moshi", "muse_glimmer", "muse_glimmer_assistant",
    "muse_glimmer_text", "muse_spark_text", "nanochat", "nemotron", "nemotron3_5_transcribe_asr_audio",
    "nemotron3_diarization_audio", "neomme", "neucodec", "nomic_bert", "olmo", "olmo2", "olmo3", "olmoe",
    "paddleocr_vl", "paddleocr_vl_text", "pe_audio", "pe_audio_video", "pe_video", "persimmon", "phi", "phi3",
    "phi4_multimodal", "phimoe", "qwen2", "qwen2_5_omni", "qwen2_5_omni_talker", "qwen2_5_omni_text",
    "qwen2_5_omni_thinker", "qwen2_5_vl", "qwen2_5_vl_text", "qwen2_moe", "qwen2_vl", "qwen2_vl_text", "qwen3",
    "qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_vl_moe", "qwen3_vl_moe_text", "qwen3_vl_text",
    "recurrent_gemma", "seed_oss", "smollm3", "solar_open", "stablelm", "starcoder2", "step3p5", "step3p7",
    "t5_gemma_module", "t5gemma2_decoder", "t5gemma2_encoder", "t5gemma2_text", "timesfm2_5", "ultrabert",
    "unlimited_ocr", "unlimited_ocr_text", "vaultgemma", "video_llama_3", "voxtral_realtime",
    "voxtral_realtime_encoder", "voxtral_realtime_text", "xcodec2"
})  # fmt: skip
_NEGATED = frozenset({"nanochat"})  # rotate_half = cat(x2, -x1)
_SPLIT_MROPE = frozenset({
    "glm_ocr", "glm_ocr_text", "paddleocr_vl", "paddleocr_vl_text", "qwen2_5_omni", "qwen2_5_omni_talker",
    "qwen2_5_omni_text", "qwen2_5_omni_thinker", "qwen2_5_vl", "qwen2_5_vl_text", "qwen2_vl", "qwen2_vl_text"
})  # fmt: skip
_CYCLED_MROPE = frozenset({
    "cosmos3_edge", "cosmos3_edge_text", "qwen3_vl", "qwen3_vl_moe", "qwen3_vl_moe_text", "qwen3_vl_text"
})  # fmt: skip

MODEL_TYPES: dict[str, ModelConvention] = {
    name: ModelConvention(
        "interleaved" if name in INTERLEAVED_MODEL_TYPES else "half",
        -1 if name in _NEGATED else 1,
        "split" if name in _SPLIT_MROPE else "cycled" if name in _CYCLED_MROPE else None,
    )
    for name in sorted(INTERLEAVED_MODEL_TYPES | HALF_MODEL_TYPES)
}

_DEINTERLEAVED = (
    "its attention reads planes (2j, 2j+1) and writes them de-interleaved to (j, j + D/2) "
    "(apply_rotary_pos_emb_interleave): q and k come out permuted, which no AxialRoPE reproduces"
)
_PARTIAL_MROPE = "its M-RoPE sections cover a partial rotary width, which rope_from_config does not build"
# model types whose config rope_from_config could read, but whose rotation it would not reproduce
REFUSED: dict[str, str] = {
    **dict.fromkeys(("axk1", "axk2", "bailing_hybrid", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa",
                     "hy_v4", "mistral4", "mistral_large4", "mistral_large4_text", "youtu"), _DEINTERLEAVED),
    **dict.fromkeys(("glm4v", "glm4v_text", "glm4v_moe", "glm4v_moe_text", "glm_image", "glm_image_text", "qwen3_5",
                     "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), _PARTIAL_MROPE),
    **dict.fromkeys(("gptj", "codegen"), "its rotary covers `rotary_dim` channels, interleaved (rotate_every_two)"),
}  # fmt: skip


def model_convention(model_type: str | None) -> ModelConvention:
    """The checked rotation of a transformers model type (``ValueError`` naming it when it is not pinned)."""
    if model_type in REFUSED:
        raise ValueError(
            f"model_type {model_type!r} is refused: {REFUSED[model_type]}; build its rope with ar.AxialRoPE directly"
        )
    if model_type not in MODEL_TYPES:
        what = "a config without model_type" if not model_type else f"model_type {model_type!r}"
        raise ValueError(
            f"{what} is not pinned: rope_from_config builds the rope of the {len(MODEL_TYPES)} transformers model "
            "types whose rotation (pairing, sign, M-RoPE layout) a test checked against their modeling code "
            "(axial_rope.conventions.MODEL_TYPES). Check the model's apply_rotary_pos_emb and pass pairing='half' "
            "or 'interleaved', or build ar.conventions.llama / ar.AxialRoPE directly"
        )
    return MODEL_TYPES[model_type]
