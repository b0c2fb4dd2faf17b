"""llama.vim's keystroke handlers as `bench-session --keystroke-ms` runs them (`bench/llama_vim_typing.py`),
against a scripted server that answers after a fixed time: one request at a time, the next for
wherever the cursor is at the 100 ms retry after it, a pause that waits for an earlier cursor's
request, and a suggestion that the typing continues shown from the cache."""

import threading
import time

from dyncomplete.bench import llama_vim
from dyncomplete.bench.llama_vim_typing import At, TypingEditor, typed_between

LINES = tuple([f"v{i} = {i}" for i in range(300)] + ["    total = price * count", "    return total"] +
              [f"w{i} = {i}" for i in range(40)])


class Server:
    """Answers every request `delay_s` after it came, with `answer(context)`; logs (start, end, context, budget)."""

    def __init__(self, delay_s: float, answer=lambda context: "x"):
        self.delay_s, self.answer, self.log, self.lock = delay_s, answer, [], threading.Lock()

    def __call__(self, context, predict_ms):
        start = time.perf_counter()
        time.sleep(self.delay_s)
        with self.lock:
            self.log.append((start, time.perf_counter(), context, predict_ms))
        return {"text": self.answer(context)}


def type_line(editor: TypingEditor, states: list[At], gap_s: float) -> float:
    """Each cursor `gap_s` after the one before; when the last came."""
    at_s = time.perf_counter()
    for at in states:
        at_s += gap_s
        editor.run_until(at_s)
        editor.move(at)
    return at_s


def test_typing_passes_every_character_of_the_line_then_each_line_down_to_the_pause():
    before, pause = At(LINES, 300, "    "), At(LINES, 302, "")
    states = typed_between(LINES, before, pause, LINES[300])
    assert [s.typed for s in states[:2]] == ["    t", "    to"] and states[len(LINES[300]) - 5].typed == LINES[300]
    assert [(s.y, s.typed) for s in states[-2:]] == [(301, ""), (302, "")]
    assert typed_between(LINES, At(LINES, 300, "    to"), At(LINES, 300, "    tota"), None) == \
        [At(LINES, 300, "    tot"), At(LINES, 300, "    tota")]
    assert typed_between(LINES, None, pause, None) == [pause]  # another file: the cursor jumps


def test_one_request_at_a_time_each_for_the_cursor_at_the_retry_after_the_last():
    server = Server(0.25)
    editor = TypingEditor(server)
    try:
        states = typed_between(LINES, At(LINES, 300, "    "), At(LINES, 300, LINES[300]), None)
        type_line(editor, states, 0.05)
        editor.settle(5)
    finally:
        editor.close()
    log = sorted(server.log, key=lambda r: r[0])
    assert len(log) >= 3
    for (_, end, _, _), (start, _, context, budget) in zip(log, log[1:]):
        assert end <= start < end + llama_vim.RETRY_S + 0.1  # never two at once; sent again soon after
        assert budget == llama_vim.FIRST_PREDICT_MS
    typed = [r[2].middle for r in log]
    assert typed == sorted(typed, key=len) and len(set(typed)) == len(typed)  # the cursor at each send


def test_a_pause_waits_for_the_request_of_an_earlier_cursor_then_for_its_own():
    server = Server(0.3)
    editor = TypingEditor(server)
    try:
        start = At(LINES, 300, "    t")
        editor.move(start)  # sent at once
        pause = At(LINES, 300, "    to")
        editor.run_until(time.perf_counter() + 0.05)
        paused_s = time.perf_counter()
        editor.move(pause)  # the request for "    t" runs: retried every 100 ms
        shown = editor.wait_shown(pause, 5)
        waited = time.perf_counter() - paused_s
    finally:
        editor.close()
    assert shown.answer is not None and shown.answer[0] >= paused_s  # its own answer, after the pause
    held = editor.held_back_s(editor.context(pause, None), paused_s)
    assert 0.25 - 0.02 <= held <= 0.25 + llama_vim.RETRY_S + 0.1  # the running request's rest, then the retry
    assert waited >= held + 0.3 - 0.02
    assert [r[2].middle for r in server.log] == ["    t", "    to"]


def test_a_suggestion_that_the_typing_continues_shows_at_once_and_asks_for_the_text_with_it_accepted():
    rest = LINES[300][len("    tot"):]
    server = Server(0.05, lambda context: rest if context.middle == "    tot" else "")
    editor = TypingEditor(server)
    try:
        asked = At(LINES, 300, "    tot")
        editor.move(asked)
        editor.wait_shown(asked, 5)
        editor.run_until(time.perf_counter() + 0.3)  # the speculative request, for the line with it accepted
        pause = At(LINES, 300, "    tota")
        editor.move(pause)  # the user typed the suggestion's first character
        assert editor.shown is not None and editor.shown.at == pause and editor.shown.content == rest[1:]
        assert editor.shown.answer is None  # from the cache, not from an answer for this text
        editor.settle(5)
    finally:
        editor.close()
    speculative = [r for r in server.log if r[3] == llama_vim.SPECULATIVE_PREDICT_MS]
    assert len(speculative) == 1 and speculative[0][2].middle == LINES[300]  # the line with `rest` accepted
