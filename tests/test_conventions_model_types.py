"""Every model type of the installed transformers whose modeling module has a rotary: ``ar.rope_from_config``
of its tiny config rotates q and k as the model's own rotary module and ``apply_rotary_pos_emb`` do
(``tests/model_types_support.py``), or refuses it, naming it, with the reason listed here.

transformers 5.25.0: 379 model types with a rotary; 180 matched (``ar.conventions.MODEL_TYPES`` pins their
pairing, sign and M-RoPE layout), 192 refused. A model type that is neither fails the test: pin it (the
sweep's ``try_all=True`` says which pairing, sign and layout its code has) or list it with a reason.
"""

from __future__ import annotations

import pytest
import torch

import axial_rope as ar
from axial_rope.conventions import model_types

transformers = pytest.importorskip("transformers")
import model_types_support as mts  # noqa: E402 - imports transformers' auto classes

TOLERANCE = 1e-5  # float32 tables at positions < 50; a wrong pairing or sign is off by O(1)

# the model types rope_from_config refuses, by reason (checked: rope_from_config raises on each tiny config)
REFUSED = {
    (
        "DeepSeek's apply_rotary_pos_emb_interleave (with rope_interleave, or always): planes (2j, 2j+1) "
        "written back de-interleaved to (j, j + D/2), a permutation no AxialRoPE makes"
    ): """
        axk1 axk2 bailing_hybrid deepseek_v3 deepseek_v32 glm4_moe_lite glm_moe_dsa hy_v4 kimi_k25 mistral4
        mistral_large4 mistral_large4_text youtu
    """,
    ("M-RoPE sections over a partial rotary width (GLM-4V, GLM-Image, Qwen3.5)"): """
        glm4v glm4v_moe glm4v_moe_text glm4v_text glm_image glm_image_text qwen3_5 qwen3_5_moe
        qwen3_5_moe_text qwen3_5_text
    """,
    ("`rotary_dim` channels rotated by rotate_every_two, one tensor at a time (GPT-J, CodeGen)"): """
        codegen gptj
    """,
    (
        "a vision tower or image model: 2D rope on patch grids (rope_type 'axial', SAM, Llama 4 and EoMT "
        "vision); the ViT conventions are ar.conventions' constructors"
    ): """
        cohere_compass_vision edgetam_video eomt_dinov3 ernie4_5_vl_moe_vision exaone4_5_vision
        gemma4_vision glm4v_moe_vision glm4v_vision glm5_next_vision glm_ocr_vision inkling2_vision
        kimi_k25_vision lfm3_vl_vision llama4_vision_model llava_onevision1_5_vision minimax_m3_vl_vision mlcd mlcd_vision_model
        muse_glimmer_vision ovis2_5_vision muse_spark_vision paddleocr_vl_vision pixtral qwen2_5_omni_vision_encoder
        qwen2_5_vl_vision qwen2_vl_vision qwen3_5_moe_vision qwen3_5_vision qwen3_omni_moe_vision_encoder
        qwen3_vl_moe_vision qwen3_vl_vision qwen4_exp_vision sam2_video sam3_tracker_video sam3_vit_model
        step3p5_vision video_llama_3_vision
    """,
    (
        "a vision, audio, codec, adapter or encoder-decoder part without rope fields of its own: its module's "
        "rotary reads another config"
    ): """
        apertus1p5_vision_tokenizer chameleon_vqgan cosmos3_edge_vision deepseek_ocr2_sam_vision_model
        deepseek_ocr2_vision dia emu3_vqgan esmfold2 gemma3n_audio gemma3n_vision gemma4_audio
        gemma4_unified_audio gemma4_unified_vision glm_image_vision glm_image_vqmodel granite_docling_vision
        hunyuan_vl_vision hy_v4_vl_vision idefics_perciever idefics_vision lasr_ctc mllama_vision_model
        molmo2_adapter molmo2_vision moonshine_streaming_encoder moshi_depth nemotron3_diarization
        phi4_multimodal_audio phi4_multimodal_vision pi05 qwen2_5_omni_audio_encoder qwen2_5_omni_bigvgan
        qwen2_5_omni_token2wav t5gemma t5gemma2 unlimited_ocr_sam_vision_model unlimited_ocr_vision
        unlimited_ocr_vision_encoder
    """,
    (
        "no apply_rotary_pos_emb(q, k, cos, sin) from a rotary built on this config: conformer, relative or "
        "2D rotaries, a custom rotation, or no RoPE (SSM hybrids, ASR encoders)"
    ): """
        clvp clvp_decoder clvp_encoder dinov3_vit edgetam_video_mask_decoder edgetam_video_prompt_encoder
        granite4_vision granite4_vision_text higgs_audio_v2 inkling2_text jamba lightglue longcat_flash
        musicflamingo nemo_speechlm nemotron_asr_streaming nemotron_asr_streaming_encoder nemotron_h
        parakeet_ctc parakeet_encoder parakeet_rnnt parakeet_tdt pe_audio_encoder pe_audio_video_encoder
        pocket_tts_audio_tokenizer pocket_tts_audio_tokenizer_decoder pocket_tts_audio_tokenizer_encoder
        qwen3_omni_moe_audio_encoder roformer sam2_video_mask_decoder sam2_video_prompt_encoder sam3
        sam3_detr_decoder sam3_detr_encoder sam3_geometry_encoder sam3_mask_decoder
        sam3_tracker_video_mask_decoder sam3_tracker_video_prompt_encoder sam3_vision_model sapiens2
        sapiens2_head seamless_m4t vjepa2 wav2vec2-bert wav2vec2-conformer
    """,
    (
        "ropes or head sizes per layer or per sub-rope (per_layer_config, 'compress'/'main', 'hybrid', "
        "'indexed_attention', NoPE full-attention layers): rope_from_config reads one rope per layer type"
    ): """
        beam deepseek_v4 diffusion_gemma diffusion_gemma_text dots3_note_text embedding_gemma2
        embedding_gemma2_text gemma4 gemma4_text gemma4_unified gemma4_unified_text zaya
    """,
    (
        "M-RoPE and XD-RoPE variants (Qwen-Omni thinker, talker and DiT, Qwen4-Exp, HunYuan-VL, ERNIE 4.5-VL) "
        "whose sections or positions the sweep does not fit to a tiny head: not checked"
    ): """
        ernie4_5_vl_moe ernie4_5_vl_moe_text hunyuan_vl hunyuan_vl_text qwen2_5_omni_dit qwen3_omni_moe
        qwen3_omni_moe_talker_code_predictor qwen3_omni_moe_talker_text qwen3_omni_moe_text
        qwen3_omni_moe_thinker qwen4_exp qwen4_exp_text
    """,
    (
        "not swept: the config class rejects the tiny sizes (validation tied to sub-configs), a 1-layer tiny "
        "config without attention (LFM3), an odd rotary width on the tiny head (Moonshine streaming), "
        "head_dim 0 (GLM-5 Next) or a one-tensor apply_rotary_pos_emb(x, cos, sin) (Gemma 3n)"
    ): """
        apertus1p5 cohere_compass cohere_compass_text dots3_note dots3_note_audio_encoder
        dots3_note_vision_encoder efficientloftr exaone4_5 gemma3n gemma3n_text glm5_next glm5_next_text
        gradium_phonon_tts granite_docling hy_v4_vl hy_v4_vl_text inkling2 kolibri1_1 lfm3 lfm3_vl
        llava_onevision1_5 moonshine_streaming
        muse_spark muse_spark_audio nemotron3_5_transcribe_audio nemotron3_5_transcribe_word_timestamp
        olmo_hybrid pocket_tts zamba zamba2
    """,
}
REFUSED_TYPES = {name: reason for reason, names in REFUSED.items() for name in names.split()}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, tuple[str, object]]:
    """model type -> ("matched" | "wrong", worst |q, k| difference) or ("refused" | "not swept", message)."""
    found = {}
    for model_type in mts.rotary_model_types():
        try:
            outcome = mts.sweep(model_type)
        except mts.NotSwept as why:
            found[model_type] = ("not swept", str(why))
            continue
        if outcome.error is not None:
            found[model_type] = ("refused", outcome.error)
        else:
            diff = outcome.diff["from_config"]
            found[model_type] = ("matched" if diff <= TOLERANCE else "wrong", diff)
    return found


