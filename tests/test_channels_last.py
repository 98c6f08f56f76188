"""Channels-last convolutions (rewrite.passes.channels_last): the layout facts the pass relies on, its
decisions from measured kernel times, and that a compiled model gives eager's values and eager's output
layout whichever way it decides."""
from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch

import rewrite
from rewrite.cost import calibration
from rewrite.cost.kernel_times import KernelTimes, convolution_signature
from rewrite.ir import TensorMeta
from rewrite.passes import channels_last_convolutions
from rewrite.passes.channels_last import _IMAGE_OPS, _TUPLES

aten = torch.ops.aten
FIXED = calibration.DEFAULT
CL = torch.channels_last


def meta(*shape):
    return TensorMeta(torch.float32, tuple(sympy.Integer(s) for s in shape), torch.device("cpu"))


class Layouts(KernelTimes):
    """Convolution times from a rule: ``faster`` says which layout measures faster (by a third)."""

    def __init__(self, faster: str):
        super().__init__(None)
        self.faster = faster
        self.asked = 0

    def convolution_seconds(self, in_metas, params, channels_last):
        self.asked += 1
        fast = (self.faster == "channels_last") == channels_last
        return 60e-6 if fast else 90e-6


class Block(torch.nn.Module):
    """A ResNet-style trunk: stem conv, batch norm, ReLU, max pooling, two residual convolutions, pooling."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv1 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        for bn in (self.bn, self.bn1):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.stem(x))), 2)
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.nn.functional.pad(self.conv2(y), (1, 1, 1, 1))[:, :, 1:-1, 1:-1] + x
        return y, y.mean(dim=(2, 3)), y.flatten(1)


def _compiled_graph_ops(model, x, faster: str):
    _, seen, out, times = _compiled(model, x, faster)
    return seen["ops"], out, times


def _compiled(model, x, faster: str):
    """(compiled model, what its backend saw, its last output, the kernel times it asked), called on ``x``
    until past its tier-up."""
    seen = {}

    class Backend(rewrite.backend.RewriteBackend):
        def on_optimized(self, graph, *a, **k):
            seen["ops"] = graph.op_counts()
            return super().on_optimized(graph, *a, **k)

    times = Layouts(faster)
    with calibration.use(dataclasses.replace(FIXED, kernel_times=times)):
        f = torch.compile(model, backend=Backend(rewrite.CompilerConfig()), dynamic=False)
        with torch.no_grad():
            outs = [f(x) for _ in range(rewrite.CompilerConfig().exec.tier_up_calls + 2)]  # past the tier-up
    return f, seen, outs[-1], times


def test_the_ops_it_looks_through_keep_a_channels_last_image_channels_last():
    x = torch.randn(2, 8, 6, 6).contiguous(memory_format=CL)
    c = torch.randn(8)
    results = {
        "constant_pad_nd": aten.constant_pad_nd.default(x, [1, 1, 2, 0]),
        "avg_pool2d": aten.avg_pool2d.default(x, [2, 2]),
        "max_pool2d_with_indices": aten.max_pool2d_with_indices.default(x, [2, 2])[0],
        "_adaptive_avg_pool2d": aten._adaptive_avg_pool2d.default(x, [3, 3]),
        "adaptive_avg_pool2d": aten.adaptive_avg_pool2d.default(x, [3, 3]),
        "max_pool2d": aten.max_pool2d.default(x, [2, 2]),
        "batch_norm": aten._native_batch_norm_legit_no_training.default(x, c, c, c, c.abs() + 1, 0.1, 1e-5)[0],
        "relu": aten.relu.default(x),
        "add per channel": aten.add.Tensor(x, c.view(8, 1, 1)),
        "mul of two": aten.mul.Tensor(x, x),
        "convolution": aten.convolution.default(x, torch.randn(8, 8, 3, 3), None, [1, 1], [1, 1], [1, 1], False,
                                                [0, 0], 1),
    }
    for name, out in results.items():
        assert out.is_contiguous(memory_format=CL) and not out.is_contiguous(), name
    assert {t.__name__ for t in _TUPLES} >= {"_native_batch_norm_legit_no_training.default",
                                            "max_pool2d_with_indices.default"}
    assert "constant_pad_nd.default" in {t.__name__ for t in _IMAGE_OPS}


@pytest.mark.parametrize("faster", ["channels_last", "contiguous"])
def test_values_and_output_layouts_are_eager_s_whichever_layout_it_picks(faster):
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 3, 12, 12)
    ops, got, times = _compiled_graph_ops(model, x, faster)
    with torch.no_grad():
        want = model(x)
    assert times.asked > 0
    converted = ops.get("aten.contiguous.default", 0)
    assert (converted > 0) == (faster == "channels_last"), ops
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        assert g.stride() == w.stride()  # the caller gets eager's layout back


def test_a_caller_s_channels_last_input_gives_eager_s_values():
    torch.manual_seed(1)
    model = Block().eval()
    x = torch.randn(2, 3, 12, 12).contiguous(memory_format=CL)
    _, got, _ = _compiled_graph_ops(model, x, "channels_last")
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_frozen_weights_are_laid_out_channels_last_once_at_compile_time():
    torch.manual_seed(1)
    model = Block().eval()
    x = torch.randn(2, 3, 12, 12)
    ops, got, _ = _compiled_graph_ops(model, x, "channels_last")
    assert ops.get("aten.clone.default", 0) == 1, ops  # the image, on the way in; no weight is copied per call
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    weight = torch.randn(8, 4, 3, 3)
    laid_out = rewrite.ops.channels_last_weight(weight)
    assert laid_out.is_contiguous(memory_format=CL) and torch.equal(laid_out, weight)
    # every gear folds its own copy of a frozen weight: equal contents share one laid-out copy
    assert rewrite.ops.channels_last_weight(weight.clone()) is laid_out


def test_one_convolution_alone_stays_as_it_is():
    conv = torch.nn.Conv2d(3, 8, 3).eval()
    x = torch.randn(1, 3, 8, 8)
    ops, got, _ = _compiled_graph_ops(conv, x, "channels_last")
    assert "aten.contiguous.default" not in ops
    with torch.no_grad():
        torch.testing.assert_close(got, conv(x), rtol=1e-5, atol=1e-5)


class PatchEmbedding(torch.nn.Module):
    """ViT / Swin's stem: a strided convolution whose image becomes tokens, then a LayerNorm."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 2, stride=2)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.conv(x).flatten(2).transpose(1, 2))


