"""A layer tree's Python-side state, put back as it was after nbdiff's own calls."""

import pytest

torch = pytest.importorskip("torch")

from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.trace.user_state import kept_user_state  # noqa: E402


class _Cache:
    def __init__(self):
        self.keys, self.seen = [], 0


class _Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.history, self.calls, self.cache, self.shape = [1], 0, _Cache(), [2, 2]

    def forward(self, x):
        self.history.append(x)
        self.calls += 1
        self.cache.keys.append(x)
        self.cache.seen += 1
        self.shape = [2, 2]  # rebound to an equal value every call: no state
        self.fc.last = x  # added on a sublayer
        return self.fc(x)


def test_every_kind_of_python_state_is_put_back_in_place_and_reported():
    model = _Stateful()
    history, cache, keys = model.history, model.cache, model.cache.keys
    with kept_user_state(framework_of(model, "m"), model) as state:
        model(torch.ones(1, 2))
    assert state.changed
    assert model.history is history and history == [1] and model.calls == 0
    assert model.cache is cache and cache.keys is keys and keys == [] and cache.seen == 0
    assert not hasattr(model.fc, "last")


def test_a_call_that_keeps_no_state_reports_none():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())
    with kept_user_state(framework_of(model, "m"), model) as state:
        model(torch.ones(1, 2))
    assert not state.changed


def test_a_rebound_equal_value_is_no_change():
    class Shapes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.shape, self.scale = [2, 2], 1.0

        def forward(self, x):
            self.shape, self.scale = [2, 2], 1.0
            return x

    model = Shapes()
    with kept_user_state(framework_of(model, "m"), model) as state:
        model(torch.ones(1, 2))
    assert not state.changed


class _Config:
    def __init__(self):
        self.hidden, self.layers_seen, self.root = 4, [], None


class _SharedConfig(torch.nn.Module):
    """Every layer holds the one config object (transformers' way), which refers back to itself."""

    def __init__(self):
        super().__init__()
        self.config = _Config()
        self.config.root = self.config
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(3))
        for block in self.blocks:
            block.config = self.config

    def forward(self, x):
        self.config.layers_seen.append(len(self.config.layers_seen))
        self.config.hidden = 8
        for block in self.blocks:
            x = block(x)
        return x


def test_an_object_many_layers_hold_or_one_referring_to_itself_is_put_back_once():
    # A config that refers to itself made the snapshot recurse without end (RecursionError).
    model = _SharedConfig()
    config, seen = model.config, model.config.layers_seen
    with kept_user_state(framework_of(model, "m"), model) as state:
        model(torch.ones(1, 2))
    assert state.changed
    assert all(b.config is config for b in model.blocks) and model.config is config and config.root is config
    assert config.hidden == 4 and config.layers_seen is seen and seen == []
    with kept_user_state(framework_of(model, "m"), model) as state:
        model.blocks[0](torch.ones(1, 2))  # nothing of the config touched
    assert not state.changed
