"""The base of every WMRLRun API model: camelCase on the wire, snake_case in Python, no unknown fields."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class WireModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_wire(self) -> dict[str, Any]:
        """The camelCase JSON form used in Kubernetes objects and rendered configs."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
