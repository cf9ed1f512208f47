"""The few error types that cross module boundaries."""


class UsageError(Exception):
    """Bad command-line arguments or configuration: reported as one line, exit code 2."""

    exit_code = 2


class InferenceUnavailable(RuntimeError):
    """No inference server answers on this node, and none could be started (``rapid.rollout.inference_client``).
    Here, not there, so that ``rapid``'s command line names it without importing torch first."""


class FormatError(ValueError):
    """A stored object that is corrupt, truncated, oversized, of an unknown format or hostile.

    Consumers count and skip such objects; they never crash on them.
    """
