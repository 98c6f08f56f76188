"""The rules that make real models faster (issue 18): each checked on random instances, each shown
firing on a real model whose result still matches eager, and the rules that look right and are not
rejected with a counterexample."""
from __future__ import annotations

import pytest
import sympy
import torch

import rewrite
from rewrite import models
from rewrite.config import CompilerConfig
from rewrite.cost import calibration
from rewrite.dsl import aten as P
from rewrite.dsl import dtype_is, is_const, is_float, op, rule, variables
from rewrite.ir import Graph, TensorMeta
from rewrite.optimizer import optimize
from rewrite.report import GraphReport
from rewrite.rules import algebra, fused, gemm, shape_ops
from rewrite.testing import assert_equivalent, check_rule
from rewrite.unit import CompileUnit

aten = torch.ops.aten
NEW = [shape_ops.FRESH_COPIES, shape_ops.POINTWISE_RESHAPES, algebra.IDENTITY_CHAINS, *gemm.RULESETS, *fused.RULESETS]
NEW_RULES = [r for rs in NEW for r in rs]
# Costs fixed for the tests, so what extraction picks does not depend on the machine the tests run on.
FIXED = calibration.DEFAULT


@pytest.mark.parametrize("new_rule", NEW_RULES, ids=[r.name for r in NEW_RULES])
def test_new_rule_is_sound_on_more_instances(new_rule):
    report = check_rule(new_rule, examples=80, min_valid=6)
    assert report.ok


x, y, c, b, w = variables("x y c b w")
# Each left out of the library (see the module that says why); check_rule must find the counterexample.
LEFT_OUT = [
    # -0.0: (x + 0.0) + (-0.0) is +0.0 for x = -0.0, x + (-0.0) is -0.0
    rule(P.add.Tensor(P.add.Tensor(x, 0.0), c), P.add.Tensor(x, c), when=[is_float(x)], name="add_zero_then_any"),
    # erf GELU post-op: ATen's gelu(+inf) is nan, oneDNN's is inf
    rule(P.gelu.default(P.addmm.default(b, x, w)),
         op(torch.ops.mkldnn._linear_pointwise.default)(x, P.t_copy.default(w), b, "gelu", [], "none"),
         when=[dtype_is(b, torch.float32), dtype_is(x, torch.float32), is_const(w)], name="linear_gelu_erf"),
]
if not fused.LINEAR.rules:  # no oneDNN linear in this build: nothing to reject
    LEFT_OUT.pop()


@pytest.mark.parametrize("bad_rule", LEFT_OUT, ids=[r.name for r in LEFT_OUT])
def test_left_out_rule_has_a_counterexample(bad_rule):
    with pytest.raises(AssertionError, match="counterexample"):
        check_rule(bad_rule, examples=300)


def test_inexact_rules_declare_it_and_fail_bit_exact_checking():
    assert not gemm.FOLD_SCALES.rules[0].exact and algebra.IDENTITY_CHAINS.rules[0].exact
    exact_twin = rule(fused.GELU.rules[0].lhs, fused.GELU.rules[0].rhs, when=fused.GELU.rules[0].when, name="gelu_exact")
    with pytest.raises(AssertionError, match="unsound"):
        check_rule(exact_twin, examples=200)  # tanh GELU fused rounds differently: not bit-exact


# -- real models ------------------------------------------------------------------------------------

def _compile(model, *args, disabled=(), tier_up_calls=None):
    config = CompilerConfig()
    config.experimental_config.frozen_parameter = True
    config.rules.disabled = list(disabled)
    if tier_up_calls is not None:
        config.exec.tier_up_calls = tier_up_calls
    with torch.no_grad(), calibration.use(FIXED):
        want = model(*args)
        report = rewrite.explain(model, *args, config=config)
    return want[0], report.result[0], report


def _fired(report, *names):
    applied = report.applied()
    missing = [n for n in names if not applied.get(n)]
    assert not missing, f"{missing} did not fire; applied: {applied}"


