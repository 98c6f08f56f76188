"""A TorchAir script runs with `import rewrite.compat.torchair as torchair` and `.npu()` removed."""
import torch

import rewrite.compat.torchair as torchair


def test_torchair_script_with_gears_and_streams():
    config = torchair.CompilerConfig()
    config.inference_config.dynamic_gears_merge_policy = "zip"
    backend = torchair.get_npu_backend(compiler_config=config)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, a, b):
            c = a + 1
            with torchair.scope.npu_stream_switch("1", 3):
                torchair.scope.npu_wait_tensor(b, c)
                d = torch.mm(b, self.w)
            return c.sum() + d

    model = Model().eval()
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    torchair.inference.set_dim_gears(a, dim_gears={0: [2, 4]})
    torchair.inference.set_dim_gears(b, dim_gears={0: [2, 4]})
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for rows in (4, 2):
            x, y = torch.randn(rows, 8), torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x, y), model(x, y))
