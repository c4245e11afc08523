"""Loading the settings' layers with pydantic-settings, strictly: flags > environment > config.toml >
defaults.

A pydantic-settings model mirrors the `Settings` dataclass field by field (`_model`); its sources are
the library's own: the flags as init arguments, `EnvSettingsSource` for `KERNELEVOLVE_<FIELD>`, and
`TomlConfigSettingsSource` for the workspace's `config.toml`. The model only reads and checks; what
it read becomes a `Settings` (the dataclass defaults fill the rest), and `Settings.validate` keeps its
rules. Deliberately stricter than the library's defaults:

- a boolean is true/false/1/0/yes/no/on/off in any case, nothing else (pydantic also takes t, y, ...);
- a whole number is refused a fraction, and a number is refused nan and inf;
- a list is comma-separated in the environment and flags (never JSON), a TOML array in the file;
- an optional number reads auto, none or an empty string as "unset" (the platform's choice);
- a key of config.toml, or a `KERNELEVOLVE_*` variable, that is neither a setting nor one of
  `OTHER_VARIABLES` is refused with the nearest valid name: a misspelling never passes silently.

Every refusal is a `WorkspaceError` that names the variable, the file and key, or the flag, and says
what it accepts. Each value's layer is kept (`Source`) for `kernelevolve config`.

Importing this module imports pydantic (a few hundred milliseconds); `config.load_settings` does it
on demand, and nothing a worker process imports does.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, create_model
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from kernelevolve.config.values import (
    ENV_PREFIX,
    OTHER_VARIABLES,
    WORKSPACE_VARIABLE,
    Settings,
    Source,
    setting_names,
)
from kernelevolve.errors import WorkspaceError

TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")
UNSET_WORDS = ("auto", "none", "")


# -- the model: the dataclass's fields, each with its reader ---------------------------------------


def _boolean(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    word = value.strip().lower() if isinstance(value, str) else None
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError("not a boolean")


def _names(value: Any) -> Any:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _unset_words(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value.strip().lower() in UNSET_WORDS):
        return None
    return value


def _is_optional(typ: Any) -> bool:
    return typing.get_origin(typ) in (types.UnionType, typing.Union) and type(None) in typing.get_args(typ)


def _inner(typ: Any) -> Any:
    """X of `X | None`, else the type itself."""
    if _is_optional(typ):
        return next(a for a in typing.get_args(typ) if a is not type(None))
    return typ


def _reader(typ: Any) -> Any:
    """The model's annotation for a dataclass field's type."""
    if _is_optional(typ):
        return Annotated[_reader(_inner(typ)) | None, BeforeValidator(_unset_words)]
    if typ is bool:
        return Annotated[bool, BeforeValidator(_boolean)]
    if typing.get_origin(typ) is list:
        return Annotated[list[str], NoDecode, BeforeValidator(_names)]
    return typ


def _accepted(typ: Any) -> str:
    """What a field accepts, in words, for the error that refuses a value."""
    if _is_optional(typ):
        return f"{_accepted(_inner(typ))}, or auto"
    if typ is bool:
        words = ", ".join(w for pair in zip(TRUE_WORDS, FALSE_WORDS, strict=True) for w in pair)
        return f"a boolean ({words}; in any case)"
    if typ is int:
        return "a whole number"
    if typ is float:
        return "a number"
    if typing.get_origin(typ) is list:
        return "names separated by commas (in config.toml, a list of strings)"
    return "a string"


def _short(accepted: str) -> str:
    """`_accepted` without its parenthesis: for the hint, the message having said it in full."""
    return accepted.split(" (")[0]


class _Layers(BaseSettings):
    """The base of `_model`: which sources, in which order, and how they are read."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",  # `_refuse_unknown_*` have named the culprit already; this is the backstop
        allow_inf_nan=False,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # earlier wins: flags, then the environment, then the workspace's config.toml; no .env file
        # and no secrets directory (secrets are not settings)
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)


@functools.cache
def _fields() -> dict[str, Any]:
    """Each setting's type, as the dataclass declares it."""
    hints = typing.get_type_hints(Settings)
    return {name: hints[name] for name in setting_names()}


@functools.cache
def _fields_model() -> type[_Layers]:
    """The dataclass's fields (but `workspace`) as a model's, with the dataclass's defaults."""
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        if f.name in _fields():
            factory = f.default_factory  # a list's default (every other field has a plain default)
            default = Field(default_factory=factory) if callable(factory) else f.default
            fields[f.name] = (_reader(_fields()[f.name]), default)
    return create_model("SettingsFields", __base__=_Layers, **fields)


@functools.lru_cache(maxsize=8)
def _model(toml: Path) -> type[_Layers]:
    """The model whose TOML layer is `toml` (pydantic-settings takes the file's name from the config)."""
    config = SettingsConfigDict(toml_file=toml)
    return type("SettingsLayers", (_fields_model(),), {"model_config": config, "__module__": __name__})


# -- loading ---------------------------------------------------------------------------------------


