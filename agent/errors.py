"""voxline's small exception hierarchy: every message says what went wrong and what to do."""

from __future__ import annotations


class VoxlineError(Exception):
    """Base of every error voxline raises on purpose; the CLI prints it without a traceback."""


class ConfigError(VoxlineError):
    """A configuration value is invalid or unknown."""


class MissingExtraError(VoxlineError):
    """An optional dependency is not installed."""

    def __init__(self, what: str, extra: str, package: str | None = None) -> None:
        pkg = f" ({package})" if package else ""
        super().__init__(
            f"{what} needs an optional dependency that is not installed{pkg} — "
            f"install it with: pip install 'voxline[{extra}]'"
        )
        self.extra = extra


class ModelNotFoundError(VoxlineError):
    """A model file or model package is missing."""


class AudioInputError(VoxlineError):
    """An audio input cannot be read or decoded."""


class CapacityError(VoxlineError):
    """A fixed-capacity resource (an ASR slot pool, a call limit) is full."""


def require(module: str, *, what: str, extra: str, package: str | None = None):  # noqa: ANN201
    """Import ``module`` or raise a MissingExtraError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(what, extra, package or module) from exc
