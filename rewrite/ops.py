"""What rewrite knows about ops, in one place: names, argument binding, keys, dtype groups, families.

Every layer (the IR printer, the e-graph, the shape engine, the padding proof, the cost model, the
executors, the export format) reads op knowledge from here instead of keeping a private table:

* **names**: `target_name` gives the one spelling of a call target (``aten.mul.Tensor``,
  ``higher_order.cond``, ``mul`` for Python's ``operator.mul``, ``math.floor``, ``torch.sym_max``);
  `target_from_name` is its inverse. Graph dumps, reports, e-graph terms and export files all use it.
* **binding**: `canonical_call` (every schema argument present, so two spellings of a call compare
  equal), `bind_arguments` (schema name -> value), `split_args` and `strip_defaults`.
* **keys**: canonical strings and hashes that two layers must agree on exactly: `dtype_str`,
  `shape_key`, `splat_key`, `constant_key`.
* **dtype groups**: `FLOATS`, `INTS`, `SIGNED_INTS`, `ALL_DTYPES`.
* **families** in the manner of tinygrad's ``GroupOp``: named frozensets of targets (``RESHAPES``,
  ``VIEWS``, ``MATMULS``...). A pass keeps ``{family: rule}`` tables plus named exceptions, so a new
  overload joins every pass at once, and two passes cannot disagree about what a view is.
"""
from __future__ import annotations

import functools
import hashlib
import math
import operator
import re
import threading
import weakref
from typing import Any, Sequence

import sympy
import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = [
    "OpError", "target_name", "target_from_name", "register_target", "is_registered",
    "canonical_call", "bind_arguments", "split_args", "strip_defaults", "schema_types", "schema_default",
    "NO_DEFAULT", "dtype_str", "shape_key", "splat_key", "constant_key", "ContentIndex",
    "FLOATS", "INTS", "SIGNED_INTS", "ALL_DTYPES",
    "is_overload", "is_mutable", "is_nondeterministic", "draws_random_numbers",
    "is_collective", "issues_collective", "COLLECTIVE_NAMESPACES", "is_pointwise", "returns_view", "family_table", "overloads",
    "GEMMS", "ADD_MATMULS", "COMMUTATIVE", "COMPUTE_FAMILIES", "MEMORY_FAMILIES", "COST_FAMILIES",
]

aten = torch.ops.aten


class OpError(ValueError):
    """An op name or a call's arguments do not fit the op; the message says what is allowed."""


# -- names -----------------------------------------------------------------------------------------

# Python callables a graph may call besides ATen/custom ops: size arithmetic, getitem on multi-output
# nodes, and torch's symbolic helpers. Named as `target_name` spells them.
SIZE_FUNCTIONS: dict[str, Any] = {}
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq", "ne", "lt",
              "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift", "rshift", "getitem", "truth"):
    SIZE_FUNCTIONS[_name] = getattr(operator, _name)
for _name in ("floor", "ceil", "trunc", "sqrt"):
    SIZE_FUNCTIONS[f"math.{_name}"] = getattr(math, _name)
for _name in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum", "_sym_sqrt"):
    if hasattr(torch, _name):
        SIZE_FUNCTIONS[f"torch.{_name}"] = getattr(torch, _name)
_FUNCTION_NAMES = {id(fn): name for name, fn in SIZE_FUNCTIONS.items()}

_known_targets: dict[str, Any] = dict(SIZE_FUNCTIONS)


def is_overload(target) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def target_name(t) -> str:
    """The one name of a call target: ``aten.mul.Tensor``, ``higher_order.cond``, ``mul``, ``math.floor``."""
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._schema.name.split('::')[-1]}.{t._overloadname}"
    if isinstance(t, torch._ops.HigherOrderOperator):
        return f"higher_order.{t.name()}"
    known = _FUNCTION_NAMES.get(id(t))
    if known is not None:
        return known
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__name__", repr(t))
    if mod in ("_operator", "operator"):
        return name
    return f"{mod}.{name}" if mod else name


def register_target(target) -> str:
    """Remember ``target`` under its name so `target_from_name` gives it back; returns the name."""
    name = target_name(target)
    _known_targets.setdefault(name, target)
    return name


_OVERLOAD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
_HIGHER_ORDER_NAME = re.compile(r"higher_order\.[A-Za-z][A-Za-z0-9_]*")


