"""Saved diffusers models whose config.json must still describe their weights.

Some config fields carry no weights (``theta``, ``pos_mode``, ``input_size``, ``num_heads``
without QK-norm, ``axes_dim``, ``temporal_scaling``): a changed or removed value loads without
a shape error and changes the outputs. So the model keeps a fingerprint of those fields in a
buffer, ``config_fingerprint``, written with the weights by ``save_pretrained``, and
``from_pretrained`` compares it with the config it read:

- a field missing from config.json is an error (a default would silently fill it);
- a weight-free field that differs from the one saved with the weights is an error naming
  both values; to change one on purpose, pass it to ``from_pretrained`` (``theta=...``), which
  then is what the model records;
- weights whose shapes the config does not give (``hidden_size``, ``num_heads`` with QK-norm,
  ...) are an error that says so, instead of diffusers' advice to re-initialise them;
- weights the config has no place for, or lacks (an edited ``qk_norm``: ``None`` -> ``"rms"``
  adds norm weights, ``"rms"`` -> ``"layer"`` adds their biases; ``depth``, ``num_classes``,
  ``cond_dim``), are an error naming the field, before any weight is loaded, instead of a
  log line and new random weights (or, with ``device_map``, a meta-device error). The check
  sits in ``_load_pretrained_model``, where diffusers compares the checkpoint's key names
  with the model's on every loading path.

``load_state_dict`` between models in memory copies weights only: the fingerprint always
describes the model's own config. Files saved without a fingerprint (older versions) load
unchecked.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import struct

import torch

__all__ = ["CheckedConfigMixin", "FINGERPRINT"]

FINGERPRINT = "config_fingerprint"
_VERSION = 1


def _encode(value) -> int:
    """A value as an int64: an int as itself, a float by its bits, anything else by a 62-bit digest of its JSON."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        text = json.dumps(value, sort_keys=True)
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2
    if isinstance(value, int):
        return value
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


class CheckedConfigMixin:
    """For a diffusers ``ModelMixin``: implement ``weight_free()``, call ``_init_fingerprint()`` in ``__init__``."""

    def weight_free(self) -> dict:
        """``{field: value}`` of the config fields that carry no weights, as the model uses them."""
        raise NotImplementedError

    def _fingerprint(self) -> torch.Tensor:
        values = [_VERSION] + [_encode(v) for v in self.weight_free().values()]
        return torch.tensor(values, dtype=torch.int64)

    def _init_fingerprint(self) -> None:
        # an int64 buffer: model.to(dtype) and torch_dtype= leave it exact
        self.register_buffer(FINGERPRINT, self._fingerprint(), persistent=True)

    def reset_fingerprint(self) -> None:
        """Recompute the buffer (a model built on the meta device gets its values here, after ``to_empty``)."""
        getattr(self, FINGERPRINT).copy_(self._fingerprint().to(getattr(self, FINGERPRINT).device))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        key = prefix + FINGERPRINT
        if key in state_dict:  # from_pretrained compares it with the config; load_state_dict never adopts it
            self._saved_fingerprint = state_dict[key].detach().clone()
        own = getattr(self, FINGERPRINT).clone()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)
        getattr(self, FINGERPRINT).copy_(own)
        if key in missing:  # a state dict of the weights alone (e.g. another model's) is complete
            missing.remove(key)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        fields = set(cls._init_fields())
        explicit = fields & set(kwargs)  # passed on purpose: not compared with the saved values
        try:
            model = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except (ValueError, RuntimeError) as err:
            if not re.search(r"expected shape|size mismatch", str(err)):
                raise
            detail = str(err).split(" If you want")[0].replace("Cannot load  because ", "")
            raise ValueError(
                f"the config.json of {pretrained_model_name_or_path} does not describe its weights ({detail}): "
                f"the shapes follow from its fields ({_shape_hint(str(err))}); restore the config the weights were "
                "saved with"
            ) from err
        missing = sorted(set(model.config.get("_use_default_values", ())) & fields - explicit)
        if missing:
            raise ValueError(
                f"the config.json of {pretrained_model_name_or_path} lacks {missing}: every field is required "
                "(a default would silently change the model); restore them, or pass them to from_pretrained"
            )
        model._check_fingerprint(pretrained_model_name_or_path, explicit)
        return model

    @classmethod
    def _load_pretrained_model(cls, *args, **kwargs):
        # diffusers' one call with the model built from config.json and the checkpoint's key names,
        # before any weight is read: arguments taken by name, so a reordering cannot fool the check
        arguments = inspect.signature(super()._load_pretrained_model).bind(*args, **kwargs).arguments
        model, loaded = arguments["model"], arguments["loaded_keys"]
        _check_keys(model, loaded, arguments.get("pretrained_model_name_or_path"))
        return super()._load_pretrained_model(*args, **kwargs)

    @classmethod
    def _init_fields(cls) -> list[str]:
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def _check_fingerprint(self, source, explicit: set[str]) -> None:
        saved = self.__dict__.pop("_saved_fingerprint", None)
        if saved is None:  # diffusers' low-memory loading sets the buffer itself
            saved = getattr(self, FINGERPRINT).clone()
        own = self._fingerprint()
        getattr(self, FINGERPRINT).copy_(own)  # from now on: this model's config
        if saved.shape != own.shape or int(saved[0]) != _VERSION:
            raise ValueError(f"{source}: its config fingerprint is of another version ({saved.tolist()[:1]})")
        names = list(self.weight_free())
        differ = [n for n, a, b in zip(names, saved[1:].tolist(), own[1:].tolist()) if a != b and n not in explicit]
        if differ:
            values = self.weight_free()
            detail = ", ".join(
                f"{n}: {_decode(values[n], saved[1 + names.index(n)])} saved with the weights, "
                f"{values[n]!r} in config.json"
                for n in differ
            )
            raise ValueError(
                f"the config.json of {source} does not match the settings its weights were saved with ({detail}); "
                f"these fields change the outputs without changing a shape: restore config.json, or pass the new "
                f"value to from_pretrained ({differ[0]}=...) to mean it"
            )


