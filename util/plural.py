"""Counted nouns for messages: ``plural(1, "step")`` -> ``1 step``, ``plural(3, "step")`` -> ``3 steps``."""
from __future__ import annotations

#: nouns whose plural is not noun + "s"
_IRREGULAR = {"index": "indices", "matrix": "matrices", "vertex": "vertices"}


def plural_noun(count: int, noun: str, plural_form: str | None = None) -> str:
    """``noun`` or its plural, as ``count`` asks."""
    if count == 1:
        return noun
    if plural_form is not None:
        return plural_form
    if noun in _IRREGULAR:
        return _IRREGULAR[noun]
    head, _, last = noun.rpartition(" ")
    if last.endswith(("s", "x", "ch", "sh")):
        word = last + "es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        word = last[:-1] + "ies"
    else:
        word = last + "s"
    return f"{head} {word}" if head else word


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``count`` followed by ``noun`` in the right number: ``1 step``, ``0 steps``, ``2 entries``."""
    return f"{count} {plural_noun(count, noun, plural_form)}"
