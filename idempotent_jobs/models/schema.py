"""The shape a job's answer must have: a pydantic model or a JSON schema, sent to the provider
as its structured-output schema and checked on every answer (a provider's structured output is a
strong hint, not a guarantee: a truncated or hand-rolled answer can still miss it)."""

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from idempotent_jobs.core.errors import InvalidInputError


class SchemaMismatch(ValueError):  # noqa: N818 - a finding about an answer, raised and caught
    """An answer outside its schema; ``problems`` name each place and reason."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class OutputSchema:
    """A named JSON schema, and the check of an answer's text against it (by the pydantic model
    it came from, else by ``jsonschema``)."""

    name: str
    json_schema: Mapping[str, Any]
    model: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, spec: object, name: str | None = None) -> "OutputSchema":
        """From a pydantic model class, a JSON schema (a mapping), or an ``OutputSchema``."""
        if isinstance(spec, OutputSchema):
            return spec
        schema_of = getattr(spec, "model_json_schema", None)
        if isinstance(spec, type) and callable(schema_of):
            return cls(name or spec.__name__, schema_of(), spec)
        if isinstance(spec, Mapping):
            if spec.get("type") != "object":
                raise InvalidInputError(
                    "output_schema", "a JSON schema of an object ('type': 'object') is needed"
                )
            from jsonschema import Draft202012Validator
            from jsonschema.exceptions import SchemaError

            try:
                Draft202012Validator.check_schema(dict(spec))
            except SchemaError as exc:
                raise InvalidInputError(
                    "output_schema", f"not a JSON schema: {exc.message}"
                ) from None
            return cls(name or str(spec.get("title") or "answer"), dict(spec))
        raise InvalidInputError(
            "output_schema",
            f"must be a pydantic model class or a JSON schema mapping, got {type(spec).__name__}",
        )

    @property
    def wire_name(self) -> str:
        """The name as providers accept it (letters, digits, _ and -, at most 64)."""
        kept = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in self.name)
        return (kept or "answer")[:64]

    def check(self, text: str | None) -> dict[str, Any]:
        """The answer ``text`` as a JSON object of this schema; :class:`SchemaMismatch` naming
        each problem otherwise."""
        if text is None or not text.strip():
            raise SchemaMismatch(["the answer is empty"])
        if self.model is not None:
            return self._check_with_model(text)
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise SchemaMismatch([f"the answer is not JSON ({exc})"]) from None
        from jsonschema import Draft202012Validator

        errors = sorted(
            Draft202012Validator(dict(self.json_schema)).iter_errors(value),
            key=lambda e: list(e.absolute_path),
        )
        if errors:
            raise SchemaMismatch(
                [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors]
            )
        if not isinstance(value, dict):
            raise SchemaMismatch(["the answer is not a JSON object"])
        return value

    def _check_with_model(self, text: str) -> dict[str, Any]:
        from pydantic import ValidationError

        try:
            parsed = self.model.model_validate_json(text)
        except ValidationError as exc:
            raise SchemaMismatch(
                [
                    f"{'/'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}"
                    for e in exc.errors(include_url=False)
                ]
            ) from None
        dumped: dict[str, Any] = parsed.model_dump(mode="json")
        return dumped

    def fingerprint_text(self) -> str:
        """The schema as canonical text (recorded with results as part of the configuration)."""
        return json.dumps(self.json_schema, sort_keys=True, separators=(",", ":"))
