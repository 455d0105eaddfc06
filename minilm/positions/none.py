"""NoPE: no positional information; the causal mask alone orders the tokens
(Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization")."""

from minilm.positions.base import PositionScheme, register


@register("none")
class NoPosition(PositionScheme):
    """NoPE: every hook is the identity; the causal mask alone orders the tokens."""

    description = "no positional information (NoPE): order comes only from the causal mask"
    options = {}
