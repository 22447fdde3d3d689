"""Store a teacher's sparse next-token distribution in MindRecord and read it back for offline distillation.

A teacher runs once; per token we keep either its top-k token ids with their log-probabilities
(``kind="topk"``) or the distinct ids of ``num_samples`` draws with their counts (``kind="sampled"``).

Format (one MindRecord sample per sequence; S = seq_len, k = ids kept per token, V = vocab_size):

=====================  =========  ==========================================================================
field                  type       content
=====================  =========  ==========================================================================
input_ids              int32 [S]  the tokens the teacher saw
labels                 int32 [S]  optional (present in every sample or in none)
teacher_ids            bytes      [S, k] little-endian int16 when V <= 32768, else int32; padding id -1
teacher_values         bytes      [S, k] little-endian float16 / bfloat16 / float32: logprobs or counts
teacher_ids_dtype      string     "int16" or "int32"           (how to decode ``teacher_ids``)
teacher_values_dtype   string     "float16", "bfloat16", "float32" (how to decode ``teacher_values``)
kind                   string     "topk" or "sampled"
seq_len, k, vocab_size int32      scalars
=====================  =========  ==========================================================================

The teacher fields are raw bytes because MindRecord arrays hold only int32/int64/float32/float64; the dtype of
each is written beside it in every sample, so a file decodes without outside knowledge. Bytes per token of the
teacher fields: ``k * (id bytes + value bytes)``, e.g. k=64, V=151936 (int32 ids), bfloat16 values -> 384.
bfloat16 is rounded to nearest-even (``ml_dtypes`` when installed, else the same rounding in numpy) and
widened exactly, so reading gives back bit for bit what was stored. See docs/teacher_store.md.
"""
import json
import os

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import ops
from mindspore.mindrecord import FileReader, FileWriter

from ._validation import is_integer

try:  # optional: a faster bfloat16 cast; the numpy rounding below gives the same bits
    import ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    ml_dtypes = None

__all__ = ["teacher_topk", "teacher_topk_from_hidden", "teacher_sample", "TeacherStoreWriter",
           "stored_teacher_dataset", "read_stored_teacher"]

FORMAT_NAME = "ms_kldiv.teacher_store"
FORMAT_VERSION = 1
PAD_ID = -1
IGNORE_LABEL = -100
KINDS = ("topk", "sampled")

# Little-endian on disk whatever the host; bfloat16 travels as its uint16 bit pattern.
_ID_DTYPES = {"int16": np.dtype("<i2"), "int32": np.dtype("<i4")}
_VALUE_DTYPES = {"float16": np.dtype("<f2"), "bfloat16": np.dtype("<u2"), "float32": np.dtype("<f4")}
# Largest integer n such that every count 0..n is exact in the value dtype (counts of kind="sampled").
_EXACT_COUNT_LIMIT = {"float16": 2 ** 11, "bfloat16": 2 ** 8, "float32": 2 ** 24}
_INT32_MAX = 2 ** 31 - 1


# ------------------------------------------------------------------------------------------- small helpers
def _is_tensor(x):
    return isinstance(x, ms.Tensor)