@pytest.mark.parametrize("faster", ["channels_last", "contiguous"])
def test_a_patch_embedding_convolution_alone_goes_channels_last_without_a_copy_back(faster):
    torch.manual_seed(2)
    model = PatchEmbedding().eval()
    x = torch.randn(2, 3, 8, 8)
    ops, got, _ = _compiled_graph_ops(model, x, faster)
    converted = ops.get("aten.clone.default", 0)  # the image (and weight) copied channels-last on the way in
    assert (converted > 0) == (faster == "channels_last"), ops
    assert "aten.contiguous.default" not in ops  # the tokens of a channels-last image are contiguous as they are
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == want.stride()


class TokensToPatches(torch.nn.Module):
    """SegFormer's next stage: tokens back into an image (``permute(...).contiguous()``, NCHW in eager), then a
    strided overlapping patch embedding."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.embed = PatchEmbedding()
        self.embed.conv = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)

    def forward(self, tokens):
        b, n, c = tokens.shape
        image = self.norm(tokens).reshape(b, 4, n // 4, c).permute(0, 3, 1, 2).contiguous()
        return self.embed(image)


def test_a_convolution_reads_the_channels_last_source_of_a_layout_copy_as_it_is():
    torch.manual_seed(3)
    model = TokensToPatches().eval()
    x = torch.randn(2, 16, 8)
    ops, got, _ = _compiled_graph_ops(model, x, "channels_last")
    # no copy: the image is read through the permute (no copy to NCHW and back), and the frozen weight was laid
    # out channels-last at compile time
    assert ops.get("aten.clone.default", 0) == 0, ops
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    ops, got, _ = _compiled_graph_ops(model, x, "contiguous")
    assert ops.get("aten.clone.default", 0) == 1, ops  # eager's copy to NCHW, kept
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


class PaddedPixel(torch.nn.Module):
    """MobileNetV2's last blocks: a single-pixel image expanded by a 1x1 convolution, ReLU6, TF-style padding,
    a depthwise 3x3."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.down = torch.nn.Conv2d(16, 8, 4)
        self.expand = torch.nn.Conv2d(8, 16, 1)
        self.depthwise = torch.nn.Conv2d(16, 16, 3, groups=16)

    def forward(self, x):
        pixel = torch.relu(self.down(self.stem(x)))
        pixel = torch.nn.functional.relu6(self.expand(pixel))
        return self.depthwise(torch.nn.functional.pad(pixel, (1, 1, 1, 1)))


