"""The word lists ``quality.c4.bad_words`` can name instead of giving a file: one registry, each
name mapped to a file inside an installed package (nothing is downloaded at run time).

C4's own list (the "List of Dirty, Naughty, Obscene and Otherwise Bad Words", ``en``) ships in no
maintained package and is not copied here; ``better-profanity`` ships a profanity list of its own.
"""
from __future__ import annotations

import importlib.util
import os
from typing import NamedTuple

from colaflow.config import ConfigError


class NamedList(NamedTuple):
    """Where a named word list lives.

    Attributes:
        package: the importable package holding the file (located, never imported).
        file: the file inside the package, one word or phrase per line.
        install: what to ``pip install`` when the package is missing.
    """

    package: str
    file: str
    install: str


NAMED_LISTS = {
    # better-profanity 0.7.0: 916 English entries, some spelled with digits or symbols (a "$" for an "s")
    "better-profanity": NamedList("better_profanity", "profanity_wordlist.txt",
                                  "'colaflow[curation]' (or better-profanity==0.7.0)"),
}


def word_list_path(spec: str) -> str:
    """The file that ``quality.c4.bad_words=spec`` means: a :data:`NAMED_LISTS` name's file inside
    its installed package, else ``spec`` itself (a local path or an fsspec URL, read as given).

    Args:
        spec: a name of :data:`NAMED_LISTS`, a path or a URL.
    Returns:
        the path or URL of the word list.
    Raises:
        colaflow.config.ConfigError: a named list whose package is not installed (saying what to
            install), or a local ``spec`` that is neither a file nor a name (listing the names).
    """
    named = NAMED_LISTS.get(spec)
    if named is None:
        if "://" not in spec and not os.path.isfile(spec):
            raise ConfigError(f"quality.c4.bad_words={spec}: no such file and no named list; give a word list "
                              f"(one word or phrase per line), one of {', '.join(NAMED_LISTS)}, or null")
        return spec
    found = importlib.util.find_spec(named.package)  # locates the package without running it
    if found is None or not found.submodule_search_locations:
        raise ConfigError(f"quality.c4.bad_words={spec} needs the {named.package} package: "
                          f"pip install {named.install}")
    return os.path.join(found.submodule_search_locations[0], named.file)
