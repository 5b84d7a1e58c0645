"""The rectified-flow formulas live in models/flow.py alone: the trainer's tasks and the studies call them.

The packed task's loss is checked against an independent float64 computation of the flow objective
(``x_t = (1 - t) x_0 + t eps``, target ``eps - x_0``, sum of squared errors over all pixels of the step
divided by their count). The model and images run in float64 here; what stays float32 is the task's
draw of ``t`` and ``noise``, and the task forms ``1 - t`` in float32 (the reference in float64): a
relative error of at most u = 6e-8 in the weight of ``x_0``, so an input perturbation of at most
6e-8 of ``|x_0|`` (about 1). Two DiT blocks amplify an input perturbation by less than 10 (norms,
softmax and weights of size 0.05), and the loss (about 2, a mean of squared errors of size
about 1) moves by at most twice that: ``TOL = 1e-6`` relative. Summation order adds 1e-12.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from models.flow import T_SCALE, euler_times, noisy, target_velocity
from models.training.tasks import PackedImageTask, step_generator
from models.training.tasks import logit_normal as task_logit_normal

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-6  # relative; the bound in the module docstring
# x_t or the velocity target typed out instead of called: (1 - t) * x + t * n, noise - x0, n - x
RETYPED = re.compile(r"\(1\.?0? - \w+\) \* \w+ \+ \w+ \* \w+|\bnoise - x0?\b|\(n - x\)")


def test_packed_loss_is_the_flow_objective_per_image():
    torch.manual_seed(0)
    task = PackedImageTask("tiny", 32, 0)
    model = task.build().double().eval()
    with torch.no_grad():  # away from adaLN-Zero's zeros: the prediction depends on x_t
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x0, y, _ = task.images(2, 4)
    gen = step_generator(task.seed, 2, "packed-noise0")  # the task's draws, in its order
    noise = [torch.randn(x.shape, generator=gen) for x in x0]
    t = task_logit_normal(len(x0), gen)
    drop = torch.rand(len(x0), generator=gen) < task.config.class_dropout_prob
    xt = [((1 - float(ti)) * x.double() + float(ti) * n.double()) for x, n, ti in zip(x0, noise, t)]
    preds = model(xt, t.double() * 1000.0, y, force_drop_ids=drop)
    want = sum(((p[:3] - (n.double() - x.double())) ** 2).sum() for p, x, n in zip(preds, x0, noise))
    want = want / sum(x.numel() for x in x0)
    model_float64_inputs = _float64_loss(task, model, 2, 4)
    assert abs(model_float64_inputs - want.item()) < TOL * abs(want.item())


def _float64_loss(task, model, step, batch_size) -> float:
    """The task's loss with its images and noise promoted to float64 (the model is float64)."""
    real = task.images

    def images64(*args, **kw):
        images, labels, waste = real(*args, **kw)
        return [x.double() for x in images], labels, waste

    task.images = images64
    try:
        return task.loss(model, step, batch_size).item()
    finally:
        task.images = real


def test_flow_helpers_and_no_retyped_formula_outside_flow():
    x0, noise = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    t = torch.tensor([0.25, 0.75], dtype=torch.float64)
    assert torch.equal(noisy(x0, t, noise)[1], 0.25 * x0[1] + 0.75 * noise[1])
    assert torch.equal(target_velocity(x0, noise), noise - x0) and T_SCALE == 1000.0
    assert euler_times(4).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert RETYPED.search("xt = (1 - ti) * x + ti * n") and RETYPED.search("(pred - (noise - x0))")
    offenders = [
        f"{path.relative_to(ROOT)}:{i}"
        for folder in ("models/training", "models/studies")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if RETYPED.search(line.split("#")[0])
    ]
    assert not offenders, f"flow formulas re-typed instead of called from models/flow.py: {offenders}"
