import warnings

warnings.filterwarnings("ignore", message="No ccache found")
