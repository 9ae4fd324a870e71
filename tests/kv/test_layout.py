"""ModelLayout: every shipped config parses to the facts of shared/data/model-configs."""

import json

import pytest

from gcache.errors import ConfigError
from gcache.kv import SHIPPED_CONFIGS, LayerGeometry, ModelLayout

MIMO_48_FULL = (0, 5, 11, 17, 23, 29, 35, 41, 47)

# name: (layers, full layers, sliding layers, W, full geometry, sliding geometry)
FACTS = {
    "mimo-v2.5": (48, 9, 39, 128, LayerGeometry(4, 192, 128, 2), LayerGeometry(8, 192, 128, 2)),
    "mimo-v2.5-pro": (70, 10, 60, 128, LayerGeometry(4, 192, 128, 2),
                      LayerGeometry(8, 192, 128, 2)),
    "gpt-oss-20b": (24, 12, 12, 128, LayerGeometry(8, 64, 64, 2), LayerGeometry(8, 64, 64, 2)),
    "gemma-3-1b": (26, 4, 22, 512, LayerGeometry(1, 256, 256, 2), LayerGeometry(1, 256, 256, 2)),
    "llama-3.2-1b": (16, 16, 0, 0, LayerGeometry(8, 64, 64, 2), LayerGeometry(8, 64, 64, 2)),
}


def test_every_shipped_config_is_covered():
    assert set(FACTS) == set(SHIPPED_CONFIGS)


@pytest.mark.parametrize("name", SHIPPED_CONFIGS)
def test_shipped_configs_parse_to_their_facts(name):
    layers, n_full, n_swa, window, full, swa = FACTS[name]
    layout = ModelLayout.from_config(name)
    assert (layout.num_layers, len(layout.full_layers), len(layout.swa_layers), layout.window) \
        == (layers, n_full, n_swa, window)
    assert (layout.full, layout.swa) == (full, swa)
    assert sorted(layout.full_layers + layout.swa_layers) == list(range(layers))


def test_mimo_reads_the_layer_list_not_a_period():
    layout = ModelLayout.from_config("mimo-v2.5")
    assert layout.full_layers == MIMO_48_FULL


def test_mimo_sliding_layers_carry_twice_the_kv_of_full_layers():
    layout = ModelLayout.from_config("mimo-v2.5-pro")
    assert layout.full.bytes_per_token == 4 * (192 + 128) * 2
    assert layout.swa.bytes_per_token == 2 * layout.full.bytes_per_token
    assert layout.layer_bytes_per_token(layout.swa_layers[0]) == layout.swa.bytes_per_token


def test_config_file_on_disk_and_text_config_nesting(tmp_path):
    path = tmp_path / "tiny-gemma" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": {
        "num_hidden_layers": 6, "sliding_window": 8, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 16, "hidden_size": 32,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}}))
    layout = ModelLayout.from_config(path, page_size=4)
    assert layout.model == "tiny-gemma"
    assert layout.swa_layers == (0, 1, 2, 3, 4) and layout.window == 8


def test_gemma_sliding_window_pattern_and_mistral_single_window():
    gemma = ModelLayout.from_config({"num_hidden_layers": 12, "sliding_window": 512,
                                     "sliding_window_pattern": 6, "num_attention_heads": 4,
                                     "hidden_size": 256})
    assert gemma.full_layers == (5, 11)
    mistral = ModelLayout.from_config({"num_hidden_layers": 4, "sliding_window": 4096,
                                       "num_attention_heads": 8, "num_key_value_heads": 2,
                                       "hidden_size": 512})
    assert mistral.swa_layers == (0, 1, 2, 3) and mistral.full_layers == ()
    assert mistral.full.k_head_dim == 64


def test_tensor_parallel_splits_kv_heads_and_replicates_when_fewer_than_ranks():
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
           "hidden_size": 512}
    assert ModelLayout.from_config(cfg, tp_size=2, tp_rank=1).full.kv_heads == 2
    assert ModelLayout.from_config(cfg, tp_size=8, tp_rank=7).full.kv_heads == 1
    a, b = (ModelLayout.from_config(cfg, tp_size=2, tp_rank=r) for r in (0, 1))
    assert a.fingerprint() != b.fingerprint()


def test_mla_keeps_one_latent_per_token():
    layout = ModelLayout.from_config({"num_hidden_layers": 3, "kv_lora_rank": 512,
                                      "qk_rope_head_dim": 64, "num_attention_heads": 16,
                                      "hidden_size": 2048}, tp_size=4)
    assert layout.full == LayerGeometry(1, 576, 0, 2)


def test_scaled_layout_keeps_the_ratio_between_layer_types():
    layout = ModelLayout.from_config("mimo-v2.5-pro").scaled(512)
    assert (layout.full.bytes_per_token, layout.swa.bytes_per_token) == (5, 10)
    with pytest.raises(ConfigError, match="scale"):
        ModelLayout.from_config("mimo-v2.5-pro").scaled(3)


@pytest.mark.parametrize("cfg, match", [
    ({}, "num_hidden_layers"),
    ({"num_hidden_layers": 2, "layer_types": ["sliding_attention"], "sliding_window": 4,
      "num_attention_heads": 2, "hidden_size": 8}, "one entry per layer"),
    ({"num_hidden_layers": 1, "layer_types": ["local"], "sliding_window": 4,
      "num_attention_heads": 2, "hidden_size": 8}, "must be one of"),
    ({"num_hidden_layers": 2, "hybrid_layer_pattern": [0, 2], "sliding_window": 4,
      "num_attention_heads": 2, "hidden_size": 8}, "0 \\(full\\) or 1"),
    ({"num_hidden_layers": 1, "layer_types": ["sliding_attention"], "num_attention_heads": 2,
      "hidden_size": 8}, "sliding_window"),
    ({"num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 8,
      "torch_dtype": "int3"}, "torch_dtype"),
    ({"num_hidden_layers": -1}, "positive integer"),
])
def test_bad_configs_name_the_field(cfg, match):
    with pytest.raises(ConfigError, match=match):
        ModelLayout.from_config(cfg)


def test_unknown_config_name_lists_the_shipped_ones(tmp_path):
    with pytest.raises(ConfigError, match="mimo-v2.5-pro"):
        ModelLayout.from_config("no-such-model")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="JSON"):
        ModelLayout.from_config(bad)
