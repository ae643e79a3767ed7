"""The installed cadenza version (torch-free, so the edge reports it without loading models)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("cadenza")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
