"""Inductor with freezing on CPU: a convolution followed by ReLU turns NaN into 0 (eager keeps NaN)."""
import sys

import torch
import torch._inductor.config

torch._inductor.config.freezing = True


class ConvReLU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


torch.manual_seed(0)
model = ConvReLU().eval()
x = torch.randn(1, 3, 6, 6)
x[0, 0, 0, 0] = float("nan")
with torch.no_grad():
    expected = model(x)
    got = torch.compile(model, backend="inductor")(x)
print("eager:   ", int(expected.isnan().sum()), "NaN of", expected.numel())
print("compiled:", int(got.isnan().sum()), "NaN of", got.numel(), "| at a NaN of eager, compiled gives",
      got[expected.isnan()][:4].tolist())
if not torch.equal(expected.isnan(), got.isnan()):
    print("REPRODUCED: the compiled model turns NaN into 0")
    sys.exit(1)
print("not reproduced")
