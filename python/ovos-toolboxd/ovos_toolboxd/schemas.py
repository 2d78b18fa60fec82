"""JSON Schemas made pydantic models, as the plugin manager's ``AgentTool``
wants its argument and output types.

What is converted: ``properties`` with ``required`` (a property not
required defaults to ``None``, or to the schema's ``default``), the
scalar types, ``enum`` and ``const`` (as ``Literal``), nested objects (as
nested models), ``additionalProperties`` objects (as ``dict``), arrays
(``items``), ``anyOf``/``oneOf`` and a ``type`` list (as ``Union``, a
``null`` member as ``Optional``), local ``$ref`` into ``$defs`` or
``definitions``. Anything else is ``Any``: the daemon checks every call
against the tool's real schema anyway, before its toolbox sees it; these
models are the agent's first, friendlier check, and keep the fields a
model does not know (``extra="allow"``), so nothing the schema allows is
refused here.
"""

from typing import Any, Dict, List, Literal, Optional, Tuple, Type, Union

from pydantic import BaseModel, ConfigDict, Field, create_model

#: How deep nested schemas are followed (a recursive ``$ref`` stops here).
MAX_DEPTH = 8


class OpenModel(BaseModel):
    """A model that keeps the fields it does not declare."""

    model_config = ConfigDict(extra="allow")

_SCALARS: Dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": type(None),
}


def _model_name(name: str) -> str:
    """A class name from a tool or property name."""
    parts = [p for p in "".join(c if c.isalnum() else " " for c in name).split() if p]
    return "".join(p[:1].upper() + p[1:] for p in parts) or "Model"


class _Converter:
    """Converts the schemas of one tool, resolving ``$ref`` in its root."""

    def __init__(self, root: Dict[str, Any]):
        self.root = root if isinstance(root, dict) else {}

    def resolve(self, schema: Any) -> Any:
        """``schema`` with a local ``$ref`` followed (once per call)."""
        if isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            ref = schema["$ref"]
            if ref.startswith("#/"):
                target: Any = self.root
                for part in ref[2:].split("/"):
                    part = part.replace("~1", "/").replace("~0", "~")
                    target = target.get(part) if isinstance(target, dict) else None
                if isinstance(target, dict):
                    merged = {k: v for k, v in schema.items() if k != "$ref"}
                    return {**target, **merged}
        return schema

    def annotation(self, schema: Any, name: str, depth: int) -> Any:
        """The Python type of ``schema``."""
        if depth > MAX_DEPTH:
            return Any
        schema = self.resolve(schema)
        if not isinstance(schema, dict):
            return Any
        if "const" in schema:
            return Literal[schema["const"]] if _hashable(schema["const"]) else Any
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            values = tuple(schema["enum"])
            return Literal[values] if all(_hashable(v) for v in values) else Any
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                members = [
                    self.annotation(member, f"{name}{i}", depth + 1)
                    for i, member in enumerate(schema[key])
                ]
                return _union(members)
        kind = schema.get("type")
        if isinstance(kind, list):
            members = [self.annotation({**schema, "type": k}, name, depth + 1) for k in kind]
            return _union(members)
        if kind in _SCALARS:
            return _SCALARS[kind]
        if kind == "array":
            item = self.annotation(schema.get("items", {}), f"{name}Item", depth + 1)
            return List[item]  # type: ignore[valid-type]
        if kind == "object" or "properties" in schema:
            if isinstance(schema.get("properties"), dict) and schema["properties"]:
                return self.model(schema, name, depth + 1)
            extra = schema.get("additionalProperties")
            value = self.annotation(extra, f"{name}Value", depth + 1) if isinstance(extra, dict) else Any
            return Dict[str, value]  # type: ignore[valid-type]
        return Any

    def model(self, schema: Any, name: str, depth: int = 0,
              base: Type[BaseModel] = OpenModel) -> Type[BaseModel]:
        """A pydantic model for object schema ``schema``."""
        schema = self.resolve(schema)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
        fields: Dict[str, Tuple[Any, Any]] = {}
        for key, prop in (properties or {}).items():
            if not isinstance(key, str) or not key.isidentifier() or key.startswith("_"):
                # Not a Python name: kept as an extra field, not a declared one.
                continue
            prop_schema = self.resolve(prop) if isinstance(prop, dict) else {}
            kind = self.annotation(prop_schema, _model_name(f"{name} {key}"), depth)
            description = prop_schema.get("description") if isinstance(prop_schema, dict) else None
            if key in required:
                default: Any = Field(..., description=description)
            else:
                kind = Optional[kind]
                fallback = prop_schema.get("default") if isinstance(prop_schema, dict) else None
                default = Field(fallback, description=description)
            fields[key] = (kind, default)
        return create_model(_model_name(name), __base__=base, **fields)  # type: ignore[call-overload]


def _hashable(value: Any) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False


def _union(members: List[Any]) -> Any:
    """``Union`` of ``members``; ``Optional`` when one of them is ``None``."""
    unique: List[Any] = []
    for member in members:
        if member not in unique:
            unique.append(member)
    if Any in unique:
        return Any
    if len(unique) == 1:
        return unique[0]
    return Union[tuple(unique)]  # type: ignore[return-value]


def model_of(schema: Any, name: str, base: Type[BaseModel] = OpenModel) -> Type[BaseModel]:
    """The pydantic model of object schema ``schema`` (a tool's argument or
    output schema), named after ``name``, deriving from ``base`` (which
    should keep undeclared fields, as :class:`OpenModel` does)."""
    return _Converter(schema).model(schema if isinstance(schema, dict) else {}, name, base=base)
