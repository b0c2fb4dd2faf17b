"""The server's per-client memory of sent files (`serve/client_files.py`): what it keeps, what it
retrieves into a prompt, and when it keeps its choice so that the prefix cache still hits."""

from dyncomplete.engine.repo_context import Chunk, RepoContext
from dyncomplete.serve.client_files import ClientFiles, document_key

MODELS = "\n".join(["class Request:", "    def __init__(self, method, url):", "        self.method = method",
                    "        self.url = url", "", "class Response:", "    status_code = 200", ""] * 2)
UNRELATED = "\n".join(f"def helper_{i}(x):\n    return x * {i}\n" for i in range(12))
TYPING = "import os\n\ndef send(client):\n    request = Request('GET', client.base)\n"


def test_windows_of_sent_files_that_match_the_cursor_come_after_the_requests_own_chunks():
    files = ClientFiles()
    files.remember("a", RepoContext([Chunk("pkg/_models.py", MODELS), Chunk("pkg/_utils.py", UNRELATED)]))
    own = RepoContext([Chunk("pkg/open.py", "OPEN = 1")])
    context = files.context("a", TYPING, None, own)
    assert context.chunks[0].text == "OPEN = 1"
    retrieved = context.chunks[1:]
    assert retrieved[0].filename == "pkg/_models.py" and "Request" in retrieved[0].text  # ranked first
    assert {c.filename for c in retrieved} <= {"pkg/_models.py", "pkg/_utils.py"}
    assert files.context("b", TYPING, None, None) is None  # another sender has no memory


def test_the_edited_document_is_remembered_but_never_retrieved_into_its_own_prompt():
    files = ClientFiles()
    first = MODELS + "\n# end\n"
    assert files.context("a", first, None, None) is None  # nothing else was sent yet
    context = files.context("a", TYPING, "\n", None)  # another document: the first one is now context
    assert context.chunks and all(c.filename == "(recent file)" for c in context.chunks)
    assert all(c.text in first for c in context.chunks)
    back = files.context("a", first + "x = Request(", None, None)  # back in the first document
    assert [c.text for c in back.chunks] == [TYPING]  # the other one is the context now


def test_the_choice_is_kept_while_the_query_drifts_little_and_made_anew_when_files_change():
    files = ClientFiles()
    files.remember("a", RepoContext([Chunk("m.py", MODELS)]))
    first = files.context("a", TYPING, None, None).chunks
    typed_on = files.context("a", TYPING + "    response = Response()\n", None, None).chunks
    assert typed_on == first  # one more line typed: same windows, same prompt start
    files.remember("a", RepoContext([Chunk("n.py", "def send(client, request):\n    return client.base\n")]))
    assert any(c.filename == "n.py" for c in files.context("a", TYPING, None, None).chunks)


def test_a_document_seen_through_a_sliding_window_is_one_slot_and_keeps_the_choice():
    """llama.vim sends the lines around the cursor: moving down drops the window's first lines."""
    files = ClientFiles()
    files.remember("a", RepoContext([Chunk("m.py", MODELS)]))
    lines = [f"value_{i} = Request('GET', base_{i})" for i in range(400)]
    window = 0
    choices = []
    for cursor in range(200, 230, 3):
        prefix, suffix = "\n".join(lines[cursor - 100 : cursor]) + "\n", "\n".join(lines[cursor : cursor + 20])
        window = len(prefix + suffix)
        choices.append(files.context("a", prefix, suffix, None).chunks)
    assert files.nbytes <= len(MODELS) + window  # the document once, not once per pause
    assert all(chunks == choices[0] for chunks in choices)  # the same windows: the same prompt start
    assert all(c.filename == "m.py" for c in choices[0])


def test_memory_is_bounded_per_client_and_in_clients():
    files = ClientFiles(max_clients=2, max_bytes=3000)
    for i in range(5):
        files.remember("a", RepoContext([Chunk(f"f{i}.py", f"x{i} = 1\n" * 100)]))  # 700 bytes each
    assert files.nbytes <= 3000
    for client in "bcd":
        files.remember(client, None, "y = 2\n")
    assert len(files) == 2
    assert document_key("same head" + "a" * 300) == document_key("same head" + "a" * 300 + "more typed")


def test_only_the_clients_served_last_keep_their_windows_indexed():
    files = ClientFiles()
    for client in "abcdef":
        files.remember(client, RepoContext([Chunk("m.py", MODELS)]))
        files.context(client, TYPING, None, None)
    assert [bool(state.windows) for state in files._clients.values()] == [False, False, True, True, True, True]
    assert files.context("a", TYPING, None, None).chunks  # indexed again when it comes back
