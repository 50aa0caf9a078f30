"""The search term's two translations (db/queue/reads.py): a prefix of an id as a range of the
primary key, and a term as a LIKE pattern that matches only itself. The database half (the prefix
index, the context's values) is in tests/integration/api/test_search.py."""

import re
from uuid import UUID

from hypothesis import given
from hypothesis import strategies as st

from db.queue.reads import id_prefix_range, like_escaped


@given(st.uuids(), st.integers(min_value=1, max_value=36), st.booleans())
def test_every_prefix_of_an_id_is_a_range_that_holds_it(item_id: UUID, length: int, upper: bool) -> None:
    prefix = str(item_id)[:length]
    bounds = id_prefix_range(prefix.upper() if upper else prefix)
    assert bounds is not None, prefix
    low, high = bounds
    assert low <= item_id <= high, (prefix, bounds)
    # ... and nothing else: both ends start with the prefix.
    assert str(low).startswith(prefix.lower()) and str(high).startswith(prefix.lower()), bounds


def test_a_term_no_id_starts_with_is_no_range() -> None:
    for term in ("g", "inv-1", "0123456-", "01234567-89abc", "01234567_", "0" * 37, "-", "٣"):
        assert id_prefix_range(term) is None, term


@given(st.text(min_size=1, max_size=50), st.text(max_size=20))
def test_an_escaped_term_matches_itself_and_only_itself(term: str, after: str) -> None:
    """LIKE's rules (% any run, _ any one character, backslash quoting the next), written as a
    regular expression: the escaped term matches a value that starts with it, whatever it holds."""
    pattern = like_escaped(term)
    regex, chars = "", iter(pattern)
    for c in chars:
        if c == "\\":
            regex += re.escape(next(chars))
        else:
            regex += ".*" if c == "%" else "." if c == "_" else re.escape(c)
    assert re.fullmatch(regex, term, re.S)
    assert re.match(regex, term + after, re.S)
    other = term.replace("%", "x").replace("_", "x").replace("\\", "x")
    if other != term:
        assert not re.fullmatch(regex, other, re.S), (term, other)
