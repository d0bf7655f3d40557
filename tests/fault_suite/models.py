"""Paired models for the fault suite, built the same way in torch and paddle.

``make(kind, fw, bug)`` returns a model; ``bug=None`` is the faithful version.
Torch models define activations first, paddle ones last, so pairing can never
lean on definition order. Each bug names the layer that must be blamed in BUGS.
"""

from __future__ import annotations

import numpy as np


def _ns(fw: str):
    if fw == "torch":
        import torch
        import torch.nn.functional as F

        class Tanh(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, wrong):
                y = torch.tanh(x)
                ctx.save_for_backward(y)
                ctx.wrong = wrong
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return g * (1 - y * y) * (0.9 if ctx.wrong else 1.0), None

        return dict(
            Base=torch.nn.Module,
            linear=torch.nn.Linear,
            conv=lambda i, o, k: torch.nn.Conv2d(i, o, k, padding=1),
            bn=lambda c, eps=1e-5: torch.nn.BatchNorm2d(c, eps=eps),
            ln=lambda d, eps=1e-5: torch.nn.LayerNorm(d, eps=eps),
            gelu=torch.nn.GELU,
            relu=torch.nn.ReLU,
            gelu_f=F.gelu,
            relu_f=F.relu,
            linear_f=F.linear,
            mha=lambda d, h: torch.nn.MultiheadAttention(d, h, batch_first=True),
            mha_call=lambda m, x: m(x, x, x, need_weights=False)[0],
            lstm=lambda i, h: torch.nn.LSTM(i, h, batch_first=True),
            pool=lambda: torch.nn.AdaptiveAvgPool2d(1),
            flatten=lambda x: x.flatten(1),
            tanh_fn=lambda x, wrong: Tanh.apply(x, wrong),
        )
    import paddle
    import paddle.nn.functional as F
    from paddle.autograd import PyLayer

    class PTanh(PyLayer):
        @staticmethod
        def forward(ctx, x, wrong):
            y = paddle.tanh(x)
            ctx.save_for_backward(y)
            ctx.wrong = wrong
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensor()
            return g * (1 - y * y) * (0.9 if ctx.wrong else 1.0)

    return dict(
        Base=paddle.nn.Layer,
        linear=paddle.nn.Linear,
        conv=lambda i, o, k: paddle.nn.Conv2D(i, o, k, padding=1),
        bn=lambda c, eps=1e-5: paddle.nn.BatchNorm2D(c, epsilon=eps, momentum=0.9),
        ln=lambda d, eps=1e-5: paddle.nn.LayerNorm(d, epsilon=eps),
        gelu=paddle.nn.GELU,
        relu=paddle.nn.ReLU,
        # Looked up at call time, as user code does (F.gelu(x)), so API-level tracing sees the call.
        gelu_f=lambda x: F.gelu(x),
        relu_f=lambda x: F.relu(x),
        linear_f=lambda x, w, b: F.linear(x, w.T, b),
        mha=lambda d, h: paddle.nn.MultiHeadAttention(d, h),
        mha_call=lambda m, x: m(x, x, x),
        lstm=lambda i, h: paddle.nn.LSTM(i, h),
        pool=lambda: paddle.nn.AdaptiveAvgPool2D(1),
        flatten=lambda x: x.flatten(1),
        tanh_fn=lambda x, wrong: PTanh.apply(x, wrong),
    )


def _pattern(shape) -> np.ndarray:
    """1 + a fixed +-1% pattern, the same on both sides."""
    return (1 + 0.01 * np.cos(np.arange(int(np.prod(shape))))).reshape(shape).astype("float32")


def _perturbed_linear(ns, i, o, fw):
    """A Linear whose weight is off by 1% (a fixed pattern) when it runs."""

    class Linear(ns["linear"]):
        def forward(self, x):
            w = self.weight
            if fw == "torch":
                import torch

                return ns["linear_f"](x, w * torch.from_numpy(_pattern(w.shape)), self.bias)
            import paddle

            return paddle.nn.functional.linear(x, w * paddle.to_tensor(_pattern(w.shape)), self.bias)

    return Linear(i, o)


def _tanh_layer(ns, wrong):
    class CustomTanh(ns["Base"]):
        def forward(self, x):
            return ns["tanh_fn"](x, wrong)

    return CustomTanh()


