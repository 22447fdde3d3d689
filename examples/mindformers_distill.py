"""Distil a MindFormers Llama into a smaller one with ms_kldiv's fused head (docs/mindformers.md is the guide).

A 4-layer teacher and a 2-layer student (tiny configs, random weights, nothing downloaded) in GRAPH_MODE:
the student's last hidden states and head weight go to FusedLinearDistillationLoss, so the [tokens, vocabulary]
logits never exist; MindFormers' batches (input_ids [B, S+1], labels with -100, pad tokens) are turned into
ms_kldiv labels the way LlamaForCausalLM masks its own loss. Prints the loss against the model's own logits path,
then trains the student for 30 steps with nn.TrainOneStepCell.

    pip install "mindspore==2.9.0" "mindformers==1.9.0" "numpy<2"
    python examples/mindformers_distill.py
"""
import os
import sys
import tempfile
import time

# MindFormers writes its logs to ./output/log unless LOG_MF_PATH names another place; set before importing it.
os.environ.setdefault("LOG_MF_PATH", os.path.join(tempfile.gettempdir(), "ms_kldiv-mindformers-log"))
os.environ.setdefault("GLOG_v", "3")

try:
    from mindformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    print("This example needs MindFormers, which is not installed. MindFormers 1.9.0 installs next to "
          "MindSpore 2.9.0:\n    pip install \"mindspore==2.9.0\" \"mindformers==1.9.0\" \"numpy<2\"")
    sys.exit(0)

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402

import ms_kldiv  # noqa: E402

VOCAB, HIDDEN, BATCH, SEQ = 1000, 64, 4, 32
TEMPERATURE = 2.0


def llama(layers, tie=False):
    # What a Llama needs on CPU: float32 compute (the default is float16), rotary embedding by slicing, no flash
    # attention (Ascend only), the unfused RMSNorm. On Ascend keep MindFormers' defaults (see docs/mindformers.md).
    config = LlamaConfig(batch_size=BATCH, seq_length=SEQ, hidden_size=HIDDEN, num_layers=layers, num_heads=4,
                         intermediate_size=128, vocab_size=VOCAB, compute_dtype="float32",
                         param_init_type="float32", layernorm_compute_type="float32",
                         softmax_compute_type="float32", rotary_dtype="float32", use_rope_slice=True,
                         use_flash_attention=False, fused_rms_norm=False, tie_word_embeddings=tie)
    return LlamaForCausalLM(config)


class DistilledLlama(nn.Cell):
    """Takes MindFormers' training batch (input_ids [B, S+1], labels [B, S+1]) and returns the distillation loss,
    masked like LlamaForCausalLM masks its cross-entropy: a position counts when its input token is not
    pad_token_id and its label is not ignore_token_id."""

    def __init__(self, student, teacher, fused=True):
        super().__init__()
        self.student, self.teacher, self.fused = student, teacher, fused
        self.pad = student.config.pad_token_id
        self.ignore = student.config.ignore_token_id
        self.kd = ms_kldiv.FusedLinearDistillationLoss(TEMPERATURE, ignore_index=self.ignore, teacher_grad=False)
        self.kd_logits = ms_kldiv.DistillationLoss(TEMPERATURE, ignore_index=self.ignore)

    def construct(self, input_ids, labels):
        tokens, target = input_ids[:, :-1], labels[:, 1:]
        counted = ops.logical_and(tokens != self.pad, target != self.ignore)
        kd_labels = ops.where(counted, target, ops.full_like(target, self.ignore))
        hidden = self.student.model(tokens)                          # [B, S, H], after the final norm
        teacher_hidden = ops.stop_gradient(self.teacher.model(tokens))
        if self.fused:
            return self.kd(hidden, self.student.lm_head.weight, teacher_hidden, self.teacher.lm_head.weight,
                           kd_labels)
        # The model's own logits path, for comparison: [B*S, V] logits of both heads.
        logits = ops.reshape(self.student.lm_head(hidden), (-1, VOCAB))
        teacher_logits = ops.reshape(self.teacher.lm_head(teacher_hidden), (-1, VOCAB))
        return self.kd_logits(logits, teacher_logits, ops.reshape(kd_labels, (-1,)))


def main():
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    teacher, student = llama(4), llama(2, tie=True)
    # Random weights: a sharper teacher head, so that there is something to learn.
    teacher.lm_head.weight.set_data(ms.Tensor(rng.normal(0, 0.4, (VOCAB, HIDDEN)), ms.float32))
    for p in teacher.get_parameters():
        p.requires_grad = False
    print(f"student head weight is its token embedding (tie_word_embeddings): "
          f"{student.lm_head.weight is student.model.tok_embeddings.embedding_weight}")

    input_ids = rng.integers(1, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    labels = input_ids.copy()
    labels[:, :5] = -100            # a prompt the loss leaves out
    input_ids[0, -6:] = 0           # right padding (pad_token_id 0)
    input_ids, labels = ms.Tensor(input_ids), ms.Tensor(labels)

    fused_net, logits_net = DistilledLlama(student, teacher), DistilledLlama(student, teacher, fused=False)
    fused, from_logits = float(fused_net(input_ids, labels).asnumpy()), float(logits_net(input_ids, labels).asnumpy())
    print(f"fused head loss {fused:.6f}, the model's logits + DistillationLoss {from_logits:.6f}, "
          f"relative difference {abs(fused - from_logits) / from_logits:.1e}")

    step = nn.TrainOneStepCell(fused_net, nn.Adam(student.trainable_params(), learning_rate=1e-2))
    start = time.perf_counter()
    losses = [float(step(input_ids, labels).asnumpy()) for _ in range(30)]
    print(f"GRAPH_MODE training with the fused head: step 1 loss {losses[0]:.4f} -> step 30 loss {losses[-1]:.4f} "
          f"({time.perf_counter() - start:.1f} s with the compile)")


if __name__ == "__main__":
    main()
