"""``python -m ms_kldiv.bench``: ms_kldiv against MindSpore's ops.kl_div, torch and the streaming roofline.

The harness (:mod:`ms_kldiv.bench.harness`) is shared: GPU, AKG and Ascend rows are added with
:func:`ms_kldiv.bench.harness.add_row` and show up in the same table.
"""
from .harness import add_row, run, table, plot, save_json, DEFAULT_SIZES  # noqa: F401
