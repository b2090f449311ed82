"""The price of a model call, from its tokens and its endpoint's prices.

Prices are per 1,000 tokens, input and output apart, in the currency the operator
configured; the result is exact (Decimal), so sums over a session add up to the cent.
"""

from decimal import ROUND_CEILING, Decimal


def model_call_cost(
    *,
    input_tokens: int,
    output_tokens: int,
    price_input_per_1k: Decimal,
    price_output_per_1k: Decimal,
) -> Decimal:
    return (
        Decimal(input_tokens) * price_input_per_1k + Decimal(output_tokens) * price_output_per_1k
    ) / 1000


def model_call_points(*, tokens: int, credits_per_1k_tokens: Decimal) -> int:
    """Credit points for a model call's tokens (input + output), rounded up: a call that
    used any tokens on a paid endpoint costs at least one point."""
    if tokens <= 0 or not credits_per_1k_tokens:
        return 0
    points = Decimal(tokens) * Decimal(credits_per_1k_tokens) / 1000
    return int(points.to_integral_value(rounding=ROUND_CEILING))
