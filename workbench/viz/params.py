"""Notebook parameters: read a notebook's ``parameters`` cell without a kernel, parse and check values.

The parameters cell holds typed defaults, one per line, with a comment saying what it is::

    budget: int = 16  # DDTree node budget (>= 1)
    budgets: list[int] = [4, 8, 16]

``workbench batch`` reads the cell (``read_parameters``), parses command-line values by the
annotated type (``parse_value``) and checks every grid point (``validate``) before any kernel
starts. The same range rules (``RULES``, by parameter name) run again inside the notebook
(``workbench.viz.notebook.check_parameters``) so plain papermill gets the same errors.
No plotly, no torch at import.
"""

from __future__ import annotations

import ast
import io
import json
import math
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

SCALARS = ("int", "float", "str", "bool")


class ParameterError(ValueError):
    def __init__(self, name: str, message: str):
        self.name = name
        super().__init__(f"parameter {name!r}: {message}")


@dataclass(frozen=True)
class Parameter:
    name: str
    type: str  # int | float | str | bool | list
    default: Any
    help: str = ""
    element: str | None = None  # list element type

    def describe(self) -> str:
        t = f"list[{self.element}]" if self.type == "list" and self.element else self.type
        return f"{self.name}: {t} = {self.default!r}" + (f"  # {self.help}" if self.help else "")


# ----------------------------------------------------------------------------------------------
# reading the parameters cell


def parameters_cell(nb: dict) -> tuple[int, str]:
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            src = cell.get("source", "")
            return i, "".join(src) if isinstance(src, list) else src
    raise ValueError("the notebook has no cell tagged 'parameters'")


def _annotation(node: ast.expr | None) -> tuple[str | None, str | None]:
    if node is None:
        return None, None
    if isinstance(node, ast.Name) and node.id in SCALARS + ("list",):
        return node.id, None
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "list":
        el = node.slice
        if isinstance(el, ast.Name) and el.id in SCALARS:
            return "list", el.id
    raise ValueError(f"unsupported parameter annotation {ast.unparse(node)!r}: use int, float, str, bool or list[...]")


def _infer(value) -> tuple[str, str | None]:
    if isinstance(value, bool):
        return "bool", None
    for t in (int, float, str):
        if isinstance(value, t):
            return t.__name__, None
    if isinstance(value, list):
        kinds = {_infer(v)[0] for v in value}
        if kinds == {"int", "float"}:
            kinds = {"float"}
        return "list", (kinds.pop() if len(kinds) == 1 else None)
    raise ValueError(f"unsupported parameter default {value!r}")


def parse_parameters_source(source: str) -> dict[str, Parameter]:
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    params: dict[str, Parameter] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, ann, value_node = node.target.id, node.annotation, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, ann, value_node = node.targets[0].id, None, node.value
        else:
            raise ValueError(f"parameters cell line {node.lineno}: only `name: type = literal` assignments are allowed")
        try:
            default = ast.literal_eval(value_node)
        except ValueError:
            raise ValueError(f"parameters cell: the default of {name!r} must be a literal") from None
        typ, el = _annotation(ann)
        if typ is None:
            typ, el = _infer(default)
        elif typ == "list" and el is None:
            el = _infer(default)[1]
        params[name] = Parameter(name, typ, default, comments.get(node.lineno, ""), el)
    return params


def read_parameters(notebook: str | Path) -> dict[str, Parameter]:
    """The parameters of a notebook file, in cell order."""
    path = Path(notebook)
    if not path.is_file():
        raise FileNotFoundError(f"notebook {path} does not exist")
    nb = json.loads(path.read_text())
    _, src = parameters_cell(nb)
    return parse_parameters_source(src)


# ----------------------------------------------------------------------------------------------
# values


def _parse_scalar(name: str, typ: str, text: str):
    t = text.strip()
    if typ == "str":
        return text
    if typ == "bool":
        low = t.lower()
        if low in ("true", "yes", "1", "on"):
            return True
        if low in ("false", "no", "0", "off"):
            return False
        raise ParameterError(name, f"expected a bool (true/false), got {text!r}")
    if typ == "int":
        try:
            return int(t)
        except ValueError:
            raise ParameterError(name, f"expected an int, got {text!r}") from None
    if typ == "float":
        try:
            return float(t)
        except ValueError:
            raise ParameterError(name, f"expected a float, got {text!r}") from None
    raise ParameterError(name, f"cannot parse type {typ}")


def parse_value(param: Parameter, text: str):
    """A command-line string as the parameter's type. Lists: JSON (``[4, 8]``) or ``4,8``."""
    if param.type != "list":
        return _parse_scalar(param.name, param.type, text)
    t = text.strip()
    if t.startswith("["):
        try:
            value = json.loads(t)
        except json.JSONDecodeError as exc:
            raise ParameterError(param.name, f"not a JSON list: {exc}") from None
        return coerce(param, value)
    if not t:
        return []
    return [_parse_scalar(param.name, param.element or "str", part) for part in t.split(",")]


