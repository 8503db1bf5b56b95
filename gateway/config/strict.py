"""Strict settings: unknown keys refused at any depth, with the closest valid name.

Every settings section derives from :class:`Section` (``extra="forbid"``), so a field added to
any section is checked without more code. This module turns pydantic's errors into one line
per problem (``ratelimit.backnd: unknown setting; did you mean `backend`?``) and checks the
``TIERGATE_*`` environment the same way, before the settings are built.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

ENV_PREFIX = "TIERGATE_"
# TIERGATE_* variables that are not settings paths but are read by the command line.
NON_SETTINGS_ENV = frozenset({"TIERGATE_CONFIG"})

Loc = tuple[str | int, ...]
# The password of a URL's user-info (``scheme://user:PASSWORD@host``), wherever a URL is quoted.
_URL_PASSWORD = re.compile(r"(://[^/@:\s'\"]*:)[^/@\s'\"]*@")


def without_passwords(text: str) -> str:
    """``text`` with the password of every URL in it shown as ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", text) if "://" in text else text


class Section(BaseModel):
    """The base of every settings section: unknown keys are errors, never ignored."""

    # hide_input_in_errors: a ValidationError's text never quotes a value (it may be a key);
    # format_validation_error still reads the inputs it may echo from ``errors()``.
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, hide_input_in_errors=True
    )