def test_a_padded_single_pixel_reaches_the_next_convolution_channels_last(monkeypatch):
    """ATen's ops often give a 1x1 image NCHW strides (a 1x1 convolution of a pixel does), so its padding is NCHW,
    and a channels-last convolution would copy it inside ATen on every call: the pass pads a channels-last copy."""
    from rewrite.kernels.cgen import conv

    monkeypatch.setattr(conv, "MAX_MACS", 0)  # every convolution stays ATen's: the copies inside it are the point
    torch.manual_seed(4)
    model = PaddedPixel().eval()
    x = torch.randn(2, 8, 4, 4)
    f, seen, _, _ = _compiled(model, x, "channels_last")
    with torch.no_grad():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = f(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    assert seen["ops"].get("aten.contiguous.default", 0) == 1, seen["ops"]  # the output, back to eager's layout
    convolutions = [e for e in prof.events() if e.name == "aten::_convolution"]
    assert len(convolutions) == 4
    copies = [e.name for e in prof.events() if e.name in ("aten::contiguous", "aten::clone", "aten::copy_")
              and e.cpu_parent is not None and e.cpu_parent.name == "aten::_convolution"]
    assert not copies, copies


def test_convolutions_eager_already_runs_channels_last_are_left_alone():
    """ConvNeXt's blocks permute NHWC tensors to NCHW: already channels-last, nothing to convert."""

    class Nhwc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.b = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x):
            h = self.norm(x).permute(0, 3, 1, 2)
            return self.b(self.a(h)).permute(0, 2, 3, 1)

    model = Nhwc().eval()
    x = torch.randn(2, 6, 6, 8)
    ops, got, times = _compiled_graph_ops(model, x, "channels_last")
    assert times.asked == 0 and "aten.contiguous.default" not in ops
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


def test_no_kernel_times_no_change():
    from rewrite.ir import Graph

    g = Graph()
    x = g.placeholder("x", meta(1, 3, 8, 8))
    w = g.placeholder("w", meta(8, 3, 3, 3))
    y = g.call(aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), meta=meta(1, 8, 8, 8))
    g.set_output((y,))
    assert channels_last_convolutions(g, None) == 0


def test_convolution_times_are_measured_per_layout_and_kept():
    times = KernelTimes(None)
    metas = [meta(2, 8, 8, 8), meta(8, 1, 3, 3)]
    params = ([1, 1], [1, 1], [1, 1], False, [0, 0], 8)
    contiguous = times.convolution_seconds(metas, params, channels_last=False)
    channels_last = times.convolution_seconds(metas, params, channels_last=True)
    assert contiguous is not None and channels_last is not None and 1e-8 <= min(contiguous, channels_last) < 0.1
    assert len(times.times) == 2
    key = convolution_signature(metas, params, True)
    assert key.endswith(";channels_last)") and times.times[key] == channels_last
    assert times.convolution_seconds(metas, params, channels_last=True) == channels_last  # kept
    assert convolution_signature([meta(2, 8, 8), meta(8, 1, 3)], params, True) is None  # not a 2-d image
    assert convolution_signature(metas, ([1, 1], [1, 1], [1, 1], False, [0, 0], 8.5), True) is None
