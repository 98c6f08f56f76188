"""Channels-last images for CPU convolutions, where the machine runs them faster that way.

oneDNN's convolution follows its input's layout, and at many shapes it is much faster on a
channels-last (NHWC) image than on a contiguous (NCHW) one: measured here, a depthwise 3x3 of 48
channels at 16x16 took 123 us contiguous and 71 us channels-last, a 1x1 of 8 to 48 channels at
batch 8 162 us and 83 us. At others it is slower (a 3-channel stem conv: 23 us against 55 us).
Inductor converts every convolution of a graph (its ``layout_optimization``); this pass converts each
region of at least two convolutions linked by layout-keeping ops, unless the times `rewrite.cost.kernel_times`
measures for both layouts at the graph's static shapes, with the copies at the region's borders, say
it clearly loses (`MAX_LOSS`). What eager
already runs channels-last (a convolution reading an NHWC tensor permuted to NCHW, as in ConvNeXt)
is left as it is.

A chosen convolution reads ``clone(x, memory_format=channels_last)`` of an image ``x`` from outside
the region, and its weight the same way (oneDNN would copy it inside its kernel on every call); a frozen
weight (a constant) is laid out channels-last once, at compile time (`ops.channels_last_weight`). Its result
stays channels-last through the ops that keep the layout and mean the same whatever it is (`_keeps_layout`:
pointwise ops whose other operands broadcast over the image's height and width, batch norm, padding, pooling), and the
next convolution reads it as it is. Every other reader of such a value (a view, the graph's output,
a convolution left contiguous) reads ``contiguous(value)``, so everything outside the channels-last
region sees the layout eager gives it: a wrong guess about a layout costs a copy, never a result
(views become reshapes once the pass changed anything: an input the caller passed channels-last
may take another layout through the graph than in eager). Reductions over the height and width (global pooling) read channels-last values as they are.

Only static CPU graphs without stream scopes, float32 4-d convolutions, and only where both layouts
were measured (no kernel times, no change).
"""
from __future__ import annotations

import logging
import operator

import torch

from .. import ops
from ..cost import CONVOLUTION_PARAMS, current, op_cost
from ..ir import Graph, Node, TensorMeta, map_nodes
from ..utils import connected_groups
from .boundary import views_as_reshapes
from .pass_type import Pass, Step

log = logging.getLogger("rewrite")

__all__ = ["CHANNELS_LAST", "channels_last_convolutions"]

aten = torch.ops.aten
_CONVOLUTION = aten.convolution.default
_CHANNELS_LAST = torch.channels_last
# Ops returning a tuple whose first element keeps its image input's layout; the others are per-channel
# statistics (batch norm) or must be unused (max pooling's indices are laid out like the image).
_TUPLES = ops.BATCH_NORMS | ops.overloads("max_pool2d_with_indices.default")
# Ops whose result keeps their image input's layout (verified in tests/test_channels_last.py).
_IMAGE_OPS = ops.overloads("constant_pad_nd.default", "avg_pool2d.default", "_adaptive_avg_pool2d.default",
                           "adaptive_avg_pool2d.default", "max_pool2d.default")
# Views that may flatten an image's height and width (a patch embedding's tokens, `_tokens_of`).
_FLATTENS = ops.overloads("view.default", "reshape.default", "_unsafe_view.default")
# Reductions that read a channels-last image as it is when they reduce its height and width.
_SPATIAL_REDUCTIONS = ops.overloads("mean.dim", "sum.dim_IntList", "amax.default")
# A region goes channels-last with at least this many convolutions, unless its convolutions timed alone
# (plus the copies at its borders) are slower channels-last by more than this share of their time.
# Timed alone they understate what the layout gains inside a graph, where pooling, batch norm, global
# pooling and the weights' copies run channels-last too (static kernels walk it in memory order): the
# zoo's ResNet at batch 1 measures 17% slower alone and ran 8% faster, at batch 8 from 17% faster to
# 0.5% slower alone (two fresh measurements) and ran 26% faster; EfficientNet 20-25% faster, ConvNeXt and
# SegFormer 5-12% (benchmarks/zoo.py, paired). One convolution alone, between two copies, is left as it is;
# one whose readers need no copy back (a patch embedding, `_tokens_of`) is measured like a region.
MIN_CONVOLUTIONS = 2
MAX_LOSS = 0.25


