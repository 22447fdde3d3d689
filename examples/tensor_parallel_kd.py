"""Tensor-parallel (vocabulary-parallel) distillation of an LM head with ms_kldiv, launched by msrun.

Each rank holds a contiguous slice of the vocabulary: its rows of the student's head weight and bias and of the
teacher's head (`W[V_r, H]`), as a tensor-parallel LLM shards its output layer. The body producing the hidden
states is replicated. FusedLinearDistillationLoss(vocab_parallel_group=...) gives every rank the loss of the whole
vocabulary and the gradients of its slices (d(hidden) summed over the group), without any rank holding the
[N, V] logits. Run it on 2 CPU workers as

    msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=8119 --join=True \\
          --log_dir=$(mktemp -d) examples/tensor_parallel_kd.py

(Ascend: the same line with the workers on NPUs, HCCL; GPU: NCCL; see docs/vocab_parallel.md). The workers'
output lands in worker_<r>.log under --log_dir. Without msrun it trains the same model in one process on the whole
vocabulary: the reference the sliced run reproduces (`--out DIR` writes each run's losses and parameters).
"""
import argparse
import json
import os

import numpy as np

import ms_kldiv  # first: keeps MindSpore's compiler files out of the working directory
import mindspore as ms
from mindspore import nn, ops

ROWS, FEATURES, HIDDEN, VOCAB = 64, 16, 32, 1001  # 1001: the slices are uneven (500 + 501 on 2 ranks)


def launched_by_msrun():
    # msrun runs this script in every worker (MS_WORKER) and once as the scheduler (MS_SCHED); both call init()
    return os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED")


class Student(nn.Cell):
    """A replicated body and this rank's slice [lo, hi) of the output head."""

    def __init__(self, rng, lo, hi):
        super().__init__()
        body = (rng.standard_normal((FEATURES, HIDDEN)) * 0.4).astype(np.float32)
        head = (rng.standard_normal((VOCAB, HIDDEN)) * 0.2).astype(np.float32)
        self.body = ms.Parameter(ms.Tensor(body), name="body")
        self.head = ms.Parameter(ms.Tensor(head[lo:hi]), name="head")
        self.bias = ms.Parameter(ms.Tensor(np.zeros(hi - lo, np.float32)), name="bias")

    def construct(self, x):
        return ops.tanh(ops.matmul(x, self.body))


class DistillStep(nn.Cell):
    def __init__(self, student, teacher_head, loss):
        super().__init__()
        self.student, self.loss = student, loss
        self.teacher_head = ms.Parameter(teacher_head, name="teacher_head", requires_grad=False)

    def construct(self, x, teacher_hidden, labels):
        return self.loss(self.student(x), self.student.head, teacher_hidden, self.teacher_head, labels,
                         self.student.bias)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--graph", action="store_true", help="GRAPH_MODE (default PyNative)")
    parser.add_argument("--out", help="write losses and parameters here (JSON / npz)")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if args.graph else ms.PYNATIVE_MODE)
    group, rank, size = None, 0, 1
    if launched_by_msrun():
        from mindspore.communication import GlobalComm, get_group_size, get_rank, init
        init()
        group, rank, size = GlobalComm.WORLD_COMM_GROUP, get_rank(), get_group_size()
    lo, hi = VOCAB * rank // size, VOCAB * (rank + 1) // size

    rng = np.random.default_rng(0)  # the same data and initial weights in every process
    teacher_head = ms.Tensor((rng.standard_normal((VOCAB, HIDDEN)) * 0.5).astype(np.float32)[lo:hi])
    x = ms.Tensor(rng.standard_normal((ROWS, FEATURES)).astype(np.float32))
    teacher_hidden = ms.Tensor(rng.standard_normal((ROWS, HIDDEN)).astype(np.float32))
    labels_np = rng.integers(0, VOCAB, ROWS).astype(np.int32)
    labels_np[::8] = -100  # ignored tokens
    labels = ms.Tensor(labels_np)
    student = Student(rng, lo, hi)
    loss = ms_kldiv.FusedLinearDistillationLoss(2.0, hard_weight=0.5, chunk_size=16, vocab_parallel_group=group)
    step = nn.TrainOneStepCell(DistillStep(student, teacher_head, loss),
                               nn.SGD(student.trainable_params(), learning_rate=1.0))
    losses = [float(step(x, teacher_hidden, labels).asnumpy()) for _ in range(args.steps)]
    print(f"rank {rank}/{size}: vocabulary [{lo}, {hi}) of {VOCAB}; loss {losses[0]:.6f} -> {losses[-1]:.6f} "
          f"after {args.steps} steps", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        tag = f"rank{rank}" if group is not None else "single"
        with open(os.path.join(args.out, f"losses_{tag}.json"), "w") as f:
            json.dump({"losses": losses, "lo": lo, "hi": hi}, f)
        np.savez(os.path.join(args.out, f"params_{tag}.npz"),
                 **{p.name.split(".")[-1]: p.asnumpy() for p in student.trainable_params()})


if __name__ == "__main__":
    main()
