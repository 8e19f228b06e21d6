"""The installed version of Pesto IR, as `pesto-compile --version` and `pesto_ir.__version__` give it."""

from importlib import metadata

try:
    __version__ = metadata.version("pesto-ir")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
