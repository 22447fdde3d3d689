"""ms_kldiv.teacher_store: the teacher's sparse distribution (top-k or sampled) computed chunk by chunk, written
to MindRecord and read back bit for bit, directly and through a batched MindDataset pipeline."""
import os
import tracemalloc

import numpy as np
import pytest

import mindspore as ms

from ms_kldiv import teacher_store as ts


def _log_softmax64(logits):
    x = np.asarray(logits, np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _reference_topk(logits, k):
    logprobs = _log_softmax64(logits)
    ids = np.argsort(-logprobs, axis=-1, kind="stable")[..., :k]
    return ids, np.take_along_axis(logprobs, ids, axis=-1)


def _bits(x):
    x = np.asarray(x, np.float32)
    return x.view(np.uint32)


def _as_stored(values, value_dtype):
    """float32 of what value_dtype keeps of ``values`` (independent of the module where ml_dtypes is present)."""
    values = np.asarray(values, np.float32)
    if value_dtype == "float16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float32)
    if value_dtype == "bfloat16":
        try:
            import ml_dtypes
            return values.astype(ml_dtypes.bfloat16).astype(np.float32)
        except ImportError:
            return ts.bfloat16_bits_to_float32(ts._float32_to_bfloat16_bits_numpy(values))
    return values


# ------------------------------------------------------------------------------------------------ top-k
def test_topk_matches_float64_reference():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((2, 5, 50)) * 3).astype(np.float32)
    ids, logprobs = ts.teacher_topk(logits, 7)
    ref_ids, ref_logprobs = _reference_topk(logits, 7)
    assert ids.shape == (2, 5, 7) and ids.dtype == np.int32 and logprobs.dtype == np.float32
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(logprobs, ref_logprobs, rtol=0, atol=2e-6)
    assert (np.diff(logprobs, axis=-1) <= 0).all() and (logprobs <= 0).all()


def test_topk_float64_input_is_computed_in_float64():
    logits = np.random.default_rng(1).standard_normal((4, 30)) * 5
    ids, logprobs = ts.teacher_topk(logits, 30)  # k = V: the whole distribution, sorted
    ref_ids, ref_logprobs = _reference_topk(logits, 30)
    assert logprobs.dtype == np.float64
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(logprobs, ref_logprobs, rtol=0, atol=1e-13)


@pytest.mark.parametrize("ms_dtype", [ms.float32, ms.float16, ms.bfloat16], ids=str)
def test_topk_of_a_tensor_runs_in_mindspore_and_agrees(ms_dtype):
    rng = np.random.default_rng(2)
    logits = ms.Tensor(rng.standard_normal((3, 4, 64)).astype(np.float32)).astype(ms_dtype)
    exact = logits.astype(ms.float32).asnumpy()  # what the low-precision Tensor holds, in float32
    ids, logprobs = ts.teacher_topk(logits, 5, chunk_rows=5)
    ref_ids, ref_logprobs = _reference_topk(exact, 5)
    assert ids.dtype == np.int32 and logprobs.dtype == np.float32 and ids.shape == (3, 4, 5)
    # Rounded logits can tie: compare the logprobs at the ids, and that the chosen ids reach the reference values.
    np.testing.assert_allclose(logprobs, ref_logprobs, rtol=0, atol=2e-6)
    np.testing.assert_allclose(np.take_along_axis(_log_softmax64(exact), ids, axis=-1), ref_logprobs, atol=2e-6)


def test_topk_chunked_equals_unchunked():
    logits = np.random.default_rng(3).standard_normal((10, 40)).astype(np.float32)
    whole = ts.teacher_topk(logits, 6, chunk_rows=1024)
    chunked = ts.teacher_topk(logits, 6, chunk_rows=3)
    np.testing.assert_array_equal(chunked[0], whole[0])
    np.testing.assert_array_equal(chunked[1], whole[1])


def test_topk_memory_is_per_chunk_not_per_row():
    rows, vocab, chunk_rows = 2000, 5000, 50
    logits = np.random.default_rng(10).standard_normal((rows, vocab)).astype(np.float16)
    hidden = np.random.default_rng(11).standard_normal((rows, 8)).astype(np.float32)
    weight = np.random.default_rng(12).standard_normal((vocab, 8)).astype(np.float32)
    all_rows_float32 = rows * vocab * 4  # 40 MB: what an unchunked float32 copy (or N x V logits) would take
    for call in (lambda: ts.teacher_topk(logits, 8, chunk_rows=chunk_rows),
                 lambda: ts.teacher_topk_from_hidden(hidden, weight, 8, chunk_rows=chunk_rows)):
        tracemalloc.start()
        try:
            call()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < all_rows_float32 / 4, peak


