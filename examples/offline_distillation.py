"""Offline distillation: the teacher runs once, its top-k goes to MindRecord, the student trains from the file.

A synthetic language over 512 tokens, sampled from a random-weight teacher (token + previous-token embeddings ->
MLP -> head). The teacher's top-16 log-probabilities per token (bfloat16, int16 ids: 64 bytes against 2 KB of
float32 logits) are dumped with teacher_topk_from_hidden to a MindRecord store in a temporary directory. A smaller
student trains in GRAPH_MODE (nn.TrainOneStepCell) from the same initial weights over the same batches against:
the live teacher's full logits (DistillationLoss), then only stored_teacher_dataset batches with
SparseDistillationLoss mode="tail" and mode="renormalize". Each run prints KL(teacher || student) per token on
held-out sequences; the last line sums it up. About 10 s on 2 CPU cores.

    python examples/offline_distillation.py [--steps 300] [--k 16]
"""
import argparse
import itertools
import os
import shutil
import tempfile
import time

import numpy as np

import ms_kldiv  # first: keeps MindSpore's compiler files out of the working directory
import mindspore as ms
from mindspore import nn, ops
from ms_kldiv.teacher_store import TeacherStoreWriter, stored_teacher_dataset, teacher_topk_from_hidden

VOCAB = 512


class LM(nn.Cell):
    """Next-token logits from the token and the one before it (0 before the first): causal by construction."""

    def __init__(self, hidden):
        super().__init__()
        self.cur, self.prev = nn.Embedding(VOCAB, hidden), nn.Embedding(VOCAB, hidden)
        self.mlp = nn.SequentialCell([nn.Tanh(), nn.Dense(hidden, hidden), nn.ReLU()])
        self.head = nn.Dense(hidden, VOCAB)

    def hidden(self, ids):  # the last hidden states: what teacher_topk_from_hidden takes, with head.weight
        prev = ops.concat([ops.zeros_like(ids[:, :1]), ids[:, :-1]], 1)
        return self.mlp(self.cur(ids) + self.prev(prev))

    def construct(self, ids):
        return self.head(self.hidden(ids))


class KDLoss(nn.Cell):
    """Distillation (+ an optional hard-label cross-entropy) of `student`: against the live teacher's full logits
    when `teacher` is given, else against the stored top-k ids and log-probabilities that come with each batch."""

    def __init__(self, student, args, teacher=None, mode="tail"):
        super().__init__()
        self.student, self.teacher, self.ce_weight = student, teacher, args.ce_weight
        self.kd = (ms_kldiv.DistillationLoss(args.temperature, "tokenmean") if teacher is not None else
                   ms_kldiv.SparseDistillationLoss(mode, args.temperature, "tokenmean"))
        self.ce = nn.CrossEntropyLoss()

    def construct(self, input_ids, labels, *stored_teacher):
        logits = self.student(input_ids)
        if self.teacher is None:
            loss = self.kd(logits, *stored_teacher)
        else:
            loss = self.kd(logits, ops.stop_gradient(self.teacher(input_ids)))
        if self.ce_weight > 0:
            loss = loss + self.ce_weight * self.ce(logits.reshape(-1, VOCAB), labels.reshape(-1))
        return loss


def sample_corpus(teacher, n, seq_len, rng):
    """n sequences of seq_len + 1 tokens drawn from the teacher (Gumbel-max), a window of two tokens per step."""
    ids = np.zeros((n, seq_len + 2), np.int32)  # column 0: the 0 the model sees before the first token
    ids[:, 1] = rng.integers(0, VOCAB, n)
    for t in range(seq_len):
        logits = teacher(ms.Tensor(ids[:, t:t + 2]))[:, 1].asnumpy()
        ids[:, t + 2] = np.argmax(logits + rng.gumbel(size=logits.shape), -1)
    return ids[:, 1:-1], ids[:, 2:]  # input_ids, labels (the next tokens)


def held_out_kl(student, teacher, input_ids):
    ids = ms.Tensor(input_ids)
    return float(ms_kldiv.distillation_loss(student(ids), teacher(ids), 1.0, "tokenmean").asnumpy())