def _shown(value, limit=80):
    """``repr(value)`` for a message, cut to ``limit`` characters (an array passed as an option is long)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _to_numpy(x, name):
    """A Tensor or array-like as a numpy array of numbers: TypeError for anything else (None, str, objects)."""
    if _is_tensor(x):
        if x.dtype == ms.bfloat16:  # asnumpy of bfloat16 needs ml_dtypes; float32 holds it exactly
            x = x.astype(ms.float32)
        return x.asnumpy()
    if x is None or isinstance(x, (str, bytes, dict, set)):
        raise TypeError(f"'{name}' must be a Tensor or a numeric array, got {type(x).__name__}: {_shown(x)}")
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"'{name}' must be array-like, got {type(x).__name__}: {exc}") from None
    if arr.dtype.kind not in "biuf" and not _is_numpy_floating(arr.dtype):  # object, str, complex, ...
        raise TypeError(f"'{name}' must be a Tensor or a numeric array, got {type(x).__name__} of dtype {arr.dtype}")
    return arr


def _check_positive_int(value, name, maximum=None):
    """An int (Python or NumPy; bool is not one) >= 1: TypeError for another type, ValueError out of range."""
    if not is_integer(value):
        raise TypeError(f"'{name}' must be a positive int, got {type(value).__name__}: {_shown(value)}")
    if value < 1:
        raise ValueError(f"'{name}' must be a positive int, got {_shown(value)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"'{name}' must be at most {maximum}, got {value}")
    return int(value)


def _check_choice(value, name, choices):
    """A str among ``choices``: TypeError for another type (a list was 'unhashable'), ValueError for another str."""
    if not isinstance(value, str):
        raise TypeError(f"'{name}' must be a str, one of {list(choices)}, got {type(value).__name__}: {_shown(value)}")
    if value not in choices:
        raise ValueError(f"'{name}' must be one of {list(choices)}, got {_shown(value)}")
    return value


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"'{name}' must be a bool, got {type(value).__name__}: {_shown(value)}")
    return bool(value)


def _check_path(path):
    """``path`` as a str (str or os.PathLike of a str, not empty)."""
    try:
        path_str = os.fspath(path)
    except TypeError:
        raise TypeError(f"'path' must be a str or os.PathLike, got {type(path).__name__}: {_shown(path)}") from None
    if not isinstance(path_str, str):
        raise TypeError(f"'path' must be a str or os.PathLike of a str, got {type(path_str).__name__}: {_shown(path)}")
    if not path_str:
        raise ValueError("'path' must not be empty")
    return path_str


def _check_seed(seed):
    """What ``numpy.random.default_rng`` takes: None, an int >= 0 or a sequence of them, a SeedSequence,
    BitGenerator or Generator."""
    if seed is None or isinstance(seed, (np.random.SeedSequence, np.random.BitGenerator, np.random.Generator)):
        return seed
    if isinstance(seed, np.ndarray) and seed.ndim == 0:
        seed = seed.item()
    if is_integer(seed):
        entries = [seed]
    elif isinstance(seed, np.ndarray) and np.issubdtype(seed.dtype, np.integer):
        entries = seed.ravel().tolist()
    elif isinstance(seed, (list, tuple)) and all(is_integer(s) for s in seed):
        entries = list(seed)
    else:
        raise TypeError(f"'seed' must be an int >= 0, a sequence of them, None, or a numpy SeedSequence, "
                        f"BitGenerator or Generator, got {type(seed).__name__}: {_shown(seed)}")
    if any(s < 0 for s in entries):
        raise ValueError(f"'seed' must be >= 0, got {_shown(seed)}")
    return seed


def _compute_dtype(dtype):
    """float64 stays float64; every other floating type (float16, bfloat16, float32) is handled in float32."""
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


_MS_FLOATING = (ms.float16, ms.bfloat16, ms.float32, ms.float64)


def _is_numpy_floating(dtype):
    # ml_dtypes' bfloat16 is a float numpy does not class as np.floating
    return np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16"


def _check_floating(x, name):
    floating = x.dtype in _MS_FLOATING if _is_tensor(x) else _is_numpy_floating(x.dtype)
    if not floating:
        raise TypeError(f"'{name}' must be floating point, got dtype {x.dtype}")


def _ms_compute_dtype(tensor):
    return ms.float64 if tensor.dtype == ms.float64 else ms.float32


def float32_to_bfloat16_bits(values):
    """uint16 bit patterns of ``values`` (cast to float32) rounded to bfloat16, round-to-nearest-even.

    NaN stays a (quiet) NaN of the same sign; overflow rounds to +-inf like any IEEE cast."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if ml_dtypes is not None:
        return values.astype(ml_dtypes.bfloat16).view(np.uint16)
    return _float32_to_bfloat16_bits_numpy(values)


