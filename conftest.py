"""Test-session options shared by tests/ and the doctests of bcrecord/."""

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--probe-style",
        choices=("auto", "inline", "call"),
        default="auto",
        help="how inserted probes are spelled for the whole session (bcrecord.set_probe_style)",
    )


def pytest_configure(config: pytest.Config) -> None:
    from bcrecord.rewrite import set_probe_style

    set_probe_style(config.getoption("--probe-style"))
