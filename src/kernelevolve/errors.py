"""The project's exceptions.

Inside the library, failures that a user must act on are raised as one of these; the CLI turns them
into a message and an exit code, and nothing else does. A candidate's failure is never an exception:
it is a `Verdict` value (see `kernelevolve.evaluate.verdict`).
"""


class KernelevolveError(Exception):
    """Base class. `hint` says what the user can do about it."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class SpecError(KernelevolveError):
    """A spec file cannot be used: it names the file and the problem."""


class PlatformError(KernelevolveError):
    """The requested platform is unknown or not usable on this machine."""


class WorkspaceError(KernelevolveError):
    """The workspace (database, blobs, config) cannot be opened or is inconsistent."""


class HarnessError(KernelevolveError):
    """The evaluation harness itself failed (not the candidate): a worker could not be started or
    prepared, or the device is unhealthy."""
