"""Property-based and stateful tests (hypothesis)."""

from hypothesis import HealthCheck, settings


def fuzz_settings(examples: int) -> settings:
    """The same `examples` inputs every run (no flaky vacuity), no deadline (real databases
    and servers), fixtures shared across examples (each example checks its own effects)."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
