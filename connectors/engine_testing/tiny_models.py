"""Tiny randomly initialised models made locally for engine tests (no downloads).

A byte-level BPE tokenizer trained on a few sentences, and a 2-layer model of a given
architecture saved in fp32 with ``save_pretrained``; the same weights serve SGLang and the
Hugging Face reference.
"""

from __future__ import annotations

import pathlib

import torch

CORPUS = ["The cache keeps the keys and values of every layer for each token of the prompt.",
          "A sliding window layer only attends to the most recent tokens of the sequence.",
          "GCache stores pages of KV in shared memory and on disk across a cluster of hosts."]


def tokenizer(path: pathlib.Path, *, special: tuple[str, ...] = ()):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512,
                                  special_tokens=["<s>", "</s>", "<pad>", *special],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.save_pretrained(path)
    return fast


def llama(path: pathlib.Path, *, seed: int = 0) -> pathlib.Path:
    from transformers import LlamaConfig, LlamaForCausalLM
    path.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(path)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=2048, dtype="float32",
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    return _save_random(LlamaForCausalLM(config), path, seed, 0.08)


IDEFICS3_IMAGE = 56             # pixels a side; 14-pixel patches, 4 image embeddings each


def idefics3(path: pathlib.Path, *, seed: int = 0) -> pathlib.Path:
    """A vision-language model vLLM runs on CPU without torchvision: Idefics3 (a SigLIP-style
    vision tower, pixel shuffle, a Llama text model), its PIL image processor with image
    splitting off, and the tokenizer with Idefics3's special tokens."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )
    path.mkdir(parents=True, exist_ok=True)
    special = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
               *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)))
    tok = tokenizer(path, special=special)
    images = Idefics3ImageProcessorPil(do_image_splitting=False,
                                       size={"longest_edge": IDEFICS3_IMAGE},
                                       max_image_size={"longest_edge": IDEFICS3_IMAGE})
    processor = Idefics3Processor(image_processor=images, tokenizer=tok,
                                  image_seq_len=(IDEFICS3_IMAGE // 14) ** 2 // 4,
                                  chat_template="{% for m in messages %}{{ m['content'] }}"
                                                "{% endfor %}")
    vision = Idefics3VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, image_size=IDEFICS3_IMAGE,
                                  patch_size=14)
    text = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                       head_dim=64, max_position_embeddings=2048,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    config = Idefics3Config(vision_config=vision.to_dict(), text_config=text.to_dict(),
                            scale_factor=2, image_token_id=tok.convert_tokens_to_ids("<image>"),
                            tie_word_embeddings=False)
    config.dtype = "float32"
    config.pad_token_id = config.text_config.pad_token_id = tok.pad_token_id
    _save_random(Idefics3ForConditionalGeneration(config), path, seed, 0.08)
    processor.save_pretrained(path)
    return path


def image(seed: int, size: int = IDEFICS3_IMAGE):
    """A PIL image of random pixels: a different seed, a different image."""
    import numpy as np
    from PIL import Image
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def prompt_ids(path: pathlib.Path, repeats: int = 4) -> list[int]:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    return tok(" ".join(CORPUS * repeats), add_special_tokens=False)["input_ids"]


def hf_greedy(path: pathlib.Path, ids: list[int], new_tokens: int) -> list[int]:
    """The reference: Hugging Face ``transformers`` greedy decoding in fp32."""
    return hf_greedy_logprobs(path, ids, new_tokens)[0]


def hf_greedy_logprobs(path: pathlib.Path, ids: list[int],
                       new_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and each one's log-probability. Tiny random models often repeat one token
    whatever their KV; the log-probabilities still move with every bit of it, so comparing them
    is what shows that an engine attended over the right KV."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                             min_new_tokens=new_tokens, pad_token_id=model.config.pad_token_id,
                             output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(ids):].tolist()
    logprobs = [float(torch.log_softmax(step[0].float(), -1)[t])
                for step, t in zip(out.logits, tokens)]
    return tokens, logprobs


def gemma4(path: pathlib.Path, *, seed: int = 0, window: int = 32) -> pathlib.Path:
    """A hybrid sliding-window model (Gemma 4 text): sliding and full layers alternate."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    path.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(path)
    config = Gemma4TextConfig(
        vocab_size=512, vocab_size_per_layer_input=512, hidden_size=128,
        hidden_size_per_layer_input=16, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, per_layer_config={},
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        sliding_window=window, max_position_embeddings=2048, dtype="float32",
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    config.architectures = ["Gemma4ForCausalLM"]
    config.swa_num_key_value_heads = config.num_key_value_heads   # SGLang's hybrid pool reads it
    return _save_random(Gemma4ForCausalLM(config), path, seed, 0.08)


def _save_random(model, path: pathlib.Path, seed: int, std: float) -> pathlib.Path:
    """Random weights, larger than the default init so greedy tokens vary with the input."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    model.to(torch.float32).save_pretrained(path, safe_serialization=True)
    return path


def gemma3(path: pathlib.Path, *, seed: int = 0, window: int = 32,
           first: str = "sliding_attention") -> pathlib.Path:
    """A hybrid sliding-window Gemma 3 text model; ``first`` is the kind of layer 0."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    path.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(path)
    other = "full_attention" if first == "sliding_attention" else "sliding_attention"
    config = Gemma3TextConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, sliding_window=window,
        layer_types=[first, other, first, other], max_position_embeddings=2048,
        query_pre_attn_scalar=64, dtype="float32", bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config.architectures = ["Gemma3ForCausalLM"]
    return _save_random(Gemma3ForCausalLM(config), path, seed, 0.08)


def gpt_oss(path: pathlib.Path, *, seed: int = 0, window: int = 32) -> pathlib.Path:
    """A hybrid sliding-window MoE model with attention sinks (gpt-oss). vLLM's gpt-oss slides on
    the even layers whatever ``layer_types`` says, so the config says the same."""
    from transformers import GptOssConfig, GptOssForCausalLM
    path.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(path)
    config = GptOssConfig(
        vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, sliding_window=window,
        layer_types=["sliding_attention", "full_attention"] * 2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=2048, dtype="float32",
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    config.architectures = ["GptOssForCausalLM"]
    return _save_random(GptOssForCausalLM(config), path, seed, 0.08)
