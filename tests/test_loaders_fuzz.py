"""Property tests of every loader: random bytes and mutated valid files give either a valid object
or `UserError` (one line, which the CLI prints as `error: ...` with exit 2), never another exception.

The valid files are the bundled ones (a slice of the measured H200 profile, the acceptance
profiles), a plan written by `swiftspec plan --gpus 8 -o` (tests/data/plan-gpus8.json), the run log
in tests/data, a validation report built here and a tiny safetensors checkpoint written here.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from swiftspec.profiler.prompts import read_jsonl
from swiftspec.runtime.launch import read_prompt_file
from swiftspec.runtime.runlog import RunLog
from swiftspec.runtime.weights import load_model
from swiftspec.spec import AcceptanceProfile, ModelSpec, Plan, Profile, UserError
from swiftspec.validate import read_sweep

DATA = Path(__file__).parent / "data"
PKG = Path(str(resources.files("swiftspec") / "data"))
FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def valid_or_user_error(load: Callable[[], Any]) -> Any:
    """load() -> its object, or None when it raised UserError with a one-line message."""
    try:
        return load()
    except UserError as e:
        assert "\n" not in str(e) and str(e).strip(), f"not one line: {e!r}"
        return None


# ---- mutations ---------------------------------------------------------------------------------

ODD_VALUES = st.sampled_from([
    None, True, False, 0, -1, -7, 2.5, -0.5, 1e308, 10**30, 10**400, float("nan"), float("inf"), float("-inf"),
    "", "x", "1", "\u00e9", [], [1], [-1, 2.5], {}, {"a": 1},
])  # fmt: skip
JSON_VALUES = st.one_of(ODD_VALUES, st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
    max_leaves=6,
))  # fmt: skip


def json_paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys / indices) into a JSON document, the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += json_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:6]):  # the first entries of long lists are enough
            out += json_paths(v, prefix + (i,))
    return out


@st.composite
def mutated_json(draw, doc: Any) -> str:
    """`doc` with one to three values replaced or deleted, serialised (NaN / Infinity allowed)."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(json_paths(doc)))
        value = copy.deepcopy(draw(JSON_VALUES))  # never share (and later mutate) a strategy's constant
        if not path:
            doc = value
            continue
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            if draw(st.booleans()) and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    return json.dumps(doc)


