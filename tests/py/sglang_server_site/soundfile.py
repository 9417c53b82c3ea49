"""STAND-IN for the soundfile package, so that SGLang's HTTP server imports in the test venv (tests/py/
test_sglang_plugin.py, part 5). The SGLang venv is installed --no-deps (scripts/setup.sh --sglang)
and lacks soundfile, which srt/entrypoints/openai/audio_chunking.py imports for speech transcription and
serving_transcription.py asks for its formats when the server starts. Nothing of the test reads audio: every
function but available_formats raises."""


def available_formats():
    return {"WAV": "WAV (Microsoft) [stand-in]"}


def __getattr__(name):
    raise RuntimeError("soundfile is a stand-in in this test (tests/py/sglang_server_site): no %s" % name)
