"""The default suite is repeatable: hypothesis runs the same examples every time (conftest's `ci` profile)
and no property test draws its own at random."""

from __future__ import annotations

import os
import re

import pytest
from conftest import REPO
from hypothesis import settings


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci", reason="another hypothesis profile chosen")
def test_property_tests_are_derandomized():
    assert settings.default.derandomize and settings.default.database is None
    # a test's own settings inherit the profile's unless they say otherwise; none does (conftest's
    # `explore` profile does, for a run that asks for it)
    for path in sorted((REPO / "tests").glob("*.py")):
        if path.name != "conftest.py":
            assert not re.search(r"derandomize\s*=\s*False", path.read_text()), path.name
