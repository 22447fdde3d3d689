"""Regenerate ``distill_trl_golden.json``: TRL's generalized JSD (``trl.GKDTrainer.generalized_jsd_loss``'s
definition, transcribed in torch: log_softmax of logits / T; beta 0 forward KL, beta 1 reverse KL, else
beta * KL(P_t || M) + (1 - beta) * KL(P_s || M) with log M = logsumexp(log P_s + log(1 - beta), log P_t + log beta);
rows with label -100 dropped; 'batchmean' = sum / kept rows), times T^2 as ms_kldiv defines it, and the gradients
of that loss for both logits by torch autograd, in float64.

    python tests/golden/make_distill_golden.py      # needs torch 2.x (CPU); the tests do not
"""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

BETAS = (0.0, 0.1, 0.5, 0.9, 1.0)
TEMPERATURES = (0.5, 1.0, 2.0, 4.0)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distill_trl_golden.json")


def generalized_jsd(student_logits, teacher_logits, labels, beta, temperature):
    s = F.log_softmax(student_logits / temperature, dim=-1)
    t = F.log_softmax(teacher_logits / temperature, dim=-1)
    if beta == 0:
        jsd = F.kl_div(s, t, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(t, s, reduction="none", log_target=True)
    else:
        b = torch.tensor(beta, dtype=s.dtype)
        mix = torch.logsumexp(torch.stack([s + torch.log(1 - b), t + torch.log(b)]), dim=0)
        jsd = b * F.kl_div(mix, t, reduction="none", log_target=True) + \
            (1 - b) * F.kl_div(mix, s, reduction="none", log_target=True)
    mask = labels != -100
    jsd = jsd[mask]
    return jsd.sum() / mask.sum() * temperature ** 2


def main():
    rng = np.random.default_rng(2026)
    student = rng.normal(size=(5, 7)) * 2.0
    teacher = rng.normal(size=(5, 7)) * 2.0
    labels = np.array([3, -100, 0, 6, 2])
    cases = []
    for beta in BETAS:
        for temperature in TEMPERATURES:
            s = torch.tensor(student, dtype=torch.float64, requires_grad=True)
            t = torch.tensor(teacher, dtype=torch.float64, requires_grad=True)
            loss = generalized_jsd(s, t, torch.tensor(labels), beta, temperature)
            ds, dt = torch.autograd.grad(loss, (s, t))
            cases.append({"beta": beta, "temperature": temperature, "batchmean": loss.item(),
                          "d_student": ds.tolist(), "d_teacher": dt.tolist()})
    doc = {"torch": torch.__version__, "dtype": "float64", "student": student.tolist(), "teacher": teacher.tolist(),
           "labels": labels.tolist(), "ignore_index": -100, "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