@functools.lru_cache(maxsize=1)
def _registered(generation: int) -> frozenset:
    """``ns.op.overload`` of every operator in torch's dispatcher (``generation`` refreshes it)."""
    names = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        op, _, overload = rest.partition(".")
        names.add(f"{ns}.{op}.{overload or 'default'}")
    return frozenset(names)


_generation = [0]


def is_registered(name: str) -> bool:
    """Whether ``name`` (``ns.op.overload``) is an operator registered in torch's dispatcher.

    Answered from the dispatcher's own list of names, with no attribute lookup, so a name taken
    from a file can never steer ``getattr`` (``torch.ops.load_library``, dunder attributes...)."""
    if not isinstance(name, str) or not _OVERLOAD_NAME.fullmatch(name):
        return False
    if name in _registered(_generation[0]):
        return True
    _generation[0] += 1  # an op registered since (an extension imported later): look once more
    return name in _registered(_generation[0])


def target_from_name(name: str):
    """The callable named ``name`` (the inverse of `target_name`); raises OpError if unknown.

    Only registered operators and higher-order ops are looked up: never an attribute chain that
    the name alone chooses."""
    known = _known_targets.get(name) if isinstance(name, str) else None
    if known is not None:
        return known
    target = None
    if isinstance(name, str) and _HIGHER_ORDER_NAME.fullmatch(name):
        target = getattr(torch.ops.higher_order, name.split(".")[1], None)
        if not isinstance(target, torch._ops.HigherOrderOperator):
            target = None
    elif is_registered(name):
        ns, opname, overload = name.split(".")
        target = getattr(getattr(getattr(torch.ops, ns), opname), overload)
        if not isinstance(target, torch._ops.OpOverload):
            target = None
    if target is None:
        raise OpError(f"unknown op target {name!r}; expected an op overload such as 'aten.mul.Tensor', "
                      "a higher-order op such as 'higher_order.cond' or a size function such as 'mul'")
    _known_targets[name] = target
    return target


# -- argument binding --------------------------------------------------------------------------------

NO_DEFAULT = object()