def channels_last_convolutions(graph: Graph, kernel_times) -> int:
    """Run the convolutions of ``graph`` channels-last where that measures faster; returns how many."""
    if kernel_times is None or any(n.stream is not None or n.waits for n in graph.nodes):
        return 0
    users = graph.users()
    # What eager already runs channels-last (ConvNeXt's convolutions read permuted NHWC tensors) stays as it is.
    eager = _channels_last_values(graph, set(), users)
    candidates = {n.id: t for n in graph.nodes if n.id not in eager and (t := _measured(n, kernel_times)) is not None}
    if not candidates:
        return 0
    # Convolutions linked by layout-keeping ops (a residual block, a network's whole trunk) share one
    # layout: switching one alone would convert at every join. Each such region goes channels-last as
    # a whole unless its measured convolutions and border copies say it clearly loses (`MAX_LOSS`).
    everywhere = _channels_last_values(graph, set(candidates), users)
    by_id = {n.id: n for n in graph.nodes}
    chosen = set()
    for region in _regions(graph, everywhere - eager, candidates):
        convolutions = [c for c in region if c in candidates]
        contiguous_s = sum(candidates[c][0] for c in convolutions)
        gain = contiguous_s - sum(candidates[c][1] for c in convolutions)
        copied_back = [by_id[i] for i in region if _exits(by_id[i], everywhere, users)]
        copies = _border_copies(by_id, region, candidates, everywhere, copied_back)
        enough = len(convolutions) >= MIN_CONVOLUTIONS or not copied_back
        worth = enough and gain - copies >= -MAX_LOSS * contiguous_s
        log.debug("channels-last: a region of %d convolutions (%.1f us) gains %.1f us, its copies cost %.1f us: %s",
                  len(convolutions), contiguous_s * 1e6, gain * 1e6, copies * 1e6, "taken" if worth else "left")
        if worth:
            chosen |= set(convolutions)
    if not chosen:
        return 0
    _convert(graph, users, chosen, _channels_last_values(graph, chosen, users), eager)
    graph.prune()  # layout copies no convolution reads any more
    # A view may now read a differently-strided tensor than in eager (an input the caller passed
    # channels-last, say): views that cannot be views of it copy instead of failing.
    views_as_reshapes(graph)
    return len(chosen)


def _run(step: Step) -> dict:
    """With the kernel times of the cost model in use (`rewrite.cost.current`; None: nothing measured, no change)."""
    return {"channels_last": channels_last_convolutions(step.graph, current().kernel_times)}


CHANNELS_LAST = Pass("channels_last", "channels_last", _run,
                     "convolutions run channels-last where the kernels measured at the graph's shapes say it pays")


def _channels_last_values(graph: Graph, chosen: set, users: dict) -> set[int]:
    """Ids of the values that are channels-last when the ``chosen`` convolutions read channels-last images:
    those, what follows any convolution's image layout or keeps its input's, and NHWC tensors permuted
    to NCHW (`_permuted_nhwc`)."""
    out: set[int] = set()
    for n in graph.nodes:
        if n.id in chosen or _permuted_nhwc(n) or _keeps_layout(n, out, users) \
                or (n.kind == "call" and n.target is _CONVOLUTION and isinstance(n.args[0], Node)
                    and n.args[0].id in out):
            out.add(n.id)
    return out


def _permuted_nhwc(n: Node) -> bool:
    """``permute(y, [0, 3, 1, 2])`` of an image ``y`` made by a computation (not a view) or reshaped from one:
    channels-last."""
    if n.kind != "call" or n.target is not aten.permute.default or not isinstance(n.args[0], Node):
        return False
    y = n.args[0]
    # a computation's result, or a reshape of one (contiguous too: SegFormer's tokens reshaped into NHWC)
    made = y.args[0] if y.kind == "call" and y.target in ops.RESHAPES and isinstance(y.args[0], Node) else y
    return [d % 4 for d in n.args[1]] == [0, 3, 1, 2] and isinstance(y.meta, TensorMeta) and y.meta.rank == 4 \
        and made.kind == "call" and made.target not in ops.VIEWS


def _regions(graph: Graph, channels_last: set, candidates: dict) -> list[set[int]]:
    """The channels-last values grouped into connected regions (union-find over their data edges)."""
    links = [(n.id, t.id) for n in graph.nodes if n.id in channels_last
             for t in ([n.args[0]] if n.id in candidates else n.inputs)
             if isinstance(t, Node) and t.id in channels_last]
    return [set(group) for group in connected_groups(channels_last, links)]


def _border_copies(by_id: dict, region: set, candidates: dict, channels_last: set, copied_back: list) -> float:
    """Seconds of the layout copies a region needs: images converted in, values converted back out."""
    images = {(i := _image_as_read(by_id[c], channels_last)).id: i for c in region if c in candidates}
    seconds = sum(_copy_s(image.meta) for i, image in images.items() if i not in channels_last)
    return seconds + sum(_copy_s(value.meta) for value in copied_back)