def test_every_rotary_model_type_is_matched_or_refused_with_a_reason(outcomes):
    kinds = {kind: sorted(t for t, (k, _) in outcomes.items() if k == kind) for kind in
             ("matched", "wrong", "refused", "not swept")}  # fmt: skip
    assert not kinds["wrong"], {t: outcomes[t][1] for t in kinds["wrong"]}  # pinned, and silently wrong
    unexplained = sorted(t for t in outcomes if outcomes[t][0] != "matched" and t not in REFUSED_TYPES)
    assert not unexplained, "pin these in ar.conventions.MODEL_TYPES or list them in REFUSED: " + str(
        {t: str(outcomes[t][1])[:200] for t in unexplained}
    )
    stale = sorted(t for t in REFUSED_TYPES if outcomes.get(t, ("gone",))[0] in ("matched", "gone"))
    assert not stale, f"listed as refused, but matched (or no longer a rotary model type): {stale}"
    assert len(kinds["matched"]) + len(kinds["refused"]) + len(kinds["not swept"]) == len(outcomes)
    assert len(kinds["matched"]) >= 180  # transformers 5.25.0 (the docs quote the counts)


def test_refusals_name_the_model_type(outcomes):
    for model_type, (kind, message) in outcomes.items():
        if kind != "refused":
            continue
        config = mts.tiny_config(model_type)
        named = {model_type, getattr(mts.rope_source(config), "model_type", model_type)}
        assert any(repr(name) in message for name in named), (model_type, message)
        if model_type in model_types.REFUSED:
            assert model_types.REFUSED[model_type] in message