def canonical_call(target, args: Sequence, kwargs: dict | None = None) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of an ATen call with every schema argument present.

    Positional schema arguments go to ``args`` and keyword-only ones to ``kwargs``; missing ones
    take their schema default. Two spellings of the same call thus compare equal, which is what
    lets a pattern match a node and the e-graph CSE them. Non-ATen targets pass through.
    """
    kwargs = dict(kwargs or {})
    if not isinstance(target, torch._ops.OpOverload):
        return tuple(args), kwargs
    schema = target._schema
    out_args, out_kwargs = [], {}
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        raise OpError(f"{target_name(target)} takes {len(positional)} positional arguments, got {len(args)}")
    for i, a in enumerate(schema.arguments):
        if not a.kwarg_only and i < len(args):
            value = args[i]
        elif a.name in kwargs:
            value = kwargs.pop(a.name)
        elif a.has_default_value():
            value = a.default_value
        else:
            raise OpError(f"{target_name(target)}: missing required argument {a.name!r} (schema: {schema})")
        (out_kwargs.__setitem__(a.name, value) if a.kwarg_only else out_args.append(value))
    if kwargs:
        raise OpError(f"{target_name(target)}: unknown keyword arguments {sorted(kwargs)}; schema: {schema}")
    return tuple(out_args), out_kwargs


def bind_arguments(target, args: Sequence, kwargs: dict | None = None) -> dict:
    """Schema argument name -> value for a call of an ATen overload, defaults filled in."""
    cargs, ckwargs = canonical_call(target, args, kwargs)
    positional = [a.name for a in target._schema.arguments if not a.kwarg_only]
    return {**dict(zip(positional, cargs)), **ckwargs}


def split_args(target, values: Sequence) -> tuple[list, dict]:
    """A canonical flat argument list (schema order) -> ``(args, kwargs)``."""
    if not isinstance(target, torch._ops.OpOverload):
        return list(values), {}
    args, kwargs = [], {}
    for a, v in zip(target._schema.arguments, values):
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return args, kwargs


def strip_defaults(target, args: Sequence, kwargs: dict) -> tuple[tuple, dict]:
    """Drop trailing arguments equal to their schema default, so calls read like eager ones."""
    if not isinstance(target, torch._ops.OpOverload):
        return tuple(args), kwargs
    schema_args = target._schema.arguments
    positional = [a for a in schema_args if not a.kwarg_only]
    args = list(args)
    while args and len(args) <= len(positional):
        a = positional[len(args) - 1]
        if a.has_default_value() and _is_default(args[-1], a.default_value):
            args.pop()
        else:
            break
    out_kwargs = {}
    for a in schema_args:
        if a.kwarg_only and a.name in kwargs:
            v = kwargs[a.name]
            if not (a.has_default_value() and _is_default(v, a.default_value)):
                out_kwargs[a.name] = v
    return tuple(args), out_kwargs


def _is_default(value, default) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return (len(value) == len(default)
                and all(type(x) is type(y) and x == y for x, y in zip(value, default)))
    return type(value) is type(default) and not isinstance(value, torch.Tensor) and value == default


def schema_types(target) -> tuple[list[str], dict[str, str]]:
    """Schema type strings of the positional and keyword-only arguments ('Tensor', 'int[]', ...)."""
    if not isinstance(target, torch._ops.OpOverload):
        return [], {}
    pos, kw = [], {}
    for a in target._schema.arguments:
        (kw.__setitem__(a.name, str(a.type)) if a.kwarg_only else pos.append(str(a.type)))
    return pos, kw


def schema_default(target, name: str):
    """The schema default of argument ``name``, or `NO_DEFAULT`."""
    if isinstance(target, torch._ops.OpOverload):
        for a in target._schema.arguments:
            if a.name == name and a.has_default_value():
                return a.default_value
    return NO_DEFAULT


# -- properties read off the schema ------------------------------------------------------------------

def is_mutable(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def is_nondeterministic(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


# Ops of these namespaces talk to other processes (a call on one rank needs its peer calls on the others).
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd")


def is_collective(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.namespace in COLLECTIVE_NAMESPACES


def issues_collective(target) -> bool:
    """A collective call the ranks must issue in one order (``all_reduce``, ``all_gather_into_tensor``...):
    every functional collective but ``wait_tensor``, which only waits for one issued before."""
    return is_collective(target) and target._opname != "wait_tensor"


def draws_random_numbers(target, args: tuple, kwargs: dict) -> bool:
    """Whether this call advances a random generator: seeded-nondeterministic ops, except those
    (attention) whose only randomness is a ``dropout_p`` argument that is 0."""
    if not is_nondeterministic(target):
        return False
    params = target._schema.arguments
    i = next((k for k, a in enumerate(params) if a.name == "dropout_p"), None)
    if i is None:
        return True
    p = kwargs.get("dropout_p", args[i] if i < len(args) else params[i].default_value)
    return not (isinstance(p, (int, float)) and p == 0)


def is_pointwise(target) -> bool:
    """Pointwise ATen ops without mutation whose results are all tensors."""
    return (isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags
            and not target._schema.is_mutable
            and all(r.type.kind() == "TensorType" for r in target._schema.returns))


def returns_view(target) -> bool:
    """Whether the op's result may share its first input's memory (schema alias annotation).

    ``_unsafe_view`` has none (autograd treats it as fresh), yet its result shares memory.
    """
    if target is aten._unsafe_view.default:
        return True
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.returns:
        return False
    info = target._schema.returns[0].alias_info
    return info is not None and not info.is_write


# -- keys two layers must agree on ---------------------------------------------------------------------

def dtype_str(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def shape_key(shape) -> str:
    """Canonical string of a shape (tuple of ints / sympy expressions)."""
    return "[" + ",".join(str(sympy.sympify(s)) for s in shape) + "]"


def splat_key(value) -> str | None:
    """Canonical string of 'every element equals this number', or None if not a splat."""
    if isinstance(value, bool):
        value = float(value)
    if isinstance(value, (int, float)):
        f = float(value)
        if math.isnan(f):
            return None
        return repr(f) if f != 0 else ("-0.0" if math.copysign(1, f) < 0 else "0.0")
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        if value.numel() == 0 or value.is_complex():
            return None
        flat = value.reshape(-1)
        first = flat[0]
        # a few samples first: a weight matrix is rejected without a pass over all its elements
        if flat.numel() > 64 and not bool((flat[:: flat.numel() // 16] == first).all()):
            return None
        if not bool((flat == first).all()):
            return None
        if value.dtype.is_floating_point and bool((torch.signbit(flat) != torch.signbit(first)).any()):
            return None
        return splat_key(first.item())
    return None


# tensor -> (its version counter, its key): the optimizer runs several times per graph (rounds,
# gears) and hashing real weights costs ~0.1 s per 100 MB each time. Keyed by identity, weakly.
_constant_keys = WeakIdKeyDictionary()


def constant_key(value) -> tuple:
    """A hashable key equal for two constants exactly when their contents are bit-identical.

    Constants are compared by dtype, shape, device and their bytes, so -0.0 and 0.0, or two NaN
    payloads, stay apart: merging them would change results.
    """
    if not isinstance(value, torch.Tensor):
        if isinstance(value, (int, float, bool, str, type(None))):
            return ("py", type(value).__name__, repr(value))
        return ("id", id(value))
    if value.is_sparse or value.is_quantized or value.is_nested or value.layout != torch.strided:
        return ("id", id(value))
    cached = _constant_keys.get(value)
    if cached is not None and cached[0] == value._version:
        return cached[1]
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    # clone, not contiguous(): a 1-element tensor with stride 0 counts as contiguous but cannot be viewed as bytes.
    raw = (t.clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8) if t.numel()
           else torch.empty(0, dtype=torch.uint8))
    digest = hashlib.blake2b(memoryview(raw.numpy()), digest_size=16).hexdigest()
    key = ("tensor", str(value.dtype), tuple(value.shape), str(value.device), value.requires_grad, digest)
    _constant_keys[value] = (value._version, key)
    return key


SAMPLE_ELEMENTS = 64  # elements from each end of a constant in its sample key


def _sample_key(value: torch.Tensor) -> tuple:
    """dtype, shape, device, requires_grad and a digest of the first and last elements: equal for
    bit-identical constants, and for different weights almost never equal."""
    if value.numel() <= 2 * SAMPLE_ELEMENTS or value.layout != torch.strided or value.is_quantized \
            or value.is_nested:  # small (hashing it all is as cheap; decided by the shape alone), or not plain
        return constant_key(value)
    flat = value.detach().reshape(-1)  # a copy only when not contiguous: the elements in logical order
    ends = torch.cat([flat[:SAMPLE_ELEMENTS], flat[-SAMPLE_ELEMENTS:]]).cpu().view(torch.uint8)
    digest = hashlib.blake2b(memoryview(ends.numpy()), digest_size=16).hexdigest()
    return ("sample", str(value.dtype), tuple(value.shape), str(value.device), value.requires_grad, digest)


class ContentIndex:
    """Constants by content (`constant_key`: bit-identical dtype, shape, device and bytes), hashing a
    constant's bytes in full only when another constant has the same `_sample_key`. Frozen weights
    are hundreds of MB that almost never repeat: hashing them all cost ~1.3 s of BERT-base's compile."""

    def __init__(self):
        self._sampled: dict[tuple, list] = {}  # sample key -> [(value, payload)] until a second value shares it
        self._full: dict[tuple, object] = {}  # constant_key -> payload, for values whose sample key is shared

    def setdefault(self, value, payload):
        """The payload of the first constant added with ``value``'s content; ``payload`` if none was."""
        if not isinstance(value, torch.Tensor):
            return self._full.setdefault(constant_key(value), payload)
        sample = _sample_key(value)
        group = self._sampled.get(sample)
        if group is None:
            self._sampled[sample] = [(value, payload)]
            return payload
        for earlier, earlier_payload in group:  # the group is keyed by full content from now on
            self._full.setdefault(constant_key(earlier), earlier_payload)
        group.clear()
        return self._full.setdefault(constant_key(value), payload)


