"""What an answer costs: an endpoint's prices, applied to the tokens (and engine time) it used."""

from __future__ import annotations

from dataclasses import dataclass

MILLION = 1_000_000
# Money is counted in Redis as whole micro-units of SPEND_CURRENCY (INCRBY takes integers).
MICROS = 1_000_000


@dataclass(frozen=True, slots=True)
class Price:
    """Per million input and output tokens (external APIs), and per engine-second (a local engine
    priced by its time, when the operator sets a rate)."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    per_engine_second: float = 0.0

    @classmethod
    def of(cls, endpoint) -> Price:
        """An endpoint row's prices; empty fields cost nothing."""
        return cls(
            input_per_mtok=float(endpoint.price_input or 0),
            output_per_mtok=float(endpoint.price_output or 0),
            per_engine_second=float(endpoint.price_engine_second or 0),
        )

    def cost(
        self, prompt_tokens: int, completion_tokens: int, engine_seconds: float = 0.0
    ) -> float:
        return (
            prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok
        ) / MILLION + engine_seconds * self.per_engine_second


FREE = Price()


def micros(amount: float) -> int:
    """Money in Redis's unit, rounded up: a reservation never under-counts."""
    return -int(-amount * MICROS // 1)