def _float32_to_bfloat16_bits_numpy(values):
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds the 16 dropped bits to nearest, ties to even.
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits + np.uint32(0x7FFF) + lowest_kept) >> np.uint32(16)).astype(np.uint16)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet_nan = ((bits >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return np.where(is_nan, quiet_nan, rounded)


def bfloat16_bits_to_float32(bits):
    """float32 values of bfloat16 bit patterns (exact: bfloat16 is float32's upper half)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _id_dtype_name(vocab_size):
    # int16 must also hold the padding id -1, which it does; the bound is on the largest real id V - 1.
    return "int16" if vocab_size - 1 <= np.iinfo(np.int16).max else "int32"


def _flatten_rows(x, name, min_ndim=1, classes=False):
    """[..., D] -> ([N, D] view or Tensor, leading shape). ``classes``: D is the vocabulary, which must be >= 1."""
    if x.ndim < min_ndim:
        raise ValueError(f"'{name}' must have at least {min_ndim} dimension(s) [..., D], got shape {tuple(x.shape)}")
    if classes and x.shape[-1] == 0:
        raise ValueError(f"'{name}' must have at least one class on the last axis, got shape {tuple(x.shape)}")
    lead = tuple(x.shape[:-1])
    return x.reshape((int(np.prod(lead, dtype=np.int64)), x.shape[-1])), lead


def _check_row_max(row_max, name):
    # The row maximum is NaN if any logit is NaN, +inf if one is +inf, -inf if all are: all unusable.
    if not np.all(np.isfinite(row_max)):
        raise ValueError(f"'{name}' has a row with a NaN or +inf logit, or with every logit -inf")


# --------------------------------------------------------------------------------------- teacher top-k
def _topk_rows_numpy(rows, k):
    """Top-k ids and log-softmax values of a [R, V] float32/float64 block, sorted descending."""
    vocab = rows.shape[-1]
    row_max = rows.max(axis=-1, keepdims=True)
    _check_row_max(row_max, "logits")
    log_normalizer = np.log(np.exp(rows - row_max).sum(axis=-1, keepdims=True))
    if k < vocab:
        ids = np.argpartition(rows, vocab - k, axis=-1)[:, vocab - k:]
    else:
        ids = np.broadcast_to(np.arange(vocab), rows.shape)
    top = np.take_along_axis(rows, ids, axis=-1)
    order = np.argsort(-top, axis=-1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=-1)
    top = np.take_along_axis(top, order, axis=-1)
    # (x - max) - log(sum exp(x - max)) is <= 0 in floating point too: the sum is >= 1.
    return ids.astype(np.int32), (top - row_max) - log_normalizer


def _topk_rows_mindspore(rows, k):
    """Same as _topk_rows_numpy on a Tensor block, on the Tensor's device; only [R, k] comes back to the host."""
    rows = rows.astype(_ms_compute_dtype(rows))
    row_max = rows.max(axis=-1, keepdims=True)
    # (MindSpore's CPU max passes over a NaN that is not a row's first element: the row's NaN is looked for)
    has_nan = ops.isnan(rows).any(axis=-1, keep_dims=True).asnumpy()
    _check_row_max(np.where(has_nan, np.nan, row_max.asnumpy()), "logits")
    log_normalizer = ops.log(ops.exp(rows - row_max).sum(axis=-1, keepdims=True))
    top, ids = ops.topk(rows, k, dim=-1, largest=True, sorted=True)
    logprobs = (top - row_max) - log_normalizer
    return ids.asnumpy().astype(np.int32), logprobs.asnumpy()


def _topk_over_chunks(num_rows, lead, k, chunk_rows, chunk_logits, use_mindspore, out_dtype):
    ids = np.empty((num_rows, k), np.int32)
    logprobs = np.empty((num_rows, k), out_dtype)
    topk_rows = _topk_rows_mindspore if use_mindspore else _topk_rows_numpy
    for start in range(0, num_rows, chunk_rows):
        stop = min(start + chunk_rows, num_rows)
        ids[start:stop], logprobs[start:stop] = topk_rows(chunk_logits(start, stop), k)
    return ids.reshape(lead + (k,)), logprobs.reshape(lead + (k,))


def teacher_topk(logits, k, chunk_rows=1024):
    """Top-k token ids and their log-probabilities under the teacher, per row of ``logits [..., V]``.

    Returns numpy ``(ids [..., k] int32, logprobs [..., k])``, sorted by descending probability, where
    ``logprobs = log_softmax(logits)`` over the full vocabulary, computed in float32 (float64 for float64 input,
    which is also the dtype returned). Rows are processed ``chunk_rows`` at a time, so the memory used is
    O(chunk_rows x V) whatever the number of rows. A MindSpore Tensor is reduced on its own device (only the
    [chunk, k] results are copied to the host); a numpy array with numpy. Ties between equal logits are broken
    arbitrarily.
    """
    k = _check_positive_int(k, "k")
    chunk_rows = _check_positive_int(chunk_rows, "chunk_rows")
    if not _is_tensor(logits):
        logits = _to_numpy(logits, "logits")
    _check_floating(logits, "logits")
    rows, lead = _flatten_rows(logits, "logits", classes=True)
    vocab = rows.shape[-1]
    k = _check_positive_int(k, "k", maximum=vocab)
    use_mindspore = _is_tensor(rows)
    if use_mindspore:
        out_dtype = np.float64 if rows.dtype == ms.float64 else np.float32
        chunk_logits = lambda start, stop: rows[start:stop]  # noqa: E731
    else:
        out_dtype = _compute_dtype(rows.dtype)
        chunk_logits = lambda start, stop: rows[start:stop].astype(out_dtype, copy=False)  # noqa: E731
    return _topk_over_chunks(rows.shape[0], lead, k, chunk_rows, chunk_logits, use_mindspore, out_dtype)


def teacher_topk_from_hidden(hidden, weight, k, bias=None, chunk_rows=1024):
    """:func:`teacher_topk` of ``hidden @ weight.T + bias`` without ever holding the [N, V] logits.

    ``hidden [..., H]`` are the teacher's last hidden states, ``weight [V, H]`` its output head, ``bias [V]``
    optional. The logits are formed ``chunk_rows`` rows at a time in float32 (float64 if ``hidden`` is
    float64); a head stored in another dtype is cast once (a V x H copy, not N x V). If any argument is a
    MindSpore Tensor the matmul and the top-k run in MindSpore on its device.
    """
    k = _check_positive_int(k, "k")
    chunk_rows = _check_positive_int(chunk_rows, "chunk_rows")
    use_mindspore = any(_is_tensor(x) for x in (hidden, weight, bias) if x is not None)
    arrays = {}
    for name, value in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if value is None and name == "bias":
            continue
        if not _is_tensor(value):
            value = _to_numpy(value, name)
        _check_floating(value, name)  # (before a Tensor is made of an array: any dtype checked as given)
        arrays[name] = ms.Tensor(value) if use_mindspore and not _is_tensor(value) else value
    hidden_rows, lead = _flatten_rows(arrays["hidden"], "hidden")
    weight = arrays["weight"]
    if weight.ndim != 2 or weight.shape[1] != hidden_rows.shape[1]:
        raise ValueError(f"'weight' must have shape [V, H] with H = hidden.shape[-1] = {hidden_rows.shape[1]}, "
                         f"got {tuple(weight.shape)}")
    vocab = weight.shape[0]
    if vocab == 0:
        raise ValueError(f"'weight' must have at least one row (V >= 1), got shape {tuple(weight.shape)}")
    bias = arrays.get("bias")
    if bias is not None and tuple(bias.shape) != (vocab,):
        raise ValueError(f"'bias' must have shape [V] = ({vocab},), got {tuple(bias.shape)}")
    k = _check_positive_int(k, "k", maximum=vocab)

    if use_mindspore:
        compute = _ms_compute_dtype(hidden_rows)
        out_dtype = np.float64 if compute == ms.float64 else np.float32
        weight_t = weight.astype(compute).T
        bias = None if bias is None else bias.astype(compute)

        def chunk_logits(start, stop):
            logits = ops.matmul(hidden_rows[start:stop].astype(compute), weight_t)
            return logits if bias is None else logits + bias
    else:
        out_dtype = _compute_dtype(hidden_rows.dtype)
        weight_t = weight.astype(out_dtype, copy=False).T
        bias = None if bias is None else bias.astype(out_dtype, copy=False)

        def chunk_logits(start, stop):
            logits = hidden_rows[start:stop].astype(out_dtype, copy=False) @ weight_t
            return logits if bias is None else logits + bias
    return _topk_over_chunks(hidden_rows.shape[0], lead, k, chunk_rows, chunk_logits, use_mindspore, out_dtype)


# ------------------------------------------------------------------------------------- teacher sampling
def _distinct_with_counts(draws, k):
    """[R, n] drawn ids -> ([R, k] distinct ids ascending, padded with -1; [R, k] counts, padded with 0)."""
    num_rows, num_draws = draws.shape
    draws = np.sort(draws, axis=-1)
    starts = np.ones(draws.shape, bool)
    starts[:, 1:] = draws[:, 1:] != draws[:, :-1]
    slot = np.cumsum(starts, axis=-1) - 1  # which distinct id each draw belongs to
    most_distinct = int(slot[:, -1].max()) + 1 if num_rows else 0
    if most_distinct > k:
        raise ValueError(f"a row drew {most_distinct} distinct ids, more than 'k' = {k}; raise k "
                         f"(at most num_samples = {num_draws} can be needed)")
    row = np.broadcast_to(np.arange(num_rows)[:, None], draws.shape)
    ids = np.full((num_rows, k), PAD_ID, np.int32)
    ids[row[starts], slot[starts]] = draws[starts]
    counts = np.bincount((row * k + slot).ravel(), minlength=num_rows * k).reshape(num_rows, k)
    return ids, counts.astype(np.int32)


def teacher_sample(logits, num_samples, k, seed, chunk_rows=1024):
    """Draw ``num_samples`` ids per row of ``logits [..., V]`` from softmax(logits), with replacement.

    Returns numpy ``(ids [..., k] int32, counts [..., k] int32)``: the distinct ids drawn, ascending, and how
    often each was drawn (counts sum to ``num_samples``), padded with id -1 / count 0 up to ``k``. A row with
    more than ``k`` distinct ids is a ValueError. Draws come from ``numpy.random.default_rng(seed)`` row after
    row, so the result does not depend on ``chunk_rows`` (rows per chunk, memory O(chunk_rows x V)).
    """
    num_samples = _check_positive_int(num_samples, "num_samples")
    k = _check_positive_int(k, "k")
    chunk_rows = _check_positive_int(chunk_rows, "chunk_rows")
    seed = _check_seed(seed)
    if not _is_tensor(logits):
        logits = _to_numpy(logits, "logits")
    _check_floating(logits, "logits")
    rows, lead = _flatten_rows(logits, "logits", classes=True)
    num_rows, vocab = rows.shape
    rng = np.random.default_rng(seed)
    ids = np.empty((num_rows, k), np.int32)
    counts = np.empty((num_rows, k), np.int32)
    for start in range(0, num_rows, chunk_rows):
        stop = min(start + chunk_rows, num_rows)
        # Sampling by inverse CDF in float64: exact enough that probabilities ~1e-12 are still reachable.
        block = _to_numpy(rows[start:stop], "logits").astype(np.float64)
        row_max = block.max(axis=-1, keepdims=True)
        _check_row_max(row_max, "logits")
        cdf = np.cumsum(np.exp(block - row_max), axis=-1)
        uniforms = rng.random((stop - start, num_samples)) * cdf[:, -1:]
        draws = np.empty(uniforms.shape, np.int64)
        for r in range(stop - start):
            draws[r] = np.searchsorted(cdf[r], uniforms[r], side="right")
        np.minimum(draws, vocab - 1, out=draws)  # a uniform that rounds onto the total stays in range
        ids[start:stop], counts[start:stop] = _distinct_with_counts(draws, k)
    return ids.reshape(lead + (k,)), counts.reshape(lead + (k,))


# ------------------------------------------------------------------------------------------------ writing
def _shard_files(path, shard_num):
    """The data files FileWriter makes for ``path``: the path itself, or path0 .. path{n-1} for n shards."""
    return [path] if shard_num == 1 else [f"{path}{i}" for i in range(shard_num)]


class TeacherStoreWriter:
    """Append teacher distributions to a MindRecord file, one sample (sequence) per :meth:`write`.

    ``TeacherStoreWriter(path, vocab_size, k, value_dtype="bfloat16", kind="topk")`` as a context manager;
    the file is complete when the ``with`` block ends (or after :meth:`close`). ``kind="topk"`` stores
    log-probabilities (each <= 0, -inf allowed), ``kind="sampled"`` counts (integers >= 0, exact in
    ``value_dtype``). With ``shard_num > 1`` MindRecord writes ``path0`` .. ``path{n-1}`` (see :attr:`files`).
    Each data file has a ``.db`` index beside it; both are needed to read.
    """

    _FLUSH_SAMPLES = 64  # samples buffered before one FileWriter.write_raw_data call

    def __init__(self, path, vocab_size, k, *, value_dtype="bfloat16", kind="topk", shard_num=1,
                 overwrite=False):
        self._path = _check_path(path)
        self._vocab_size = _check_positive_int(vocab_size, "vocab_size", maximum=_INT32_MAX)
        self._k = _check_positive_int(k, "k")
        _check_choice(value_dtype, "value_dtype", sorted(_VALUE_DTYPES))
        _check_choice(kind, "kind", KINDS)
        shard_num = _check_positive_int(shard_num, "shard_num", maximum=1000)
        overwrite = _check_bool(overwrite, "overwrite")
        self._value_dtype = value_dtype
        self._kind = kind
        self._id_dtype = _id_dtype_name(self._vocab_size)
        self._files = _shard_files(self._path, shard_num)
        parent = os.path.dirname(os.path.abspath(self._path))
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"'path': directory {parent} does not exist")
        # with shards, a single-file store at the path itself counts too: readers look for it first
        single = [f for f in (self._path, self._path + ".db") if shard_num > 1 and os.path.exists(f)]
        existing = [f for name in self._files for f in (name, name + ".db") if os.path.exists(f)] + single
        directories = [f for f in existing if os.path.isdir(f)]
        if directories:  # overwrite=True would not replace it
            raise ValueError(f"'path' must name a file, but {directories[0]} is a directory")
        if existing and not overwrite:
            raise FileExistsError(f"'path': {existing[0]} exists; pass overwrite=True to replace it")
        for stale in single:  # MindRecord overwrites the shards it writes, not this
            os.remove(stale)
        self._writer = FileWriter(self._path, shard_num, overwrite=overwrite)
        self._has_labels = None  # decided by the first sample
        self._pending = []
        self._tokens_written = 0
        self._samples_written = 0
        self._closed = False

    # -- properties
    @property
    def files(self):
        """The data files written (each with its ``.db`` index); any one of them opens the whole set."""
        return list(self._files)

    @property
    def id_dtype(self):
        return self._id_dtype

    @property
    def bytes_per_token(self):
        """Bytes of the teacher fields per token: k * (id bytes + value bytes)."""
        return self._k * (_ID_DTYPES[self._id_dtype].itemsize + _VALUE_DTYPES[self._value_dtype].itemsize)

    @property
    def tokens_written(self):
        """Tokens accepted by :meth:`write` / :meth:`write_batch` so far."""
        return self._tokens_written

    @property
    def samples_written(self):
        return self._samples_written

    # -- context manager
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # Also on error: what was accepted so far is committed, so the files are readable, never half written.
        self.close()
        return False

    # -- writing
    def write(self, input_ids, ids, values, labels=None):
        """Append one sequence: ``input_ids [S]``, teacher ``ids [S, k]``, ``values [S, k]`` (logprobs for
        kind="topk", counts for kind="sampled"), optional ``labels [S]``. Nothing is written if it is invalid."""
        self._append([self._encode(input_ids, ids, values, labels)])

    def write_batch(self, samples):
        """Append several sequences, each a dict with keys input_ids, ids, values and optionally labels.
        All are validated before any is written."""
        if isinstance(samples, (dict, str, bytes)) or not hasattr(samples, "__iter__"):
            raise TypeError(f"'samples' must be a list of dicts, got {type(samples).__name__}")
        encoded = []
        for i, sample in enumerate(samples):
            if not isinstance(sample, dict):
                raise TypeError(f"'samples'[{i}] must be a dict, got {type(sample).__name__}: {_shown(sample)}")
            unknown = set(sample) - {"input_ids", "ids", "values", "labels"}
            if unknown:
                raise ValueError(f"'samples'[{i}] has unknown keys {sorted(map(str, unknown))}")
            missing = [key for key in ("input_ids", "ids", "values") if key not in sample]
            if missing:
                raise ValueError(f"'samples'[{i}] lacks the keys {missing}")
            encoded.append(self._encode(sample.get("input_ids"), sample.get("ids"), sample.get("values"),
                                        sample.get("labels")))
        self._append(encoded)

    def close(self):
        """Write what is buffered and commit the files (also done by the ``with`` block)."""
        if self._closed:
            return
        self._closed = True
        if self._has_labels is None:  # nothing was written: an empty but valid store
            self._add_schema(has_labels=False)
        self._flush()
        self._writer.commit()

    # -- internals
    def _encode(self, input_ids, ids, values, labels):
        if self._closed:
            raise RuntimeError("the TeacherStoreWriter is closed")
        input_ids = self._int_array(input_ids, "input_ids")
        if input_ids.ndim != 1 or input_ids.shape[0] == 0:
            raise ValueError(f"'input_ids' must have shape [S] with S >= 1, got {input_ids.shape}")
        seq_len = input_ids.shape[0]
        expected = (seq_len, self._k)
        ids = self._int_array(ids, "ids")
        if ids.shape != expected:
            raise ValueError(f"'ids' must have shape [S, k] = {expected}, got {ids.shape}")
        if ids.min() < PAD_ID or ids.max() >= self._vocab_size:
            raise ValueError(f"'ids' must be in [-1, vocab_size) = [-1, {self._vocab_size}), "
                             f"got values in [{ids.min()}, {ids.max()}]")
        self._check_distinct(ids)
        values = self._encode_values(values, ids, expected)
        has_labels = labels is not None
        if self._has_labels is not None and has_labels != self._has_labels:
            raise ValueError(f"'labels' must be given for every sample or for none; the first sample "
                             f"{'had' if self._has_labels else 'had no'} labels")
        sample = {
            "input_ids": input_ids.astype(np.int32),
            "teacher_ids": ids.astype(_ID_DTYPES[self._id_dtype]).tobytes(),
            "teacher_values": values,
            "teacher_ids_dtype": self._id_dtype,
            "teacher_values_dtype": self._value_dtype,
            "kind": self._kind,
            "seq_len": seq_len,
            "k": self._k,
            "vocab_size": self._vocab_size,
        }
        if has_labels:
            labels = self._int_array(labels, "labels")
            if labels.shape != (seq_len,):
                raise ValueError(f"'labels' must have shape [S] = ({seq_len},), got {labels.shape}")
            sample["labels"] = labels.astype(np.int32)
        return has_labels, sample

    @staticmethod
    def _int_array(x, name):
        arr = _to_numpy(x, name)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"'{name}' must be integer, got dtype {arr.dtype}")
        if arr.size and (arr.min() < -_INT32_MAX - 1 or arr.max() > _INT32_MAX):
            raise ValueError(f"'{name}' does not fit int32")
        return arr

    @staticmethod
    def _check_distinct(ids):
        # A repeated id would count its probability twice in the loss; padding (-1) may repeat.
        ordered = np.sort(ids, axis=-1)
        repeated = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] != PAD_ID)
        if repeated.any():
            position = int(np.nonzero(repeated.any(axis=-1))[0][0])
            raise ValueError(f"'ids' repeats a token id at position {position}; ids must be distinct per token")

    def _encode_values(self, values, ids, expected):
        values = _to_numpy(values, "values")
        if not (_is_numpy_floating(values.dtype) or np.issubdtype(values.dtype, np.integer)):
            raise TypeError(f"'values' must be numeric, got dtype {values.dtype}")
        if values.shape != expected:
            raise ValueError(f"'values' must have shape [S, k] = {expected}, got {values.shape}")
        with np.errstate(over="ignore"):  # a float64 log-probability below float32's range is -inf: still p = 0
            values32 = values.astype(np.float32)
        if np.isnan(values32).any():
            raise ValueError("'values' contains NaN")
        if self._kind == "topk":
            if (values32 > 0).any():
                raise ValueError(f"'values' are log-probabilities for kind='topk' and must be <= 0, "
                                 f"got a maximum of {values32.max()}")
        else:
            limit = _EXACT_COUNT_LIMIT[self._value_dtype]
            counts = values.astype(np.float64)  # as given: float32 would round 2**24 + 1 onto 2**24
            if (counts < 0).any() or (counts != np.round(counts)).any():
                raise ValueError("'values' are counts for kind='sampled' and must be integers >= 0")
            if counts.size and counts.max() > limit:
                raise ValueError(f"'values': a count of {counts.max():.0f} is not exact in "
                                 f"{self._value_dtype} (exact up to {limit}); use a wider value_dtype")
            if (values32[ids == PAD_ID] != 0).any():
                raise ValueError("'values' must be 0 where ids is the padding id -1")
        if self._value_dtype == "bfloat16":
            stored = float32_to_bfloat16_bits(values32).astype(_VALUE_DTYPES["bfloat16"])
        else:
            with np.errstate(over="ignore"):  # float16 rounds log-probabilities below -65504 to -inf, as it should
                stored = values32.astype(_VALUE_DTYPES[self._value_dtype])
        return stored.tobytes()

    def _schema(self, has_labels):
        schema = {
            "input_ids": {"type": "int32", "shape": [-1]},
            "teacher_ids": {"type": "bytes"},
            "teacher_values": {"type": "bytes"},
            "teacher_ids_dtype": {"type": "string"},
            "teacher_values_dtype": {"type": "string"},
            "kind": {"type": "string"},
            "seq_len": {"type": "int32"},
            "k": {"type": "int32"},
            "vocab_size": {"type": "int32"},
        }
        if has_labels:
            schema["labels"] = {"type": "int32", "shape": [-1]}
        return schema

    def _add_schema(self, has_labels):
        self._has_labels = has_labels
        description = json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": self._kind,
                                  "vocab_size": self._vocab_size, "k": self._k, "ids_dtype": self._id_dtype,
                                  "values_dtype": self._value_dtype})
        self._writer.add_schema(self._schema(has_labels), description)
        self._writer.add_index(["seq_len"])  # the .db indexes only this field, not every scalar

    def _append(self, encoded):
        if not encoded:
            return
        labels_flags = {has_labels for has_labels, _ in encoded}
        if len(labels_flags) > 1:
            raise ValueError("'labels' must be given for every sample or for none")
        if self._has_labels is None:
            self._add_schema(labels_flags.pop())
        for _, sample in encoded:
            self._pending.append(sample)
            self._tokens_written += sample["seq_len"]
            self._samples_written += 1
        if len(self._pending) >= self._FLUSH_SAMPLES:
            self._flush()

    def _flush(self):
        if self._pending:
            self._writer.write_raw_data(self._pending)
            self._pending = []


