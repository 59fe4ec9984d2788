"""plugins/module_utils/_mask.py: the one secret-masking grammar of the gate's progress file and
listener command line, wait_for_sglang's progress lines and the watchdog's lines and records."""

from __future__ import annotations

import json

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils._mask import MASK, mask, printable, redact_argv

KEY = "sk-Qw3n-7f1c"

# (text, masked): each form a secret takes in what the collection shows; the rest of the text as it was.
FORMS = [
    # the key in clear, known to the caller (the watchdog's and the gate's key)
    (f"POST /generate with {KEY} timed out", f"POST /generate with {MASK} timed out"),
    # a command line: the flag, a space, the value
    (f"python3 -m sglang.launch_server --api-key {KEY} --port 30000",
     f"python3 -m sglang.launch_server --api-key {MASK} --port 30000"),
    ("python3 -m sglang.launch_server --admin-api-key 'adm 1n' --port 30000",
     f"python3 -m sglang.launch_server --admin-api-key {MASK} --port 30000"),
    # a command line: flag=value
    ("launch_server --api-key=abc123 --host 0.0.0.0", f"launch_server --api-key={MASK} --host 0.0.0.0"),
    ("launch_server --api-key = abc123 --host 0.0.0.0", f"launch_server --api-key = {MASK} --host 0.0.0.0"),
    # SGLang's server_args line at start-up (0.5.11 srt/entrypoints/engine.py logs it at INFO)
    ("[2026-12-01 17:15:13] server_args=ServerArgs(model_path='/srv/models/qwen', api_key='abc123', "
     "admin_api_key=None, tokenizer_mode='auto', max_total_tokens=4096, chunked_prefill_size=8192)",
     f"[2026-12-01 17:15:13] server_args=ServerArgs(model_path='/srv/models/qwen', api_key={MASK}, "
     f"admin_api_key={MASK}, tokenizer_mode='auto', max_total_tokens=4096, chunked_prefill_size=8192)"),
    # an HTTP authorization header, as text and as JSON
    ("curl -H 'Authorization: Bearer abc.123-x' http://127.0.0.1:30000/health",
     f"curl -H 'Authorization: Bearer {MASK}' http://127.0.0.1:30000/health"),
    ('{"headers": {"Authorization": "bearer abc123"}, "url": "/v1/models"}',
     f'{{"headers": {{"Authorization": "bearer {MASK}"}}, "url": "/v1/models"}}'),
    # JSON and a Python dict
    ('{"model": "qwen", "api_key": "abc\\"123", "port": 30000}', f'{{"model": "qwen", "api_key": {MASK}, "port": 30000}}'),
    ("{'model': 'qwen', 'api_key': 'abc123'}", f"{{'model': 'qwen', 'api_key': {MASK}}}"),
    # YAML (the server's --config file), a header, other secret words
    ("api-key: abc123", f"api-key: {MASK}"),
    ("X-API-Key: abc123, retry", f"X-API-Key: {MASK}, retry"),
    ("HF_TOKEN=hf_abc password=p4ss client_secret: s3c", f"HF_TOKEN={MASK} password={MASK} client_secret: {MASK}"),
]


@pytest.mark.parametrize("text, masked", FORMS)
def test_each_form_of_a_secret_is_masked_and_nothing_else_changes(text, masked):
    assert mask(text, (KEY,)) == masked


def test_the_forms_in_one_line_are_all_masked():
    line = " ".join(text for text, _masked in FORMS)
    done = mask(line, (KEY,))
    for secret in (KEY, "abc123", "abc.123-x", "adm 1n", "hf_abc", "p4ss", "s3c"):
        assert secret not in done, secret
    assert done == " ".join(masked for _text, masked in FORMS)


@pytest.mark.parametrize("text", [
    "max_new_tokens=128 max_total_tokens: 4096 tokenizer_path=/srv/tok",
    "monkey=1 keyboard: 2 turkey = 3 keys=4 secretary: 5",
    "Decode batch. #running-req: 1, gen throughput (token/s): 51.23, #queue-req: 0",
    "The server is fired up and ready to roll!",
    "http://127.0.0.1:30000/v1/models answered 200",
])
def test_text_without_a_secret_is_unchanged(text):
    assert mask(text) == text and mask(text, ("", None)) == text


def test_a_known_secret_is_masked_wherever_it_is_also_as_json_escapes_it():
    key = 'k"ey\\é'
    record = json.dumps({"msg": f"sent {key}"})
    assert key not in mask(f"a{key}b", (key,)) and mask(f"a{key}b", (key,)) == f"a{MASK}b"
    assert json.loads(mask(record, (key,))) == {"msg": f"sent {MASK}"}
    # a longer secret that holds a shorter one is masked whole
    assert mask("abc-123-xyz", ("123", "abc-123-xyz")) == MASK


def test_masking_is_idempotent():
    once = mask(" ".join(text for text, _masked in FORMS), (KEY,))
    assert mask(once, (KEY,)) == once


def test_redact_argv_masks_a_flags_whole_value():
    argv = ["python3", "-m", "sglang.launch_server", "--api-key", "a b c", "--admin-api-key=adm 1n",
            "--tokenizer-path", "/srv/tok", "--max-total-tokens", "4096", f"--note=uses {KEY}", "api_key=abc123",
            "-api_key", "x"]
    assert redact_argv(argv, (KEY,)) == [
        "python3", "-m", "sglang.launch_server", "--api-key", MASK, f"--admin-api-key={MASK}",
        "--tokenizer-path", "/srv/tok", "--max-total-tokens", "4096", f"--note=uses {MASK}", f"api_key={MASK}",
        "-api_key", MASK]
    assert redact_argv(["sglang", "--api-key"]) == ["sglang", "--api-key"]  # a flag with nothing after it


def test_a_long_line_is_masked_in_linear_time():
    """A log line is untrusted text: the grammar has no nested repetition to blow up on."""
    line = "a_" * 20000 + "key=" + "x" * 100
    assert mask(line).endswith(f"key={MASK}")
    assert mask("-_" * 20000) == "-_" * 20000


@pytest.mark.parametrize("text, shown", [
    ("[2026-12-04 10:00:00] Load weight end.", "[2026-12-04 10:00:00] Load weight end."),
    ("\x1b[31mERROR\x1b[0m: CUDA out of memory", "ERROR: CUDA out of memory"),  # colour, removed
    ("\x1b]0;owned\x07title", "title"),  # a window title (OSC ... BEL)
    ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),  # a hyperlink (OSC ... ST)
    ("ok\x1b[2J\x1b[Hcleared", "okcleared"),  # clear the screen, home the cursor
    ("a\rb\x08c\x00d\x7fe\x9bf\x85g", "a?b?c?d?e?f?g"),  # C0, DEL, C1 (CSI and NEL alone)
    ("tab\tkept, ключ ✓ kept", "tab\tkept, ключ ✓ kept"),
    ("ends with a lone escape\x1b", "ends with a lone escape"),
])
def test_printable_takes_terminal_control_out_of_server_text(text, shown):
    assert printable(text) == shown
    assert printable(shown) == shown
