"""The library's shared test fixtures (`tests/conftest.py`), for the harness's tests.

The two packages share one repository and one test run (`bash scripts/test`): the
fixtures are the library's, not copies.
"""

from tests.conftest import FIXTURES, data_dir, pep8_rulebook

__all__ = ["FIXTURES", "data_dir", "pep8_rulebook"]
