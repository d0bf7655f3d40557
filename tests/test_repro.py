"""result.repro(path): a standalone script that fails on the bug and passes after the fix."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import OptionError  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def _run(script):
    # No nbdiff on the path: the script needs only numpy, safetensors and the frameworks.
    code = (
        f"import sys; sys.modules['nbdiff'] = None; exec(open({str(script)!r}).read(), {{'__file__': {str(script)!r}}})"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")


def _diverges_until_fixed(script, bug, fix):
    """The script exits 1 ("DIVERGES") as written, and 0 ("agrees") once ``bug`` reads ``fix``."""
    text = open(script).read()
    run = _run(script)
    assert run.returncode == 1 and "DIVERGES" in run.stdout, run.stdout + run.stderr
    with open(script, "w") as f:
        f.write(text.replace(bug, fix))
    run = _run(script)
    assert run.returncode == 0 and "agrees" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("base_fw, raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_the_script_exits_1_on_the_bug_and_0_after_the_fix(tmp_path, base_fw, raw_fw):
    bug_side = "raw" if raw_fw == "paddle" else "base"
    base = BUILDERS["mlp"](base_fw, "eps" if bug_side == "base" else None)
    raw = BUILDERS["mlp"](raw_fw, "eps" if bug_side == "raw" else None)
    script = nbdiff.auto_diff(base, raw, inputs("mlp")).repro(str(tmp_path / "repro"))
    text = open(script).read()
    assert "epsilon=0.001" in text and "import nbdiff" not in text
    _diverges_until_fixed(script, "epsilon=0.001", "epsilon=1e-05")  # the fix, where the port went wrong


def test_no_repro_without_the_layers(tmp_path):
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    loaded = nbdiff.load(result.save(str(tmp_path / "r")))
    with pytest.raises(OptionError, match="not a layer call with its layers at hand"):
        loaded.repro(str(tmp_path / "x"))


def test_a_backward_only_bug_is_reproduced_by_its_input_gradient(tmp_path):
    import numpy as np

    from tests.repro_models import PaddleNet, TorchNet

    x = np.random.RandomState(0).randn(4, 8).astype("float32")
    result = nbdiff.auto_diff(TorchNet(), PaddleNet(), x)
    d = result.first_divergence
    assert (d.phase.value, d.base_path) == ("backward", "act")
    script = result.repro(str(tmp_path / "repro"), d)
    text = open(script).read()
    assert "BACKWARD = True" in text and "PaddleTanh(bug=True)" in text
    _diverges_until_fixed(script, "PaddleTanh(bug=True)", "PaddleTanh(bug=False)")


def test_repro_of_agreeing_models_says_there_is_nothing_to_reproduce(tmp_path):
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), inputs("mlp"))
    assert result
    with pytest.raises(OptionError, match="no divergence to reproduce"):
        result.repro(str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_a_layer_named_with_backslashes_still_gives_a_script_that_runs(tmp_path):
    import numpy as np

    from tests.repro_models import ODD_NAME, PaddleOddNames, TorchOddNames

    x = np.random.RandomState(0).randn(4, 8).astype("float32")
    result = nbdiff.auto_diff(TorchOddNames(), PaddleOddNames(), x)
    assert result.first_divergence.base_path == ODD_NAME
    run = _run(result.repro(str(tmp_path / "repro")))
    assert run.returncode == 1 and "DIVERGES" in run.stdout, run.stdout + run.stderr


NOTEBOOK_CELLS = [
    "import numpy as np\nimport torch\nfrom torch import nn\nimport paddle",
    '''
class Scale(nn.Module):
    """A hand-written layer, as ports have: its arguments kept on it."""

    def __init__(self, features, factor=1.0):
        super().__init__()
        self.features, self.factor = features, factor
        self.weight = nn.Parameter(torch.ones(features))

    def forward(self, x):
        return x * self.weight * self.factor


class PaddleScale(paddle.nn.Layer):
    def __init__(self, features, factor=1.0):
        super().__init__()
        self.features, self.factor = features, factor
        self.weight = self.create_parameter([features], default_initializer=paddle.nn.initializer.Constant(1.0))

    def forward(self, x):
        return x * self.weight * self.factor


class TorchNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.scale = nn.Linear(4, 4), Scale(4)

    def forward(self, x):
        return self.scale(self.fc(x))


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc, self.scale = paddle.nn.Linear(4, 4), PaddleScale(4, factor=1.01)

    def forward(self, x):
        return self.scale(self.fc(x))
''',
    "import nbdiff\nresult = nbdiff.auto_diff(TorchNet(), PaddleNet(), np.ones((2, 4), 'float32'))",
]


def test_a_layer_class_defined_in_a_notebook_cell_is_written_into_the_script(tmp_path):
    """repro refused classes from a notebook cell (a script cannot import `__main__`); the cell's
    source is at hand (IPython keeps it), with the session's imports (`nn` from another cell)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        for text in NOTEBOOK_CELLS:
            assert shell.run_cell(text, store_history=True).success
        result = shell.user_ns["result"]
        assert result.first_divergence.base_path == "scale"
        script = result.repro(str(tmp_path / "repro"))
    finally:
        InteractiveShell.clear_instance()
    text = open(script).read()
    assert "class Scale(nn.Module):" in text and "class PaddleScale(paddle.nn.Layer):" in text
    assert "class TorchNet" not in text and "from torch import nn" in text
    assert "Scale(features=4, factor=1.0)" in text and "PaddleScale(features=4, factor=1.01)" in text
    _diverges_until_fixed(script, "factor=1.01", "factor=1.0")