@st.composite
def mutated_bytes(draw, data: bytes) -> bytes:
    """`data` truncated, or with bytes flipped, inserted or deleted."""
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "random"]))
    if kind == "random":
        return draw(st.binary(max_size=200))
    if kind == "truncate":
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    b = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(len(b) - 1, 0)))
        if kind == "flip" and b:
            b[i] = draw(st.integers(0, 255))
        elif kind == "insert":
            b[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif b:
            del b[i]
    return bytes(b)


def file_variants(text: str, doc: Any = None) -> st.SearchStrategy[bytes]:
    """Bytes of a mutated file: byte-level mutations of `text`, plus value mutations of `doc`."""
    s = mutated_bytes(text.encode())
    if doc is not None:
        s = st.one_of(s, mutated_json(doc).map(str.encode))
    return s


# ---- profile: compute.csv, comm.csv, meta.json -------------------------------------------------


def _profile_files() -> dict[str, str]:
    src = PKG / "profiles" / "h200-measured"
    compute = src.joinpath("compute.csv").read_text().splitlines()
    comm = src.joinpath("comm.csv").read_text().splitlines()
    return {"compute.csv": "\n".join(compute[:40]) + "\n", "comm.csv": "\n".join(comm[:20]) + "\n",
            "meta.json": src.joinpath("meta.json").read_text()}


PROFILE = _profile_files()


@st.composite
def mutated_csv(draw, text: str) -> str:
    """One to three cells of a CSV replaced (text, NaN, inf, negative, fraction, empty), a column
    dropped, or a row repeated."""
    rows = [r.split(",") for r in text.splitlines()]
    kind = draw(st.sampled_from(["cell", "cell", "drop_column", "duplicate_row"]))
    if kind == "drop_column":
        j = draw(st.integers(0, len(rows[0]) - 1))
        rows = [r[:j] + r[j + 1 :] for r in rows]
    elif kind == "duplicate_row":
        i = draw(st.integers(1, len(rows) - 1))
        rows.insert(draw(st.integers(1, len(rows))), list(rows[i]))
    else:
        for _ in range(draw(st.integers(1, 3))):
            i, j = draw(st.integers(1, len(rows) - 1)), draw(st.integers(0, len(rows[0]) - 1))
            rows[i][j] = draw(st.sampled_from(["abc", "nan", "inf", "-inf", "-1", "2.5", "", "1e400", "True",
                                               '"x,y"', "0", "9" * 30]))
    return "\n".join(",".join(r) for r in rows) + "\n"


def _write_profile(folder: Path, name: str, data: bytes) -> None:
    for n, t in PROFILE.items():
        (folder / n).write_text(t)
    (folder / name).write_bytes(data)


def test_profile_slice_is_valid():
    with tempfile.TemporaryDirectory() as d:
        _write_profile(Path(d), "meta.json", PROFILE["meta.json"].encode())
        prof = Profile.load(d)
    assert len(prof.compute) == 39 and len(prof.comm) == 19


@FUZZ
@given(data=st.data(), name=st.sampled_from(["compute.csv", "comm.csv", "meta.json"]))
def test_profile_load_fuzz(data, name):
    text = PROFILE[name]
    if name == "meta.json":
        blob = data.draw(file_variants(text, json.loads(text)))
    else:
        blob = data.draw(st.one_of(mutated_csv(text).map(str.encode), mutated_bytes(text.encode())))
    with tempfile.TemporaryDirectory() as d:
        _write_profile(Path(d), name, blob)
        prof = valid_or_user_error(lambda: Profile.load(d))
    if prof is not None:  # what loads is what the simulator can use
        assert (prof.compute["ms"] >= 0).all() and prof.compute["ms"].map(math.isfinite).all()
        assert not prof.compute.duplicated(["op", "model", "tp", "tokens", "kv_len"]).any()
        assert not prof.comm.duplicated(["collective", "group_size", "bytes"]).any()


def test_profile_numbers_pandas_keeps_as_text_load_as_numbers(tmp_path):
    """A cell too long for an int64 (pandas then reads the whole column as text) loads as a
    float, so the simulator never compares strings (found by the fuzz test above)."""
    rows = PROFILE["compute.csv"].splitlines()
    head, first = rows[0].split(","), rows[1].split(",")
    first[head.index("ms")] = "9" * 30
    _write_profile(tmp_path, "compute.csv", "\n".join([rows[0], ",".join(first), *rows[2:]]).encode())
    prof = Profile.load(tmp_path)
    assert prof.compute["ms"].dtype == float and prof.compute["ms"].iloc[0] == pytest.approx(1e30)
    assert (prof.compute["ms"] >= 0).all()


@pytest.mark.parametrize("cell,match", [("abc", "row 1 column ms: 'abc' is not a number"),
                                        ("nan", "row 1 column ms"), ("inf", "not finite"), ("-1", "negative")])
def test_profile_bad_ms_cell_is_named(tmp_path, cell, match):
    rows = PROFILE["compute.csv"].splitlines()
    rows[1] = ",".join(rows[1].split(",")[:5] + [cell] + rows[1].split(",")[6:])
    _write_profile(tmp_path, "compute.csv", ("\n".join(rows) + "\n").encode())
    with pytest.raises(UserError, match=match):
        Profile.load(tmp_path)


def test_profile_duplicate_key_is_refused(tmp_path):
    rows = PROFILE["compute.csv"].splitlines()
    _write_profile(tmp_path, "compute.csv", ("\n".join(rows + [rows[3]]) + "\n").encode())
    with pytest.raises(UserError, match=r"compute.csv has 2 rows for one key \(op=embed.*rows 3, 40\).*empty folder"):
        Profile.load(tmp_path)
    comm = PROFILE["comm.csv"].splitlines()
    _write_profile(tmp_path, "comm.csv", ("\n".join(comm + [comm[1]]) + "\n").encode())
    (tmp_path / "compute.csv").write_text(PROFILE["compute.csv"])
    with pytest.raises(UserError, match=r"comm.csv has 2 rows for one key \(collective=all_reduce"):
        Profile.load(tmp_path)


def test_bundled_profiles_load():
    for name in ("h200-measured", "h200-fp8", "h200-derived"):
        assert len(Profile.load(f"builtin:{name}").compute) > 0


# ---- acceptance profiles -----------------------------------------------------------------------

ACCEPTANCE = {p.name: p.read_text() for p in sorted((PKG / "acceptance").glob("*.json"))}


@FUZZ
@given(data=st.data(), name=st.sampled_from(sorted(ACCEPTANCE)))
def test_acceptance_load_fuzz(data, name):
    text = ACCEPTANCE[name]
    blob = data.draw(file_variants(text, json.loads(text)))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "acc.json"
        p.write_bytes(blob)
        ap = valid_or_user_error(lambda: AcceptanceProfile.load(p))
    if ap is not None:
        assert all(0 <= x <= 1 for x in ap.positional + ap.draft_prob_by_rank)
        assert all(math.isfinite(v) for v in ap.accepted.values())


# ---- plans -------------------------------------------------------------------------------------

PLAN = (DATA / "plan-gpus8.json").read_text()


def test_plan_fixture_loads():
    plan = Plan.load(DATA / "plan-gpus8.json")
    assert plan.split.num_gpus == 8 and plan.prediction is not None


@FUZZ
@given(blob=file_variants(PLAN, json.loads(PLAN)))
def test_plan_load_fuzz(blob):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "plan.json"
        p.write_bytes(blob)
        plan = valid_or_user_error(lambda: Plan.load(p))
    if plan is not None:
        assert all(isinstance(g, int) and g >= 0 for g in plan.split.target_gpus + plan.split.draft_gpus)
        assert isinstance(plan.policy.bs, int) and plan.policy.bs >= 1 and isinstance(plan.target, str)


@pytest.mark.parametrize("field,value,match", [
    (("split", "target_gpus"), [-1, 4, 5, 6], r"target_gpus\[0\] must be an integer >= 0, got -1"),
    (("policy", "bs"), 7.5, "bs must be an integer >= 1, got 7.5"),
    (("mode",), "warp", "unknown mode 'warp'"),
    (("policy",), None, "policy must be an object, got None"),
    (("target",), None, "target must be a non-empty string"),
    (("prediction", "iteration_ms"), "fast", "iteration_ms must be a finite number"),
])  # fmt: skip
def test_plan_bad_field_is_named(tmp_path, field, value, match):
    doc = json.loads(PLAN)
    parent = doc
    for k in field[:-1]:
        parent = parent[k]
    parent[field[-1]] = value
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match=match):
        Plan.load(tmp_path / "p.json")