# -- dtype groups ------------------------------------------------------------------------------------

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SIGNED_INTS = (torch.int8, torch.int16, torch.int32, torch.int64)
INTS = (torch.uint8,) + SIGNED_INTS
ALL_DTYPES = FLOATS + INTS + (torch.bool,)
COMPLEX = (torch.complex64, torch.complex128)
# Storage dtypes with few or no CPU kernels: they are moved, cast and stored, rarely computed with.
FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
               if hasattr(torch, n))
WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)


# -- families ----------------------------------------------------------------------------------------

def overloads(*names: str) -> frozenset:
    """ATen overloads by ``op.overload``, skipping those this torch build lacks (how a family is declared)."""
    out = []
    for n in names:
        packet, overload = n.split(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            out.append(op)
    return frozenset(out)


# Views and layout: the result reads its input's elements in another arrangement.
RESHAPES = overloads("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")
PERMUTES = overloads("permute.default", "permute_copy.default")
TRANSPOSES = overloads("transpose.int", "transpose_copy.int")
MATRIX_TRANSPOSES = overloads("t.default", "t_copy.default")
EXPANDS = overloads("expand.default", "expand_copy.default")
UNSQUEEZES = overloads("unsqueeze.default", "unsqueeze_copy.default")
SQUEEZES = overloads("squeeze.dim", "squeeze.dims", "squeeze.default", "squeeze_copy.dim", "squeeze_copy.dims")
SLICES = overloads("slice.Tensor", "slice_copy.Tensor")
SELECTS = overloads("select.int", "select_copy.int")
SPLITS = overloads("split.Tensor", "split_copy.Tensor")
SPLITS_WITH_SIZES = overloads("split_with_sizes.default", "split_with_sizes_copy.default")
# The same elements, the same shape: an alias or a fresh copy (possibly of another dtype or layout).
ALIASES = overloads("alias.default", "detach.default")
COPIES = overloads("clone.default", "lift_fresh_copy.default", "contiguous.default", "_to_copy.default")
# Ops that move no data: their result is a view of their input (copy variants excluded).
VIEWS = overloads("view.default", "_unsafe_view.default", "permute.default", "t.default", "transpose.int",
                   "expand.default", "unsqueeze.default", "squeeze.dim", "squeeze.dims", "squeeze.default",
                   "slice.Tensor", "select.int", "alias.default", "as_strided.default", "detach.default",
                   "split.Tensor", "split_with_sizes.default", "unbind.int")
# Sizes read off a tensor (SymInt results).
SIZE_QUERIES = overloads("sym_size.int", "sym_numel.default", "sym_stride.int", "sym_storage_offset.default")
# Ops whose result depends on the layout of their input, not only on its values.
STRIDE_READERS = overloads("as_strided.default", "as_strided_.default", "as_strided_scatter.default",
                            "sym_stride.int", "sym_stride.default", "stride.int")

# Reductions, by where their dim and keepdim arguments sit.
SUMS = overloads("sum.dim_IntList", "sum.default", "prod.dim_int", "prod.default")
MEANS = overloads("mean.dim", "mean.default")
VARIANCES = overloads("var.correction", "var.dim", "std.correction", "std.dim")
VARIANCE_MEANS = overloads("var_mean.correction", "std_mean.correction")
MIN_MAX = overloads("amax.default", "amin.default")
ANY_ALL = overloads("any.dim", "any.dims", "any.default", "all.dim", "all.dims", "all.default")
ARG_REDUCTIONS = overloads("argmax.default", "argmin.default")
MAX_MIN_DIM = overloads("max.dim", "min.dim")
FULL_MAX_MIN = overloads("max.default", "min.default")
LOGSUMEXP = overloads("logsumexp.default")
# Along one dim, keeping the shape.
SOFTMAXES = overloads("_softmax.default", "_log_softmax.default", "softmax.int", "log_softmax.int")
SCANS = overloads("cumsum.default", "cumprod.default")
SCANS_WITH_INDICES = overloads("cummax.default", "cummin.default")
SORTS = overloads("sort.default", "sort.stable")
TOP_K = overloads("topk.default")
# Reductions over one dim that return (values, indices), like max.dim.
SELECTIONS = overloads("kthvalue.default", "median.dim", "mode.default", "nanmedian.dim")

MATMULS = overloads("mm.default", "bmm.default", "addmm.default", "baddbmm.default", "matmul.default",
                     "linear.default")
# The BLAS GEMMs graphs call after AOTAutograd: what static kernels generate and rules fold weights into.
GEMMS = overloads("mm.default", "addmm.default", "bmm.default")
# GEMMs that add a bias given first (``addmm(b, x, w)``): the activation is their second argument.
ADD_MATMULS = overloads("addmm.default", "baddbmm.default")
CONVOLUTIONS = overloads("convolution.default")
ATTENTION = overloads("scaled_dot_product_attention.default", "_scaled_dot_product_flash_attention_for_cpu.default",
                       "_scaled_dot_product_efficient_attention.default",
                       "_scaled_dot_product_flash_attention.default", "_scaled_dot_product_cudnn_attention.default")
LAYER_NORMS = overloads("native_layer_norm.default")

# Tensors made from sizes and values alone, or shaped like another tensor.
FACTORIES = overloads("zeros.default", "ones.default", "empty.memory_format", "rand.default", "randn.default")
FULLS = overloads("full.default")
RANGES = overloads("arange.default", "arange.start", "arange.start_step")
SCALAR_TENSORS = overloads("scalar_tensor.default")
LIKE_FACTORIES = overloads("full_like.default", "zeros_like.default", "ones_like.default", "empty_like.default",
                            "rand_like.default", "randn_like.default")
NEW_FACTORIES = overloads("new_zeros.default", "new_ones.default", "new_empty.default", "new_full.default")

# Python arithmetic on sizes (SymInt / SymFloat / SymBool values).
SIZE_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
                             operator.mod, operator.neg, operator.pow, operator.eq, operator.ne, operator.lt,
                             operator.le, operator.gt, operator.ge})