# ------------------------------------------------------------------------------------------------ reading
OUTPUT_COLUMNS = ("input_ids", "labels", "teacher_ids", "teacher_values")
_SIDECAR_COLUMNS = ("teacher_ids_dtype", "teacher_values_dtype", "seq_len", "k")


def _resolve_store_file(path):
    path = _check_path(path)
    for candidate in (path, path + "0"):  # a single file, or the first shard of a shard set
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"'path': no teacher store at {path} (nor {path}0)")


def _stored_fields(path):
    reader = FileReader(path, num_consumer=1)
    try:
        fields = set(reader.schema())
    finally:
        reader.close()
    missing = {"input_ids", "teacher_ids", "teacher_values", *_SIDECAR_COLUMNS} - fields
    if missing:
        raise ValueError(f"'path': {path} is not a teacher store (fields {sorted(missing)} missing)")
    return fields


def _as_str(x):
    if isinstance(x, np.ndarray):
        x = x.item()
    return x.decode() if isinstance(x, bytes) else str(x)


def _as_bytes(x):
    # MindDataset hands a bytes field over as a numpy 'S' array; FileReader as bytes.
    return x if isinstance(x, bytes) else np.asarray(x).tobytes()


def _decode_teacher(teacher_ids, teacher_values, ids_dtype, values_dtype, seq_len, k):
    ids_dtype, values_dtype = _as_str(ids_dtype), _as_str(values_dtype)
    shape = (int(seq_len), int(k))
    ids = np.frombuffer(_as_bytes(teacher_ids), dtype=_ID_DTYPES[ids_dtype])
    values = np.frombuffer(_as_bytes(teacher_values), dtype=_VALUE_DTYPES[values_dtype])
    if ids.size != shape[0] * shape[1] or values.size != ids.size:
        raise ValueError(f"corrupt teacher store sample: {ids.size} ids / {values.size} values for [S, k] = {shape}")
    ids = ids.astype(np.int32).reshape(shape)
    if values_dtype == "bfloat16":
        values = bfloat16_bits_to_float32(values)
    return ids, values.astype(np.float32).reshape(shape)


