"""Served JSON is exactly json.dumps(indent=2) of the JSON-able value (plus a newline), with non-finite
floats as strings — whatever shortcut the writer takes for big flat lists."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings, strategies as st

from ckptfs.util.jsonutil import dumps_bytes

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                    st.text())
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                       st.dictionaries(st.text(), inner, max_size=6)),
                      max_leaves=40)


@settings(max_examples=150, deadline=None)
@given(values)
def test_same_text_as_json_dumps_indent_2(value):
    expected = json.dumps(value, indent=2, ensure_ascii=False) + "\n"
    assert dumps_bytes(value) == expected.encode("utf-8", "backslashreplace")


def test_numpy_values_and_non_finite_floats():
    value = {"scores": np.array([1.5, np.nan, np.inf, -np.inf], np.float32), "ids": np.arange(3, dtype=np.int32),
             "tokens": ("a", "b\n\"c\"", "é"), "x": np.float64(-0.0), "nested": [[1, 2], [], {}], "nan": math.nan}
    parsed = json.loads(dumps_bytes(value))
    assert parsed == {"scores": [1.5, "NaN", "Infinity", "-Infinity"], "ids": [0, 1, 2],
                      "tokens": ["a", "b\n\"c\"", "é"], "x": -0.0, "nested": [[1, 2], [], {}], "nan": "NaN"}
    assert dumps_bytes(value).endswith(b"}\n")


def test_invalid_utf8_names_survive_as_escapes():
    name = b"bad\xff".decode("utf-8", "surrogateescape")
    assert json.loads(dumps_bytes({"name": name}))["name"] == name