def test_refused_model_types_are_not_pinned():
    assert not set(REFUSED_TYPES) & set(ar.conventions.MODEL_TYPES)
    assert set(model_types.REFUSED) <= set(REFUSED_TYPES)


def test_the_issue_examples_follow_the_code_not_the_name():
    """GLM, GLM-4, ERNIE 4.5, Helium, Cohere 2 MoE and Moonshine pair (2j, 2j+1); NanoChat's rotate_half is
    cat(x2, -x1), a rotation by minus the angle (negated frequencies, half pairing)."""
    for model_type in ("glm", "glm4", "ernie4_5", "ernie4_5_moe", "helium", "cohere2_moe", "moonshine"):
        assert ar.rope_from_config(mts.tiny_config(model_type)).pairing == "interleaved", model_type
    nanochat = ar.rope_from_config(mts.tiny_config("nanochat"))
    assert nanochat.pairing == "half" and bool((nanochat.freqs <= 0).all()) and bool((nanochat.freqs < 0).any())
    plain = ar.rope_from_config(mts.tiny_config("llama"))
    assert torch.equal(nanochat.freqs, -plain.freqs)


LLAMA_LIKE = {"hidden_size": 64, "num_attention_heads": 2, "rope_theta": 1e4}


def test_an_unpinned_model_type_is_refused_by_name_and_pairing_builds_it():
    with pytest.raises(ValueError, match="model_type 'my_llama' is not pinned.*pairing="):
        ar.rope_from_config({"model_type": "my_llama", **LLAMA_LIKE})
    with pytest.raises(ValueError, match="a config without model_type is not pinned"):
        ar.rope_from_config(LLAMA_LIKE)
    rope = ar.rope_from_config({"model_type": "my_llama", **LLAMA_LIKE}, pairing="interleaved")
    assert rope.pairing == "interleaved" and torch.equal(rope.freqs, ar.AxialRoPE(32).freqs)
    with pytest.raises(ValueError, match="pairing='interleaved' contradicts model_type 'llama'"):
        ar.rope_from_config({"model_type": "llama", **LLAMA_LIKE}, pairing="interleaved")
    with pytest.raises(ValueError, match="pairing must be None, 'half' or 'interleaved', got 'complex'"):
        ar.rope_from_config({"model_type": "my_llama", **LLAMA_LIKE}, pairing="complex")
    with pytest.raises(ValueError, match="model_type 'deepseek_v3' is refused: its attention reads planes"):
        ar.rope_from_config({"model_type": "deepseek_v3", **LLAMA_LIKE}, pairing="interleaved")


def test_mrope_layout_comes_from_the_code_not_the_flag():
    """No modeling file reads ``mrope_interleaved``: Qwen2-VL splits and Qwen3-VL interleaves whatever it says;
    a model type whose rotary has no M-RoPE refuses an ``mrope_section``."""
    params = {"rope_theta": 1e6, "mrope_section": [4, 6, 6]}
    for model_type, spectrum in (("qwen2_vl", "split"), ("qwen3_vl_text", "cycled")):
        for flag in (True, False):
            config = {"model_type": model_type, "head_dim": 32, "rope_parameters": params | {"mrope_interleaved": flag}}
            assert ar.rope_from_config(config).spectrum == spectrum
    with pytest.raises(ValueError, match="model_type 'llama' has no M-RoPE"):
        ar.rope_from_config({"model_type": "llama", "head_dim": 32, "rope_parameters": params})