def test_bert_merges_qkv_drops_copies_and_matches_eager():
    # ATen code (no tier-up), where the fused linear (linear_tanh) is offered too
    want, got, report = _compile(models.bert(), models.token_batch(2, 16), tier_up_calls=0)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    _fired(report, "merge_parallel_addmm_3", "merge_parallel_addmm_2", "copy_of_fresh", "copy_of_viewed_fresh",
           "gelu_of_view", "linear_tanh")
    ops = report.graphs[0].ops_after
    assert ops.get("aten.split.Tensor") == 2 and ops["aten.addmm.default"] <= 13 - 2 * 2  # QKV: 3 GEMMs -> 1
    assert "aten.clone.default" not in ops
    before, after = report.graphs[0].predicted_cost
    assert after < before


def test_gpt2_gelu_chain_becomes_one_kernel_and_matches_eager():
    # ATen code (no tier-up): the only place oneDNN's fused linear is offered (see the next test)
    want, got, report = _compile(models.gpt2(), models.token_batch(2, 16), tier_up_calls=0)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    _fired(report, "gelu_tanh", "gelu_tanh_of_view", "linear_gelu_tanh", "scale_into_addmm", "scale_before_view")
    ops = report.graphs[0].ops_after
    assert "aten.pow.Tensor_Scalar" not in ops and "aten.tanh.default" not in ops
    assert ops.get("aten.gelu.default", 0) + ops.get("mkldnn._linear_pointwise.default", 0) == 2


def test_graphs_headed_for_static_kernels_keep_small_gemms_as_kernels():
    # The default mode tiers up to static kernels: GEMM and post-op are C kernels in one native run there,
    # and oneDNN's fused linear (no static kernel) would be an ATen call between them. Offered, it loses on
    # this small model's GEMMs (oneDNN's call alone costs more than they take): extraction keeps the GEMMs.
    want, got, report = _compile(models.gpt2(), models.token_batch(2, 16))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    _fired(report, "gelu_tanh", "scale_into_addmm", "linear_gelu_tanh")
    assert not report.graphs[0].ops_after.get("mkldnn._linear_pointwise.default")


def test_t5_merges_bias_free_projections_and_matches_eager():
    want, got, report = _compile(models.t5().encoder, models.token_batch(2, 8))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    _fired(report, "merge_parallel_mm_3", "merge_parallel_mm_2", "relu_of_view")
    assert report.graphs[0].ops_after.get("aten.split.Tensor") == 2


def test_eager_attention_scale_moves_into_the_q_weight_and_matches_eager():
    from transformers import BertConfig, BertModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = BertModel(BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64,
                                     attn_implementation="eager")).eval()
    want, got, report = _compile(model, models.token_batch(2, 8))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    _fired(report, "scale_into_bmm", "scale_before_clone", "scale_before_permute", "scale_before_expand",
           "scale_into_addmm")


def test_resnet_batch_norms_fold_into_convolutions_and_match_eager():
    from transformers import ResNetConfig, ResNetModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = ResNetModel(ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                         layer_type="basic")).eval()
    want, got, report = _compile(model, torch.randn(2, 3, 32, 32))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    _fired(report, "batch_norm_into_conv_s2_p3", "batch_norm_into_conv_s1_p1", "batch_norm_into_conv_s2_p1",
           "batch_norm_into_conv_1x1_s2_p0")  # the last: the 1x1 projection of the shortcut
    ops = report.graphs[0].ops_after
    assert ops.get("aten._native_batch_norm_legit_no_training.default", 0) == 0


def test_switching_the_new_families_off_by_name_keeps_the_graph_as_before():
    _, _, on = _compile(models.bert(), models.token_batch(2, 16))
    want, got, off = _compile(models.bert(), models.token_batch(2, 16), disabled=["gemm", "fused", "shape.fresh_copies"])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    fired = set(off.applied())
    assert not fired & {r.name for rs in gemm.RULESETS + fused.RULESETS + [shape_ops.FRESH_COPIES] for r in rs}
    assert off.ops_after > on.ops_after


