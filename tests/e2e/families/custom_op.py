"""A model whose forward calls an op from its own ``torch.library`` namespace (``hapc_test::``):
importing this file registers the op, as importing a library (transformers, torchvision) does."""

import torch

if not hasattr(torch.ops.hapc_test, "scaled_tanh"):
    @torch.library.custom_op("hapc_test::scaled_tanh", mutates_args=())
    def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.tanh(x) * scale

    @scaled_tanh.register_fake
    def _(x, scale):
        return torch.empty_like(x)

    def _backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * ctx.scale * (1 - (y / ctx.scale) ** 2), None

    def _save(ctx, inputs, output):
        ctx.scale = inputs[1]
        ctx.save_for_backward(output)

    scaled_tanh.register_autograd(_backward, setup_context=_save)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x, y):
        h = torch.ops.hapc_test.scaled_tanh(self.a(x), 1.5)
        return torch.nn.functional.cross_entropy(self.b(h), y)


def model():
    return Net()


def inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(10, 8, generator=gen), torch.randint(0, 4, (10,), generator=gen)
