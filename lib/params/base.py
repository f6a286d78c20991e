"""The machinery of lib/params: strict typed parsing (:func:`parse_section`), :class:`ParamError`, and
the value sets the sections share."""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from pathlib import PurePosixPath
from typing import Any, Callable, TypeVar


T = TypeVar("T")

PAIR_PATTERN = re.compile(r"^en-[a-z]{2}$")
# the pairs lib/corpus can generate (its grammar's target languages; a test keeps the two equal)
DEMO_PAIRS = ("en-de", "en-es", "en-it")
DEMO_MUSTC_ROOT = "data/mustc-demo"  # where dvc.yaml's corpus stage writes them (a test checks dvc.yaml)


class ParamError(ValueError):
    """A params.yaml value is missing, unknown or of the wrong type; the message names the key."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _check(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (recursively); return the converted value."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for alt in args:
            try:
                return _check(value, alt, key)
            except ParamError as e:
                errors.append(str(e))
        raise ParamError(f"{key}: {value!r} matches none of {', '.join(_type_name(a) for a in args)}")
    if tp is type(None):
        if value is not None:
            raise ParamError(f"{key}: expected null, got {value!r}")
        return None
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ParamError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        item_tp = args[0] if args else Any
        items = [_check(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ParamError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        k_tp, v_tp = args if args else (Any, Any)
        return {_check(k, k_tp, f"{key} key"): _check(v, v_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        # YAML reads "1e-3" as a string and "2" as an int; accept ints and numeric strings for floats.
        # No param means anything by nan or inf ("nan" would pass every `x <= 0` check after it).
        if isinstance(value, bool):
            raise ParamError(f"{key}: expected a number, got {value!r}")
        number = None
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ParamError(f"{key}: expected a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(number):
            raise ParamError(f"{key}: expected a finite number, got {value!r}")
        return number
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ParamError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
        return value
    raise TypeError(f"unsupported annotation {tp!r} for {key}")


def _from_dict(cls: type[T], data: Any, prefix: str) -> T:
    if not isinstance(data, dict):
        raise ParamError(f"{prefix}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    # a field marked ``metadata={"yaml": False}`` is no params.yaml key (Params.variant_sections)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("yaml", True)}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        where = f"{prefix}: " if prefix else ""  # the top level has no prefix: "unknown key(s) foo", not ": ... .foo"
        raise ParamError(f"{where}unknown key(s) {', '.join(f'{prefix}.{k}' if prefix else str(k) for k in unknown)}; "
                         f"known: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name in data:
            kwargs[name] = _check(data[name], hints[name], key)
        elif (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING) or \
                getattr(cls, "ALL_KEYS_REQUIRED", False):
            raise ParamError(f"{key}: missing")
    obj = cls(**kwargs)
    run_validate(obj, prefix)
    return obj


def run_validate(obj: Any, prefix: str) -> None:
    """``obj.validate(prefix)`` when the section has one, a ValueError raised there as a ParamError."""
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate(prefix)
        except ParamError:
            raise
        except ValueError as e:
            raise ParamError(str(e)) from None


#: The top-level sections that a variant's own module parses, not load_params: section -> that module.
#: Only the names live here, so that a stage that uses no variant imports none of a variant's code.
VARIANT_SECTIONS = {"smoothing": "lib.params.smoothing", "multi": "lib.params.multi"}
#: name -> (the section's dataclass, check(params, section) against the rest of the params); filled by
#: :func:`register_variant_section` when the variant's module is imported.
VARIANT_PARSERS: dict[str, tuple[type, Callable[[Any, Any], None]]] = {}


def register_variant_section(name: str, cls: type, check: Callable[[Any, Any], None]) -> None:
    """Make ``name`` (one of :data:`VARIANT_SECTIONS`) parse as ``cls`` and be checked by ``check(params,
    section)`` (raising :class:`ParamError`); called by the variant's module when it is imported."""
    if name not in VARIANT_SECTIONS:
        raise ValueError(f"register_variant_section: {name!r} is not one of {list(VARIANT_SECTIONS)} (add it to "
                         f"VARIANT_SECTIONS: load_params must know the name to tell it from a typo)")
    VARIANT_PARSERS[name] = (cls, check)


def model_config_of(p: Any) -> Any:
    """The model config of the params ``p`` (lib.model.config), or None when ``model.overrides`` do not
    build one (the model section reports that): what a variant's section is checked against."""
    from lib.model.config import model_config

    try:
        return model_config(p.model.size, **p.model.overrides)
    except (TypeError, ValueError):
        return None


def parse_section(cls: type[T], data: Any, prefix: str) -> T:
    """Build the dataclass ``cls`` from the mapping ``data``; errors name ``prefix.<key>``."""
    return _from_dict(cls, data, prefix)


def _check_repo_relative(value: str, key: str) -> None:
    """An output path param must name a folder inside the repository: DVC declares outs relative
    to it (dvc.yaml's ``${data.prepared_dir}/...``), an absolute (or ``~``) path would write outside the
    workspace that DVC caches and checks out, and a ``..`` would escape it. Checked on the text
    (no file system access), so a symlinked folder inside the repository stays the user's call."""
    parts = PurePosixPath(value).parts
    if not value.strip() or PurePosixPath(value).is_absolute() or value.startswith("~") or ".." in parts \
            or all(part == "." for part in parts):
        raise ParamError(f"{key}: must be a relative path inside the repository, got {value!r}")


#: Metrics a run may select its best checkpoint by, and whether lower is better.
LOWER_IS_BETTER = {"loss": True, "nll": True, "wer": True, "bleu": False, "chrf": False}
#: Precision modes of ``train_*.amp`` (lib/precision.py resolves ``auto`` per device). ``fp64``: the
#: whole model in float64, no autocast -- for exactness checks (two processes against one), not speed.
AMP_MODES = ("none", "bf16", "fp16", "auto", "probe", "fp64")
#: Where the value bias b_V goes in Eq. 3 (lib/analysis/contributions.py).
VALUE_BIAS_MODES = ("bias", "token")
LR_SCHEDULERS = ("inverse_sqrt", "polynomial_decay")
#: ``train_*.fold_update``: an update of k batches as one folded batch (lib/train/loop.py, FoldPolicy).
FOLD_MODES = ("auto", "on", "off")
