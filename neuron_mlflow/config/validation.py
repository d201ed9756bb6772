"""Readable configuration errors: pydantic's validation errors as one ``ConfigError``.

Every nested model derives from :class:`_StrictModel`: unknown fields are errors, and the
outermost model being validated reports every bad field with its dotted path, the value
received and what is allowed.

Example:
    >>> from neuron_mlflow.config import Schedule
    >>> try:
    ...     Schedule(active=0)
    ... except ValueError as err:
    ...     print(str(err).splitlines()[1].split(";")[0])
      active: got 0
"""

from __future__ import annotations

import contextvars
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from neuron_mlflow.errors import ConfigError


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)


def config_error(model: type[BaseModel], exc: ValidationError) -> ConfigError:
    """pydantic's ``ValidationError`` of ``model`` as a :class:`ConfigError`: each line names
    the field (dotted path), the value received and what is allowed.

    Example:
        >>> from pydantic import BaseModel, Field, ValidationError
        >>> class Steps(BaseModel):
        ...     active: int = Field(ge=1)
        >>> try:
        ...     Steps(active=0)
        ... except ValidationError as exc:
        ...     print(config_error(Steps, exc))
        invalid Steps:
          active: got 0; Input should be greater than or equal to 1
    """
    lines = [f"invalid {model.__name__}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(_fields_at(model, tuple(err["loc"][:-1]))) or "none"
            got = err["input"]
            lines.append(f"  {loc}: unknown field (got {got!r}); allowed fields: {allowed}")
        else:
            lines.append(f"  {loc}: got {err['input']!r}; {err['msg']}")
    return ConfigError("\n".join(lines), errors=exc.errors())


_VALIDATING = contextvars.ContextVar("neuron_mlflow_validating", default=False)


def _validate_readably(model: BaseModel, init: Any, data: dict[str, Any]) -> None:
    """Run pydantic's ``__init__``; the outermost model turns errors into ``ConfigError``
    (nested ones re-raise, so that it names every bad field with its full dotted path)."""
    if _VALIDATING.get():
        init(**data)
        return
    token = _VALIDATING.set(True)
    try:
        init(**data)
    except ValidationError as exc:
        raise config_error(type(model), exc) from None
    finally:
        _VALIDATING.reset(token)


class _StrictModel(BaseModel):
    """Base of the nested models: unknown fields are errors, messages are readable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, **data: Any) -> None:
        _validate_readably(self, super().__init__, data)
