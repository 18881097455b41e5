"""Argument checks shared by the hash grid's op wrappers (ops.py), its pure-TF form (pure_tf.py) and its Keras layer
(layer.py): each raises ValueError naming the function and the argument, before anything runs."""

from __future__ import annotations

import dataclasses

from tf_metal_ops.hash_grid.config import HashGridConfig

# The options of an encoding: HashGridConfig's fields besides n_input_dims, in the op's attr order, and their defaults.
OPTION_DEFAULTS = {f.name: f.default for f in dataclasses.fields(HashGridConfig) if f.name != "n_input_dims"}
OPTION_NAMES = tuple(OPTION_DEFAULTS)


def check_flag(fn: str, name: str, value, *, allow_none: bool = False):
    """``value`` when it is True or False (or None where ``allow_none``), else ValueError."""
    if isinstance(value, bool) or (allow_none and value is None):
        return value
    allowed = "True, False or None" if allow_none else "True or False"
    raise ValueError(f"{fn}: {name} must be {allowed}, got {value!r}")


def call_options(fn: str, config, options: dict) -> dict:
    """The encoding options of one call: ``config``'s (a HashGridConfig) or the keyword ``options`` over the
    defaults; not both, and no unknown names (ValueError)."""
    unknown = set(options) - set(OPTION_NAMES)
    if unknown:
        raise ValueError(f"{fn}: unknown options {sorted(unknown)} (the options are {', '.join(OPTION_NAMES)})")
    if config is None:
        return {**OPTION_DEFAULTS, **options}
    if not isinstance(config, HashGridConfig):
        raise ValueError(f"{fn}: config must be a HashGridConfig, got {type(config).__name__}")
    if options:
        raise ValueError(f"{fn}: pass either config or the options {sorted(options)}, not both")
    return config.op_kwargs()


def call_config(fn: str, n_input_dims, config, options: dict) -> HashGridConfig:
    """The HashGridConfig of one call for positions with ``n_input_dims`` columns: ``config`` itself, whose D must
    match, or one built from ``options`` (D None, not known statically: 1 stands in, for every check but D's)."""
    chosen = call_options(fn, config, options)
    if config is None:
        return HashGridConfig(n_input_dims if n_input_dims is not None else 1, **chosen)
    if n_input_dims is not None and config.n_input_dims != n_input_dims:
        raise ValueError(f"{fn}: positions have {n_input_dims} columns, config has n_input_dims={config.n_input_dims}")
    return config