def mlp(fw: str, bug: str | None = None):
    ns = _ns(fw)

    class MLP(ns["Base"]):
        def __init__(self):
            super().__init__()
            if fw == "torch":
                self.act = ns["relu"]() if bug == "act" else ns["gelu"]()
            self.fc1 = ns["linear"](16, 64)
            self.norm = ns["ln"](64, 1e-3 if bug == "eps" else 1e-5)
            self.fc2 = _perturbed_linear(ns, 64, 64, fw) if bug == "weight" else ns["linear"](64, 64)
            self.mid = _tanh_layer(ns, bug == "backward")
            self.fc3 = ns["linear"](64, 8)
            if fw != "torch":
                self.act = ns["relu"]() if bug == "act" else ns["gelu"]()

        def forward(self, x):
            h = self.fc1(x)
            h = (ns["relu_f"] if bug == "functional" else ns["gelu_f"])(h) * 3.0
            h = self.norm(h)
            h = self.act(self.fc2(h))
            h = self.mid(h)
            return self.fc3(h)

    return MLP()


def cnn(fw: str, bug: str | None = None):
    ns = _ns(fw)

    class CNN(ns["Base"]):
        def __init__(self):
            super().__init__()
            if fw == "torch":
                self.act = ns["relu"]()
            self.conv1 = ns["conv"](3, 8, 3)
            self.bn1 = ns["bn"](8)
            self.conv2 = _perturbed_conv(ns, 8, 16, fw) if bug == "weight" else ns["conv"](8, 16, 3)
            self.bn2 = ns["bn"](16, 1e-3 if bug == "eps" else 1e-5)
            self.pool = ns["pool"]()
            self.fc = ns["linear"](16, 10)
            if fw != "torch":
                self.act = ns["relu"]()

        def forward(self, x):
            x = self.act(self.bn1(self.conv1(x)))
            x = self.act(self.bn2(self.conv2(x)))
            return self.fc(ns["flatten"](self.pool(x)))

    return CNN()


def _perturbed_conv(ns, i, o, fw):
    """A 3x3 conv whose weight is off by 1% (a fixed pattern) when it runs."""

    class Conv(type(ns["conv"](1, 1, 3))):
        def forward(self, x):
            w = self.weight
            if fw == "torch":
                import torch

                return torch.nn.functional.conv2d(x, w * torch.from_numpy(_pattern(w.shape)), self.bias, padding=1)
            import paddle

            return paddle.nn.functional.conv2d(x, w * paddle.to_tensor(_pattern(w.shape)), self.bias, padding=1)

    return Conv(i, o, 3, padding=1)


def transformer(fw: str, bug: str | None = None, d: int = 32, heads: int = 4):
    ns = _ns(fw)

    class Block(ns["Base"]):
        def __init__(self):
            super().__init__()
            if fw == "torch":
                self.act = ns["relu"]() if bug == "act" else ns["gelu"]()
            self.ln1 = ns["ln"](d)
            self.attn = ns["mha"](d, heads)
            self.ln2 = ns["ln"](d, 1e-3 if bug == "eps" else 1e-5)
            self.fc1 = ns["linear"](d, 4 * d)
            self.fc2 = ns["linear"](4 * d, d)
            if fw != "torch":
                self.act = ns["relu"]() if bug == "act" else ns["gelu"]()

        def forward(self, x):
            h = self.ln1(x)
            x = x + ns["mha_call"](self.attn, h)
            # The MLP branch is scaled down, so an error inside it hides in the block output.
            return x + 0.01 * self.fc2(self.act(self.fc1(self.ln2(x))))

    return Block()


def lstm(fw: str, bug: str | None = None):
    ns = _ns(fw)

    class Tagger(ns["Base"]):
        def __init__(self):
            super().__init__()
            self.rnn = ns["lstm"](8, 16)
            self.head = _perturbed_linear(ns, 16, 4, fw) if bug == "weight" else ns["linear"](16, 4)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out)

    return Tagger()


def inputs(kind: str) -> np.ndarray:
    rng = np.random.RandomState(0)
    shape = {"mlp": (8, 16), "cnn": (4, 3, 8, 8), "transformer": (2, 6, 32), "lstm": (3, 5, 8)}[kind]
    return rng.randn(*shape).astype("float32")


BUILDERS = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "lstm": lstm}

# (model kind, bug) -> (phase, base path blamed, where)
BUGS = {
    ("mlp", "act"): ("forward", "act", "layer"),
    ("mlp", "eps"): ("forward", "norm", "layer"),
    ("mlp", "weight"): ("forward", "fc2", "layer"),
    ("mlp", "backward"): ("backward", "mid", "layer"),
    ("mlp", "functional"): ("forward", "", "between"),
    ("cnn", "weight"): ("forward", "conv2", "layer"),
    ("cnn", "eps"): ("forward", "bn2", "layer"),
    ("transformer", "act"): ("forward", "act", "layer"),
    ("transformer", "eps"): ("forward", "ln2", "layer"),
    ("lstm", "weight"): ("forward", "head", "layer"),
}