def _exits(value: Node, channels_last: set, users: dict) -> list[Node]:
    """The readers of the channels-last ``value`` that must read it converted back to eager's layout."""
    if not isinstance(value.meta, TensorMeta):
        return []
    return [u for u in users.get(value.id, ()) if not _reads_as_it_is(u, value, channels_last, users)]


def _measured(n: Node, kernel_times) -> tuple[float, float] | None:
    """(contiguous, channels-last) seconds of a float32 2-d convolution node on the CPU, or None."""
    if n.kind != "call" or n.target is not _CONVOLUTION:
        return None
    a = ops.bind_arguments(_CONVOLUTION, n.args, n.kwargs)
    tensors = [a["input"], a["weight"]] + ([a["bias"]] if a["bias"] is not None else [])
    if not all(isinstance(t, Node) and _image(t.meta, rank=None) for t in tensors) or not _image(a["input"].meta) \
            or a["transposed"] or a["input"].meta.dtype != torch.float32:
        return None
    params = tuple(a[p] for p in CONVOLUTION_PARAMS)
    params = tuple(list(v) if isinstance(v, (list, tuple)) else v for v in params)
    metas = [t.meta for t in tensors]
    contiguous_s = kernel_times.convolution_seconds(metas, params, channels_last=False)
    channels_last_s = kernel_times.convolution_seconds(metas, params, channels_last=True) \
        if contiguous_s is not None else None
    return None if channels_last_s is None else (contiguous_s, channels_last_s)


def _image(meta, rank: int | None = 4) -> bool:
    return isinstance(meta, TensorMeta) and meta.is_static() and meta.device is not None \
        and meta.device.type == "cpu" and (rank is None or meta.rank == rank)


def _single_pixel(meta) -> bool:
    return _image(meta) and int(meta.shape[2]) == 1 and int(meta.shape[3]) == 1


def _copy_s(meta) -> float:
    return op_cost(aten.clone.default, meta, [meta])


def _keeps_layout(n: Node, channels_last: set, users: dict) -> bool:
    """Whether ``n``'s result is channels-last, given which of its inputs are (and it means the same)."""
    if n.kind != "call" or not n.args or not isinstance(n.meta, TensorMeta) and n.target not in _TUPLES:
        return False
    first = n.args[0]
    if n.target is operator.getitem:
        return isinstance(first, Node) and first.id in channels_last and n.args[1] == 0
    if n.target in _TUPLES or n.target in _IMAGE_OPS:
        if not (isinstance(first, Node) and first.id in channels_last):
            return False
        if n.target is aten.constant_pad_nd.default and len(n.args[1]) > 4:
            return False  # padding the channels or the batch too
        if n.target in _TUPLES:  # read through getitem only; max pooling's indices unused
            return all(u.target is operator.getitem and (u.args[1] == 0 or n.target in ops.BATCH_NORMS)
                       for u in users.get(n.id, ()))
        return True
    if not ops.is_pointwise(n.target) or not _image(n.meta) or _layout_copy_source(n) is not None:
        return False
    shape = tuple(n.meta.shape)
    reads_cl = False
    for t in n.inputs:
        if t.id in channels_last and isinstance(t.meta, TensorMeta) and tuple(t.meta.shape) == shape:
            reads_cl = True
        elif not _broadcast_over_image(t.meta):
            return False  # another full image: the result's layout is no longer the first one's
    return reads_cl


def _layout_copy_source(n: Node) -> Node | None:
    """``x`` when ``n`` is ``clone(x, memory_format=contiguous_format)``: a copy made for its layout alone (its
    result is NCHW whatever ``x`` is; SegFormer's ``permute(...).contiguous()`` before a convolution)."""
    if n.kind == "call" and n.target is aten.clone.default and isinstance(n.args[0], Node) \
            and n.kwargs.get("memory_format") is torch.contiguous_format:
        return n.args[0]
    return None


def _image_as_read(conv: Node, channels_last: set) -> Node:
    """The tensor a channels-last ``conv`` reads for its image: its input, or the source of a layout copy of
    it when that source is channels-last already (the copy to NCHW and back would be two copies for none)."""
    image = conv.args[0]
    source = _layout_copy_source(image)
    return source if source is not None and source.id in channels_last else image


def _broadcast_over_image(meta) -> bool:
    """A per-channel or per-sample operand (sizes 1 in height and width) or a scalar tensor."""
    if not isinstance(meta, TensorMeta) or meta.shape is None:
        return False
    padded = (1,) * (4 - len(meta.shape)) + tuple(meta.shape)
    return len(padded) == 4 and padded[2] == 1 and padded[3] == 1


