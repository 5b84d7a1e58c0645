"""A study's settings back from its page's json: the dataclass that ``asdict`` and json turned into lists and dicts."""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass

__all__ = ["settings_to"]


def settings_to(cls, settings: dict):
    """The study dataclass ``cls`` from its json settings (``asdict`` then json: lists back to tuples, nested
    dataclasses rebuilt from their dicts)."""

    def tuples(v):
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v

    kwargs = {}
    for f in fields(cls):
        if f.name not in settings:
            continue
        value = settings[f.name]
        default = f.default if f.default is not MISSING else None
        if f.default_factory is not MISSING:
            default = f.default_factory()
        if is_dataclass(default) and isinstance(value, dict):
            kwargs[f.name] = settings_to(type(default), value)
        else:
            kwargs[f.name] = tuples(value)
    return cls(**kwargs)