def family_table(*pairs) -> dict:
    """``{target: rule}`` from ``(family, rule)`` pairs (a family is any iterable of targets).

    Later pairs win, so a named exception listed after its family overrides it.
    """
    table: dict = {}
    for family, rule in pairs:
        for target in family:
            table[target] = rule
    return table


# Every reduction over dims, whatever the position of its dim and keepdim arguments (bind them by name).
REDUCTIONS = (SUMS | MEANS | VARIANCES | VARIANCE_MEANS | MIN_MAX | ANY_ALL | ARG_REDUCTIONS | MAX_MIN_DIM
              | FULL_MAX_MIN | LOGSUMEXP | SELECTIONS)


def _ops_of(namespace: str, *names: str) -> frozenset:
    """Overloads of a non-ATen namespace by ``op.overload``, skipping those this build lacks."""
    out = []
    for n in names:
        packet, overload = n.split(".")
        op = getattr(getattr(getattr(torch.ops, namespace), packet, None), overload, None)
        if isinstance(op, torch._ops.OpOverload):
            out.append(op)
    return frozenset(out)


# Fused CPU kernels ATen ships (oneDNN linear with post-ops; MKL GEMM on a weight packed per batch
# size), where this build has them; the cost model knows them whether or not a rule produces them.
FUSED_LINEARS = _ops_of("mkldnn", "_linear_pointwise.default", "_linear_pointwise.binary")
PACKED_LINEARS = _ops_of("mkl", "_mkl_linear.default")

