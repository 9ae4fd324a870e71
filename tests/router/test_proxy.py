"""gcache-router as a process with no engine up: its own answers (models, health, metrics, the
OpenAI error bodies) and a clear 503 when every engine is down. The engines' side is
connectors/vllm/tests/test_router.py (two real vLLM engines)."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from gcache.cli.ports import free_ports


def word_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["<s>", "</s>", "<unk>", "the", "cache", "keeps", "pages", "of", "kv"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    root = tmp_path_factory.mktemp("router")
    port, dead_a, dead_b = free_ports(3)
    log = root / "router.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gcache.router.main", "--listen", f"127.0.0.1:{port}",
         "--model", f"tiny={word_tokenizer(root / 'tok')}", "--buckets", "8,16",
         "--instance", f"http://127.0.0.1:{dead_a}", "--instance",
         f"http://127.0.0.1:{dead_b};bucket=1", "--health-interval", "0.2"],
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "gcache-router ready" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", (dead_a, dead_b)
        assert proc.poll() is None, log.read_text()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log.read_text()


def call(url, path, body=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url + path, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_models_and_metrics(router):
    url, _ = router
    status, body = call(url, "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["tiny"]
    status, body = call(url, "/metrics")
    assert status == 200 and b"gcache_router_instance_up" in body


@pytest.mark.parametrize("path, payload, status, words", [
    ("/v1/completions", b'{"model": "tiny", "prompt"', 400, "malformed JSON"),
    ("/v1/completions", b'"the cache"', 400, "JSON object"),
    ("/v1/completions", b'{"model": "big", "prompt": "the cache"}', 404, "`big` does not exist"),
    ("/v1/completions", b'{"model": "tiny", "prompt": {"a": 1}}', 400, "'prompt' must be"),
    ("/v1/completions", b'{"model": "tiny", "prompt": [1, -2]}', 400, "'prompt' must be"),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": []}', 400, "'messages' must"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "' + b"the cache " * 9 + b'"}', 400,
     "longest bucket"),
])
def test_bad_input_gets_an_openai_error_body(router, path, payload, status, words):
    url, _ = router
    got, body = call(url, path, raw=payload)
    error = json.loads(body)["error"]
    assert got == status and error["code"] == status and words in error["message"], body
    assert set(error) == {"message", "type", "param", "code"}


def test_with_every_engine_down_a_request_gets_503_naming_them(router):
    url, (dead_a, dead_b) = router
    got, body = call(url, "/v1/completions", {"model": "tiny", "prompt": "the cache keeps"})
    message = json.loads(body)["error"]["message"]
    assert got == 503 and f"127.0.0.1:{dead_a}" in message and f"127.0.0.1:{dead_b}" in message
    status, body = call(url, "/health")
    assert status == 503 and json.loads(body) == {"instances_up": []}


def test_a_tokenizer_that_cannot_be_loaded_stops_the_router_at_start(tmp_path):
    port, engine = free_ports(2)
    done = subprocess.run(
        [sys.executable, "-m", "gcache.router.main", "--listen", f"127.0.0.1:{port}",
         "--model", f"tiny={tmp_path / 'missing'}", "--instance", f"http://127.0.0.1:{engine}"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr
    assert "models=" in done.stderr and "its tokenizer cannot be loaded" in done.stderr


def test_messages_the_chat_template_refuses_are_a_bad_request(tmp_path):
    from transformers import AutoTokenizer

    from gcache.errors import InvalidRequest
    from gcache.router.prompts import prompt_tokens
    path = word_tokenizer(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}"
                               "{{ raise_exception('no tools here') }}{% endif %}"
                               "{{ m['content'] }} {% endfor %}")
    body = {"messages": [{"role": "user", "content": "the cache keeps pages of kv"}]}
    assert prompt_tokens(tokenizer, "/v1/chat/completions", body) == [3, 4, 5, 6, 7, 8]
    with pytest.raises(InvalidRequest, match="no tools here"):
        prompt_tokens(tokenizer, "/v1/chat/completions",
                      {"messages": [{"role": "tool", "content": "x"}]})


def test_a_chat_request_with_an_image_is_looked_up_only_before_the_image(tmp_path):
    """The engine keys the image's placeholder tokens by the image (``gcache.mm``), which the
    router cannot compute: it looks up only what precedes the first media part."""
    from transformers import AutoTokenizer

    from gcache.router.prompts import lookup_tokens, prompt_tokens
    tokenizer = AutoTokenizer.from_pretrained(word_tokenizer(tmp_path / "tok"))
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    chat = "/v1/chat/completions"
    text = {"type": "text", "text": "the cache keeps"}
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    plain = {"messages": [{"role": "user", "content": "pages of kv"},
                          {"role": "user", "content": [text]}]}
    with_image = {"messages": [{"role": "user", "content": "pages of kv"},
                               {"role": "user", "content": [text, picture,
                                                            {"type": "text", "text": "kv"}]}]}
    tokens = prompt_tokens(tokenizer, chat, plain)
    assert lookup_tokens(tokenizer, chat, plain, tokens) == tokens
    tokens = prompt_tokens(tokenizer, chat, with_image)
    known = lookup_tokens(tokenizer, chat, with_image, tokens)
    assert 0 < len(known) < len(tokens) and known == tokens[:len(known)]
    first = {"messages": [{"role": "user", "content": [picture, text]}]}
    assert lookup_tokens(tokenizer, chat, first, prompt_tokens(tokenizer, chat, first)) == []


def serve_engine(post):
    """A local HTTP engine whose health checks pass (their times are in the returned list)
    and whose completions are ``post(handler)``."""
    import http.server
    import threading

    checks = []

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):                        # /health: fine
            checks.append(time.monotonic())
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            post(self)

        def log_message(self, *args):
            pass

    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    engine.daemon_threads = True
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    return engine, checks


def start_hang_router(tmp_path, engine):
    """A router in front of ``engine`` alone that gives up on 1 s of silence and holds a hung
    engine out for 5 s; (process, url, log path, the engine's name), once it is up."""
    name = f"127.0.0.1:{engine.server_port}"
    (port,) = free_ports(1)
    log = tmp_path / "router.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gcache.router.main", "--listen", f"127.0.0.1:{port}",
         "--model", f"tiny={word_tokenizer(tmp_path / 'tok')}",
         "--instance", f"http://{name}", "--health-interval", "0.2",
         "--upstream-read-timeout", "1", "--hang-hold", "5"],
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        up_again(proc, url, log, 60)
    except BaseException:
        proc.terminate()
        proc.wait(timeout=30)
        raise
    return proc, url, log, name


