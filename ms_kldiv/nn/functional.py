"""``mindspore.mint.nn.functional``-shaped alias of :func:`ms_kldiv.kl_div`."""
from ..functional import kl_div

__all__ = ["kl_div"]
