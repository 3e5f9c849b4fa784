"""Errors the tool reports to users, each with the exit code scripts can rely on."""

from __future__ import annotations

# Exit codes (documented in README.md).
OK = 0
PATCH_FAILED = 1  # a patch conflicts, drifts, or is already upstream
BAD_INPUT = 2  # malformed series, lock or patch file; bad command line
FETCH_FAILED = 3  # download failed or a checksum did not match
BUILD_REFUSED = 4  # the series cannot be laid over the binary wheel
INTERRUPTED = 130


class OverlayError(Exception):
    """A failure the user can act on; ``str()`` is the message shown."""

    exit_code = BAD_INPUT


class InputError(OverlayError):
    exit_code = BAD_INPUT


class FetchError(OverlayError):
    exit_code = FETCH_FAILED


class PatchError(OverlayError):
    exit_code = PATCH_FAILED

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result  # the SeriesResult to report, when there is one


class BuildRefused(OverlayError):
    exit_code = BUILD_REFUSED
