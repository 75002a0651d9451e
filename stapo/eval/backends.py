"""Generation back-ends for evaluation: vLLM on GPUs, HF ``generate`` anywhere (CPU included)."""

from __future__ import annotations

import torch

from stapo.models.generation import load_for_generation


class HFGenerator:
    """Batched sampling with transformers; slow but runs on a laptop CPU."""

    def __init__(self, model_path: str, batch_size: int = 16):
        self.model, self.tokenizer, ids = load_for_generation(model_path)
        self.eos_ids, self.pad_id = ids.eos_ids, ids.pad_id
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, prompts, n, temperature, top_p, max_tokens, seed):
        torch.manual_seed(seed)
        texts = [
            self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            for messages in prompts
        ]
        outputs: list[list[str]] = []
        per_batch = max(1, self.batch_size // n)
        for start in range(0, len(texts), per_batch):
            encoded = self.tokenizer(texts[start : start + per_batch], return_tensors="pt", padding=True)
            room = getattr(self.model.config, "max_position_embeddings", None)
            new_tokens = max_tokens if room is None else max(1, min(max_tokens, room - encoded["input_ids"].shape[1]))
            sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
            generated = self.model.generate(
                **encoded, max_new_tokens=new_tokens, num_return_sequences=n, eos_token_id=self.eos_ids,
                pad_token_id=self.pad_id, **(sampling if temperature > 0 else {"do_sample": False}),
            )
            prompt_len = encoded["input_ids"].shape[1]
            decoded = self.tokenizer.batch_decode(generated[:, prompt_len:], skip_special_tokens=True)
            outputs += [decoded[i : i + n] for i in range(0, len(decoded), n)]
        return outputs


class VLLMGenerator:
    """vLLM's offline engine (GPU clusters; the project's Docker image has it)."""

    def __init__(self, model_path: str, tensor_parallel_size: int = 1, max_model_len: int = 32768):
        from vllm import LLM  # imported here: vLLM does not install on CPU machines

        self.llm = LLM(model=model_path, tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len)

    def __call__(self, prompts, n, temperature, top_p, max_tokens, seed):
        from vllm import SamplingParams

        params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
        results = self.llm.chat(prompts, params, use_tqdm=True)
        return [[choice.text for choice in result.outputs] for result in results]


def make_generator(backend: str, model_path: str, **kwargs):
    if backend == "auto":
        backend = "vllm" if torch.cuda.is_available() else "hf"
    if backend == "vllm":
        return VLLMGenerator(model_path, **{k: v for k, v in kwargs.items() if k != "batch_size"})
    if backend == "hf":
        return HFGenerator(model_path, **{k: v for k, v in kwargs.items() if k == "batch_size"})
    raise ValueError(f"--backend must be one of auto, hf, vllm, got {backend!r}")
