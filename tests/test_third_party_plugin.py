"""A separately installed plugin package registers a model line through the entry point and is
served by the stock CLI next to the demo-tokenizer Qwen3 model: no change to the core."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from openinfer.loading.weights import save_safetensors

HERE = Path(__file__).parent
OPENINFER = [sys.executable, "-m", "openinfer.cli"]
WORDS = ["<eos>", "the", "cat", "sat", "on", "mat", "and", "slept"]


@pytest.fixture(scope="module")
def example_installed():
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
           str(HERE / "example_plugin")]
    subprocess.run(pip, check=True)
    yield
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "openinfer-example"], check=True)


def bigram_checkpoint(path: Path) -> Path:
    path.mkdir()
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "chat_template": (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}")}))
    (path / "config.json").write_text(json.dumps({"model_type": "openinfer_bigram", "vocab_size": len(WORDS),
                                                  "max_position_embeddings": 64}))
    table = np.full((len(WORDS), len(WORDS)), -10.0, dtype=np.float32)
    for a, b in [("the", "cat"), ("cat", "sat"), ("sat", "on"), ("on", "the"), ("mat", "<eos>")]:
        table[vocab[a], vocab[b]] = 10.0
    save_safetensors(path / "model.safetensors", {"bigram.weight": table.shape}, lambda _: table, "F32")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_plugins_command_lists_the_line_and_the_broken_entry_point(example_installed):
    out = subprocess.run(OPENINFER + ["plugins"], capture_output=True, text=True, check=True).stdout
    assert "example (openinfer-example 0.1.0) model lines: bigram" in out
    assert "qwen3 (openinfer-qwen3" in out
    assert "    bigram presets: none\n" in out and "    qwen3 presets: qwen3-4b, qwen3-8b, qwen3-tiny" in out
    assert "example_broken (openinfer-example): ImportError: openinfer_example.broken is broken on purpose" in out


def test_serves_third_party_line_beside_qwen3(example_installed, tmp_path):
    ckpt = bigram_checkpoint(tmp_path / "bigram")
    subprocess.run(OPENINFER + ["synth", "--preset", "qwen3-tiny", "--out", str(tmp_path / "tiny")], check=True,
                   capture_output=True)
    port = free_port()
    proc = subprocess.Popen(OPENINFER + ["serve", "--port", str(port), "--model", f"bigram={ckpt}",
                                         "--model", f"tiny={tmp_path / 'tiny'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                models = httpx.get(f"{base}/v1/models").json()
                break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    pytest.fail(proc.stdout.read())
                time.sleep(0.1)
        assert sorted(m["id"] for m in models["data"]) == ["bigram", "tiny"]
        r = httpx.post(f"{base}/v1/completions", json={"model": "bigram", "prompt": "the", "max_tokens": 10,
                                                        "temperature": 0}).json()
        assert r["choices"][0]["text"].split() == ["cat", "sat", "on", "the", "cat", "sat", "on", "the", "cat", "sat"]
        r = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 3}).json()
        assert r["usage"]["completion_tokens"] == 3
        r = httpx.post(f"{base}/v1/completions", json={"model": "nope", "prompt": "x"})
        assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
