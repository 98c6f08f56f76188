"""The model zoo's timm and diffusers families (tests/zoo/vision_archs.py) in CI: a subset across both families, each
architecture through every mode (default with tier-up, reduce-overhead with static kernels, batch gears) and
compared with eager on every output tensor. timm needs torchvision, which installs only beside torch 2.14.1 here, so
this file runs in ``.venv-torch2.14`` (``make test-torch2.14``) and skips in ``.venv``. ``make zoo-vision`` runs
every architecture; ``ZOO_ALL=1`` runs them all here too."""
from __future__ import annotations

import copy
import os

import pytest
import torch

pytest.importorskip("timm", reason="the vision zoo needs timm (pip install -e '.[zoo-vision]' beside torchvision)")
pytest.importorskip("diffusers", reason="the vision zoo needs diffusers (pip install -e '.[zoo-vision]')")

from zoo import BY_NAME, MODES, VISION_ARCHS, compare, run_arch  # noqa: E402
from zoo.runner import geared_inputs, verdict  # noqa: E402
from zoo.vision_archs import TIMM_ARCHS, unet_inputs  # noqa: E402

# Convolutions, windowed attention, a ViT; the UNet as pipelines call it (a 0-d timestep) and the text encoder.
# Together about a minute of `make test-torch2.14` on 2 cores.
CI = ("timm_resnet", "timm_convnext", "timm_vit", "timm_swin", "unet2d_condition", "clip_text_encoder")
ALL = os.environ.get("ZOO_ALL") == "1"


def _param(arch):
    marks = [] if ALL or arch.name in CI else [
        pytest.mark.skip(reason="zoo: run by `make zoo-vision` (python -m tests.zoo --family timm,diffusers); "
                                "ZOO_ALL=1 runs it here")]
    return pytest.param(arch, id=arch.name, marks=marks)


@pytest.mark.parametrize("arch", [_param(a) for a in VISION_ARCHS])
def test_architecture_matches_eager_in_every_mode(arch):
    failed, fixed, known = verdict(run_arch(arch, MODES, verbose=True))
    assert not failed, f"{arch.name}:\n" + "\n".join(failed)
    assert not fixed, (f"{arch.name} passes where it carries a known-defect marker; remove it from "
                       f"tests/zoo/vision_archs.py: {fixed}")
    if known:
        pytest.xfail("; ".join(known))


def test_ci_subset_spans_both_families_and_the_zoo_spans_twenty_timm_families():
    assert set(CI) <= {a.name for a in VISION_ARCHS}
    assert {BY_NAME[n].family for n in CI} == {a.family for a in VISION_ARCHS} == {"timm", "diffusers"}
    assert len(TIMM_ARCHS) >= 20


def test_a_unet_timestep_for_the_whole_batch_takes_no_gear():
    """The gears mode gears dim 0 of every input; a 0-d timestep has none (``set_dim_gears`` would refuse it) and is
    the same at every batch, so it is left out, while the latent and the text states are geared."""
    inputs = unet_inputs(2, seed=0)
    assert inputs["timestep"].dim() == 0
    assert [id(t) for t in geared_inputs(inputs)] == [id(inputs["sample"]), id(inputs["encoder_hidden_states"])]


def test_a_wrong_weight_inside_a_residual_branch_is_seen():
    """The zoo draws the constant parameters of a fresh model at random (vision_archs.randomize_constant_parameters):
    as built, ConvNeXt's layer scale of 1e-6 keeps its blocks' branches out of the output, and a 10% error in a
    block's depthwise convolution moved the output by 1e-8 of its scale, far inside the comparison's tolerance."""
    arch = BY_NAME["timm_convnext"]
    model = arch.model()
    inputs = arch.inputs(2, seed=0)
    wrong = copy.deepcopy(model)
    with torch.no_grad():
        want = model(**inputs)
        wrong.model.stages[-1].blocks[-1].conv_dw.weight.mul_(1.1)
        got = wrong(**inputs)
    ok, _, why = compare(got, want)
    assert not ok and "out.features" in why