def up_again(proc, url, log, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while call_or_none(url, "/health") != 200:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def held_down_while_its_checks_pass(url, log, checks, since: float) -> None:
    while sum(t > since for t in checks) < 3:             # its checks go on passing
        assert time.monotonic() - since < 30, log.read_text()
        time.sleep(0.05)
    got, body = call(url, "/health")
    assert got == 503 and json.loads(body)["instances_up"] == [], body


def test_an_engine_that_hangs_after_a_healthy_check_gives_up_its_request_and_is_held_down(
        tmp_path):
    """An engine that answers its health checks but never a completion (a hung scheduler)
    holds the request for --upstream-read-timeout only: then it counts as failed and the
    request goes elsewhere, here nowhere (503 naming it). Its passing checks do not bring it
    back before --hang-hold (so no later request waits out the timeout there again); after
    the hold it is back, and a second hang in a row holds it twice as long."""
    import threading

    release = threading.Event()
    engine, checks = serve_engine(lambda handler: release.wait(60))   # never answered
    proc, url, log, name = start_hang_router(tmp_path, engine)
    try:
        started = time.monotonic()
        got, body = call(url, "/v1/completions", {"model": "tiny", "prompt": "the cache keeps"})
        assert got == 503, body
        assert name in json.loads(body)["error"]["message"]
        assert time.monotonic() - started < 20
        held_down_while_its_checks_pass(url, log, checks, time.monotonic())
        assert "held out of rotation for 5s (hang 1 in a row)" in log.read_text()
        up_again(proc, url, log, 60)                         # the hold is over
        got, body = call(url, "/v1/completions", {"model": "tiny", "prompt": "the cache keeps"})
        assert got == 503, body
        assert "held out of rotation for 10s (hang 2 in a row)" in log.read_text()
    finally:
        release.set()
        engine.shutdown()
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log.read_text()


def test_an_engine_that_stalls_in_the_middle_of_a_stream_ends_it_with_an_error_and_is_held_down(
        tmp_path):
    """An engine that starts streaming and then goes silent (a scheduler hung mid-decode)
    costs its client one --upstream-read-timeout: the stream ends with an error event after
    the tokens already sent, and the engine is held out of rotation as one that hangs before
    answering is, though its health checks pass."""
    import threading

    release = threading.Event()

    def stream_then_stall(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        handler.wfile.write(b'data: {"choices": [{"text": " the"}]}\n\n')
        handler.wfile.flush()
        release.wait(60)

    engine, checks = serve_engine(stream_then_stall)
    proc, url, log, name = start_hang_router(tmp_path, engine)
    try:
        started = time.monotonic()
        got, body = call(url, "/v1/completions",
                         {"model": "tiny", "prompt": "the cache keeps", "stream": True})
        assert got == 200, body
        first, error = [json.loads(event.removeprefix(b"data: "))
                        for event in body.split(b"\n\n") if event]
        assert first == {"choices": [{"text": " the"}]}
        assert name in error["error"]["message"] and "streaming" in error["error"]["message"]
        assert time.monotonic() - started < 20
        held_down_while_its_checks_pass(url, log, checks, time.monotonic())
        assert ("silent for 1s in the middle of a stream; held out of rotation for 5s "
                "(hang 1 in a row)") in log.read_text()
    finally:
        release.set()
        engine.shutdown()
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log.read_text()


def call_or_none(url, path):
    try:
        return call(url, path)[0]
    except OSError:
        return None
