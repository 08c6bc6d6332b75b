"""Errors that carry every problem found in the user's input, each naming its field."""

from __future__ import annotations

from simdist.frozen import frozen


@frozen(slots=True)
class Problem:
    field: str  # dotted path in the scenario file, e.g. "plan.tp"
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class ScenarioError(ValueError):
    """A scenario (or any user input) that cannot be used; holds every problem at once."""

    def __init__(self, problems: list[Problem] | Problem):
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class Collector:
    """Accumulates problems so validation can report all of them, not only the first."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix
        self.problems: list[Problem] = []

    def add(self, field: str, message: str) -> None:
        path = f"{self.prefix}.{field}" if self.prefix and field else (field or self.prefix)
        self.problems.append(Problem(path, message))

    def extend(self, err: ScenarioError) -> None:
        self.problems.extend(err.problems)

    def raise_if_any(self) -> None:
        if self.problems:
            raise ScenarioError(self.problems)
