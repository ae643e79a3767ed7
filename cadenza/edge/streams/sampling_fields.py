"""The sampling extensions every speech request accepts (HTTP body, WebSocket ``speak``):
each optional, validated at the edge, and unset ones taking the served model's defaults."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from cadenza.contract.sampling import SamplingParams


class SamplingFields(BaseModel):
    seed: int | None = Field(None, ge=0, lt=2**63)
    temperature: float | None = Field(None, ge=0, le=5)
    top_k: int | None = Field(None, ge=0, le=1_000_000)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, lt=1)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    stop_token_ids: list[Annotated[int, Field(ge=0, lt=2**31)]] | None = Field(None, max_length=16)
    fine_temperature: float | None = Field(None, ge=0, le=5)
    guidance_scale: float | None = Field(None, ge=0, le=100)

    def sampling(self, defaults: SamplingParams) -> SamplingParams:
        """The model's ``defaults`` with this request's own choices."""
        return defaults.with_overrides(
            seed=self.seed,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            stop_ids=None if self.stop_token_ids is None else tuple(self.stop_token_ids),
            fine_temperature=self.fine_temperature,
            guidance_scale=self.guidance_scale,
        )