def train(loss_cell, batches, steps, lr):
    step = nn.TrainOneStepCell(loss_cell, nn.Adam(loss_cell.student.trainable_params(), learning_rate=lr))
    step.set_train()
    for batch in itertools.islice(batches, steps):
        step(*batch)
    loss_cell.student.set_train(False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sequences", type=int, default=384, help="training sequences in the store")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--k", type=int, default=16, help="teacher ids kept per token")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--ce-weight", type=float, default=0.0, help="weight of a hard-label cross-entropy term")
    args = parser.parse_args()
    if not 1 <= args.batch <= args.sequences:  # an empty epoch would make the repeated dataset spin forever
        parser.error("--batch must be between 1 and --sequences")

    ms.set_context(mode=ms.GRAPH_MODE)
    start = time.time()
    rng = np.random.default_rng(args.seed)
    ms.set_seed(args.seed)
    teacher = LM(128)
    # Random weights at unit scale: a peaked, far from one-hot teacher (entropy ~2.5-2.9 nats, top-16 ~80-86%).
    for weight in (teacher.cur.embedding_table, teacher.prev.embedding_table, teacher.head.weight):
        weight.set_data(ms.Tensor(rng.normal(0, 1, (VOCAB, 128)), ms.float32))
    teacher.set_train(False)
    input_ids, labels = sample_corpus(teacher, args.sequences, args.seq_len, rng)
    eval_ids, _ = sample_corpus(teacher, 64, args.seq_len, rng)
    probs = ops.softmax(teacher(ms.Tensor(eval_ids)), -1).asnumpy()
    entropy = float(-(probs * np.log(np.maximum(probs, 1e-30))).sum(-1).mean())
    top_mass = float(np.sort(probs, -1)[..., -args.k:].sum(-1).mean())
    print(f"teacher: V={VOCAB}, {args.sequences} training + 64 held-out sequences of {args.seq_len} tokens; "
          f"entropy {entropy:.2f} nats/token, top-{args.k} holds {top_mass:.1%} of the probability")

    workdir = tempfile.mkdtemp(prefix="ms_kldiv_offline_")
    try:
        path = os.path.join(workdir, "teacher.mindrecord")
        with TeacherStoreWriter(path, VOCAB, args.k, value_dtype="bfloat16") as writer:
            for i in range(0, args.sequences, 64):  # 64 sequences at a time; [rows, V] only 512 rows at a time
                hidden = teacher.hidden(ms.Tensor(input_ids[i:i + 64]))
                ids, logprobs = teacher_topk_from_hidden(hidden, teacher.head.weight, args.k,
                                                         bias=teacher.head.bias, chunk_rows=512)
                writer.write_batch([dict(input_ids=a, ids=b, values=c, labels=d) for a, b, c, d
                                    in zip(input_ids[i:i + 64], ids, logprobs, labels[i:i + 64])])
        # Blocks on disk, not getsize: MindRecord leaves a 48 MiB hole (never written, sparse) in each data file.
        disk = sum(os.stat(os.path.join(workdir, f)).st_blocks * 512 for f in os.listdir(workdir))
        dense = writer.tokens_written * VOCAB * 4
        print(f"store: {writer.tokens_written} tokens, top-{args.k} bfloat16 + {writer.id_dtype} ids = "
              f"{writer.bytes_per_token} bytes/token; {disk / 1e6:.2f} MB on disk vs {dense / 1e6:.2f} MB of "
              f"float32 logits ({dense / disk:.0f}x smaller)")

        def fresh_student():
            ms.set_seed(args.seed + 1)  # every run starts from the same weights
            return LM(32)

        results = {"untrained": held_out_kl(fresh_student(), teacher, eval_ids)}
        print(f"held-out KL(teacher || student), nats/token, after {args.steps} steps of {args.batch} sequences:\n"
              f"  {'untrained':<28} {results['untrained']:.4f}")
        names = {"dense": "dense logits (live teacher)", "tail": f"top-{args.k} store, tail",
                 "renormalize": f"top-{args.k} store, renormalize"}
        for run in names:
            student = fresh_student()
            if run == "dense":  # the live teacher over the batches the store holds, in its order (shuffle=False)
                starts = itertools.cycle(range(0, args.sequences - args.batch + 1, args.batch))
                batches = ((ms.Tensor(input_ids[j:j + args.batch]), ms.Tensor(labels[j:j + args.batch]))
                           for j in starts)
                loss = KDLoss(student, args, teacher)
            else:  # only the store: the teacher is idle
                stored = stored_teacher_dataset(path, columns=["input_ids", "labels", "teacher_ids", "teacher_values"])
                batches = stored.batch(args.batch, drop_remainder=True).repeat().create_tuple_iterator(num_epochs=1)
                loss = KDLoss(student, args, mode=run)
            train(loss, batches, args.steps, args.lr)
            results[run] = held_out_kl(student, teacher, eval_ids)
            print(f"  {names[run]:<28} {results[run]:.4f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"offline_distillation: untrained_kl={results['untrained']:.4f} dense_kl={results['dense']:.4f} "
          f"topk_tail_kl={results['tail']:.4f} topk_renormalize_kl={results['renormalize']:.4f} "
          f"ratio={results['tail'] / results['dense']:.3f} bytes_per_token={writer.bytes_per_token} "
          f"seconds={time.time() - start:.1f}")


if __name__ == "__main__":
    main()