def _pad_sequence(array, pad_to, fill, name):
    length = array.shape[0]
    if length > pad_to:
        raise ValueError(f"'pad_to' = {pad_to} is shorter than a stored sequence ({name} has length {length})")
    if length == pad_to:
        return array
    padding = np.full((pad_to - length,) + array.shape[1:], fill, array.dtype)
    return np.concatenate([array, padding])


def read_stored_teacher(path):
    """Every sample of a teacher store as a dict of numpy arrays: input_ids [S] int32, labels [S] int32 (if
    stored), teacher_ids [S, k] int32 (padding -1), teacher_values [S, k] float32, plus kind (str), seq_len,
    k, vocab_size (ints). In file order (shard after shard). Meant for tests and inspection."""
    path = _resolve_store_file(path)
    _stored_fields(path)
    reader = FileReader(path, num_consumer=1)
    samples = []
    try:
        for raw in reader.get_next():
            ids, values = _decode_teacher(raw["teacher_ids"], raw["teacher_values"], raw["teacher_ids_dtype"],
                                          raw["teacher_values_dtype"], raw["seq_len"], raw["k"])
            sample = {"input_ids": np.asarray(raw["input_ids"], np.int32)}
            if "labels" in raw:
                sample["labels"] = np.asarray(raw["labels"], np.int32)
            sample.update(teacher_ids=ids, teacher_values=values, kind=_as_str(raw["kind"]),
                          seq_len=int(raw["seq_len"]), k=int(raw["k"]), vocab_size=int(raw["vocab_size"]))
            samples.append(sample)
    finally:
        reader.close()
    return samples


