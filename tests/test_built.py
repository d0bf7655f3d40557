"""Construction sites: the line of the owner's __init__ that built a layer."""

import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from nbdiff.trace.origin.built import construction_site  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        self.norm = torch.nn.LayerNorm(2, eps=1e-3)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.head = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU())


class PNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.layers = paddle.nn.LayerList([paddle.nn.LayerNorm(2, epsilon=1e-3)])


def _line(frame):
    return open(frame.filename).read().splitlines()[frame.lineno - 1].strip()


def test_the_line_that_built_each_layer():
    net = Net()
    assert _line(construction_site(net, "blocks.1.norm")) == "self.norm = torch.nn.LayerNorm(2, eps=1e-3)"
    assert construction_site(net, "blocks.1.norm").function == "Block.__init__"
    assert _line(construction_site(net, "blocks.0.fc2")).startswith("self.fc1, self.fc2 =")
    # inside framework containers: where the container was built
    assert _line(construction_site(net, "blocks.1")).startswith("self.blocks = torch.nn.ModuleList")
    assert _line(construction_site(net, "head.1")).startswith("self.head = torch.nn.Sequential")
    assert _line(construction_site(PNet(), "layers.0")).startswith("self.layers = paddle.nn.LayerList")


def test_unknown_places_are_none():
    net = Net()
    assert construction_site(net, "") is None and construction_site(net, "nothing.here") is None
    assert construction_site(torch.nn.Sequential(torch.nn.Linear(2, 2)), "0") is None


def test_a_comparison_on_the_same_line_does_not_hide_the_assignment():
    class Cond(torch.nn.Module):
        def __init__(self, bug=None):
            super().__init__()
            if self.training == "never":
                pass
            self.norm = torch.nn.LayerNorm(2, eps=1e-3 if bug == "eps" else 1e-5)

    assert "self.norm = " in _line(construction_site(Cond(), "norm"))
