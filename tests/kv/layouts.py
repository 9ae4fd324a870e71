"""Tiny layouts for tests that move real bytes: shapes of the real models, few bytes."""

from gcache.kv import ModelLayout


def hybrid(*, window: int = 128, page: int = 64, pattern=(0, 1, 1, 0, 1), model: str = "tiny",
           tp_rank: int = 0, tp_size: int = 1) -> ModelLayout:
    """MiMo-like: full layers 4 × (4+2) fp32 per token, sliding layers twice that."""
    return ModelLayout.from_config({
        "num_hidden_layers": len(pattern), "hybrid_layer_pattern": list(pattern),
        "sliding_window": window, "num_key_value_heads": 1, "head_dim": 4, "v_head_dim": 2,
        "swa_num_key_value_heads": 2, "swa_head_dim": 4, "swa_v_head_dim": 2,
        "torch_dtype": "float32"}, page_size=page, model=model, tp_rank=tp_rank,
        tp_size=tp_size)


def full_attention(*, page: int = 64, model: str = "tiny-llama") -> ModelLayout:
    return ModelLayout.from_config({"num_hidden_layers": 3, "num_attention_heads": 2,
                                    "num_key_value_heads": 1, "hidden_size": 8,
                                    "torch_dtype": "float32"}, page_size=page, model=model)


def all_sliding(*, window: int = 96, page: int = 32, model: str = "tiny-mistral") -> ModelLayout:
    return ModelLayout.from_config({"num_hidden_layers": 2, "num_attention_heads": 2,
                                    "num_key_value_heads": 1, "hidden_size": 8,
                                    "sliding_window": window, "torch_dtype": "float32"},
                                   page_size=page, model=model)
