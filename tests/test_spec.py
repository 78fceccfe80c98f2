import json

import pytest

from swiftspec.spec import (
    AcceptanceProfile,
    Mode,
    ModelSpec,
    Plan,
    Prediction,
    SourceRef,
    Split,
    TreePolicy,
    UserError,
    bundled_models,
)


def test_bundled_models_load_with_expected_shapes():
    names = bundled_models()
    assert len(names) >= 13
    m = ModelSpec.from_config("llama-3-70b")  # case-insensitive
    assert (m.num_layers, m.hidden, m.num_heads, m.num_kv_heads, m.head_dim) == (80, 8192, 64, 8, 128)
    assert 69e9 < m.param_count() < 72e9
    q = ModelSpec.from_config("Qwen2-72B")
    assert q.qkv_bias and q.architecture == "qwen2"
    assert ModelSpec.from_config("Llama-3.2-1B").tie_embeddings


@pytest.mark.parametrize("name", ["Llama-3-70B", "Qwen2-1.5B", "R1-Distill-Qwen-32B", "deepseek-coder-1.3b"])
@pytest.mark.parametrize("tp", [1, 2, 3, 4, 6, 8])
def test_shard_covers_all_heads_and_keeps_gqa_groups(name, tp):
    m = ModelSpec.from_config(name)
    s = m.shard(tp)
    assert s.q_heads * tp >= m.num_heads and s.ffn * tp >= m.ffn and s.vocab * tp >= m.vocab
    assert s.kv_heads * tp >= m.num_kv_heads or tp % m.num_kv_heads == 0
    assert s.q_heads % s.kv_heads == 0


def test_unknown_model_lists_bundled():
    with pytest.raises(UserError, match="Llama-3-70B"):
        ModelSpec.from_config("gpt-5")


def test_config_missing_fields_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(UserError, match="intermediate_size.*num_hidden_layers"):
        ModelSpec.from_config(tmp_path)


def test_unsupported_architecture_named(tmp_path):
    cfg = {"model_type": "gpt2", "hidden_size": 64, "intermediate_size": 1, "num_hidden_layers": 1,
           "num_attention_heads": 1, "vocab_size": 1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="'gpt2' is not supported"):
        ModelSpec.from_config(tmp_path)


def test_split_validation():
    Split.disaggregated(2, 6).validate(Mode.async_)
    with pytest.raises(UserError, match="at least 2 GPUs"):
        Split.shared(1, with_draft=False).validate(Mode.async_)
    with pytest.raises(UserError, match="same GPUs"):
        Split.disaggregated(1, 1).validate(Mode.serial)
    Split.shared(8).validate(Mode.serial)
    with pytest.raises(UserError):
        Split.shared(8).validate(Mode.autoregressive)


def test_plan_json_round_trip(tmp_path):
    plan = Plan(
        target="Llama-3-70B", draft="Llama-3.2-3B", split=Split.disaggregated(4, 4), mode=Mode.async_,
        policy=TreePolicy(bs=8, w=8, d=3),
        prediction=Prediction(400.0, 401.0, 350.0, 3.4, 8.5, {"target": 7.0}),
        profile=SourceRef("builtin:h200", "ab" * 32, "derived"),
        acceptance=SourceRef("builtin:x", "cd" * 32, "synthetic (x)"),
    )
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    static = TreePolicy(bs=4, w=1, d=0, kind="static", topology=(-1, 0, 0, 1))
    assert TreePolicy.from_dict(json.loads(json.dumps(static.to_dict()))) == static


def test_plan_bad_inputs(tmp_path):
    with pytest.raises(UserError, match="not found"):
        Plan.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        Plan.load(tmp_path / "bad.json")
    (tmp_path / "bad2.json").write_text(json.dumps({"target": "x"}))
    with pytest.raises(UserError, match="malformed"):
        Plan.load(tmp_path / "bad2.json")


def test_acceptance_profile_validation(tmp_path):
    ap = AcceptanceProfile(positional=[0.5, 0.2], draft_prob_by_rank=[0.6, 0.2], traces=[[0, 1, -1]],
                           trace_probs=[[0.6, 0.1, 0.0]], top_k=2, meta={"source": "measured"})
    ap.save(tmp_path / "a.json")
    assert AcceptanceProfile.load(tmp_path / "a.json") == ap
    assert ap.label == "measured"
    bad = ap.to_dict() | {"positional": [0.9, 0.9]}
    (tmp_path / "b.json").write_text(json.dumps(bad))
    with pytest.raises(UserError, match="summing"):
        AcceptanceProfile.load(tmp_path / "b.json")


def test_fp8_weight_bytes_count_one_byte_per_gemm_weight():
    """fp8 specs (what a plan on an fp8 profile uses for its memory fit): GEMM weights at one byte
    plus a float32 scale per output row, embeddings, norms and biases in the model dtype, the LM
    head its own fp8 copy even when tied; the parameter count does not change."""
    import dataclasses

    for name in ("Llama-3-8B", "Llama-3.2-1B", "Qwen2-1.5B"):  # untied, tied, qkv bias
        native = ModelSpec.from_config(name)
        fp8 = dataclasses.replace(native, weight_format="fp8")
        for tp in (1, 2, 8):
            s = native.shard(tp)
            rows = (s.q_heads + 2 * s.kv_heads) * native.head_dim
            gemm = native.hidden * rows + s.q_heads * native.head_dim * native.hidden + 3 * native.hidden * s.ffn
            scales = 4 * (rows + 2 * native.hidden + 2 * s.ffn)
            assert native.layer_weight_bytes(tp) - fp8.layer_weight_bytes(tp) == gemm * 2 - gemm - scales
            lm_native = 0 if (native.tie_embeddings and tp == 1) else s.vocab * native.hidden * 2
            diff = native.num_layers * (gemm - scales) + lm_native - s.vocab * (native.hidden + 4)
            assert native.weight_bytes(tp) - fp8.weight_bytes(tp) == diff > 0
        assert fp8.param_count() == native.param_count()


@pytest.mark.parametrize("name", ["Llama-3-70B", "Llama-3.2-1B", "Qwen2-72B", "Qwen2-1.5B"])
def test_linear_shapes_shard_the_checkpoint_projections(name):
    """`linear_shapes(tp)`: at TP 1 the fused qkv and gate_up are the checkpoint's projections
    stacked; at every TP the column-parallel linears (qkv, gate_up) split N and the row-parallel
    ones (o, down) K, the ranks together holding the whole model plus zero padding (ffn: less than
    one input a rank)."""
    from swiftspec.runtime.weights import _projection_shapes

    spec = ModelSpec.from_config(name)
    hf = _projection_shapes(spec)
    q, k, v, o, gate, up, down = hf.values()
    assert spec.linear_shapes(1) == {"qkv": (q[0] + k[0] + v[0], spec.hidden), "o": o,
                                     "gate_up": (gate[0] + up[0], spec.hidden), "down": down}
    for tp in range(1, 9):
        s = spec.linear_shapes(tp)
        assert s["qkv"][1] == s["gate_up"][1] == s["o"][0] == s["down"][0] == spec.hidden
        assert s["o"][1] == spec.shard(tp).q_heads * spec.head_dim
        assert s["gate_up"][0] == 2 * s["down"][1] and 0 <= tp * s["down"][1] - spec.ffn < tp
        assert tp * s["qkv"][0] >= q[0] + k[0] + v[0]