# -- identity chains ---------------------------------------------------------------------------------

def _chain(steps: int) -> Graph:
    """A ``steps``-op chain of sound identities on a [4, 4] input: +0.0, *1.0, double negation,
    double transpose, reshape to its own shape, contiguous copy."""
    g = Graph("chain")
    meta = TensorMeta(torch.float32, (sympy.Integer(4), sympy.Integer(4)))
    v = g.placeholder("x", meta)
    ops = [lambda v: [(aten.add.Tensor, (v, 0.0))],
           lambda v: [(aten.mul.Tensor, (v, 1.0))],
           lambda v: [(aten.neg.default, (v,)), (aten.neg.default, None)],
           lambda v: [(aten.t.default, (v,)), (aten.t.default, None)],
           lambda v: [(aten.reshape.default, (v, [4, 4]))],
           lambda v: [(aten.clone.default, (v,), {"memory_format": torch.contiguous_format})]]
    made = 0
    while made < steps:
        for target, args, *kwargs in ops[made % len(ops)](v):
            v = g.call(target, args if args is not None else (v,), kwargs[0] if kwargs else None, meta=meta)
            made += 1
    g.set_output((v,))
    return g


def test_a_hundred_step_identity_chain_ends_as_one_op():
    g = _chain(100)
    assert g.num_ops() >= 100
    report = GraphReport("chain")
    with calibration.use(FIXED):
        out = optimize(g, CompileUnit.detached(g.name, CompilerConfig(), report))
    assert out.op_counts() == {"aten.add.Tensor": 1}  # x + 0.0: the one op that is not an identity for -0.0
    assert report.applied.get("add_zero_then_add")
    assert_equivalent(g, out, exact=True)
    before, after = report.predicted_cost
    assert after < before / 50


def test_identity_chain_after_a_real_model_collapses():
    model = models.bert()

    def f(ids):
        h = model(ids).last_hidden_state
        return (((h + 0.0) * 1.0 + 0.0) + 0.0,)

    ids = models.token_batch(2, 16)
    want, got, report = _compile(f, ids)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    _fired(report, "add_zero_then_add", "mul_one")


def test_fused_linear_rules_exist_only_where_the_build_has_the_kernel(monkeypatch):
    """Without oneDNN (or when the kernel fails its tiny trial run) there is no fused rule, and the reason is listed."""
    from rewrite.rules import fused

    monkeypatch.setattr(fused, "LEFT_OUT", [])
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert fused._linear_rules() == []
    assert any("no oneDNN" in why for why in fused.LEFT_OUT)

    def broken(dtype):
        return torch.ops.mkldnn._linear_pointwise.default, (torch.ones(2, 3, dtype=dtype), torch.ones(5, 7), None,
                                                             "relu", [], "")

    assert not fused.available("_linear_pointwise", broken, torch.float32)
    assert fused.LEFT_OUT[-1].startswith("_linear_pointwise (torch.float32): ")


@pytest.mark.skipif(not fused.LINEAR.rules, reason="this build has no oneDNN fused linear")
@pytest.mark.parametrize("kernels", ["default", "inductor", "static"])
def test_every_fused_op_a_rule_emits_runs_on_every_kernel_backend(kernels, tmp_path):
    """A rule may only produce what every kernel backend runs: each post-op of the fused linear rules,
    through ATen code past the tier-up, Inductor's kernels and reduce-overhead's static kernels."""
    torch.manual_seed(0)
    w, b = torch.randn(16, 8), torch.randn(16)
    post_ops = [(attr, alg) for _, attr, alg in fused._ACTIVATIONS.values()]

    def f(x):
        return [torch.ops.mkldnn._linear_pointwise.default(x, w, b, attr, [], alg) for attr, alg in post_ops]

    config = rewrite.CompilerConfig()
    if kernels == "inductor":
        config.mode = "reduce-overhead"
        config.exec.kernels = "inductor"
    elif kernels == "static":
        config.mode = "reduce-overhead"
        config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = str(tmp_path)
    compiled = torch.compile(f, backend=rewrite.get_backend(compiler_config=config), fullgraph=True)
    x = torch.randn(4, 8)
    for _ in range(config.exec.tier_up_calls + 2):
        torch.testing.assert_close(compiled(x), f(x), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not fused.LINEAR.rules, reason="this build has no oneDNN fused linear")