def test_non_utf8_files_are_one_line(tmp_path):
    p = tmp_path / "x.json"
    p.write_bytes(b'{"a": "\xff\xfe"}')
    for load in (Plan.load, AcceptanceProfile.load, read_sweep, read_jsonl):
        with pytest.raises(UserError, match=r"is not UTF-8 text \(byte 0xff at offset 7\)"):
            load(p)
    with pytest.raises(UserError, match="not UTF-8"):
        read_prompt_file(str(p), 100)


# ---- prompt files ------------------------------------------------------------------------------

PROMPTS_JSONL = '{"prompt": "hello there"}\n{"ids": [1, 2, 3]}\n'
PROFILER_PROMPTS = (PKG / "prompts" / "chat.jsonl").read_text().splitlines()[:3]


@FUZZ
@given(blob=st.one_of(mutated_bytes(PROMPTS_JSONL.encode()),
                      st.lists(st.one_of(mutated_json({"prompt": "hi"}), mutated_json({"ids": [1, 2, 3]})),
                               min_size=1, max_size=3).map(lambda xs: "\n".join(xs).encode())),
       suffix=st.sampled_from([".jsonl", ".txt"]))  # fmt: skip
def test_run_prompt_file_fuzz(blob, suffix):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"prompts{suffix}"
        p.write_bytes(blob)
        items = valid_or_user_error(lambda: read_prompt_file(str(p), vocab=100))
    for it in items or []:
        assert isinstance(it, str) or (it and all(isinstance(x, int) and 0 <= x < 100 for x in it))


@pytest.mark.parametrize("line,match", [('{"ids": ["a"]}', r'"ids"\[0\] must be an integer in 0..99'),
                                        ('{"ids": [100]}', "got 100"), ('{"ids": [-3]}', "got -3"),
                                        ('{"ids": [1.5]}', "got 1.5"), ('{"ids": "12"}', "must be a list"),
                                        ('{"prompt": 5}', "must be a non-empty string"), ("[1]", "expected")])
def test_run_prompt_file_bad_line(tmp_path, line, match):
    (tmp_path / "p.jsonl").write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(UserError, match=f"p.jsonl line 2.*{match}"):
        read_prompt_file(str(tmp_path / "p.jsonl"), vocab=100)


@FUZZ
@given(blob=st.one_of(mutated_bytes("\n".join(PROFILER_PROMPTS).encode()),
                      st.lists(st.one_of(mutated_json(json.loads(PROFILER_PROMPTS[0])),
                                         mutated_json({"id": "raw", "tokens": [1, 17, 42]})),
                               min_size=1, max_size=3).map(lambda xs: "\n".join(xs).encode())))  # fmt: skip