def test_a_refused_repro_leaves_no_folder_behind(tmp_path):
    """It left a folder holding only repro.safetensors."""
    import numpy as np

    def make():
        class Local(torch.nn.Module):  # made in a function: no script can define it
            def forward(self, x):
                return x * 1.01

        return Local()

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 4), make())
    raw = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Identity())
    result = nbdiff.auto_diff(base, raw, np.ones((2, 4), "float32"))
    assert result.first_divergence.base_path == "1"
    with pytest.raises(OptionError, match="defined in a function"):
        result.repro(str(tmp_path / "repro"))
    assert not (tmp_path / "repro").exists()


HELPER_CELLS = [
    "import numpy as np\nimport torch\nimport paddle",
    """
WIDTH = 12
SCALES = {"torch": 1.0, "paddle": 1.01}


def gate(x):
    return x * SCALES["torch"]


class TSwish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return gate(x * torch.sigmoid(x))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * (s + x * s * (1 - s))


class PSwish(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * paddle.nn.functional.sigmoid(x) * SCALES["paddle"]

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensor()
        s = paddle.nn.functional.sigmoid(x)
        return g * (s + x * s * (1 - s))


class TAct(torch.nn.Module):
    def forward(self, x):
        return TSwish.apply(x)[..., :WIDTH]


class PAct(paddle.nn.Layer):
    def forward(self, x):
        return PSwish.apply(x)[..., :WIDTH]
""",
    """
class TNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act = torch.nn.Linear(WIDTH, WIDTH), TAct()

    def forward(self, x):
        return self.act(self.fc(x))


class PNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc, self.act = paddle.nn.Linear(WIDTH, WIDTH), PAct()

    def forward(self, x):
        return self.act(self.fc(x))
""",
    "import nbdiff\nresult = nbdiff.auto_diff(TNet(), PNet(), np.ones((2, WIDTH), 'float32'))",
]


def test_a_notebook_class_takes_the_helpers_and_constants_it_uses_into_the_script(tmp_path):
    """TAct calls an autograd.Function of its cell and reads WIDTH: the script held TAct alone and died
    with NameError (exit 1, read as "still diverges"). It writes what each class uses, once each."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        for text in HELPER_CELLS:
            assert shell.run_cell(text, store_history=True).success
        result = shell.user_ns["result"]
        assert result.first_divergence.base_path == "act", result.report()
        script = result.repro(str(tmp_path / "repro"))
    finally:
        InteractiveShell.clear_instance()
    text = open(script).read()
    notebook = text.split("# defined in the notebook")[1]
    for defined in ("WIDTH = 12", "def gate(x):", "class TSwish(", "class PSwish(", "class TAct(", "class PAct("):
        assert notebook.count(defined) == 1, defined
    assert notebook.count("import torch") == 1 and "class TNet" not in text
    assert notebook.index("class TSwish(") < notebook.index("class TAct(") and notebook.index(
        "def gate"
    ) < notebook.index("class TSwish(")
    _diverges_until_fixed(script, "'paddle': 1.01", "'paddle': 1.0")


def test_a_script_that_cannot_run_exits_2_and_says_why(tmp_path):
    """A script that failed for another reason than the divergence (a missing file, a NameError) exited 1,
    the status that means "still diverges"."""
    base = BUILDERS["mlp"]("torch", None)
    raw = BUILDERS["mlp"]("paddle", "eps")
    script = nbdiff.auto_diff(base, raw, inputs("mlp")).repro(str(tmp_path / "repro"))
    text = open(script).read()
    with open(script, "w") as f:
        f.write(text.replace("raw = ", "raw = undefined_name or ", 1))
    run = _run(script)
    assert run.returncode == 2 and "could not run: NameError" in run.stderr, run.stdout + run.stderr
    with open(script, "w") as f:
        f.write(text)
    (tmp_path / "repro" / "repro.safetensors").unlink()
    run = _run(script)
    assert run.returncode == 2 and "could not run: FileNotFoundError" in run.stderr, run.stdout + run.stderr


def test_a_class_defined_inside_a_cells_block_is_written_at_the_top_level():
    """A class defined under an `if` of its cell came out indented: the script could not be read."""
    from IPython.core.interactiveshell import InteractiveShell

    from nbdiff.report.cell_classes import CellDefinitions

    shell = InteractiveShell.instance()
    try:
        cells = [
            "import torch",
            "OFFSET = 0.5\nif True:\n    class Shift(torch.nn.Module):\n        def forward(self, x):\n            return x + OFFSET",
        ]
        for text in cells:
            assert shell.run_cell(text, store_history=True).success
        found = CellDefinitions()
        assert found.add(shell.user_ns["Shift"])
        source = found.source()
    finally:
        InteractiveShell.clear_instance()
    assert "\nclass Shift(torch.nn.Module):" in source and "OFFSET = 0.5" in source, source
    namespace: dict = {}
    exec(compile(source, "repro.py", "exec"), namespace)  # the script's own text, as it would run
    assert namespace["Shift"]()(torch.ones(2)).tolist() == [1.5, 1.5]