# oneDNN post-ops of ``mkldnn._linear_pointwise``, as ATen calls: (attr, algorithm) -> f(linear output),
# and ``.binary``'s attr -> f(linear output, other). A rule may only produce a post-op listed here
# (rules/fused.py checks it), so every kernel backend can run the fused op: the ones that cannot
# lower oneDNN's kernel (Inductor asserts on an unpacked weight) run `unfused_linear` instead.
LINEAR_POST_OPS = {
    ("none", ""): lambda y: y,
    ("relu", ""): torch.ops.aten.relu.default,
    ("tanh", ""): torch.ops.aten.tanh.default,
    ("sigmoid", ""): torch.ops.aten.sigmoid.default,
    ("gelu", "none"): torch.ops.aten.gelu.default,
    ("gelu", "tanh"): lambda y: torch.ops.aten.gelu.default(y, approximate="tanh"),
}
LINEAR_BINARY_OPS = {"add": torch.ops.aten.add.Tensor, "sub": torch.ops.aten.sub.Tensor,
                     "mul": torch.ops.aten.mul.Tensor}


class _SharedForms:
    """A constant's derived form (a packed or re-laid-out copy) by the constant's contents (`constant_key`), made
    once: every gear of a function folds its own copy of a frozen weight, and all of them read one derived copy.
    It lives as long as some graph or generated code holds it."""

    def __init__(self):
        self._forms: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def get(self, weight: torch.Tensor, make) -> torch.Tensor:
        key = constant_key(weight)
        with self._lock:
            form = self._forms.get(key)
        if form is None:
            form = make(weight.detach())
            with self._lock:  # two threads deriving one weight at once: the first one's copy is kept
                form = self._forms.setdefault(key, form)
        return form