def load(workspace: Path, workspace_flag: bool, flags: dict[str, Any]) -> tuple[Settings, dict[str, Source]]:
    """Settings from every layer over `workspace`'s config.toml, and where each value came from."""
    toml = workspace / "config.toml"
    model = _model(toml)
    given = {k: v for k, v in flags.items() if v is not None}
    # The layers are read once here, by the same sources as the model's, to refuse unknown names
    # before validation and to know where each value came from (the merge keeps no record of it);
    # the model reads them again as it is built (a few milliseconds in all).
    _refuse_unknown_flags(given)
    _refuse_unknown_variables()
    try:
        in_toml = TomlConfigSettingsSource(model)() if toml.is_file() else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise WorkspaceError(f"{toml}: invalid TOML: {exc}", hint="fix or delete the file") from exc
    _refuse_unknown_keys(in_toml, toml)
    in_env = EnvSettingsSource(model)()
    sources = {
        name: Source("flag")
        if name in given
        else Source("env", ENV_PREFIX + name.upper())
        if name in in_env
        else Source("toml", str(toml))
        if name in in_toml
        else Source("default")
        for name in _fields()
    }
    try:
        read = model(**given)
    except ValidationError as exc:
        raise _refusal(exc, sources) from None
    values = read.model_dump(exclude_unset=True)  # what the layers gave; the dataclass has the rest
    sources["workspace"] = (
        Source("flag")
        if workspace_flag
        else Source("env", WORKSPACE_VARIABLE)
        if os.environ.get(WORKSPACE_VARIABLE)
        else Source("default")
    )
    return Settings(workspace=workspace, **values).validate(), sources


def _nearest(name: str, valid: list[str]) -> str | None:
    found = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    return found[0] if found else None


def _refuse_unknown_flags(given: dict[str, Any]) -> None:
    for key in given:
        if key not in _fields():
            near = _nearest(key, list(_fields()))
            raise WorkspaceError(
                f"unknown setting {key!r}" + (f"; did you mean {near!r}?" if near else ""),
                hint="valid settings: " + ", ".join(_fields()),
            )


def _refuse_unknown_keys(in_toml: dict[str, Any], toml: Path) -> None:
    unknown = [key for key in in_toml if key not in _fields()]
    if not unknown:
        return
    key = unknown[0]
    if key == "workspace":
        raise WorkspaceError(
            f"{toml}: unknown setting 'workspace'",
            hint=f"a workspace is chosen by --workspace or {WORKSPACE_VARIABLE}, not by its own config.toml",
        )
    near = _nearest(key, list(_fields()))
    raise WorkspaceError(
        f"{toml}: unknown setting {key!r}" + (f"; did you mean {near!r}?" if near else ""),
        hint="valid settings: " + ", ".join(sorted(_fields())),
    )


def _refuse_unknown_variables() -> None:
    """Every `KERNELEVOLVE_*` variable set must be a setting's or declared in `OTHER_VARIABLES`."""
    known = {ENV_PREFIX + name.upper() for name in _fields()} | set(OTHER_VARIABLES)
    unknown = sorted(v for v in os.environ if v.upper().startswith(ENV_PREFIX) and v.upper() not in known)
    if not unknown:
        return
    # matched without the prefix, which every name shares
    suffixes = {v[len(ENV_PREFIX) :]: v for v in sorted(known)}
    lines, renames = [], []
    for var in unknown:
        near = _nearest(var[len(ENV_PREFIX) :].upper(), list(suffixes))
        lines.append(f"{var}" + (f" (did you mean {suffixes[near]}?)" if near else ""))
        if near:
            renames.append(f"{var} -> {suffixes[near]}")
    if renames:
        hint = "rename " + ", ".join(renames) + " (or unset it)"
    else:
        settings = ", ".join(ENV_PREFIX + name.upper() for name in _fields())
        hint = f"unset it; the variables read are {settings}, and {', '.join(OTHER_VARIABLES)}"
    raise WorkspaceError(
        "unknown environment variable" + ("s " if len(lines) > 1 else " ") + "; ".join(lines), hint=hint
    )


def _refusal(exc: ValidationError, sources: dict[str, Source]) -> WorkspaceError:
    """Each value pydantic refused, named by where it came from, with what its setting accepts."""
    lines: dict[str, str] = {}
    hints: dict[str, None] = {}  # ordered, without repeats
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "?"
        if name in lines:
            continue  # one line a setting (a union's members each report the same value)
        source = sources.get(name, Source("default"))
        accepted = _accepted(_fields()[name]) if name in _fields() else error["msg"]
        if source.layer == "env":
            where = f"environment variable {source.where} (setting {name!r})"
            hints[f"set {source.where} to {_short(accepted)}, or unset it"] = None
        elif source.layer == "toml":
            where = f"{source.where}: setting {name!r}"
            hints[f"correct {source.where}"] = None
        else:
            where = f"setting {name!r} ({source.layer})"
            hints[f"give {name} {_short(accepted)}"] = None
        lines[name] = f"{where}: cannot read {error.get('input')!r} as {accepted}"
    return WorkspaceError("\n".join(lines.values()), hint="; ".join(hints))