def stored_teacher_dataset(path, *, columns=None, shuffle=False, num_parallel_workers=1, pad_to=None,
                           pad_token_id=0):
    """A ``mindspore.dataset.MindDataset`` over a teacher store, decoded for training.

    Each row: ``input_ids [S] int32``, ``labels [S] int32`` (if stored), ``teacher_ids [S, k] int32`` (padding
    -1) and ``teacher_values [S, k] float32`` (float16/bfloat16 widened exactly); ``columns`` picks a subset,
    in that order. ``.batch(n)`` needs one S per batch: with ``pad_to=L`` every sequence is padded to L
    (input_ids with ``pad_token_id``, labels with -100, teacher ids with -1, values with 0; a longer sequence
    is an error when the pipeline reaches it). ``path`` is the file given to the writer (or one of its shards).
    """
    if columns is not None:
        if isinstance(columns, str):
            columns = [columns]
        elif isinstance(columns, (dict, bytes)) or not hasattr(columns, "__iter__"):
            raise TypeError(f"'columns' must be a str or a list of str, got {type(columns).__name__}: "
                            f"{_shown(columns)}")
        columns = list(columns)
        if not all(isinstance(c, str) for c in columns):
            raise TypeError(f"'columns' must be a str or a list of str, got {_shown(columns)}")
        if len(set(columns)) != len(columns):
            raise ValueError(f"'columns' must not repeat a column, got {columns}")
    if not (shuffle is None or isinstance(shuffle, (bool, np.bool_, ds.Shuffle))):
        raise TypeError(f"'shuffle' must be a bool, None or a mindspore.dataset.Shuffle, got "
                        f"{type(shuffle).__name__}: {_shown(shuffle)}")
    if isinstance(shuffle, np.bool_):
        shuffle = bool(shuffle)
    num_parallel_workers = _check_positive_int(num_parallel_workers, "num_parallel_workers")
    if pad_to is not None:
        pad_to = _check_positive_int(pad_to, "pad_to")
    if not is_integer(pad_token_id):
        raise TypeError(f"'pad_token_id' must be an int (an int32 token id), got {type(pad_token_id).__name__}: "
                        f"{_shown(pad_token_id)}")
    if not -_INT32_MAX - 1 <= pad_token_id <= _INT32_MAX:
        raise ValueError(f"'pad_token_id' must be an int32 token id, got {_shown(pad_token_id)}")
    path = _resolve_store_file(path)
    fields = _stored_fields(path)
    available = [c for c in OUTPUT_COLUMNS if c in fields or c.startswith("teacher_")]
    if columns is None:
        columns = available
    else:
        unknown = [c for c in columns if c not in available]
        if unknown or not columns:
            raise ValueError(f"'columns' must be a non-empty subset of {available}, got {columns}")

    sequence_columns = [c for c in ("input_ids", "labels") if c in columns]
    wants_teacher = any(c.startswith("teacher_") for c in columns)
    read_columns = sequence_columns + (["teacher_ids", "teacher_values", *_SIDECAR_COLUMNS] if wants_teacher else [])
    dataset = ds.MindDataset(path, columns_list=read_columns, shuffle=shuffle,
                             num_parallel_workers=num_parallel_workers)

    fills = {"input_ids": pad_token_id, "labels": IGNORE_LABEL}

    def decode(*fields_in):
        named = dict(zip(read_columns, fields_in))
        out = []
        for name in sequence_columns:
            array = named[name].astype(np.int32)
            out.append(array if pad_to is None else _pad_sequence(array, pad_to, fills[name], name))
        if wants_teacher:
            ids, values = _decode_teacher(named["teacher_ids"], named["teacher_values"], named["teacher_ids_dtype"],
                                          named["teacher_values_dtype"], named["seq_len"], named["k"])
            if pad_to is not None:
                ids = _pad_sequence(ids, pad_to, PAD_ID, "teacher_ids")
                values = _pad_sequence(values, pad_to, 0.0, "teacher_values")
            out += [ids, values]
        return tuple(out)

    decoded_columns = sequence_columns + (["teacher_ids", "teacher_values"] if wants_teacher else [])
    dataset = dataset.map(decode, input_columns=read_columns, output_columns=decoded_columns,
                          num_parallel_workers=num_parallel_workers)
    return dataset.project(columns)