_packed_linear_weights = _SharedForms()
_channels_last_weights = _SharedForms()


def packed_linear_weight(weight):
    """oneDNN's own blocked layout of a constant `FUSED_LINEARS` weight ([out, in], float32, CPU), made once.

    ``mkldnn._linear_pointwise`` takes a dense weight or this one; given a dense one, oneDNN reorders it
    on every call. Generated code binds this form instead (`CONSTANT_OPERAND_FORMS`): at MiniLM's shapes
    the call then took 0.70-0.97x of the time MKL's GEMM took. Anything else is returned as it is."""
    if not (isinstance(weight, torch.Tensor) and weight.layout == torch.strided and weight.device.type == "cpu"
            and weight.dtype == torch.float32 and weight.dim() == 2 and weight.is_contiguous() and weight.numel()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return weight
    return _packed_linear_weights.get(weight, torch.ops.mkldnn._reorder_linear_weight)


def channels_last_weight(weight: torch.Tensor) -> torch.Tensor:
    """A constant 4-d convolution weight laid out channels-last, made once (`rewrite.passes.channels_last`: a
    convolution run channels-last reads its weight so; oneDNN would copy a contiguous one on every call)."""
    return _channels_last_weights.get(weight, lambda w: w.clone(memory_format=torch.channels_last))


# Operands a kernel reads faster in a form of its own, made once when generated code binds a constant
# there (`rewrite.exec.codegen.Emitter`): target -> {argument position: the form of a constant}.
CONSTANT_OPERAND_FORMS = {
    **{t: {1: packed_linear_weight} for t in _ops_of("mkldnn", "_linear_pointwise.default")},
    **{t: {2: packed_linear_weight} for t in _ops_of("mkldnn", "_linear_pointwise.binary")},
}


def _linear(x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """``x @ weight.T + bias`` over x's last dim (weight ``[out, in]``, as oneDNN reads it), in ATen ops."""
    aten = torch.ops.aten
    rows = aten.reshape.default(x, [-1, x.shape[-1]])
    wt = aten.t.default(weight)
    y = aten.mm.default(rows, wt) if bias is None else aten.addmm.default(bias, rows, wt)
    return aten.reshape.default(y, [*x.shape[:-1], weight.shape[0]])


def unfused_linear(op, *args, **kwargs) -> torch.Tensor:
    """One of `FUSED_LINEARS` as the ATen ops it fuses (a decomposition for backends without oneDNN)."""
    if op == getattr(getattr(torch.ops.mkldnn, "_linear_pointwise", None), "default", None):
        a = bind_arguments(op, args, kwargs)
        post = LINEAR_POST_OPS.get((a["attr"], a["algorithm"] or ""))
        if post is None or a["scalars"]:
            raise NotImplementedError(f"mkldnn._linear_pointwise post-op {a['attr']!r} (algorithm {a['algorithm']!r}, "
                                      f"scalars {a['scalars']}) has no ATen form here; known: {sorted(LINEAR_POST_OPS)}")
        return post(_linear(a["X"], a["W"], a["B"]))
    a = bind_arguments(op, args, kwargs)
    if a["attr"] not in LINEAR_BINARY_OPS:
        raise NotImplementedError(f"mkldnn._linear_pointwise.binary attr {a['attr']!r} has no ATen form here; "
                                  f"known: {sorted(LINEAR_BINARY_OPS)}")
    return LINEAR_BINARY_OPS[a["attr"]](_linear(a["X"], a["W"], a["B"]), a["other"])


BATCH_NORMS = overloads("_native_batch_norm_legit_no_training.default", "_native_batch_norm_legit.default",
                         "native_batch_norm.default")
CONCATS = overloads("cat.default", "stack.default")

# Binary ops whose two tensor operands commute (the rest of their arguments at the schema's
# defaults: ``add(x, y, alpha=2)`` does not). A DSL rule matches both operand orders of these.
COMMUTATIVE = overloads("add.Tensor", "mul.Tensor", "maximum.default", "minimum.default", "logical_and.default",
                        "logical_or.default", "logical_xor.default", "bitwise_and.Tensor", "bitwise_or.Tensor",
                        "bitwise_xor.Tensor", "eq.Tensor", "ne.Tensor")

# Cost families, by what bounds an op's time: `rewrite.cost` prices them and `rewrite.cost.calibration`
# measures their rates. A compute family's work is its flops, a memory family's the bytes it moves;
# every other op is "pointwise" (memory-bound, one pass over the data).
COMPUTE_FAMILIES = {"gemm": MATMULS, "fused_linear": FUSED_LINEARS, "packed_linear": PACKED_LINEARS,
                    "attention": ATTENTION, "convolution": CONVOLUTIONS}
MEMORY_FAMILIES = {"normalization": LAYER_NORMS | BATCH_NORMS | SOFTMAXES | REDUCTIONS, "copy": COPIES | CONCATS}
COST_FAMILIES = (*COMPUTE_FAMILIES, *MEMORY_FAMILIES, "pointwise")


# -- what generated code calls -----------------------------------------------------------------------

def _python_bindings() -> dict:
    """Overload -> the op's generated Python binding, for overloads whose binding cannot mean another one
    given the arguments a graph passes (checked against ``OpOverload._op`` in tests/test_foundation.py)."""
    f, method, nn = torch._C._VariableFunctions, torch._C.TensorBase, torch._C._nn
    table = {
        "convolution.default": f.convolution, "addmm.default": f.addmm, "mm.default": f.mm, "bmm.default": f.bmm,
        "baddbmm.default": f.baddbmm, "permute.default": f.permute, "t.default": f.t, "transpose.int": f.transpose,
        "unsqueeze.default": f.unsqueeze, "squeeze.dim": f.squeeze, "select.int": f.select,
        "view.default": method.view, "expand.default": method.expand,
        "native_layer_norm.default": f.native_layer_norm, "_softmax.default": f._softmax,
        "_log_softmax.default": f._log_softmax, "clone.default": f.clone, "cat.default": f.cat,
        "embedding.default": f.embedding, "constant_pad_nd.default": f.constant_pad_nd,
        "_native_batch_norm_legit_no_training.default": f._native_batch_norm_legit_no_training,
        "_scaled_dot_product_flash_attention_for_cpu.default": f._scaled_dot_product_flash_attention_for_cpu,
        "mean.dim": f.mean, "sum.dim_IntList": f.sum, "amax.default": f.amax,
        "relu.default": f.relu, "tanh.default": f.tanh, "sigmoid.default": f.sigmoid, "exp.default": f.exp,
        "rsqrt.default": f.rsqrt, "sqrt.default": f.sqrt, "neg.default": f.neg, "abs.default": f.abs,
        "erf.default": f.erf, "gelu.default": nn.gelu, "silu.default": nn.silu, "hardtanh.default": nn.hardtanh,
        "max_pool2d_with_indices.default": nn.max_pool2d_with_indices,
    }
    return {op: fn for name, fn in table.items() for op in overloads(name)}


def _tensor_bindings() -> dict:
    """Overloads whose binding means them when every operand before the keyword arguments is a tensor
    (with a Python number it could pick the ``.Scalar`` overload)."""
    f = torch._C._VariableFunctions
    return {aten.add.Tensor: f.add, aten.sub.Tensor: f.sub, aten.mul.Tensor: f.mul, aten.div.Tensor: f.div,
            aten.where.self: f.where}


PYTHON_BINDINGS = _python_bindings()
TENSOR_BINDINGS = _tensor_bindings()


def kernel_of(target, all_tensors: bool = False):
    """What generated code calls for ``target``: an ATen overload's generated Python binding where it is
    known to mean that overload (``all_tensors``: every positional argument is a tensor), else the
    overload's ATen kernel (``OpOverload._op``); any other callable as it is.

    The binding parses its arguments in C++ code generated for its signatures; ``_op`` converts them by
    walking the schema: a convolution costs 4.8 us of Python and dispatch by its binding and 10.0 us by
    ``_op``, a permute 2.2 against 4.0, a layer norm 7.9 against 11.4 (this machine, 2026-11-27). Both
    reach the same kernel through the same dispatcher keys.
    """
    if not isinstance(target, torch._ops.OpOverload):
        return target
    fn = PYTHON_BINDINGS.get(target)
    if fn is None and all_tensors:
        fn = TENSOR_BINDINGS.get(target)
    return fn if fn is not None else target._op
