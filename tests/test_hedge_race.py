"""The live lab's hedge race (front and load generator): a call ends on its first ok
copy, or when no copy is left — as the simulator's call does (kernel: a copy's outcome
ends the call when it is ok or when no other copy is outstanding)."""

from __future__ import annotations

import asyncio

import pytest

from relakit.lab.in_path import first_answer


async def _copy(answer, delay_s, raises=None):
    await asyncio.sleep(delay_s)
    if raises is not None:
        raise raises
    return answer


def _race(*copies):
    async def race():
        tasks = {asyncio.ensure_future(_copy(*c)): c for c in copies}
        decided = await first_answer(set(tasks), lambda a: a == 200)
        for t in tasks:
            t.cancel()
        return decided.result()
    return asyncio.run(race())


def test_a_refused_copy_does_not_end_the_call_while_another_is_out():
    assert _race((429, 0.01), (200, 0.05)) == 200  # throttled or rejected first


def test_a_failed_copy_does_not_end_it_either():
    assert _race((0, 0.01, TimeoutError()), (200, 0.05)) == 200


def test_the_first_ok_copy_ends_the_call():
    assert _race((200, 0.01), (500, 0.002), (429, 0.2)) == 200


def test_with_no_ok_copy_the_last_to_finish_decides():
    assert _race((500, 0.01), (503, 0.03)) == 503
    with pytest.raises(TimeoutError):
        _race((500, 0.01), (0, 0.03, TimeoutError()))
