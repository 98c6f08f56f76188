"""torch.compile drops an in-place update of a 0-dim float64 input (AOTAutograd backends: inductor, aot_eager)."""
import sys

import torch


def f(a, b):
    a.add_(b)        # updates the caller's tensor
    return a * 2     # reads the updated value


results = {}
for backend in ("eager", "aot_eager", "inductor"):
    torch._dynamo.reset()
    a, b = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
    out = torch.compile(f, backend=backend, fullgraph=True)(a, b)
    results[backend] = (a.item(), out.item())
    print(f"{backend:10s} a after the call = {a.item()}, returned {out.item()}   (eager Python: 1.0, 2.0)")
if any(v != (1.0, 2.0) for v in results.values()):
    print("REPRODUCED: the update is dropped and the result computed from the old value")
    sys.exit(1)
print("not reproduced")