def _reads_as_it_is(reader: Node, value: Node, channels_last: set, users: dict) -> bool:
    """Whether ``reader`` may read the channels-last ``value`` without a conversion."""
    if reader.id in channels_last:
        if reader.target is _CONVOLUTION:
            return reader.args[0] is value and value not in reader.args[1:]
        return True
    if reader.kind == "call" and reader.target in _SPATIAL_REDUCTIONS and reader.args and reader.args[0] is value:
        dims = ops.bind_arguments(reader.target, reader.args, reader.kwargs).get("dim")
        return dims is not None and {d % 4 for d in dims} >= {2, 3}
    return _tokens_of(reader, value, users)


def _tokens_of(reader: Node, value: Node, users: dict) -> bool:
    """``reader`` flattens the image ``value`` into (N, C, H*W) for its readers, which all swap the last two
    dims: a patch embedding's ``conv(x).flatten(2).transpose(1, 2)`` (ViT, Swin, SegFormer). Of a
    channels-last image the tokens are a view and contiguous (eager copies them, or a LayerNorm reads
    them strided); the flattening becomes a reshape (`views_as_reshapes`), so any layout means the same."""
    if reader.kind != "call" or reader.target not in _FLATTENS or not reader.args or reader.args[0] is not value \
            or not _image(reader.meta, rank=3) or not _image(value.meta):
        return False
    n, c, h, w = (int(s) for s in value.meta.shape)
    if tuple(int(s) for s in reader.meta.shape) != (n, c, h * w):
        return False
    readers = users.get(reader.id, ())
    return bool(readers) and all(_swaps_last_two(u) for u in readers)


def _swaps_last_two(n: Node) -> bool:
    if n.kind != "call" or not n.args:
        return False
    if n.target is aten.permute.default:
        return [d % 3 for d in n.args[1]] == [0, 2, 1]
    if n.target is aten.transpose.int:
        return {d % 3 for d in n.args[1:3]} == {1, 2}
    return False


def _convert(graph: Graph, users: dict, chosen: set, channels_last: set, eager: set) -> None:
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    into: dict[int, Node] = {}  # tensor id -> its channels-last copy (one per tensor, however many read it)

    def channels_last_copy(t: Node, before: Node) -> Node:
        if t.id not in into:
            into[t.id] = graph.call(aten.clone.default, (t,), {"memory_format": _CHANNELS_LAST}, meta=t.meta,
                                    before=before)
        return into[t.id]

    for conv in [n for n in graph.nodes if n.id in chosen]:
        image, weight = _image_as_read(conv, channels_last), conv.args[1]
        # oneDNN copies a contiguous weight into channels-last on every call, inside its ATen kernel. A frozen
        # weight is laid out so once, here (ResNet-50: 17 weight copies, 45 MB a call); another weight is copied
        # in the graph, a static kernel in the native run beside it. A 1x1 weight is both layouts.
        if isinstance(weight, Node) and any(int(s) != 1 for s in weight.meta.shape[2:]):
            if weight.kind == "constant" and isinstance(weight.value, torch.Tensor):
                if weight.id not in into:
                    into[weight.id] = graph.constant(ops.channels_last_weight(weight.value), meta=weight.meta,
                                                     before=conv)
                laid_out = into[weight.id]
            else:
                laid_out = channels_last_copy(weight, conv)
            conv.args = conv.args[:1] + (laid_out,) + conv.args[2:]
        conv.args = (image if image.id in channels_last else channels_last_copy(image, conv),) + conv.args[1:]
    # A single-pixel image is both layouts, and ATen's ops often give it NCHW strides (a pointwise op, a 1x1
    # convolution of a pixel); a padding of it then makes an NCHW image, which the next convolution copies to
    # channels-last inside ATen on every call (MobileNetV2's last blocks: TF-style padding of a 1x1 image before
    # a depthwise 3x3). Padding a channels-last copy of the pixel (C values per sample) gives the padded image
    # the layout the region has.
    for pad in [n for n in graph.nodes if n.id in channels_last and n.target is aten.constant_pad_nd.default
                and _single_pixel(n.args[0].meta)]:
        pad.args = (channels_last_copy(pad.args[0], pad),) + pad.args[1:]
    for value in [n for n in graph.nodes if n.id in channels_last - eager and isinstance(n.meta, TensorMeta)]:
        exits = _exits(value, channels_last, users)
        if not exits:
            continue
        first = min(exits, key=lambda u: position[u.id])
        back = graph.call(aten.contiguous.default, (value,), {}, meta=value.meta, before=first)
        swap = lambda m, value=value, back=back: back if m is value else m  # noqa: E731
        for u in exits:
            u.args = map_nodes(u.args, swap)
            u.kwargs = map_nodes(u.kwargs, swap)
