"""The price of a model call, from its tokens and its endpoint's prices.

Prices are per 1,000 tokens, input and output apart, in the currency the operator
configured; the result is exact (Decimal), so sums over a session add up to the cent.
"""

from decimal import Decimal


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
