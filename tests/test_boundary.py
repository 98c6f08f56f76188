"""Optimization keeps what callers and kernels see beyond values: fresh, distinct outputs and layouts."""
import torch

import rewrite


def _compile(fn, config=None):
    return torch.compile(fn, backend=rewrite.get_backend(config), fullgraph=True)


def test_cse_does_not_hand_back_one_tensor_twice():
    x = torch.randn(3)
    a, b = _compile(lambda x: (x + 1, x + 1))(x)
    assert a.data_ptr() != b.data_ptr()
    a.add_(1)
    torch.testing.assert_close(b, x + 1)
    z1, z2 = _compile(lambda x: (torch.zeros(3), torch.zeros(3)))(x)
    assert z1.data_ptr() != z2.data_ptr()


def test_same_output_twice_stays_one_tensor_like_eager():
    def fn(x):
        y = x * 2
        return y, y

    a, b = _compile(fn)(torch.randn(3))
    assert a.data_ptr() == b.data_ptr()  # eager returns the same tensor twice too


def test_identity_rule_does_not_return_the_input_itself():
    x = torch.randn(4)
    out = _compile(lambda x: x * 1)(x)
    assert out.data_ptr() != x.data_ptr()
    out.add_(1)
    assert not torch.equal(out, x)


def test_view_after_a_rewrite_of_a_strided_value():
    def fn(x):
        return (x.expand(4, 3) * 1).view(12) + 0.5

    x = torch.randn(1, 3)
    torch.testing.assert_close(_compile(fn)(x), fn(x))


def test_as_strided_reads_the_layout_it_was_given():
    def fn(x):
        return (x[:, 0:3] * 1).as_strided((4, 3), (3, 1)) + 0.5

    x = torch.arange(24.0).reshape(4, 6)
    torch.testing.assert_close(_compile(fn)(x), fn(x))


def test_frozen_weights_that_the_graph_updates_stay_state():
    torch.manual_seed(0)
    x = torch.randn(8, 3) * 5 + 3
    eager, compiled = torch.nn.BatchNorm1d(3).train(), torch.nn.BatchNorm1d(3).train()
    config = rewrite.CompilerConfig()
    config.experimental_config.frozen_parameter = True
    fn = _compile(compiled, config)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fn(x), eager(x))
    torch.testing.assert_close(compiled.running_var, eager.running_var)
    torch.testing.assert_close(compiled.running_mean, eager.running_mean)
    assert compiled.num_batches_tracked.item() == eager.num_batches_tracked.item() == 2
    torch.testing.assert_close(compiled.weight, eager.weight)