def test_profiler_prompts_fuzz(blob):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "prompts.jsonl"
        p.write_bytes(blob)
        prompts = valid_or_user_error(lambda: read_jsonl(p))
    for pr in prompts or []:
        assert isinstance(pr.id, str)
        assert pr.tokens is None or all(type(t) is int and t >= 0 for t in pr.tokens)


# ---- run logs ----------------------------------------------------------------------------------

RUNLOG = {p.name: p.read_text() for p in (DATA / "runlog-h200-async-mini").iterdir()}


@FEW
@given(data=st.data(), name=st.sampled_from(sorted(RUNLOG)))
def test_runlog_load_fuzz(data, name):
    text = RUNLOG[name]
    if name.endswith(".json"):
        blob = data.draw(file_variants(text, json.loads(text)))
    else:
        lines = text.splitlines()
        i = data.draw(st.integers(0, len(lines) - 1))
        blob = data.draw(st.one_of(
            mutated_bytes(text.encode()),
            mutated_json(json.loads(lines[i])).map(lambda s: "\n".join(lines[:i] + [s] + lines[i + 1:]).encode())))
    with tempfile.TemporaryDirectory() as d:
        for n, t in RUNLOG.items():
            Path(d, n).write_text(t)
        Path(d, name).write_bytes(blob)
        log = valid_or_user_error(lambda: RunLog.load(d))
        if log is not None:
            valid_or_user_error(log.summary)  # what loads can be summarised


# ---- validate --repredict reports --------------------------------------------------------------

REPORT = {
    "meta": {"pairs": [["Llama-3-70B", "Llama-3.2-1B"]], "prompts": 3, "max_new_tokens": 64, "seed": 0,
             "host_calibration": {"Llama-3-70B+Llama-3.2-1B": {"per_forward": 0.2, "per_token": 0.001,
                                                               "per_node": 0.002, "base": {"serial": 1.0}}}},
    "rows": [{"config": "serial bs8-w8-d4 1 gpu", "measured_tokens_per_s": 50.0, "measured_accepted": 3.1,
              "measured_iteration_ms": 60.0, "measured_forward_ms": 40.0, "measured_host_ms": 5.0}],
}  # fmt: skip
REPORT_LOG = ('host fit Llama-3-70B+Llama-3.2-1B: {"per_forward": 0.2, "per_token": 0.001, "per_node": 0.002} '
              'base {"serial": 1.0}\nworkload: 3 prompts (builtin), 64 new tokens each\n'
              "  config pred tok/s a b c d e f g h\n"
              "serial bs8 1 50.0 51.0 1 1 3.1 1 60.0 40.0 5.0\nmedian |error| 1 %\n")


def test_report_fixtures_read():
    with tempfile.TemporaryDirectory() as d:
        Path(d, "report.json").write_text(json.dumps(REPORT))
        Path(d, "run.log").write_text(REPORT_LOG)
        assert read_sweep(d)["prompts"] == 3 and read_sweep(Path(d, "run.log"))["max_new_tokens"] == 64


@FUZZ
@given(data=st.data(), as_log=st.booleans())
def test_read_sweep_fuzz(data, as_log):
    blob = data.draw(file_variants(REPORT_LOG) if as_log else file_variants(json.dumps(REPORT), REPORT))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d, "run.log" if as_log else "report.json")
        p.write_bytes(blob)
        sweep = valid_or_user_error(lambda: read_sweep(p))
    if sweep is not None:
        assert sweep["prompts"] >= 1 and sweep["max_new_tokens"] >= 1 and sweep["fits"]


# ---- model configs and checkpoints -------------------------------------------------------------

TINY_CONFIG = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 32, "rms_norm_eps": 1e-6,
               "max_position_embeddings": 64, "tie_word_embeddings": False}  # fmt: skip


def tiny_checkpoint(folder: Path, config: dict | None = None) -> Path:
    """A one-layer llama checkpoint (hidden 8, 2 heads / 1 KV head, vocab 32) as model.safetensors."""
    g = torch.Generator().manual_seed(0)
    h, q, kv, f, v = 8, 8, 4, 16, 32
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h),
              "model.layers.0.input_layernorm.weight": (h,), "model.layers.0.post_attention_layernorm.weight": (h,),
              "model.layers.0.self_attn.q_proj.weight": (q, h), "model.layers.0.self_attn.k_proj.weight": (kv, h),
              "model.layers.0.self_attn.v_proj.weight": (kv, h), "model.layers.0.self_attn.o_proj.weight": (h, q),
              "model.layers.0.mlp.gate_proj.weight": (f, h), "model.layers.0.mlp.up_proj.weight": (f, h),
              "model.layers.0.mlp.down_proj.weight": (h, f)}  # fmt: skip
    save_file({k: torch.randn(s, generator=g) for k, s in shapes.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config or TINY_CONFIG))
    return folder