def test_unfused_linear_computes_what_the_onednn_kernel_computes():
    from rewrite.ops import LINEAR_BINARY_OPS, LINEAR_POST_OPS, unfused_linear

    torch.manual_seed(0)
    k = torch.ops.mkldnn._linear_pointwise
    w, b = torch.randn(16, 8), torch.randn(16)
    for x in (torch.randn(4, 8), torch.randn(2, 3, 8)):
        for attr, alg in LINEAR_POST_OPS:
            for bias in (b, None):
                torch.testing.assert_close(unfused_linear(k.default, x, w, bias, attr, [], alg),
                                           k.default(x, w, bias, attr, [], alg), atol=1e-5, rtol=1e-5)
        other = torch.randn(*x.shape[:-1], 16)
        for attr in LINEAR_BINARY_OPS:
            torch.testing.assert_close(unfused_linear(k.binary, x, other, w, b, attr), k.binary(x, other, w, b, attr),
                                       atol=1e-5, rtol=1e-5)
    with pytest.raises(NotImplementedError, match="hardswish"):
        unfused_linear(k.default, torch.randn(4, 8), w, b, "hardswish", [], "")


def _fused_linear_graph(weight: torch.Tensor) -> Graph:
    """oneDNN's linear on a constant weight: what the ``fused.linear`` rules leave of a frozen GEMM."""
    g = Graph("fused_linear")
    x = g.placeholder("x", TensorMeta(torch.float32, (sympy.Integer(8), sympy.Integer(weight.shape[1]))))
    out = TensorMeta(torch.float32, (sympy.Integer(8), sympy.Integer(weight.shape[0])))
    g.set_output((g.call(torch.ops.mkldnn._linear_pointwise.default, (x, g.constant(weight), None, "none", [], ""),
                         meta=out),))
    return g


@pytest.mark.skipif(not fused.LINEAR.rules, reason="this build has no oneDNN fused linear")
def test_generated_code_binds_the_fused_linears_weight_packed_once_per_weight():
    """oneDNN reorders a dense weight on every call; generated code binds it in oneDNN's own layout instead,
    made once: two graphs with equal weights (two gears fold one weight twice) share one packed copy."""
    from rewrite.exec.codegen import compile_graph_to_python, generate_source
    from rewrite.ops import packed_linear_weight

    weight = torch.randn(48, 32, generator=torch.Generator().manual_seed(0))
    packed = []
    for w in (weight, weight.clone()):
        source, bound = generate_source(_fused_linear_graph(w))
        (name, value), = [(k, v) for k, v in bound.items() if isinstance(v, torch.Tensor) and v.is_mkldnn]
        (call,) = [line for line in source.splitlines() if "_linear_pointwise" in line]
        assert f"(a0, {name}, None," in call, source  # the call reads the packed weight
        packed.append(value)
    assert packed[0] is packed[1]
    x = torch.randn(8, 32)
    torch.testing.assert_close(compile_graph_to_python(_fused_linear_graph(weight))(x)[0], x @ weight.t(),
                               atol=1e-5, rtol=1e-5)
    # what oneDNN's packed form does not take is bound as it is
    for other in (weight.double(), weight.t(), torch.randn(4, 8, 8), torch.empty(0, 8)):
        assert packed_linear_weight(other) is other
