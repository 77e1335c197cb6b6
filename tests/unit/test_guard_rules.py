"""The dir:// guard's pure rules: the `?cap_bytes=N` it takes, and who holds its `.lock` by the
kernel's list of locks."""

from __future__ import annotations

import pytest

from holdfast.client import guard_rules


@pytest.mark.parametrize("value,cap", [
    ("1", 1), ("4294967296", 1 << 32), ("9" * 19, int("9" * 19)),
    ("0", None), ("", None), ("-1", None), ("+5", None), (" 5", None), ("5 ", None), ("1e3", None),
    ("\u00b2", None),  # str.isdigit() took it; int() then raised ValueError, uncaught
    ("\u0661\u0660", None),  # Arabic-Indic 10: str.isdigit() and int() took it as 10
    ("9" * 20, None), ("9" * 5000, None),  # past int()'s digit limit: a ValueError too
])
def test_cap_bytes_takes_only_a_bounded_ascii_number_above_zero(value: str, cap: int | None) -> None:
    assert guard_rules.cap_bytes(value) == cap


LOCKS = """1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146541 0 EOF
1: -> FLOCK  ADVISORY  WRITE 4343 fe:00:2146541 0 EOF
2: POSIX  ADVISORY  WRITE 777 fe:00:2146541 0 EOF
3: FLOCK  ADVISORY  WRITE 888 fe:00:21465410 0 EOF
4: FLOCK  ADVISORY  WRITE 999 08:01:2146541 0 EOF
5: OFDLCK ADVISORY  READ  -1 00:19:13 0 EOF
"""


def test_flock_holders_names_who_holds_that_file_never_who_waits() -> None:
    assert guard_rules.flock_holders(LOCKS, 0xfe, 0, 2146541) == [4242]
    assert guard_rules.flock_holders(LOCKS, 8, 1, 2146541) == [999]
    assert guard_rules.flock_holders(LOCKS, 0xfe, 0, 1) == []
    assert guard_rules.flock_holders("", 0xfe, 0, 2146541) == []