@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "tensor"])
def test_topk_from_hidden_equals_from_logits(as_tensor):
    rng = np.random.default_rng(4)
    hidden = rng.standard_normal((2, 5, 16)).astype(np.float32)
    weight = rng.standard_normal((40, 16)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    logits = hidden @ weight.T + bias
    convert = ms.Tensor if as_tensor else np.asarray
    ids, logprobs = ts.teacher_topk_from_hidden(convert(hidden), convert(weight), 6, bias=convert(bias),
                                                chunk_rows=3)
    ref_ids, ref_logprobs = ts.teacher_topk(logits, 6)
    assert ids.shape == (2, 5, 6)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(logprobs, ref_logprobs, rtol=0, atol=1e-5)
    no_bias = ts.teacher_topk_from_hidden(hidden, weight, 6, chunk_rows=4)
    np.testing.assert_array_equal(no_bias[0], ts.teacher_topk(hidden @ weight.T, 6)[0])


@pytest.mark.parametrize("call, name", [
    (lambda: ts.teacher_topk(np.zeros((2, 5), np.float32), 6), "k"),
    (lambda: ts.teacher_topk(np.zeros((2, 5), np.float32), 0), "k"),
    (lambda: ts.teacher_topk(np.array([[0.0, np.nan, 1.0]], np.float32), 2), "logits"),
    # MindSpore's CPU max passes over a NaN that is not a row's first element
    (lambda: ts.teacher_topk(ms.Tensor(np.array([[0.0, np.nan, 1.0]], np.float32)), 2), "logits"),
    (lambda: ts.teacher_topk_from_hidden(ms.Tensor(np.array([[0.0, np.nan]], np.float32)),
                                         ms.Tensor(np.eye(2, dtype=np.float32)), 1), "logits"),
    (lambda: ts.teacher_topk(np.zeros((2, 5), np.float32), 2, chunk_rows=0), "chunk_rows"),
    (lambda: ts.teacher_topk_from_hidden(np.zeros((2, 4)), np.zeros((9, 3)), 2), "weight"),
    (lambda: ts.teacher_topk_from_hidden(np.zeros((2, 4)), np.zeros((9, 4)), 2, bias=np.zeros(8)), "bias"),
    (lambda: ts.teacher_sample(np.zeros((2, 5), np.float32), 0, 4, seed=0), "num_samples"),
], ids=["k>V", "k=0", "nan-logits", "nan-tensor", "nan-hidden-tensor", "chunk_rows",
        "weight-shape", "bias-shape", "num_samples"])
def test_bad_teacher_inputs_name_the_argument(call, name):
    with pytest.raises(ValueError, match=f"'{name}'"):
        call()


# --------------------------------------------------------------------------------------------- sampling
def test_sample_counts_ids_and_seed():
    logits = np.random.default_rng(5).standard_normal((3, 4, 30)).astype(np.float32)
    ids, counts = ts.teacher_sample(logits, 16, 16, seed=7)
    assert ids.shape == counts.shape == (3, 4, 16) and ids.dtype == counts.dtype == np.int32
    assert (counts.sum(axis=-1) == 16).all()
    for row_ids, row_counts in zip(ids.reshape(-1, 16), counts.reshape(-1, 16)):
        kept = row_ids[row_ids != -1]
        assert (np.diff(kept) > 0).all()  # distinct, ascending
        assert (row_counts[row_ids != -1] > 0).all() and (row_counts[row_ids == -1] == 0).all()
        assert (row_ids[len(kept):] == -1).all()  # padding only at the end
    again = ts.teacher_sample(logits, 16, 16, seed=7, chunk_rows=5)  # same seed, other chunks: same draws
    np.testing.assert_array_equal(again[0], ids)
    np.testing.assert_array_equal(again[1], counts)
    other = ts.teacher_sample(logits, 16, 16, seed=8)
    assert not np.array_equal(other[0], ids)


def test_sample_frequencies_converge():
    logits = np.log(np.array([[0.5, 0.25, 0.125, 0.1, 0.025]]))
    ids, counts = ts.teacher_sample(logits, 20000, 5, seed=0)
    frequencies = np.zeros(5)
    frequencies[ids[0][ids[0] >= 0]] = counts[0][ids[0] >= 0] / 20000
    # The binomial standard deviation is at most sqrt(0.25 / 20000) = 0.0035; 0.015 is over 4 of them.
    np.testing.assert_allclose(frequencies, np.exp(logits[0]), rtol=0, atol=0.015)


def test_sample_with_too_many_distinct_ids_names_k():
    with pytest.raises(ValueError, match="'k'"):
        ts.teacher_sample(np.zeros((2, 50), np.float32), 40, 3, seed=0)


# ------------------------------------------------------------------------------------ bfloat16 rounding
def test_bfloat16_numpy_rounding_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(6)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 3.4e38, -3.4e38, 1e-40, -1e-45,
                        1.00390625, 1.01171875, -1.00390625,  # exact ties: round to even, down and up
                        np.float32(1.0) + np.float32(2 ** -9)], np.float32)
    scaled = (rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000)).astype(np.float32)
    any_bits = rng.integers(0, 2 ** 32, 2000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([special, scaled, any_bits])
    assert values.dtype == np.float32
    ours = ts._float32_to_bfloat16_bits_numpy(values)
    with np.errstate(invalid="ignore"):  # ml_dtypes warns when casting NaN
        theirs = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(ours[finite], theirs[finite])
    assert np.isnan(ts.bfloat16_bits_to_float32(ours[~finite])).all()
    np.testing.assert_array_equal(np.signbit(ts.bfloat16_bits_to_float32(ours[~finite])), np.signbit(values[~finite]))


# ------------------------------------------------------------------------------------- writing / reading
def _topk_samples(vocab, k, lengths, seed=0, with_labels=True):
    rng = np.random.default_rng(seed)
    samples = []
    for length in lengths:
        logits = (rng.standard_normal((length, vocab)) * 4).astype(np.float32)
        ids, logprobs = ts.teacher_topk(logits, k)
        # The largest id the vocabulary holds, padding with -1 / -inf, and values at the edges of each dtype.
        if vocab - 1 not in ids[0]:
            ids[0, -1] = vocab - 1
        logprobs[0, -1] = -1e-8  # subnormal in float16
        ids[-1, -2:], logprobs[-1, -2:] = -1, -np.inf
        if length > 1:
            logprobs[1, -1] = -70000.0  # beyond float16's range: -inf there, finite in bfloat16
        sample = {"input_ids": rng.integers(0, vocab, length), "ids": ids, "values": logprobs}
        if with_labels:
            sample["labels"] = rng.integers(-100, vocab, length)
        samples.append(sample)
    return samples


def _write(path, samples, vocab, k, **kwargs):
    with ts.TeacherStoreWriter(path, vocab, k, **kwargs) as writer:
        for sample in samples:
            writer.write(**sample)
    return writer


@pytest.mark.parametrize("vocab, id_dtype", [(100, "int16"), (151936, "int32")])
@pytest.mark.parametrize("value_dtype", ["float16", "bfloat16", "float32"])
def test_round_trip_is_bit_exact(tmp_path, vocab, id_dtype, value_dtype):
    k = 8
    samples = _topk_samples(vocab, k, lengths=[3, 5, 1], seed=vocab)
    path = str(tmp_path / "teacher.mindrecord")
    writer = _write(path, samples, vocab, k, value_dtype=value_dtype)
    assert writer.id_dtype == id_dtype and writer.tokens_written == 9 and writer.samples_written == 3
    assert writer.bytes_per_token == k * ({"int16": 2, "int32": 4}[id_dtype] + {"float32": 4}.get(value_dtype, 2))
    read = ts.read_stored_teacher(path)
    assert len(read) == 3
    for sample, got in zip(samples, read):
        assert got["kind"] == "topk" and got["k"] == k and got["vocab_size"] == vocab
        assert got["seq_len"] == len(sample["input_ids"])
        np.testing.assert_array_equal(got["input_ids"], sample["input_ids"])
        np.testing.assert_array_equal(got["labels"], sample["labels"])
        assert got["teacher_ids"].dtype == np.int32 and got["teacher_values"].dtype == np.float32
        np.testing.assert_array_equal(got["teacher_ids"], sample["ids"])
        np.testing.assert_array_equal(_bits(got["teacher_values"]), _bits(_as_stored(sample["values"], value_dtype)))
        assert (got["teacher_ids"][-1, -2:] == -1).all()


def test_sampled_counts_round_trip(tmp_path):
    logits = np.random.default_rng(9).standard_normal((2, 6, 20)).astype(np.float32)
    ids, counts = ts.teacher_sample(logits, 32, 20, seed=1)
    path = str(tmp_path / "sampled.mindrecord")
    _write(path, [{"input_ids": np.arange(6), "ids": ids[i], "values": counts[i]} for i in range(2)], 20, 20,
           value_dtype="float16", kind="sampled")
    read = ts.read_stored_teacher(path)
    assert [r["kind"] for r in read] == ["sampled", "sampled"] and "labels" not in read[0]
    for i, got in enumerate(read):
        np.testing.assert_array_equal(got["teacher_ids"], ids[i])
        np.testing.assert_array_equal(got["teacher_values"], counts[i].astype(np.float32))


@pytest.mark.parametrize("k, vocab, value_dtype, expected", [
    (64, 151936, "bfloat16", 384), (64, 151936, "float32", 512), (64, 32000, "bfloat16", 256),
    (64, 32000, "float16", 256), (1, 32000, "float32", 6), (256, 151936, "bfloat16", 1536),
])
def test_bytes_per_token(tmp_path, k, vocab, value_dtype, expected):
    writer = ts.TeacherStoreWriter(str(tmp_path / "empty.mindrecord"), vocab, k, value_dtype=value_dtype)
    assert writer.bytes_per_token == expected
    writer.close()
    assert ts.read_stored_teacher(str(tmp_path / "empty.mindrecord")) == []


def test_write_batch_shards_and_overwrite(tmp_path):
    path = str(tmp_path / "sharded.mindrecord")
    samples = _topk_samples(100, 4, lengths=[2, 3, 4, 5], seed=1, with_labels=False)
    for i, sample in enumerate(samples):
        sample["input_ids"][0] = i  # to find each sample again: shards may change the order
    with ts.TeacherStoreWriter(path, 100, 4, shard_num=2) as writer:
        writer.write_batch(samples)
    assert all(os.path.isfile(f) and os.path.isfile(f + ".db") for f in writer.files) and len(writer.files) == 2
    read = sorted(ts.read_stored_teacher(path), key=lambda s: s["input_ids"][0])
    assert [s["seq_len"] for s in read] == [2, 3, 4, 5]
    for sample, got in zip(samples, read):
        np.testing.assert_array_equal(got["teacher_ids"], sample["ids"])
    with pytest.raises(FileExistsError, match="overwrite"):
        ts.TeacherStoreWriter(path, 100, 4, shard_num=2)
    _write(path, samples[:1], 100, 4, shard_num=2, overwrite=True)
    assert len(ts.read_stored_teacher(path)) == 1
    # shards over a single-file store at the same path: readers look for the path itself first, so the old store
    # would be read; refused, and with overwrite=True the old file goes
    single = str(tmp_path / "single.mindrecord")
    _write(single, samples[:1], 100, 4)
    with pytest.raises(FileExistsError, match="single.mindrecord exists"):
        ts.TeacherStoreWriter(single, 100, 4, shard_num=2)
    _write(single, samples, 100, 4, shard_num=2, overwrite=True)
    assert not os.path.exists(single) and not os.path.exists(single + ".db")
    assert sorted(s["seq_len"] for s in ts.read_stored_teacher(single)) == [2, 3, 4, 5]


def test_dataset_batches_for_training(tmp_path):
    k, vocab = 4, 100
    samples = _topk_samples(vocab, k, lengths=[6, 6, 6, 6], seed=2)
    path = str(tmp_path / "train.mindrecord")
    _write(path, samples, vocab, k, value_dtype="bfloat16")
    batches = list(ts.stored_teacher_dataset(path).batch(2).create_dict_iterator(output_numpy=True, num_epochs=1))
    assert len(batches) == 2
    expected = ts.read_stored_teacher(path)
    for b, batch in enumerate(batches):
        assert list(batch) == ["input_ids", "labels", "teacher_ids", "teacher_values"]
        assert batch["input_ids"].shape == batch["labels"].shape == (2, 6)
        assert batch["teacher_ids"].shape == batch["teacher_values"].shape == (2, 6, k)
        assert batch["input_ids"].dtype == batch["labels"].dtype == batch["teacher_ids"].dtype == np.int32
        assert batch["teacher_values"].dtype == np.float32
        for i in range(2):
            want = expected[2 * b + i]
            np.testing.assert_array_equal(batch["teacher_ids"][i], want["teacher_ids"])
            np.testing.assert_array_equal(_bits(batch["teacher_values"][i]), _bits(want["teacher_values"]))
            np.testing.assert_array_equal(batch["labels"][i], want["labels"])


def test_dataset_pads_variable_lengths_and_selects_columns(tmp_path):
    samples = _topk_samples(50, 3, lengths=[2, 5], seed=3)
    path = str(tmp_path / "ragged.mindrecord")
    _write(path, samples, 50, 3, value_dtype="float16")
    dataset = ts.stored_teacher_dataset(path, pad_to=6, pad_token_id=7)
    batch = next(dataset.batch(2).create_dict_iterator(output_numpy=True, num_epochs=1))
    assert batch["teacher_ids"].shape == (2, 6, 3)
    assert (batch["labels"][0, 2:] == -100).all() and (batch["input_ids"][0, 2:] == 7).all()
    assert (batch["teacher_ids"][0, 2:] == -1).all() and (batch["teacher_values"][0, 2:] == 0).all()
    np.testing.assert_array_equal(batch["teacher_ids"][1, :5], samples[1]["ids"])
    only = ts.stored_teacher_dataset(path, columns=["teacher_values", "input_ids"])
    row = next(only.create_dict_iterator(output_numpy=True, num_epochs=1))
    assert list(row) == ["teacher_values", "input_ids"] and row["teacher_values"].shape == (2, 3)
    with pytest.raises(ValueError, match="'columns'"):
        ts.stored_teacher_dataset(path, columns=["logits"])
    with pytest.raises(ValueError, match="'pad_token_id'"):  # padded with 7 before (an int32 wrap)
        ts.stored_teacher_dataset(path, pad_to=6, pad_token_id=2**32 + 7)
    for bad in (1.5, "a", True):  # 1.5 was padded with 1
        with pytest.raises(TypeError, match="'pad_token_id'"):
            ts.stored_teacher_dataset(path, pad_to=6, pad_token_id=bad)


def test_numpy_bfloat16_inputs_are_floating(tmp_path):
    """ml_dtypes' bfloat16 arrays (numpy does not class them as floating) are taken as a bfloat16 Tensor is."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    logits = np.random.default_rng(8).standard_normal((3, 9)).astype(np.float32)
    half = logits.astype(ml_dtypes.bfloat16)
    ids, logprobs = ts.teacher_topk(half, 4)
    ref_ids, ref_logprobs = _reference_topk(half.astype(np.float64), 4)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(logprobs, ref_logprobs, rtol=1e-6)
    assert ts.teacher_sample(half, 5, 9, seed=0)[1].sum() == 15
    path = str(tmp_path / "bf16.mindrecord")
    _write(path, [{"input_ids": np.arange(3), "ids": ids, "values": logprobs.astype(ml_dtypes.bfloat16)}], 9, 4)
    np.testing.assert_array_equal(ts.read_stored_teacher(path)[0]["teacher_ids"], ids)


# ------------------------------------------------------------------------------------------- bad input
GOOD_IDS = np.array([[3, 1], [0, -1]])
GOOD_LOGPROBS = np.array([[-0.1, -2.0], [-0.5, -np.inf]], np.float32)


@pytest.mark.parametrize("kind, kwargs, name", [
    ("topk", {"ids": np.array([[3, 1], [0, 10]])}, "ids"),  # id == vocab_size
    ("topk", {"ids": np.array([[3, 1], [0, -2]])}, "ids"),
    ("topk", {"ids": np.array([[3, 3], [0, -1]])}, "ids"),  # repeated id
    ("topk", {"ids": GOOD_IDS[:1]}, "ids"),
    ("topk", {"values": np.array([[0.1, -2.0], [-0.5, -1.0]], np.float32)}, "values"),
    ("topk", {"values": np.array([[np.nan, -2.0], [-0.5, -1.0]], np.float32)}, "values"),
    ("topk", {"values": GOOD_LOGPROBS[:, :1]}, "values"),
    ("topk", {"labels": np.array([1, 2, 3])}, "labels"),
    ("topk", {"input_ids": np.array([[1, 2]])}, "input_ids"),
    ("sampled", {"values": np.array([[2, -1], [3, 0]])}, "values"),
    ("sampled", {"values": np.array([[2.5, 1], [3, 0]])}, "values"),
    ("sampled", {"values": np.array([[2, 1], [3, 1]])}, "values"),  # count at a padding id
    ("sampled", {"values": np.array([[300, 1], [3, 0]])}, "values"),  # not exact in bfloat16
    ("sampled-f32", {"values": np.array([[2**24 + 1, 1], [3, 0]])}, "values"),  # float32 would round it to 2**24
], ids=["id=V", "id<-1", "repeated-id", "ids-shape", "logprob>0", "nan", "values-shape",
        "labels-shape", "input_ids-shape", "negative-count", "fractional-count", "count-at-padding",
        "count-not-exact", "count-not-exact-float32"])
def test_bad_writes_name_the_argument_and_write_nothing(tmp_path, kind, kwargs, name):
    kind, value_dtype = (kind, "bfloat16") if kind != "sampled-f32" else ("sampled", "float32")
    good_values = GOOD_LOGPROBS if kind == "topk" else np.array([[2, 1], [3, 0]])
    sample = {"input_ids": np.array([5, 6]), "ids": GOOD_IDS, "values": good_values, "labels": np.array([6, -100])}
    sample.update(kwargs)
    with ts.TeacherStoreWriter(str(tmp_path / "bad.mindrecord"), 10, 2, kind=kind, value_dtype=value_dtype) as writer:
        with pytest.raises(ValueError, match=f"'{name}'"):
            writer.write(**sample)
        assert writer.tokens_written == 0
        writer.write(np.array([5, 6]), GOOD_IDS, good_values, labels=np.array([6, -100]))
        with pytest.raises(ValueError, match="'labels'"):  # labels in every sample or in none
            writer.write(np.array([5, 6]), GOOD_IDS, good_values)
    assert len(ts.read_stored_teacher(str(tmp_path / "bad.mindrecord"))) == 1


@pytest.mark.parametrize("kwargs, name", [
    ({"value_dtype": "int8"}, "value_dtype"), ({"kind": "dense"}, "kind"), ({"shard_num": 0}, "shard_num"),
    ({"vocab_size": 0}, "vocab_size"), ({"k": 0}, "k"),
])
def test_bad_writer_arguments(tmp_path, kwargs, name):
    arguments = {"path": str(tmp_path / "x.mindrecord"), "vocab_size": 10, "k": 2, **kwargs}
    with pytest.raises(ValueError, match=f"'{name}'"):
        ts.TeacherStoreWriter(**arguments)
    with pytest.raises(FileNotFoundError, match="'path'"):
        ts.TeacherStoreWriter(str(tmp_path / "missing" / "x.mindrecord"), 10, 2)


# ------------------------------------------------------------------------- argument types and values
LOGITS = np.zeros((2, 5), np.float32)
HIDDEN, WEIGHT = np.zeros((2, 4), np.float32), np.zeros((5, 4), np.float32)


def _writer(tmp_path, **kwargs):
    return ts.TeacherStoreWriter(str(tmp_path / "w.mindrecord"), 10, 2, **kwargs)


def _write_one(tmp_path, **kwargs):
    sample = {"input_ids": np.array([5, 6]), "ids": GOOD_IDS, "values": GOOD_LOGPROBS, **kwargs}
    with _writer(tmp_path) as writer:
        writer.write(**sample)


def _write_batch(tmp_path, samples):
    with _writer(tmp_path) as writer:
        writer.write_batch(samples)


# (call of tmp_path, exception, the argument its message names); a wrong type is a TypeError, a wrong value of
# the right type a ValueError; a bool is no int.
BAD_ARGUMENTS = {
    "topk-k-float": (lambda p: ts.teacher_topk(LOGITS, k=2.0), TypeError, "k"),
    "topk-k-bool": (lambda p: ts.teacher_topk(LOGITS, k=True), TypeError, "k"),
    "topk-k-str": (lambda p: ts.teacher_topk(LOGITS, k="2"), TypeError, "k"),
    "topk-chunk_rows-float": (lambda p: ts.teacher_topk(LOGITS, 2, chunk_rows=4.0), TypeError, "chunk_rows"),
    "topk-chunk_rows-bool": (lambda p: ts.teacher_topk(LOGITS, 2, chunk_rows=True), TypeError, "chunk_rows"),
    "topk-int-logits": (lambda p: ts.teacher_topk(np.zeros((2, 5), np.int32), 2), TypeError, "logits"),
    "topk-int-tensor": (lambda p: ts.teacher_topk(ms.Tensor(np.zeros((2, 5), np.int32)), 2), TypeError, "logits"),
    "topk-bool-logits": (lambda p: ts.teacher_topk(np.zeros((2, 5), bool), 2), TypeError, "logits"),
    "topk-complex-logits": (lambda p: ts.teacher_topk(np.zeros((2, 5), complex), 2), TypeError, "logits"),
    "topk-None-logits": (lambda p: ts.teacher_topk(None, 2), TypeError, "logits"),
    "topk-str-logits": (lambda p: ts.teacher_topk("logits", 2), TypeError, "logits"),
    "topk-str-array-logits": (lambda p: ts.teacher_topk([["a", "b"]], 1), TypeError, "logits"),
    "topk-V=0": (lambda p: ts.teacher_topk(np.zeros((2, 0), np.float32), 1), ValueError, "logits"),
    "topk-0d-logits": (lambda p: ts.teacher_topk(np.float32(1.0), 1), ValueError, "logits"),
    "hidden-int": (lambda p: ts.teacher_topk_from_hidden(HIDDEN.astype(int), WEIGHT, 2), TypeError, "hidden"),
    "hidden-None": (lambda p: ts.teacher_topk_from_hidden(None, WEIGHT, 2), TypeError, "hidden"),
    "weight-int": (lambda p: ts.teacher_topk_from_hidden(HIDDEN, WEIGHT.astype(int), 2), TypeError, "weight"),
    "weight-int-with-tensor": (lambda p: ts.teacher_topk_from_hidden(ms.Tensor(HIDDEN), WEIGHT.astype(np.int32), 2),
                               TypeError, "weight"),
    "bias-int": (lambda p: ts.teacher_topk_from_hidden(HIDDEN, WEIGHT, 2, bias=np.zeros(5, int)), TypeError, "bias"),
    "weight-V=0": (lambda p: ts.teacher_topk_from_hidden(HIDDEN, np.zeros((0, 4), np.float32), 1), ValueError,
                   "weight"),
    "hidden-k-float": (lambda p: ts.teacher_topk_from_hidden(HIDDEN, WEIGHT, 2.0), TypeError, "k"),
    "hidden-chunk_rows-str": (lambda p: ts.teacher_topk_from_hidden(HIDDEN, WEIGHT, 2, chunk_rows="8"), TypeError,
                              "chunk_rows"),
    "sample-V=0": (lambda p: ts.teacher_sample(np.zeros((2, 0), np.float32), 4, 4, seed=0), ValueError, "logits"),
    "sample-int-logits": (lambda p: ts.teacher_sample(np.zeros((2, 5), np.int64), 4, 4, seed=0), TypeError,
                          "logits"),
    "sample-num_samples-float": (lambda p: ts.teacher_sample(LOGITS, 4.0, 4, seed=0), TypeError, "num_samples"),
    "sample-num_samples-bool": (lambda p: ts.teacher_sample(LOGITS, True, 4, seed=0), TypeError, "num_samples"),
    "sample-k-float": (lambda p: ts.teacher_sample(LOGITS, 4, 1.5, seed=0), TypeError, "k"),
    "sample-k-0": (lambda p: ts.teacher_sample(LOGITS, 4, 0, seed=0), ValueError, "k"),
    "sample-chunk_rows-0": (lambda p: ts.teacher_sample(LOGITS, 4, 4, seed=0, chunk_rows=0), ValueError,
                            "chunk_rows"),
    "sample-seed-str": (lambda p: ts.teacher_sample(LOGITS, 4, 4, seed="a"), TypeError, "seed"),
    "sample-seed-float": (lambda p: ts.teacher_sample(LOGITS, 4, 4, seed=1.5), TypeError, "seed"),
    "sample-seed-bool": (lambda p: ts.teacher_sample(LOGITS, 4, 4, seed=True), TypeError, "seed"),
    "sample-seed-negative": (lambda p: ts.teacher_sample(LOGITS, 4, 4, seed=-1), ValueError, "seed"),
    "sample-seed-negative-entry": (lambda p: ts.teacher_sample(LOGITS, 4, 4, seed=[1, -2]), ValueError, "seed"),
    "writer-path-int": (lambda p: ts.TeacherStoreWriter(5, 10, 2), TypeError, "path"),
    "writer-path-bytes": (lambda p: ts.TeacherStoreWriter(os.fsencode(p / "x.mindrecord"), 10, 2), TypeError,
                          "path"),
    "writer-path-empty": (lambda p: ts.TeacherStoreWriter("", 10, 2), ValueError, "path"),
    "writer-path-directory": (lambda p: ts.TeacherStoreWriter(p, 10, 2, overwrite=True), ValueError, "path"),
    "writer-vocab_size-str": (lambda p: ts.TeacherStoreWriter(p / "x.mindrecord", "8", 2), TypeError,
                              "vocab_size"),
    "writer-vocab_size-float": (lambda p: ts.TeacherStoreWriter(p / "x.mindrecord", 8.0, 2), TypeError,
                                "vocab_size"),
    "writer-vocab_size-bool": (lambda p: ts.TeacherStoreWriter(p / "x.mindrecord", True, 1), TypeError,
                               "vocab_size"),
    "writer-vocab_size-2**31": (lambda p: ts.TeacherStoreWriter(p / "x.mindrecord", 2**31, 2), ValueError,
                                "vocab_size"),
    "writer-k-float": (lambda p: ts.TeacherStoreWriter(p / "x.mindrecord", 10, 2.0), TypeError, "k"),
    "writer-value_dtype-list": (lambda p: _writer(p, value_dtype=["x"]), TypeError, "value_dtype"),
    "writer-value_dtype-numpy": (lambda p: _writer(p, value_dtype=np.float16), TypeError, "value_dtype"),
    "writer-kind-list": (lambda p: _writer(p, kind=["topk"]), TypeError, "kind"),
    "writer-shard_num-float": (lambda p: _writer(p, shard_num=2.0), TypeError, "shard_num"),
    "writer-shard_num-1001": (lambda p: _writer(p, shard_num=1001), ValueError, "shard_num"),
    "writer-overwrite-str": (lambda p: _writer(p, overwrite="yes"), TypeError, "overwrite"),
    "writer-overwrite-int": (lambda p: _writer(p, overwrite=1), TypeError, "overwrite"),
    "write-ids-None": (lambda p: _write_one(p, ids=None), TypeError, "ids"),
    "write-ids-float": (lambda p: _write_one(p, ids=GOOD_IDS.astype(np.float32)), TypeError, "ids"),
    "write-values-None": (lambda p: _write_one(p, values=None), TypeError, "values"),
    "write-values-str": (lambda p: _write_one(p, values=[["a", "b"], ["c", "d"]]), TypeError, "values"),
    "write-values-bool": (lambda p: _write_one(p, values=np.zeros((2, 2), bool)), TypeError, "values"),
    "write-input_ids-float": (lambda p: _write_one(p, input_ids=np.array([5.0, 6.0])), TypeError, "input_ids"),
    "write-labels-float": (lambda p: _write_one(p, labels=np.array([1.0, 2.0])), TypeError, "labels"),
    "write_batch-int": (lambda p: _write_batch(p, 5), TypeError, "samples"),
    "write_batch-dict": (lambda p: _write_batch(p, {"input_ids": [1], "ids": [[1, 2]], "values": [[0, 0]]}),
                         TypeError, "samples"),
    "write_batch-not-dicts": (lambda p: _write_batch(p, [5]), TypeError, "samples"),
    "write_batch-missing-key": (lambda p: _write_batch(p, [{"input_ids": np.array([5, 6]), "ids": GOOD_IDS}]),
                                ValueError, "samples"),
    "read-path-None": (lambda p: ts.read_stored_teacher(None), TypeError, "path"),
    "dataset-path-int": (lambda p: ts.stored_teacher_dataset(5), TypeError, "path"),
    "dataset-columns-int": (lambda p: ts.stored_teacher_dataset(p / "x", columns=5), TypeError, "columns"),
    "dataset-columns-not-str": (lambda p: ts.stored_teacher_dataset(p / "x", columns=[1]), TypeError, "columns"),
    "dataset-columns-repeated": (lambda p: ts.stored_teacher_dataset(p / "x", columns=["input_ids", "input_ids"]),
                                 ValueError, "columns"),
    "dataset-shuffle-str": (lambda p: ts.stored_teacher_dataset(p / "x", shuffle="yes"), TypeError, "shuffle"),
    "dataset-workers-float": (lambda p: ts.stored_teacher_dataset(p / "x", num_parallel_workers=1.0), TypeError,
                              "num_parallel_workers"),
    "dataset-workers-0": (lambda p: ts.stored_teacher_dataset(p / "x", num_parallel_workers=0), ValueError,
                          "num_parallel_workers"),
    "dataset-pad_to-float": (lambda p: ts.stored_teacher_dataset(p / "x", pad_to=8.0), TypeError, "pad_to"),
    "dataset-pad_to-bool": (lambda p: ts.stored_teacher_dataset(p / "x", pad_to=True), TypeError, "pad_to"),
    "dataset-pad_to-0": (lambda p: ts.stored_teacher_dataset(p / "x", pad_to=0), ValueError, "pad_to"),
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_raise_the_right_error_naming_them(tmp_path, case):
    call, error, name = BAD_ARGUMENTS[case]
    with pytest.raises(error, match=f"'{name}'") as info:
        call(tmp_path)
    assert type(info.value) is error  # not a subclass (FileNotFoundError is an OSError, not this)
    for path in tmp_path.iterdir():  # a refused writer made no file; a refused write committed none
        assert path.name.startswith("w.mindrecord") and not ts.read_stored_teacher(str(tmp_path / "w.mindrecord"))


def test_numpy_ints_seeds_and_bools_are_still_accepted(tmp_path):
    ids, logprobs = ts.teacher_topk(LOGITS, np.int64(2), chunk_rows=np.int32(1))
    assert ids.shape == (2, 2)
    reference = ts.teacher_sample(LOGITS, 8, 5, seed=3)
    for seed in (np.int64(3), np.array(3), np.random.SeedSequence(3)):
        np.testing.assert_array_equal(ts.teacher_sample(LOGITS, np.int64(8), np.int16(5), seed=seed)[1],
                                      reference[1])
    for seed in (None, [1, 2], np.array([1, 2]), np.random.default_rng(0)):
        assert ts.teacher_sample(LOGITS, 8, 5, seed=seed)[1].sum() == 16
    path = tmp_path / "np.mindrecord"  # an os.PathLike
    with ts.TeacherStoreWriter(path, np.int64(10), np.int32(2), overwrite=np.bool_(False)) as writer:
        writer.write(np.array([5, 6]), GOOD_IDS, GOOD_LOGPROBS)
    rows = ts.stored_teacher_dataset(path, columns="teacher_ids", shuffle=np.bool_(False),
                                     num_parallel_workers=np.int64(1), pad_to=np.int64(3), pad_token_id=np.int32(0))
    assert next(rows.create_dict_iterator(output_numpy=True, num_epochs=1))["teacher_ids"].shape == (3, 2)