# Which config field decides whether a weight exists (block indices: depth, counted apart)
_KEY_FIELDS = ((re.compile(r"\.[qk]_norm\."), "qk_norm"), (re.compile(r"y_embedder\."), "num_classes"),
               (re.compile(r"cond_embedder\."), "cond_dim"))  # fmt: skip
_BLOCK = re.compile(r"(?:^|\.)blocks\.(\d+)\.")


def _check_keys(model, loaded_keys, source) -> None:
    """``ValueError`` naming the config fields for weights that the checkpoint lacks or the model has no place for."""
    expected, loaded = set(model.state_dict()) - {FINGERPRINT}, set(loaded_keys) - {FINGERPRINT}
    if expected == loaded:
        return
    blocks = [{int(m.group(1)) for k in keys if (m := _BLOCK.search(k))} for keys in (loaded, expected)]
    problems = []
    if blocks[0] != blocks[1]:
        problems.append(f"depth: the weights have {len(blocks[0])} blocks, config.json {model.config.get('depth')!r}")
    same_blocks = blocks[0] & blocks[1]
    differ = {k for k in expected ^ loaded if (m := _BLOCK.search(k)) is None or int(m.group(1)) in same_blocks}
    by_field: dict[str, tuple[list[str], list[str]]] = {}  # field: (weights lacking, weights with no place)
    for key in sorted(differ):
        field = next((f for pattern, f in _KEY_FIELDS if pattern.search(key)), "another field")
        by_field.setdefault(field, ([], []))[key in loaded].append(key)
    for field, (lacking, extra) in by_field.items():
        value = f" ({model.config.get(field)!r} in config.json)" if field in model.config else ""
        said = [f"lacks {_few(lacking)}"] if lacking else []
        said += [f"has {_few(extra)}, which this config has no place for"] if extra else []
        problems.append(f"{field}{value}: the checkpoint " + " and ".join(said))
    raise ValueError(
        f"the config.json of {source} does not describe its weights ({'; '.join(problems)}): these fields decide "
        "which weights exist; restore the config the weights were saved with"
    )


def _few(keys: list[str]) -> str:
    return ", ".join(keys[:2]) + (f", ... ({len(keys)} weights)" if len(keys) > 2 else "")


def _decode(current, code: torch.Tensor) -> str:
    """The saved value where the encoding can be inverted (ints, floats), else ``another value``."""
    code = int(code)
    if isinstance(current, float):
        return repr(struct.unpack("<d", struct.pack("<q", code))[0])
    if isinstance(current, int) and not isinstance(current, bool):
        return repr(code)
    return "another value"


def _shape_hint(message: str) -> str:
    if "q_norm" in message or "k_norm" in message:
        sizes = re.findall(r"torch\.Size\(\[(\d+)\]\)", message)
        if len(sizes) == 2:
            return f"num_heads: the weights have {sizes[1]} channels per head, this config {sizes[0]}"
        return "num_heads with qk_norm"
    return "hidden_size, num_heads, depth, patch_size, in_channels, mlp_ratio, num_classes, learn_sigma, ..."
