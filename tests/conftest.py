import warnings

warnings.filterwarnings("ignore", message="No ccache found")

import signal  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def python_owns_ctrl_c():
    """Python's own SIGINT handler, as in a terminal or a kernel: a run started in the background
    (``pytest &``, some CI runners) inherits SIGINT ignored, and the Ctrl-C tests would see nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