class ConfigError(ValueError):
    """The configuration cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Origins:
    """Where each value of a loaded configuration came from: flag, env, file or default."""

    config: Path | None
    file_data: Mapping[str, Any]
    env: Mapping[Loc, str]
    flags: Mapping[Loc, str]

    def of(self, loc: Loc) -> str:
        """``flag --port``, ``env TIERGATE_X``, ``file PATH`` or ``default`` for ``loc``.

        For the whole settings (a rule across sections, ``loc`` empty): every source that
        gave a value, so an environment variable is never blamed on the file or the reverse.
        """
        if not loc:
            return self._every_source()
        prefixes = [loc[:n] for n in range(len(loc), 0, -1)]
        for sources, kind in ((self.flags, "flag"), (self.env, "env")):
            for prefix in prefixes:
                if prefix in sources:
                    return f"{kind} {sources[prefix]}"
            below = [name for path, name in sources.items() if path[: len(loc)] == loc]
            if loc and below:
                return f"{kind} {below[0]}"
        node: Any = self.file_data
        for part in loc:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return "default"
        return f"file {self.config}"

    def _every_source(self) -> str:
        sources = [f"flag {name}" for name in self.flags.values()]
        sources += [f"env {name}" for name in self.env.values()]
        if self.file_data:
            sources.append(f"file {self.config}")
        return ", ".join(dict.fromkeys(sources)) or "default"


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The valid name ``name`` was most likely meant to be, if any is close enough."""
    matches = difflib.get_close_matches(name.lower(), list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _children(annotation: Any) -> tuple[str, Any] | None:
    """For a container annotation: ("key" | "item", the element's annotation)."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (dict, Mapping) and len(args) == 2:
        return "key", args[1]
    if origin in (list, tuple, set, frozenset, Sequence) and args:
        return "item", args[0]
    return None


def _options(annotation: Any) -> list[Any]:
    """The members of ``X | Y | None`` (``Optional`` included), or the annotation itself."""
    if get_origin(annotation) in (Union, types.UnionType):
        return [a for a in get_args(annotation) if a is not type(None)]
    return [annotation]


def model_at(annotation: Any, loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The settings model found at ``loc`` below ``annotation`` (dict keys and indexes skipped)."""
    for option in _options(annotation):
        model = _model_of(option)
        if model is not None:
            if not loc:
                return model
            field = model.model_fields.get(str(loc[0]))
            if field is not None:
                found = model_at(field.annotation, loc[1:])
                if found is not None:
                    return found
            continue
        child = _children(option)
        if child is not None and loc:
            found = model_at(child[1], loc[1:])
            if found is not None:
                return found
    return None


def dotted(loc: Sequence[str | int]) -> str:
    """``("tiers", "fast", "replicas", 0)`` -> ``tiers.fast.replicas[0]``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _unknown_key(root: type[BaseModel], loc: Loc) -> str:
    parent = model_at(root, loc[:-1])
    name = str(loc[-1])
    hint = closest(name, parent.model_fields) if parent is not None else None
    suggestion = f"; did you mean `{hint}`?" if hint else ""
    return f"unknown setting{suggestion}"


def format_validation_error(
    exc: ValidationError, root: type[BaseModel], origin: Callable[[Loc], str]
) -> list[str]:
    """One line per error: ``path (origin): what is wrong``."""
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        loc: Loc = tuple(error["loc"])
        if error["type"] == "extra_forbidden" and loc:
            what = _unknown_key(root, loc)
        else:
            what = error["msg"]
            # The whole settings (loc empty) is never echoed: it may hold a token; nor is a
            # mapping or a list (free-form fields such as judge_fields may hold a credential
            # under any name): the setting's path names what is wrong.
            if _echoable(error, loc):
                what += f" (got {str(error['input'])[:80]!r})"
        where = dotted(loc) or "settings"
        source = origin(loc[:-1] if error["type"] == "missing" else loc)
        lines.append(f"{where} ({source}): {without_passwords(what)}")
    return lines


_SECRET_WORDS = ("token", "pepper", "password", "secret", "api_key", "url")


def _echoable(error: Mapping[str, Any], loc: Loc) -> bool:
    """Whether the value an error is about may be quoted back: a scalar at a path that is
    not a secret's."""
    if "input" not in error or error["type"] == "missing" or not loc or _secret(loc):
        return False
    return not isinstance(error["input"], Mapping | list | tuple | set | frozenset)


def _secret(loc: Loc) -> bool:
    """Values at these paths are never echoed back (a Redis URL may carry a password)."""
    return any(word in str(part) for part in loc for word in _SECRET_WORDS)


def _walk_env(root: type[BaseModel], parts: list[str]) -> tuple[Loc | None, str | None]:
    """Resolve ``server__port``'s parts: (the settings path, None) or (None, the problem)."""
    annotation: Any = root
    loc: list[str] = []
    for index, part in enumerate(parts):
        if not part:
            return None, "empty name between `__` separators"
        model = next((m for m in map(_model_of, _options(annotation)) if m is not None), None)
        if model is not None:
            field = model.model_fields.get(part)
            if field is None:
                hint = closest(part, model.model_fields)
                if hint is None:
                    return None, f"unknown setting `{dotted([*loc, part])}`"
                fixed = "__".join([*parts[:index], hint, *parts[index + 1 :]]).upper()
                return None, (
                    f"unknown setting `{dotted([*loc, part])}`; did you mean {ENV_PREFIX}{fixed}?"
                )
            annotation = field.annotation
        else:
            child = next((c for c in map(_children, _options(annotation)) if c), None)
            if child is None:
                return None, f"`{dotted(loc)}` has no setting `{part}`"
            annotation = child[1]
        loc.append(part)
    return tuple(loc), None


def _single_underscore(root: type[BaseModel], rest: str) -> str | None:
    """``SERVER_PORT`` meant as ``SERVER__PORT``: the corrected variable, if it is one."""
    for section, field in root.model_fields.items():
        if rest.startswith(section + "_"):
            name = rest[len(section) + 1 :]
            model = model_at(field.annotation, [])
            if model is not None and name in model.model_fields:
                return f"{ENV_PREFIX}{section.upper()}__{name.upper()}"
    return None


def env_paths(
    root: type[BaseModel], environ: Mapping[str, str], referenced: Iterable[str] = ()
) -> tuple[dict[Loc, str], list[str]]:
    """The ``TIERGATE_*`` variables that set settings, by path, and the problems found.

    A variable with ``__`` must name a real setting. One without must name a section, or is
    left alone (compose and the config file's ``${VAR}`` use such names) unless it looks like a
    setting with one underscore too few (``TIERGATE_SERVER_PORT``) or a misspelled section and
    the config file does not interpolate it.
    """
    known = set(referenced)
    paths: dict[Loc, str] = {}
    problems: list[str] = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in NON_SETTINGS_ENV:
            continue
        rest = upper[len(ENV_PREFIX) :].lower()
        if "__" in rest:
            loc, problem = _walk_env(root, rest.split("__"))
            if loc is not None:
                paths[loc] = name
            elif name not in known:
                problems.append(f"environment variable {name}: {problem}")
            continue
        if rest in root.model_fields:
            paths[(rest,)] = name
            continue
        if name in known:
            continue
        fixed = _single_underscore(root, rest)
        hint = closest(rest, root.model_fields) if fixed is None else None
        if fixed is not None:
            problems.append(f"environment variable {name}: not a setting; did you mean {fixed}?")
        elif hint is not None and difflib.SequenceMatcher(None, rest, hint).ratio() >= 0.8:
            problems.append(
                f"environment variable {name}: not a setting; "
                f"did you mean {ENV_PREFIX}{hint.upper()}?"
            )
    return paths, problems


_FIELD_NAMED = re.compile(r'field "([^"]+)"')


def env_json_problem(message: str, paths: Mapping[Loc, str]) -> str:
    """The problem of a ``TIERGATE_*`` value that is not valid JSON for its setting, naming the
    variable (pydantic-settings names only the field: ``error parsing value for field "tiers"
    from source "EnvSettingsSource"``); the value itself is never quoted."""
    found = _FIELD_NAMED.search(message)
    field = found.group(1) if found else None
    names = sorted({name for loc, name in paths.items() if loc[:1] == (field,)})
    if not names:
        return f"environment: {message}"
    which = f"variable {names[0]}" if len(names) == 1 else f"variables {', '.join(names)}: one"
    return (
        f"environment {which}: not valid JSON for the setting '{field}' (a section takes a "
        "JSON object, a list a JSON array)"
    )
