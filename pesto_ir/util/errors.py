"""Errors a user sees. Each formats itself as one readable message, never a traceback.

`PestoError.format()` is what the CLI prints: `file:line:col: error: message`, then the source
line and a caret when the error points into a text the user wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

LINE_LIMIT = 1000  # longer message lines are cut: a 5 MB junk token must not become 15 MB of error text, and
# a message naming three long paths (a link, its target, the missing folder) stays whole
EXCERPT_WIDTH = 100  # characters of a long source line shown around the caret


def clipped(text: str, limit: int = LINE_LIMIT) -> str:
    """`text` with every line over `limit` characters cut short, saying how long it was."""
    return "\n".join(line if len(line) <= limit else f"{line[:limit - 60]}... ({len(line)} characters)"
                     for line in text.split("\n"))


def first_reason(e: Exception) -> str:
    """An error's first line, with the line after it where the first only introduces it (a
    validator's "the 1f1b plan for 'g' is invalid:" and its first problem)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


class PestoError(Exception):
    """Base of every error that is the input's fault, not Pesto's."""

    def format(self) -> str:
        return clipped(f"error: {self}")


@dataclass
class SourceSpan:
    """A position in a named text, with the text itself so a caret can be drawn."""

    file: str
    line: int  # 1-based
    col: int  # 1-based
    text: str | None = None
    width: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def excerpt(self) -> str:
        if self.text is None:
            return ""
        lines = self.text.splitlines()
        if not 1 <= self.line <= len(lines):
            return ""
        src, col = lines[self.line - 1], self.col
        if len(src) > EXCERPT_WIDTH:  # a window around the caret, marked where cut
            start = max(0, min(col - 1 - EXCERPT_WIDTH // 3, len(src) - EXCERPT_WIDTH))
            end = start + EXCERPT_WIDTH
            head, tail = ("..." if start else ""), ("..." if end < len(src) else "")
            src, col = head + src[start:end] + tail, col - start + len(head)
        lead = "".join(c if c == "\t" else " " for c in src[: col - 1])
        width = max(1, min(self.width, len(src) - col + 1))
        return f"  {src}\n  {lead}{'^' * width}"


class ParseError(PestoError):
    """Bad `.pir` text, pipeline string or JSON: points at the offending character."""

    def __init__(self, message: str, span: SourceSpan, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint

    def format(self) -> str:
        out = clipped(f"{self.span}: error: {self.message}")
        excerpt = self.span.excerpt()
        if excerpt:
            out += "\n" + excerpt
        if self.hint:
            out += "\n  " + clipped(self.hint)
        return out

    def __str__(self) -> str:
        return f"{self.span}: {self.message}"


@dataclass
class Diagnostic:
    """One verifier finding, naming the op and where it is (with the source line when known)."""

    where: str
    op: str | None
    message: str
    span: SourceSpan | None = None

    def __str__(self) -> str:
        subject = f"op '{self.op}': " if self.op else ""
        return f"{self.where}: error: {subject}{self.message}"

    def format(self) -> str:
        excerpt = self.span.excerpt() if self.span is not None else ""
        return clipped(f"{self}\n{excerpt}" if excerpt else str(self))


class VerifyError(PestoError):
    """The graph breaks an IR rule; carries every finding, not just the first."""

    def __init__(self, diagnostics: list[Diagnostic], context: str = "") -> None:
        self.diagnostics = diagnostics
        self.context = context
        super().__init__("; ".join(map(str, diagnostics)))

    def format(self) -> str:
        head = f"{self.context}\n" if self.context else ""
        return head + "\n".join(d.format() for d in self.diagnostics)


class PassError(PestoError):
    """A pass failed: says which pass, after which ones, and why."""

    def __init__(self, pass_name: str, done: list[str], cause: BaseException) -> None:
        self.pass_name = pass_name
        self.done = done
        self.cause = cause
        after = f" (after {', '.join(done)})" if done else ""
        self.headline = f"error in pass {pass_name}{after}"
        # the reason in str() too: `except PestoError as e: print(e)` must not lose it
        super().__init__(f"{self.headline}: {cause}")

    def format(self) -> str:
        inner = self.cause.format() if isinstance(self.cause, PestoError) else f"error: {self.cause}"
        return f"{self.headline}:\n{inner}"