def test_tiny_checkpoint_loads(tmp_path):
    model = load_model(tiny_checkpoint(tmp_path))
    assert model.spec.hidden == 8 and model.weights == "checkpoint"


PLAUSIBLE_CONFIG = st.fixed_dictionaries({
    **{k: st.just(v) for k, v in TINY_CONFIG.items()},
    **{k: st.integers(-1, 12) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                        "num_attention_heads", "num_key_value_heads", "vocab_size")},
    "head_dim": st.none() | st.integers(-1, 6),
})  # fmt: skip


@FUZZ
@given(blob=st.one_of(file_variants(json.dumps(TINY_CONFIG), TINY_CONFIG),
                      PLAUSIBLE_CONFIG.map(lambda c: json.dumps(c).encode())))
def test_model_config_fuzz(blob):
    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_bytes(blob)
        spec = valid_or_user_error(lambda: ModelSpec.from_config(d))
    if spec is not None:
        assert min(spec.hidden, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.ffn, spec.vocab) >= 1
        assert spec.num_heads % spec.num_kv_heads == 0


@pytest.mark.parametrize("field,value,match", [
    ("hidden_size", 0, "hidden_size must be an integer >= 1, got 0"),
    ("num_attention_heads", -2, "num_attention_heads must be an integer >= 1"),
    ("num_attention_heads", 3, "num_attention_heads 3 does not divide hidden_size 8"),
    ("num_key_value_heads", 3, "num_key_value_heads 3 does not divide num_attention_heads 2"),
    ("vocab_size", 1.5, "vocab_size must be an integer"),
    ("rms_norm_eps", -1.0, "rms_norm_eps must be > 0"),
])  # fmt: skip
def test_impossible_config_is_named(tmp_path, field, value, match):
    (tmp_path / "config.json").write_text(json.dumps({**TINY_CONFIG, field: value}))
    with pytest.raises(UserError, match=match):
        ModelSpec.from_config(tmp_path)


def test_truncated_checkpoint_is_named(tmp_path):
    tiny_checkpoint(tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"model.safetensors is not a readable safetensors file .*re-download"):
        load_model(tmp_path)


def test_checkpoint_shape_mismatch_is_named(tmp_path):
    tiny_checkpoint(tmp_path, {**TINY_CONFIG, "intermediate_size": 32})
    with pytest.raises(UserError, match=r"gate_proj.weight has shape \[16, 8\] but config.json gives \[32, 8\]"):
        load_model(tmp_path)


CHECKPOINT_BYTES: dict[str, bytes] = {}


def _set(b: bytearray, flips: list[tuple[int, int]]) -> bytearray:
    for i, v in flips:
        b[i] = v
    return b


@FEW
@given(data=st.data())
def test_checkpoint_load_fuzz(data):
    if not CHECKPOINT_BYTES:
        with tempfile.TemporaryDirectory() as d:
            tiny_checkpoint(Path(d))
            CHECKPOINT_BYTES["model.safetensors"] = Path(d, "model.safetensors").read_bytes()
    good = CHECKPOINT_BYTES["model.safetensors"]
    header = int.from_bytes(good[:8], "little") + 8
    # mutate the header (names, shapes, offsets) more often than the tensor data
    flip_data = st.lists(st.tuples(st.integers(header, len(good) - 1), st.integers(0, 255)), min_size=1,
                         max_size=4).map(lambda fl: bytes(_set(bytearray(good), fl)))
    blob = data.draw(st.one_of(mutated_bytes(good[:header]).map(lambda b: b + good[header:]),
                               mutated_bytes(good), flip_data))
    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_text(json.dumps(TINY_CONFIG))
        Path(d, "model.safetensors").write_bytes(blob)
        model = valid_or_user_error(lambda: load_model(d))
    if model is not None:
        assert model.spec.hidden == 8


@pytest.mark.parametrize("index,match", [
    ("{", "checkpoint index .* is not valid JSON"),
    ('{"weight_map": []}', "weight_map must map tensor names to file names"),
    ('{"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}}', "give file names inside"),
    ('{"weight_map": {"model.norm.weight": "part-2.safetensors"}}', "part-2.safetensors not found"),
])  # fmt: skip
def test_sharded_index_is_checked(tmp_path, index, match):
    tiny_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(UserError, match=match):
        load_model(tmp_path)
