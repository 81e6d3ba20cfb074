"""The project's exception types: each message names what was wrong, where, and how to fix it."""


class InLoopEvalError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(InLoopEvalError, ValueError):
    """A configuration value is missing, out of range, or inconsistent."""


class UnknownTaskError(InLoopEvalError, KeyError):
    """A task id that the registry does not know."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class TaskDataError(InLoopEvalError, ValueError):
    """A task's data is missing or a document is malformed."""


class TokenizerError(InLoopEvalError, ValueError):
    """A tokenizer could not be loaded or cannot encode a request."""


class RequestError(InLoopEvalError, ValueError):
    """A request cannot be built, e.g. a continuation longer than the model's context."""


class ModelOutputError(InLoopEvalError, ValueError):
    """The model returned logits of the wrong shape or vocabulary size."""


class LMDataError(InLoopEvalError, ValueError):
    """A domain set for perplexity evaluation is missing, empty or malformed (names the label and file)."""
