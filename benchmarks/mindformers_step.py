"""A MindFormers distillation training step in GRAPH_MODE: the fused head against the model's own logits path.

Teacher LlamaForCausalLM (4 layers) frozen, student (2 layers) trained with nn.TrainOneStepCell and Adam, float32,
T = 2. Rows, each in its own process (a fresh peak-memory high-water mark, no shared compile cache):
  fused   FusedLinearDistillationLoss on the hidden states [B, S, H] and both heads' weights (teacher_grad=False);
  logits  the models' lm_head logits [B*S, V] and DistillationLoss (what a user writes without the fused head);
  body    no head at all (the loss is the mean square of the student's hidden states; the teacher still runs):
          what the step costs without any loss head, so that each head's own time and memory are the differences.
Columns: the first step (compile included), the median of the timed steps, and the peak resident memory of the
timed steps above what the process held with the models built and the batch made (the logits, their gradients and
the step's other buffers; the first step's peak, the compile's included, is in the JSON rows).

    python benchmarks/mindformers_step.py                              # vocabulary 32000, 4 x 256 tokens, H 128
    python benchmarks/mindformers_step.py --vocab 64000 --seq 512 --steps 5
Needs MindFormers (pip install "mindspore==2.9.0" "mindformers==1.9.0" "numpy<2"). docs/mindformers.md quotes it.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

PATHS = ("fused", "logits", "body")


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb():
    """The resident high-water mark since the last reset_peak() (the whole process's without one)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak():
    # Linux: writing 5 to clear_refs resets VmHWM, so that the timed steps' peak excludes the graph compile's.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def one_row(args):
    os.environ.setdefault("LOG_MF_PATH", os.path.join(tempfile.gettempdir(), "ms_kldiv-mindformers-log"))
    os.environ.setdefault("GLOG_v", "3")
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops
    from mindformers import LlamaConfig, LlamaForCausalLM
    import ms_kldiv

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)

    def llama(layers):
        return LlamaForCausalLM(LlamaConfig(
            batch_size=args.batch, seq_length=args.seq, hidden_size=args.hidden, num_layers=layers, num_heads=4,
            intermediate_size=2 * args.hidden, vocab_size=args.vocab, compute_dtype="float32",
            param_init_type="float32", layernorm_compute_type="float32", softmax_compute_type="float32",
            rotary_dtype="float32", use_rope_slice=True, use_flash_attention=False, fused_rms_norm=False))

    class Distill(nn.Cell):
        def __init__(self, student, teacher, path):
            super().__init__()
            self.student, self.teacher, self.path = student, teacher, path
            self.kd = ms_kldiv.FusedLinearDistillationLoss(2.0, teacher_grad=False, chunk_bytes=args.chunk_bytes)
            self.kd_logits = ms_kldiv.DistillationLoss(2.0)

        def construct(self, tokens, labels):
            hidden = self.student.model(tokens)
            teacher_hidden = ops.stop_gradient(self.teacher.model(tokens))
            if self.path == "body":
                return ops.mean(hidden * hidden) + 0.0 * ops.mean(teacher_hidden)
            if self.path == "fused":
                return self.kd(hidden, self.student.lm_head.weight, teacher_hidden, self.teacher.lm_head.weight,
                               labels)
            logits = ops.reshape(self.student.lm_head(hidden), (-1, args.vocab))
            teacher_logits = ops.reshape(self.teacher.lm_head(teacher_hidden), (-1, args.vocab))
            return self.kd_logits(logits, teacher_logits, ops.reshape(labels, (-1,)))

    teacher, student = llama(4), llama(2)
    for p in teacher.get_parameters():
        p.requires_grad = False
    rng = np.random.default_rng(0)
    tokens = ms.Tensor(rng.integers(1, args.vocab, (args.batch, args.seq)), ms.int32)
    labels = ms.Tensor(rng.integers(0, args.vocab, (args.batch, args.seq)), ms.int32)
    step = nn.TrainOneStepCell(Distill(student, teacher, args.path),
                               nn.Adam(student.trainable_params(), learning_rate=1e-3))
    base = rss_mb()
    start = time.perf_counter()
    loss = float(step(tokens, labels).asnumpy())
    first = time.perf_counter() - start
    compile_peak = peak_mb() - base
    reset_peak()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = float(step(tokens, labels).asnumpy())
        times.append(time.perf_counter() - start)
    print(json.dumps({"path": args.path, "first_step_s": first, "step_s": float(np.median(times)),
                      "steps": args.steps, "peak_above_models_mb": peak_mb() - base,
                      "first_step_peak_above_models_mb": compile_peak, "loss": loss}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="timed steps after the first (median reported)")
    parser.add_argument("--chunk-bytes", type=int, help="the fused head's chunk_bytes (default: its own)")
    parser.add_argument("--paths", default=",".join(PATHS), help="the rows to run (comma-separated; default all)")
    parser.add_argument("--path", choices=PATHS, help="run one row in this process (the driver uses it)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if args.path:
        return one_row(args)
    paths = args.paths.split(",")
    if not set(paths) <= set(PATHS):
        parser.error(f"--paths: each of {', '.join(PATHS)}; got {args.paths}")
    argv = sys.argv[1:]
    rows = []
    print(f"MindFormers Llama distillation step, GRAPH_MODE, float32: {args.batch} x {args.seq} tokens, "
          f"vocabulary {args.vocab}, hidden {args.hidden}; teacher 4 layers (frozen), student 2 layers; "
          f"fused head chunk_bytes {args.chunk_bytes or 'default'}")
    print(f"{'path':<8} {'first step (compile) s':>24} {'step s':>8} {'step peak MB above models':>27}")
    for path in paths:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--path", path],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{path}: failed\n{proc.stderr[-3000:]}")
            return 1
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{path:<8} {row['first_step_s']:>24.2f} {row['step_s']:>8.3f} {row['peak_above_models_mb']:>27.0f}")
    body = next((row for row in rows if row["path"] == "body"), None)
    for row in rows if body else ():
        if row["path"] != "body":
            print(f"{row['path']} head's own cost (its row - body): {row['step_s'] - body['step_s']:.3f} s a step, "
                  f"{row['peak_above_models_mb'] - body['peak_above_models_mb']:.0f} MB")
    if args.json:
        with open(args.json, "w") as f:
            config = {k: getattr(args, k) for k in ("vocab", "hidden", "seq", "batch", "steps", "chunk_bytes")}
            json.dump({"config": config, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