def _coerce_scalar(name: str, typ: str, value):
    if typ == "bool":
        if isinstance(value, bool):
            return value
    elif typ == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ == "str":
        if isinstance(value, str):
            return value
    raise ParameterError(name, f"expected {typ}, got {type(value).__name__} {value!r}")


def coerce(param: Parameter, value):
    """A Python value checked against the parameter's type (an int is accepted for a float)."""
    if param.type == "list":
        if not isinstance(value, (list, tuple)):
            raise ParameterError(param.name, f"expected a list, got {type(value).__name__} {value!r}")
        if param.element is None:
            return list(value)
        return [_coerce_scalar(param.name, param.element, v) for v in value]
    return _coerce_scalar(param.name, param.type, value)


# ----------------------------------------------------------------------------------------------
# range rules, by parameter name (checked wherever the parameter appears)


def _positive_int(v):
    return None if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else f"must be an integer >= 1, got {v!r}"


def _temperature(v):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return None if ok else f"must be a finite number >= 0, got {v!r}"


def _one_of(options_fn: Callable[[], tuple]):
    def check(v):
        options = options_fn()
        return None if v in options else f"{v!r} is not one of {', '.join(options)}"

    return check


def _methods():
    from ..engine import METHODS

    return METHODS


def _modes():
    from ..verify import RECURRENT_MODES

    return RECURRENT_MODES


def _formats():
    from .export import FORMATS

    return FORMATS


def _each(check, allow_empty=False):
    def run(v):
        if not isinstance(v, (list, tuple)):
            return f"expected a list, got {v!r}"
        if not v and not allow_empty:
            return "must not be empty"
        for x in v:
            err = check(x)
            if err:
                return f"element {x!r}: {err}"
        return None

    return run


def _round_index(v):
    return None if isinstance(v, int) and not isinstance(v, bool) and v >= -1 else f"must be an integer >= -1 (-1: pick one), got {v!r}"


def _seed(v):
    return None if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else f"must be an integer >= 0, got {v!r}"


def _model(kind):
    def check(v):
        if v == "":
            return None
        if kind == "drafter" and (v == "oracle" or str(v).startswith("oracle:")):
            from ..drafters.oracle import OracleSpec

            try:
                OracleSpec.parse(v)
            except ValueError as exc:
                return str(exc)
            return None
        from ..runner import ZOO_DIR

        if Path(v).is_dir() or (ZOO_DIR / str(v)).is_dir():
            return None
        return f"{v!r} is neither a directory nor a bundled zoo model" + (" nor an oracle spec" if kind == "drafter" else "")

    return check


def _nonempty(v):
    return None if isinstance(v, str) and v != "" else "must not be empty"


def _prompt_source(v):
    from .session import PROMPT_SETS

    if v in PROMPT_SETS or v == "humaneval" or Path(v).is_file():
        return None
    return f"{v!r}: expected {', '.join(PROMPT_SETS)}, humaneval, or a JSON / JSONL prompt file"


def _device(v):
    ok = v in ("auto", "cpu", "cuda") or (isinstance(v, str) and v.startswith("cuda:") and v[5:].isdigit())
    return None if ok else f"expected auto, cpu, cuda or cuda:N, got {v!r}"


def _metric(v):
    return None if v in ("kl", "state", "flip") else f"expected kl, state or flip, got {v!r}"


RULES: dict[str, Callable[[Any], str | None]] = {
    "budget": _positive_int,
    "budgets": _each(_positive_int),
    "temperature": _temperature,
    "temperatures": _each(_temperature),
    "method": _one_of(_methods),
    "methods": _each(_one_of(_methods)),
    "recurrent": _one_of(_modes),
    "recurrent_modes": _each(_one_of(_modes)),
    "max_new_tokens": _positive_int,
    "n_prompts": _positive_int,
    "top_k": _positive_int,
    "round_index": _round_index,
    "seed": _seed,
    "export_formats": _each(_one_of(_formats), allow_empty=True),
    "target": _model("target"),
    "drafter": _model("drafter"),
    "prompt": _nonempty,
    "prompts": _prompt_source,
    "device": _device,
    "color_by": _metric,
}


def check_value(name: str, value) -> None:
    rule = RULES.get(name)
    if rule is not None:
        err = rule(value)
        if err:
            raise ParameterError(name, err)


def validate(params: dict[str, Parameter], values: dict[str, Any], notebook: str = "the notebook") -> dict[str, Any]:
    """Check ``values`` (already typed, e.g. from ``parse_value``) against the notebook's
    parameters: unknown names, types, ranges. Returns the coerced values."""
    out = {}
    for name, value in values.items():
        if name not in params:
            raise ParameterError(name, f"unknown parameter for {notebook} (it has: {', '.join(params)})")
        v = coerce(params[name], value)
        check_value(name, v)
        out[name] = v
    return out
