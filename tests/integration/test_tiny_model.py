"""`prefillq make-tiny-model`: an offline random-weight Llama plus a locally trained tokenizer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from prefillq.cli.serve import register
from prefillq.integrations.tiny_model import TinyModelError, TinyModelSpec, make_tiny_model

pytestmark = pytest.mark.vllm


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_session_model_is_a_loadable_llama_with_a_working_tokenizer(tiny_model: str) -> None:
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(tiny_model)
    config = AutoConfig.from_pretrained(folder)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == \
        ("llama", 4, 256, 2048)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    text = "Short prompts first, please! 123 ünïcode"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert max(ids) < config.vocab_size and tokenizer.decode(ids) == text  # byte-level: any text round-trips
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<s><|user|>\nhi\n<|assistant|>\n"
    assert json.loads((folder / "prefillq-tiny-model.json").read_text())["made_by"] == "prefillq make-tiny-model"


def test_cli_builds_a_deterministic_model_and_protects_other_folders(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["--layers", "1", "--hidden", "64", "--vocab", "512", "--max-len", "1024", "--seed", "3"]
    first = runner.invoke(_app(), ["make-tiny-model", str(tmp_path / "a"), *args])
    assert first.exit_code == 0, first.output
    assert "tiny model written to" in first.output and "prefillq serve" in first.output
    again = runner.invoke(_app(), ["make-tiny-model", str(tmp_path / "b"), *args])
    assert again.exit_code == 0, again.output
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert digest(tmp_path / "a" / name) == digest(tmp_path / "b" / name)
    # rebuilding over an earlier tiny model is fine; a folder holding something else is not touched
    assert runner.invoke(_app(), ["make-tiny-model", str(tmp_path / "a"), *args]).exit_code == 0
    other = tmp_path / "precious"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    refused = runner.invoke(_app(), ["make-tiny-model", str(other), *args])
    assert refused.exit_code == 2 and "not empty" in refused.output
    assert (other / "notes.txt").read_text() == "keep me" and len(list(other.iterdir())) == 1


def test_inconsistent_shapes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TinyModelError, match="divide"):
        make_tiny_model(tmp_path / "bad", TinyModelSpec(hidden_size=100, num_heads=3))
