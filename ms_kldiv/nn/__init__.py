"""``mindspore.mint.nn``-shaped aliases: ``from ms_kldiv import nn`` then ``nn.KLDivLoss`` / ``nn.functional.kl_div``."""
from . import functional
from .loss import KLDivLoss

__all__ = ["KLDivLoss", "functional"]
