"""llama.vim's client side as bench-session mirrors it (`bench/llama_vim.py`), checked against
what `autoload/llama.vim` does: the context with and without an accepted suggestion, the four
cache keys, the lookup of a suggestion the typing continues, and what a shown suggestion keeps."""

from dyncomplete.bench import llama_vim
from dyncomplete.bench.session import template
from dyncomplete.bench.llama_vim import Context, SuggestionCache, local_context, shown_lines

LINES = [f"v{i} = {i}" for i in range(400)]


def test_the_context_is_256_lines_above_the_cursor_line_and_64_below():
    here = local_context(LINES, 300, "    ")
    assert here.prefix == "\n".join(LINES[44:300]) + "\n" and here.suffix == "\n" + "\n".join(LINES[301:365]) + "\n"
    assert (here.middle, here.indent) == ("", 0)  # a blank cursor line is sent empty, n_indent 0
    typed = local_context(LINES, 300, "    ret")
    assert (typed.middle, typed.indent) == ("    ret", 4)


def test_an_accepted_suggestion_moves_the_cursor_to_its_end():
    one = local_context(LINES, 300, "x = ", ["1"], last_indent=4)
    assert (one.middle, one.indent) == ("x = 1", 4) and one.prefix == local_context(LINES, 300, "x = ").prefix
    three = local_context(LINES, 300, "x = ", ["1", "y = 2", "z"])
    assert three.middle == "z" and three.suffix == one.suffix
    assert three.prefix == "\n".join([*LINES[46:300], "x = 1", "y = 2"]) + "\n"  # the window slid by two lines


def test_an_answer_is_kept_under_the_text_and_the_text_without_its_first_lines():
    context = Context("a\nb\nc\nd\n", "x", "\n", 0)
    keys = context.keys()
    assert len(keys) == len(set(keys)) == 4
    assert keys[1] == Context("b\nc\nd\n", "x", "\n", 0).keys()[0]
    assert len(Context("a\n", "x", "\n", 0).keys()) == 1  # nothing left to trim


def test_typing_what_the_suggestion_said_shows_its_rest_from_the_cache():
    cache = SuggestionCache()
    at_start = local_context(LINES, 300, "total = ")
    cache.insert(at_start, "price * count\nprint(total)")
    assert cache.suggestion(at_start) == "price * count\nprint(total)"
    assert cache.suggestion(local_context(LINES, 300, "total = pri")) == "ce * count\nprint(total)"
    assert cache.suggestion(local_context(LINES, 300, "total = sum")) is None  # typed otherwise
    assert cache.suggestion(local_context(LINES, 301, "total = pri")) is None  # another place
    assert cache.holds(at_start) and not cache.holds(local_context(LINES, 300, "total = pri"))


def test_the_cache_keeps_its_newest_keys():
    cache = SuggestionCache(max_keys=8)
    contexts = [local_context(LINES, 300 + i, "") for i in range(3)]  # four keys each
    for context in contexts:
        cache.insert(context, "x")
    assert len(cache.entries) == 8 and not cache.holds(contexts[0]) and cache.holds(contexts[2])


def test_a_shown_suggestion_drops_what_is_already_there():
    lines = ["def f():", "    ", "    return 1", "", "x = 2"]
    assert shown_lines("    y = 0\n\n", "    ", lines, 1) == ["y = 0"]  # the indentation typed, trailing lines
    assert shown_lines("    return 1", "    ", lines, 1) == [""]  # the next line again
    assert shown_lines("\n    return 1", "    ", lines, 1) == [""]
    assert shown_lines("", "    ", lines, 1) == [""]
    assert shown_lines("    y = 0\n    return 1", "    ", lines, 1) == ["y = 0", "    return 1"]


def test_the_literal_body_is_the_request_made_at_a_pause():
    assert template("llama_vim_infill.json")["t_max_predict_ms"] == llama_vim.FIRST_PREDICT_MS


def test_a_pause_before_the_background_request_is_answered_waits_for_the_next_retry():
    assert llama_vim.held_back_s(1.2, 0.4) == 0.0  # answered while the user typed
    assert llama_vim.held_back_s(0.5, 0.5) == 0.0
    assert abs(llama_vim.held_back_s(0.5, 0.55) - 0.1) < 1e-9  # the first retry, 100 ms after the pause
    assert abs(llama_vim.held_back_s(0.5, 0.6) - 0.1) < 1e-9
    assert abs(llama_vim.held_back_s(0.5, 0.61) - 0.2) < 1e-9
    assert abs(llama_vim.held_back_s(0.0, 1.234) - 1.3) < 1e-9
