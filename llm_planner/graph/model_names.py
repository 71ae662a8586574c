"""Whether two names of a model name one model: a Hugging Face id and a preset's name
('meta-llama/Meta-Llama-3-8B' and 'llama3-8b'), as files that state their model write it (a
serving profile's `model`, an engine benchmark's `model_id`)."""

from __future__ import annotations

import re


def same_model(a: str | None, b: str | None) -> bool:
    """Whether a and b plausibly name one model: with the organisation, case, punctuation and a
    leading 'meta' set aside, one holds the other. An unnamed side is taken to match."""
    if not a or not b:
        return True
    x, y = (bare_name(n) for n in (a, b))
    return bool(x and y) and (x in y or y in x)


def bare_name(name: str) -> str:
    """A model name with its organisation, case, punctuation and a leading 'meta' set aside
    ('meta-llama/Meta-Llama-3-8B' and 'llama3-8b' are both 'llama38b')."""
    return re.sub(r"^meta", "", re.sub(r"[^a-z0-9]", "", name.lower().rsplit("/", 1)[-1]))
