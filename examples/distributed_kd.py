"""Data-parallel knowledge distillation with ms_kldiv.KLDivLoss, launched by msrun (2 CPU workers, mccl backend).

Each worker takes its half of every global batch; nn.TrainOneStepCell averages the gradients across workers
(data-parallel mode, gradients_mean=True), so both ranks apply the same update and training is equivalent to one
process on the whole batch. Run it as

    msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=8118 --join=True \\
          --log_dir=$(mktemp -d) examples/distributed_kd.py

(the workers' output lands in worker_0.log / worker_1.log under --log_dir). Run without msrun, it trains the same
model in one process on the full batches, which is the reference the distributed run must reproduce.
`--out DIR` writes each rank's final parameters to DIR/params_rank<r>.npz (DIR/params_single.npz without msrun).
"""
import argparse
import os
import time

import numpy as np

import ms_kldiv  # first: keeps MindSpore's compiler files out of the working directory
import mindspore as ms
from mindspore import nn, ops

N_FEATURES, N_HIDDEN, N_CLASSES = 16, 32, 8
GLOBAL_BATCH = 32


def launched_by_msrun():
    # msrun runs this script in every worker (MS_ROLE=MS_WORKER) and once more as the scheduler (MS_SCHED),
    # whose init() serves the cluster and ends the process; both must call init().
    return os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED")


def make_data(steps, seed=0):
    """Global batches (features, hard labels, teacher logits), identical in every process."""
    rng = np.random.default_rng(seed)
    w_teacher = rng.standard_normal((N_FEATURES, N_CLASSES)) * 1.5
    x = rng.standard_normal((steps, GLOBAL_BATCH, N_FEATURES)).astype(np.float32)
    teacher_logits = (x @ w_teacher).astype(np.float32)
    labels = teacher_logits.argmax(-1).astype(np.int32)
    return x, labels, teacher_logits


class Student(nn.Cell):
    def __init__(self, seed=1):
        super().__init__()
        self.fc1 = nn.Dense(N_FEATURES, N_HIDDEN)
        self.fc2 = nn.Dense(N_HIDDEN, N_CLASSES)
        self.relu = nn.ReLU()
        # Weights from NumPy with a fixed seed: every process starts from exactly the same point.
        rng = np.random.default_rng(seed)
        for p in self.trainable_params():
            p.set_data(ms.Tensor((rng.standard_normal(p.shape) * 0.3).astype(np.float32)))

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


class KDLoss(nn.Cell):
    def __init__(self, net, temperature=2.0, alpha=0.5):
        super().__init__()
        self.net = net
        self.ce = nn.CrossEntropyLoss()
        self.kl = ms_kldiv.KLDivLoss(reduction="batchmean", log_target=True)
        self.t = temperature
        self.alpha = alpha

    def construct(self, x, y, teacher_logits):
        logits = self.net(x)
        kd = self.kl(ops.log_softmax(logits / self.t, -1),
                     ops.stop_gradient(ops.log_softmax(teacher_logits / self.t, -1))) * (self.t * self.t)
        return self.alpha * self.ce(logits, y) + (1 - self.alpha) * kd


class FusedHeadKDLoss(nn.Cell):
    """The same objective with the student's last layer inside FusedLinearDistillationLoss: the head's logits
    are made chunk by chunk and never held whole (what a large-vocabulary student needs)."""

    def __init__(self, net, temperature=2.0, alpha=0.5):
        super().__init__()
        self.net = net
        self.loss = ms_kldiv.FusedLinearDistillationLoss(temperature, hard_weight=alpha, soft_weight=1 - alpha,
                                                         chunk_size=5)

    def construct(self, x, y, teacher_logits):
        hidden = self.net.relu(self.net.fc1(x))
        return self.loss.from_teacher_logits(hidden, self.net.fc2.weight, teacher_logits, y, self.net.fc2.bias)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=None, help="directory for the final parameters (.npz per rank)")
    parser.add_argument("--loss", choices=("kldiv", "fused-linear"), default="kldiv",
                        help="KLDivLoss on the logits, or FusedLinearDistillationLoss on the last hidden layer")
    args = parser.parse_args()
    start = time.time()
    ms.set_context(mode=ms.GRAPH_MODE)

    if launched_by_msrun():
        from mindspore.communication import get_group_size, get_rank, init
        init()  # mccl on CPU, chosen by MindSpore
        rank, size = get_rank(), get_group_size()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    else:
        rank, size = 0, 1
    if GLOBAL_BATCH % size:
        raise SystemExit(f"the global batch {GLOBAL_BATCH} does not split evenly over {size} workers")
    shard = slice(rank * GLOBAL_BATCH // size, (rank + 1) * GLOBAL_BATCH // size)

    x, labels, teacher_logits = make_data(args.steps)
    net = Student()
    loss_net = KDLoss(net) if args.loss == "kldiv" else FusedHeadKDLoss(net)
    step = nn.TrainOneStepCell(loss_net, nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9))
    step.set_train()
    losses = []
    for i in range(args.steps):
        loss = step(ms.Tensor(x[i, shard]), ms.Tensor(labels[i, shard]), ms.Tensor(teacher_logits[i, shard]))
        losses.append(float(loss.asnumpy()))

    net.set_train(False)
    acc = float((net(ms.Tensor(x.reshape(-1, N_FEATURES))).asnumpy().argmax(-1) == labels.reshape(-1)).mean())
    print(f"rank {rank}/{size}: local batch {shard.stop - shard.start}, {args.steps} steps, "
          f"local loss {losses[0]:.4f} -> {losses[-1]:.4f}, agreement with teacher {acc:.3f}, "
          f"{time.time() - start:.1f} s", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = f"params_rank{rank}.npz" if size > 1 else "params_single.npz"
        np.savez(os.path.join(args.out, name), **{p.name: p.asnumpy() for p in net.trainable_params()})


if __name__ == "__main__":
    main()
